"""A hostile corpus, built at test time: every class of bad input the pipeline must survive.

Each entry says what must become of the file: ``ok`` (indexed), ``warn:<text>`` (indexed, with a
warning containing the text) or ``error:<text>`` (not indexed this time, with a per-file error
containing the text). Files git cannot hold (undecodable names, symlinks, FIFOs) are made here.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["MAX_FILE_BYTES", "build_hostile_books"]

#: the RAG_MAX_FILE_BYTES the hostile corpus is ingested with
MAX_FILE_BYTES = 200_000


def _bomb(levels: int) -> str:
    lines = ["---", "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for level in range(1, levels + 1):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * 9) + "]")
    return "\n".join([*lines, "title: bomb", "---", "# Body", "", "text"])


def build_hostile_books(data_dir: Path) -> dict[str, dict[str, str]]:
    """Write book ``hostile`` (and a neighbour book ``other``) under ``data_dir``; returns
    ``{book: {source_file: expected}}`` for the files whose outcome is known."""
    other = data_dir / "other"
    (other / "private").mkdir(parents=True)
    (other / "private" / "secret.md").write_text("# Other book\n\nOnly for the other book.\n")
    book = data_dir / "hostile"
    book.mkdir(parents=True)
    outside = data_dir.parent / "outside-secret.md"
    outside.write_text("# Outside\n\nNot in any book.\n")
    expected: dict[str, str] = {}

    def write(name: str, content: str | bytes, outcome: str) -> None:
        path = book / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        expected[name] = outcome

    write(
        "good.md",
        "---\ntitle: Good\nchapter: 2\n---\n# Good\n\nA normal page about robots.\n",
        "ok",
    )
    write("crlf-bom.md", "\ufeff---\r\ntitle: Windows\r\n---\r\n# Windows\r\n\r\nText.\r\n", "ok")
    write("latin1.md", b"# caf\xe9 au lait\n", "error:not valid UTF-8")
    write("binary.md", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "error:binary content")
    write("controls.md", "\x01\x02\x03\x04\x05\x06" * 200, "error:binary content")
    write("bad-yaml.md", "---\ntitle: [unclosed\n---\nbody\n", "error:invalid YAML")
    write("list-yaml.md", "---\n- a\n- b\n---\nbody\n", "error:not a key/value mapping")
    write("alias-bomb.md", _bomb(8), "error:aliases")
    write("recursive-anchor.md", "---\na: &a [*a]\n---\n# Body\n\ntext\n", "error:refers to itself")
    write("deep-yaml.md", "---\nx: " + "[" * 100 + "]" * 100 + "\n---\nbody\n", "error:nested")
    write("huge-frontmatter.md", "---\nt: " + "y" * 70_000 + "\n---\nbody\n", "error:larger than")
    write("python-tag.md", "---\nx: !!python/object/apply:os.system [true]\n---\nbody\n", "error:")
    write("wrong-types.md", "---\nchapter: [1, 2]\nhardware_tier: abc\n---\n# T\n\ntext\n", "warn:")
    write("nul-later.md", "# Title\n\n" + "word " * 2000 + "\x00tail\n", "warn:NUL")
    write("empty.md", "", "ok")
    write("blank.md", " \n\t\n", "ok")
    write("too-large.md", "# Big\n\n" + "word " * 50_000, "error:file too large")
    write("one-line.md", "# One line\n\n" + "x" * 100_000, "ok")
    write("unclosed-fence.md", "# Code\n\n```python\n" + "print('x')\n" * 500, "ok")
    write(
        "huge-table.md",
        "# Table\n\n| a | b |\n|---|---|\n"
        + "".join(f"| {i} | {'v' * 40} |\n" for i in range(800)),
        "ok",
    )
    write(
        "nested-lists.md", "# Lists\n\n" + "".join("  " * i + "- item\n" for i in range(300)), "ok"
    )
    write("long-title.md", "---\ntitle: " + "Title " * 400 + "\n---\n# H\n\nBody text.\n", "ok")
    write("long-heading.md", "# " + "heading " * 500 + "\n\nBody text.\n", "ok")
    write("many-headings.md", "".join(f"{'#' * (i % 6 + 1)} H{i}\n\n" for i in range(400)), "ok")
    write("huge-numbers.md", "---\nchapter: 99999999999999999999999\n---\n# N\n\nx\n", "warn:")
    write("new\nline.md", "# Newline in the name\n\ntext\n", "ok")
    write("sub/dir.md/inner.md", "# A folder named like a file\n\ntext\n", "ok")
    # entries git cannot hold
    raw = os.fsencode(book)
    with open(os.path.join(raw, b"caf\xe9-name.md"), "wb") as fh:
        fh.write(b"# Latin-1 file name\n")
    expected["caf\\xe9-name.md"] = "error:not valid UTF-8"
    os.symlink(book / "self-loop.md", book / "self-loop.md")
    expected["self-loop.md"] = "error:loop"
    os.symlink(book / "ping.md", book / "pong.md")
    os.symlink(book / "pong.md", book / "ping.md")
    expected["ping.md"] = expected["pong.md"] = "error:loop"
    os.symlink(book / "nowhere.md", book / "broken.md")
    expected["broken.md"] = "error:broken symlink"
    os.symlink(outside, book / "leak-outside.md")
    expected["leak-outside.md"] = "error:outside its book folder"
    os.symlink(other / "private" / "secret.md", book / "leak-other-book.md")
    expected["leak-other-book.md"] = "error:outside its book folder"
    os.symlink(other / "private", book / "other-folder")
    expected["other-folder"] = "error:outside its book folder"
    os.symlink(book / "good.md", book / "alias-inside.md")
    expected["alias-inside.md"] = "ok"
    os.mkfifo(book / "pipe.md")
    expected["pipe.md"] = "error:not a regular file"
    (book / "dir-named.md").mkdir()
    (book / "dir-named.md" / "real.md").write_text("# Real\n\ntext\n")
    expected["dir-named.md/real.md"] = "ok"
    return {"hostile": expected, "other": {"private/secret.md": "ok"}}

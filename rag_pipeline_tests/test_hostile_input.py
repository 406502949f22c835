"""Hostile input of the books themselves: odd file contents, odd names and trees, and files that
change while a run reads them. Each test names the fault it was written for (it failed before
the fix); each drives the production pipeline or source in-process on tiny books, and where a
run is involved, ends by comparing the index with a clean build of the same files."""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rag_pipeline_tests.conftest import make_pipeline, make_recipe, settle_files, store_config
from rag_pipeline_tests.gitbooks import NEEDS_GIT, GitRepo


@pytest.fixture
def recipe(hash_embedder: Any) -> Any:
    return make_recipe(hash_embedder)


def point_ids(store_path: Path, book: str) -> dict[str, tuple[Any, ...]]:
    """Every point of the book: id -> (record type, file, file hash, status)."""
    from rag_pipeline.schema import COLLECTION_SCHEMA, book_filter
    from rag_pipeline.store import open_store

    with open_store(store_config(store_path), COLLECTION_SCHEMA) as store:
        keys = ("record_type", "source_file", "source_file_hash", "status")
        return {
            r.id: tuple(r.payload.get(k) for k in keys)
            for r in store.scroll(book_filter(book), fields=None)
        }


def clean_build(data_dir: Path, work: Path, book: str, recipe: Any, **options: Any) -> dict:
    """The points a clean build of the book as it is now gives (a copy, a fresh store)."""
    shutil.copytree(data_dir, work / "books", symlinks=True)
    make_pipeline(work / "books", store_config(work / "q"), recipe, **options).run([book])
    return point_ids(work / "q", book)


@pytest.fixture
def book(tmp_path: Path, recipe: Any) -> Iterator[tuple[Path, Any, Any]]:
    """A book ``b`` of two files, indexed: (its folder, its pipeline, a check that the index
    equals a clean build)."""
    folder = tmp_path / "books" / "b"
    folder.mkdir(parents=True)
    (folder / "a.md").write_text("# A\n\nversion zero of a\n")
    (folder / "other.md").write_text("# Other\n\nother text\n")
    settle_files()
    pipeline = make_pipeline(tmp_path / "books", store_config(tmp_path / "q"), recipe)
    pipeline.run(["b"])

    def equals_clean_build() -> None:
        ours = point_ids(tmp_path / "q", "b")
        theirs = clean_build(tmp_path / "books", tmp_path / "clean", "b", recipe)
        shutil.rmtree(tmp_path / "clean")
        assert ours == theirs

    yield folder, pipeline, equals_clean_build


def test_a_read_that_fails_after_the_look_hashed_the_file_is_read_again(book, monkeypatch):
    """Fault: a file hashed by the run's look whose read then failed (made unreadable, an I/O
    error, replaced by a FIFO in between) got an error record carrying the look's hash: the
    next runs took it as unchanged and served the old version forever, with the stale error.
    A record of a file that gave no bytes keeps the hash of the version it serves."""
    from rag_pipeline.sources.base import SourceReadError
    from rag_pipeline.sources.folder import FolderSource

    folder, pipeline, equals_clean_build = book
    (folder / "a.md").write_text("# A\n\nversion one of a, edited\n")
    (folder / "new.md").write_text("# New\n\na new file\n")
    settle_files()
    real = FolderSource.read

    def failing(self: Any, book_id: str, file: Any, boundary: str) -> bytes:
        if file.source_file in ("a.md", "new.md"):
            raise SourceReadError(errno.EIO, "cannot read file: Input/output error")
        return real(self, book_id, file, boundary)

    monkeypatch.setattr(FolderSource, "read", failing)
    failed = pipeline.run(["b"])["b"].outcome.result
    assert sorted(failed.error_messages) == [
        "b/a.md: cannot read file: Input/output error",
        "b/new.md: cannot read file: Input/output error",
    ]
    monkeypatch.setattr(FolderSource, "read", real)
    again = pipeline.run(["b"])["b"]
    assert again.inventory.changes.modified == ("a.md", "new.md")  # new.md: its error record
    assert again.outcome.result.error_messages == []
    equals_clean_build()


def test_a_file_over_the_size_limit_is_refused_by_its_size_unread(tmp_path, recipe, monkeypatch):
    """Fault: a folder file over RAG_MAX_FILE_BYTES was hashed in full by every look (plan,
    sensor, run) before the run's read refused it. It is refused by its size, not a byte read,
    with a message that says the sizes (a limit under 1 MB read "0.0 MB"); a file that grows
    past the limit keeps its last good chunks and says why."""
    from rag_pipeline.sources.folder import FolderSource

    folder = tmp_path / "books" / "b"
    folder.mkdir(parents=True)
    (folder / "a.md").write_text("# A\n\nsmall\n")
    (folder / "big.md").write_text("# Big\n\n" + "word " * 4000)
    settle_files()
    read: list[int] = []
    real_read = os.read

    def counting(fd: int, n: int) -> bytes:
        data = real_read(fd, n)
        read.append(len(data))
        return data

    monkeypatch.setattr(os, "read", counting)
    source = FolderSource(tmp_path / "books", max_file_bytes=10_000)
    found = source.scan("b")
    assert sum(read) == len("# A\n\nsmall\n")  # big.md: not one byte
    assert [str(e) for e in found.errors] == [
        "b/big.md: file too large: 20,007 bytes exceeds the 10,000 bytes limit (RAG_MAX_FILE_BYTES)"
    ]
    monkeypatch.setattr(os, "read", real_read)

    pipeline = make_pipeline(tmp_path / "books", store_config(tmp_path / "q"), recipe)
    pipeline = pipeline.with_source(source)
    pipeline.run(["b"])
    (folder / "a.md").write_text("# A\n\n" + "grown " * 4000)
    settle_files()
    grown = pipeline.run(["b"])["b"]
    assert grown.inventory.reasons == [
        "file too large: 24,005 bytes exceeds the 10,000 bytes limit (RAG_MAX_FILE_BYTES); "
        "its last good chunks stay: a.md"
    ]
    assert {v[1] for v in point_ids(tmp_path / "q", "b").values()} == {"a.md"}  # kept


def test_a_refused_file_with_an_odd_name_is_one_error_on_one_line(book):
    """Fault: the crawl named a refused file by an escaped name cut at 200 characters, its
    record by its real name: a file whose name holds a control character or is long was two
    errors (the run's count and ``plan``'s list doubled), and a message held the raw newline
    or terminal escape of a name (a second, forged line). Errors keep the file's name; only
    messages escape it, whole."""
    folder, pipeline, _ = book
    names = ["new\nline.md", "esc\x1b[2Jape.md", "y" * 240 + ".md"]
    for name in names:
        (folder / name).write_text("# T\n\ntext\n")
    settle_files()
    pipeline.run(["b"])
    for name in names:  # each replaced by something that is not a file
        (folder / name).unlink()
        os.mkfifo(folder / name)
    with pipeline.store.open() as reader:
        planned = pipeline.plan(reader, ["b"], detail=True).books["b"]
    done = pipeline.run(["b"])["b"].outcome.result
    expected = [
        "b/esc\\x1b[2Jape.md: not a regular file: a FIFO (named pipe)",
        "b/new\\x0aline.md: not a regular file: a FIFO (named pipe)",
        f"b/{'y' * 240}.md: not a regular file: a FIFO (named pipe)",
    ]
    assert sorted(planned.errors) == sorted(done.error_messages) == expected
    assert done.errors == 3 and done.files_unreadable == 3
    assert {v[1] for v in point_ids(folder.parent.parent / "q", "b").values()} >= set(names)


@pytest.mark.parametrize(
    ("frontmatter", "fields", "warning"),
    [
        # Fault: a key given twice silently took its last value (YAML forbids it)
        (
            "title: first\ntitle: second",
            {"title": "second"},
            "frontmatter key 'title' is given more than once: its last value is used",
        ),
        ("outer: {k: 1, k: 2}", {"outer": {"k": 2}}, "frontmatter key 'k' is given more than"),
        ('{\n"t": 1, "t": 2\n}', {"t": 2}, "frontmatter key 't' is given more than once"),
        # a merge's keys are meant to be overridden: no warning
        ("base: &b {x: 1, y: 0}\nother:\n  <<: *b\n  y: 2", {"other": {"x": 1, "y": 2}}, None),
        # Fault: a !!binary value became the text "b'hello'"
        ("title: !!binary aGVsbG8=", {"title": "hello"}, None),
        ("x: !!binary /w==", {"x": None}, "frontmatter: 1 !!binary value(s) are not UTF-8 text"),
        # Fault: a !!set's items came in the hash's order, another in every process
        ("tags: !!set {b, a, c}", {"tags": ["a", "b", "c"]}, None),
    ],
)
def test_odd_yaml_values_are_kept_as_what_they_say_with_a_warning(frontmatter, fields, warning):
    from rag_pipeline.ingest.parse import parse_document
    from rag_pipeline.models import ParsedDocument

    block = frontmatter if frontmatter.startswith("{") else f"---\n{frontmatter}\n---"
    parsed = parse_document("b", "f.md", f"{block}\n# T\n\nx\n".encode(), "h")
    assert isinstance(parsed, ParsedDocument)
    assert {k: parsed.frontmatter[k] for k in fields} == fields
    if warning is None:
        assert parsed.warnings == ()
    else:
        assert len(parsed.warnings) == 1 and parsed.warnings[0].startswith(warning)


def test_a_file_with_text_but_no_markdown_block_is_an_empty_document_said_so(book):
    """Fault: a file of only link reference definitions has text (so no "empty document"
    warning at parse) but no Markdown block: it got no chunk, a record saying "empty", and
    no word in the run's report. It is said as an empty file is."""
    folder, pipeline, equals_clean_build = book
    (folder / "refs.md").write_text('[home]: https://example.com\n[docs]: /docs "Docs"\n')
    settle_files()
    run = pipeline.run(["b"])["b"]
    said = (
        "refs.md: empty document (no text once read as Markdown, such as only link reference "
        "definitions): nothing to index"
    )
    assert run.outcome.result.warnings == [said]
    outcome = next(o for o in run.chunked.outcomes if o.source_file == "refs.md")
    assert outcome.status == "empty" and outcome.warnings == (said.partition(": ")[2],)
    equals_clean_build()


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ("2020-13-45", "timestamp"),  # no month 13
        ("2020-02-30", "timestamp"),
        ("2001-12-14 21:59:43.10 -25:00", "timestamp"),
        ("0x_", "int"),
        ("!!bool maybe", "bool"),
        ("!!timestamp nope", "timestamp"),
    ],
)
def test_a_frontmatter_value_that_is_not_the_type_it_looks_like_is_kept_as_text(value, kind):
    """Fault: a date with a typo (``date: 2020-13-45``) refused the whole file with Python's
    words ("invalid frontmatter: month must be in 1..12"; for ``!!timestamp nope``: "'NoneType'
    object has no attribute 'groupdict'"). The value is kept as its text, with a warning."""
    from rag_pipeline.ingest.parse import parse_document
    from rag_pipeline.models import ParsedDocument

    data = f"---\ntitle: Kept\nwhen: {value}\n---\n# T\n\nbody\n".encode()
    parsed = parse_document("b", "f.md", data, "h")
    assert isinstance(parsed, ParsedDocument) and parsed.meta.title == "Kept"
    text = value.rpartition(" ")[2] if value.startswith("!!") else value
    assert parsed.frontmatter["when"] == text
    assert parsed.warnings == (f"frontmatter value {text!r} is not a valid {kind}: kept as text",)


def test_a_yaml_collection_of_the_wrong_shape_for_its_tag_is_named_as_that():
    from rag_pipeline.ingest.parse import parse_document
    from rag_pipeline.models import FileError

    refused = parse_document("b", "f.md", b"---\nx: !!map [1]\n---\nbody\n", "h")
    assert isinstance(refused, FileError)
    assert refused.reason.startswith("invalid YAML frontmatter: a value does not have the shape")


@pytest.mark.integration  # git processes
@NEEDS_GIT
def test_a_git_blob_over_the_size_limit_is_refused_by_the_size_its_listing_names(tmp_path):
    """Fault (the folder's, in git): a blob over RAG_MAX_FILE_BYTES was streamed whole through
    ``git cat-file`` to be refused, at every look (plan, sensor tick, run). Its size comes
    with the listing (``ls-tree -l``): it is refused by it, unread."""
    from rag_pipeline.sources import git
    from rag_pipeline.sources.base import SourceReadError

    repo = GitRepo(tmp_path / "repo")
    repo.commit("pages", {"big.md": "# Big\n\n" + "word " * 400, "small.md": "# S\n\ntext\n"})
    source = git.GitSource(
        {"gb": git.GitBookSpec(git=str(repo.path))},
        cache_dir=tmp_path / "cache",
        max_file_bytes=1000,
    )
    asked: list[str] = []
    real = git._Blobs.read

    def reading(self: Any, blob: str, max_bytes: int) -> bytes:
        asked.append(blob)
        return real(self, blob, max_bytes)

    try:
        git._Blobs.read = reading  # type: ignore[method-assign]
        found = source.scan("gb")
    finally:
        git._Blobs.read = real  # type: ignore[method-assign]
        source.close()
    assert [f.source_file for f in found.files] == ["small.md"]
    assert [str(e) for e in found.errors] == [
        "gb/big.md: file too large: 2,007 bytes exceeds the 1,000 bytes limit (RAG_MAX_FILE_BYTES)"
    ]
    big = next(v for v in source.versions("gb").files if v.source_file == "big.md")
    assert big.key not in asked and len(asked) == 1
    with pytest.raises(SourceReadError, match="too large"):
        source.read("gb", big, found.boundary)


def test_an_object_over_the_size_limit_is_refused_by_its_listed_size_without_a_request():
    """An object whose listing says it is over RAG_MAX_FILE_BYTES is refused by that size: no
    GET is made for it at any look (a request per object and tick, before)."""
    from rag_pipeline.sources.base import FileVersion, SourceReadError
    from rag_pipeline.sources.s3 import S3BookSpec, S3Source, object_key_version

    source = S3Source({"sb": S3BookSpec(s3="s3://bucket/p/")}, max_file_bytes=1000)
    listed = FileVersion("big.md", object_key_version('"e"', "t", 5000), "p/big.md", version="e")
    with pytest.raises(SourceReadError, match=r"object too large: 5,000 bytes exceeds the 1,000"):
        source.read("sb", listed, "s3://bucket/p/")
    assert source._clients == {}  # no client made, no request sent


def test_a_file_that_opens_with_a_thematic_break_is_read_as_markdown():
    """Fault: a file opening with a thematic break (``---``) and holding a second one later
    had the prose between them taken for frontmatter, a YAML string: the whole file was
    refused ("frontmatter is not a key/value mapping"). Prose is read as Markdown, with a
    warning; a YAML list there is still refused (it is frontmatter of the wrong kind)."""
    from rag_pipeline.ingest.parse import parse_document
    from rag_pipeline.models import FileError, ParsedDocument

    data = b"---\n\n# Slides\n\nFirst slide text.\n\n---\n\nSecond slide.\n"
    parsed = parse_document("b", "slides.md", data, "h")
    assert isinstance(parsed, ParsedDocument)
    assert parsed.meta.title == "Slides" and parsed.body == data.decode()
    assert parsed.warnings == (
        "the text between the first two '---' lines is not frontmatter (no key: value line): "
        "read as Markdown",
    )
    assert isinstance(parse_document("b", "l.md", b"---\n- a\n---\nx\n", "h"), FileError)


@pytest.mark.parametrize(
    "frontmatter",
    [
        "---\nx: 0b" + "1" * 20_000 + "\n---",
        "---\nx: " + "1" * 5_000 + "\n---",
        '{\n"x": ' + "1" * 5_000 + "\n}",
    ],
)
def test_a_frontmatter_integer_of_thousands_of_digits_never_refuses_the_file(frontmatter):
    """Fault: an integer too long for Python's decimal conversion (over 4,300 digits) refused
    the whole file with Python's words ("Exceeds the limit (4300 digits) for integer string
    conversion; use sys.set_int_max_str_digits()")."""
    from rag_pipeline.ingest.parse import parse_document
    from rag_pipeline.models import ParsedDocument

    parsed = parse_document("b", "f.md", f"{frontmatter}\n# T\n\nx\n".encode(), "h")
    assert isinstance(parsed, ParsedDocument) and parsed.meta.title == "T"
    assert isinstance(parsed.frontmatter["x"], str)


def test_a_file_refused_by_older_parse_rules_is_read_again_after_an_upgrade(
    book, recipe, monkeypatch
):
    """Fault: a file refused by the parse rules of an older version kept its error record
    after an upgrade whose rules accept it (until the file changed or ``--force``): the index
    was not what a clean build gives. An error record written under other parse rules (or
    none: records from before they were named) is read again once, said so by ``plan``; an
    error still standing under the current rules starts no run."""
    import dataclasses

    from rag_pipeline_tests.helpers import parse_rules_of_version_1

    folder, pipeline, equals_clean_build = book
    (folder / "slides.md").write_bytes(b"---\n\n# Slides\n\nOne.\n\n---\n\nTwo.\n")
    (folder / "list.md").write_bytes(b"---\n- a\n---\nx\n")  # refused by every version
    settle_files()
    older = dataclasses.replace(recipe, parse_rules="1")
    old_pipeline = make_pipeline(folder.parent, pipeline.store, older)
    with parse_rules_of_version_1():
        assert old_pipeline.run(["b"])["b"].outcome.result.errors == 2

    with pipeline.store.open() as reader:
        planned = pipeline.plan(reader, ["b"]).books["b"]
    assert planned.action == "run"
    assert planned.reasons == [
        "parse rules changed (version 1, now 2): its recorded error is read again: "
        "list.md, slides.md"
    ]
    upgraded = pipeline.run(["b"])["b"]
    assert upgraded.inventory.changes.modified == ("list.md", "slides.md")
    assert upgraded.outcome.result.error_messages == [
        "b/list.md: frontmatter is not a key/value mapping"
    ]
    equals_clean_build()
    with pipeline.store.open() as reader:  # decided from the saved summary, as ingest does
        assert pipeline.plan(reader, ["b"]).books["b"].action == "unchanged"
    assert not pipeline.run(["b"])["b"].inventory.changes.has_work


def test_an_error_record_written_before_parse_rules_had_a_version_is_read_again():
    """Records written before the parse rules were named carry none: their errors are checked
    again once; an ok record of no version, or an error of these rules, is left alone."""
    from rag_pipeline.ingest.changes import IndexedDocument, classify_files

    def record(name: str, status: str, version: str | None) -> IndexedDocument:
        return IndexedDocument(name, "h", status, "sig", 0, "bad", "parse", version)

    indexed = {
        "old.md": record("old.md", "error", None),
        "now.md": record("now.md", "error", "2"),
        "ok.md": record("ok.md", "ok", None),
    }
    changes = classify_files(
        dict.fromkeys(indexed, "h"), indexed, "sig", is_gone=lambda _: False, parse_version="2"
    )
    assert changes.modified == ("old.md",) and changes.unchanged == ("now.md", "ok.md")
    assert changes.reasons == {
        "old.md": "parse rules changed (no version, now 2): its recorded error is read again"
    }


def test_a_file_of_more_markdown_blocks_than_the_limit_is_refused_alone(book, recipe):
    """Fault: a file of tiny blocks (1 MB of "a\\n\\n": 333k paragraphs) was parsed whole,
    markdown-it holding every token (about 1.3 kB and 40 us a block): 10 MB of them, minutes
    and gigabytes, could take the whole run down. A file that starts more blocks than
    RAG_MAX_FILE_BLOCKS is refused once past it, naming the setting; the rest of the book is
    ingested; with the limit raised again, the file is read again."""
    import dataclasses

    from rag_pipeline.chunking import TooManyBlocks
    from rag_pipeline.chunking.structure import _blocks

    folder, pipeline, equals_clean_build = book
    (folder / "tiny.md").write_text("a\n\n" * 200)
    (folder / "fine.md").write_text("# Fine\n\n" + "| a | b |\n| - | - |\n" + "| 1 | 2 |\n" * 300)
    settle_files()
    lowered = dataclasses.replace(recipe, budget=dataclasses.replace(recipe.budget, max_blocks=50))
    limited = make_pipeline(folder.parent, pipeline.store, lowered)
    done = limited.run(["b"])["b"].outcome.result
    assert done.error_messages == [
        "b/tiny.md: too many Markdown blocks: more than 50 (headings, paragraphs, list items; "
        "RAG_MAX_FILE_BLOCKS)"
    ]
    files = {v[1] for v in point_ids(folder.parent.parent / "q", "b").values() if v[0] == "chunk"}
    assert files == {"a.md", "other.md", "fine.md"}
    assert not limited.run(["b"])["b"].inventory.changes.has_work  # refused, not retried
    # a 300-row table and a paragraph of 300 lines are one block each; lines count apart
    assert len(_blocks("| a |\n| - |\n" + "| 1 |\n" * 300 + "\n" + "word\n" * 300, 100)) == 2
    with pytest.raises(TooManyBlocks, match=r"too many lines: 1,001, more than 1,000 \(10 per"):
        _blocks("word\n" * 1000, 100)
    again = pipeline.run(["b"])["b"]  # the default limit: the refusal is read again
    assert again.inventory.changes.modified == ("tiny.md",)
    equals_clean_build()

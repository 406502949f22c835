import os
from pathlib import Path

import pytest

from rag_pipeline.config import DEFAULT_PATH_PATTERNS
from rag_pipeline.crawl import (
    InvalidBookIdError,
    compile_path_patterns,
    discover_books,
    discover_files,
    extract_path_meta,
    scan_book,
    validate_book_id,
)
from rag_pipeline.models import PathMeta


@pytest.mark.parametrize("book_id", ["ros2", "Microsoft.PowerShell.Core", "book_1", "a-b.c_d", "9"])
def test_safe_book_ids_are_accepted(book_id):
    assert validate_book_id(book_id) == book_id


@pytest.mark.parametrize(
    "book_id",
    [
        "",
        "../etc",
        "a/b",
        "a b",
        ".hidden",
        "-dash",
        "a..b",
        "x" * 129,
        "$(rm -rf ~)",
        "книга",
        "a\nb",
        "a\x00b",
        "book;drop",
    ],
)
def test_unsafe_book_ids_are_refused(book_id):
    with pytest.raises(InvalidBookIdError, match="invalid book id"):
        validate_book_id(book_id)


def test_discover_books_reports_unsafe_folders_and_skips_hidden(data_dir, write_book):
    write_book("good-book", {"a.md": "# A"})
    write_book("bad book", {"a.md": "# A"})
    write_book(".git", {"a.md": "# A"})
    (data_dir / "not-a-folder.md").write_text("# stray file")
    scan = discover_books(data_dir)
    assert scan.book_ids == ("good-book",)
    assert len(scan.rejected) == 1
    assert scan.rejected[0].book_id == "bad book"
    assert "invalid book id" in scan.rejected[0].reason


def test_missing_data_dir_has_no_books(tmp_path):
    assert discover_books(tmp_path / "nope").book_ids == ()


def test_discover_files_finds_md_and_mdx_recursively(data_dir, write_book):
    write_book(
        "b",
        {
            "intro.md": "# Intro",
            "part/one.mdx": "# One",
            "part/deep/er/two.MD": "# Two",
            "notes.txt": "not markdown",
            ".drafts/hidden.md": "# hidden",
            "_category_.json": "{}",
        },
    )
    files, errors = discover_files(data_dir, "b")
    assert [f.source_file for f in files] == ["intro.md", "part/deep/er/two.MD", "part/one.mdx"]
    assert not errors
    assert all(len(f.sha256) == 64 and f.size > 0 for f in files)


def test_symlink_outside_data_dir_is_refused(tmp_path, data_dir, write_book):
    outside = tmp_path / "secret.md"
    outside.write_text("# secret")
    root = write_book("b", {"ok.md": "# ok"})
    os.symlink(outside, root / "leak.md")
    os.symlink(tmp_path, root / "leakdir")
    os.symlink(root / "ok.md", root / "alias.md")  # inside: allowed
    os.symlink(root / "missing.md", root / "broken.md")
    files, errors = discover_files(data_dir, "b")
    assert sorted(f.source_file for f in files) == ["alias.md", "ok.md"]
    reasons = {e.source_file: e.reason for e in errors}
    assert "outside the data directory" in reasons["leak.md"]
    assert "outside the data directory" in reasons["leakdir"]
    assert reasons["broken.md"] == "broken symlink"


def test_symlink_loops_terminate(data_dir, write_book):
    root = write_book("b", {"sub/a.md": "# a"})
    os.symlink(root, root / "sub" / "loop")
    files, _ = discover_files(data_dir, "b")
    assert "sub/a.md" in [f.source_file for f in files]


def test_scan_book_refuses_unsafe_id(data_dir):
    with pytest.raises(InvalidBookIdError):
        scan_book(data_dir, "../x")


PATTERNS = compile_path_patterns(DEFAULT_PATH_PATTERNS)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (
            "module-01-foundations/chapter-02-python-agents-ros/page-05-introduction.md",
            PathMeta("module-01-foundations", 2, 5),
        ),
        ("01-chapter-1-ros2-fundamentals/03-nodes-communication.md", PathMeta(None, 1, 3)),
        ("03-chapter-4-ai-integration/02-lesson-2-voice-whisper.md", PathMeta(None, 4, 2)),
        ("module-1-ros2/week-4-lesson-2-building-packages.md", PathMeta("module-1-ros2", None, 2)),
        ("chapters/ch07-perception.md", PathMeta(None, 7, None)),
        ("intro.md", PathMeta()),
        ("developer/cmdlet/approved-verbs.md", PathMeta()),
    ],
)
def test_path_metadata_from_default_patterns(path, expected):
    assert extract_path_meta(path, PATTERNS) == expected


def test_custom_path_patterns(data_dir, write_book):
    write_book("b", {"unit-3/topic-7.md": "# x"})
    files, _ = discover_files(data_dir, "b", [r"unit-(?P<chapter>\d+)/topic-(?P<lesson>\d+)"])
    assert files[0].path_meta == PathMeta(None, 3, 7)


def test_invalid_path_pattern_names_the_pattern():
    with pytest.raises(ValueError, match=r"invalid path pattern '\(\?P<x'"):
        compile_path_patterns(("(?P<x",))


def test_file_hash_matches_bytes(data_dir, write_book):
    import hashlib

    root = write_book("b", {"a.md": b"# caf\xc3\xa9\r\n"})
    files, _ = discover_files(data_dir, "b")
    assert files[0].sha256 == hashlib.sha256(Path(root / "a.md").read_bytes()).hexdigest()

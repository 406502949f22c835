"""Books and files on disk: safe ids, symlinks, loops, odd names, unreadable entries, reads."""

import errno
import os
from pathlib import Path

import pytest

from rag_pipeline.config import DEFAULT_PATH_PATTERNS
from rag_pipeline.models import InvalidBookIdError, PathMeta, validate_book_id
from rag_pipeline.sources.crawl import (
    DataDirError,
    SourceReadError,
    book_folder_problem,
    compile_path_patterns,
    discover_books,
    extract_path_meta,
    hash_file,
    path_is_gone,
    path_meta,
    read_source,
    scan_book,
    unreadable_reason,
)
from rag_pipeline_tests.conftest import denied


def discover_files(data_dir, book_id, patterns=DEFAULT_PATH_PATTERNS):
    """(files as (name, sha256, path meta), errors) of one book."""
    scan = scan_book(data_dir, book_id)
    files = [
        (f.source_file, hash_file(f.location, scan.boundary), path_meta(f.source_file, patterns), f)
        for f in scan.files
    ]
    return files, list(scan.errors)


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


@pytest.mark.parametrize(
    ("book_id", "problem"),
    [
        ("a..b", "it contains '..'"),
        ("", "it is empty"),
        ("x" * 129, "it is 129 characters long"),
        ("a b", "it contains ' '"),
        ("a\nb", "it contains '\\x0a'"),
        ("-dash", "it starts with '-'"),
    ],
)
def test_a_refused_book_id_says_what_is_wrong_with_it(book_id, problem):
    with pytest.raises(InvalidBookIdError) as refused:
        validate_book_id(book_id)
    assert f": {problem}; use 1-128 letters" in str(refused.value)


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


def test_missing_data_dir_is_an_error_not_an_empty_corpus(tmp_path):
    with pytest.raises(DataDirError, match="does not exist"):
        discover_books(tmp_path / "nope")


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
    assert [f[0] for f in files] == ["intro.md", "part/deep/er/two.MD", "part/one.mdx"]
    assert not errors
    assert all(len(f[1]) == 64 and f[3].key.size > 0 for f in files)


def test_symlinks_leaving_the_book_folder_are_refused(tmp_path, data_dir, write_book):
    outside = tmp_path / "secret.md"
    outside.write_text("# secret")
    other = write_book("other", {"private.md": "# other book's text"})
    root = write_book("b", {"ok.md": "# ok"})
    os.symlink(outside, root / "leak.md")
    os.symlink(tmp_path, root / "leakdir")
    os.symlink(other / "private.md", root / "cross.md")  # into another book: the tenant boundary
    os.symlink(other, root / "crossdir")
    os.symlink(root / "ok.md", root / "alias.md")  # inside its own book: allowed
    os.symlink(root / "missing.md", root / "broken.md")
    files, errors = discover_files(data_dir, "b")
    assert sorted(f[0] for f in files) == ["alias.md", "ok.md"]
    reasons = {e.source_file: e.reason for e in errors}
    for name in ("leak.md", "leakdir", "cross.md", "crossdir"):
        assert "outside its book folder" in reasons[name], name
    assert "broken symlink" in reasons["broken.md"]


def test_symlink_loops_terminate(data_dir, write_book):
    root = write_book("b", {"sub/a.md": "# a"})
    os.symlink(root, root / "sub" / "loop")
    os.symlink(root / "self.md", root / "self.md")  # a file symlink to itself
    os.symlink(root / "y.md", root / "x.md")
    os.symlink(root / "x.md", root / "y.md")  # two links pointing at each other
    files, errors = discover_files(data_dir, "b")
    assert [f[0] for f in files] == ["sub/a.md"]
    reasons = {e.source_file: e.reason for e in errors}
    assert {"self.md", "x.md", "y.md"} <= set(reasons)
    assert all("loop" in reasons[n] for n in ("self.md", "x.md", "y.md"))


def test_a_file_name_that_is_not_utf8_is_refused_alone(data_dir, write_book):
    root = write_book("b", {"ok.md": "# ok"})
    with open(os.path.join(os.fsencode(root), b"caf\xe9.md"), "wb") as fh:
        fh.write(b"# latin-1 name")
    files, errors = discover_files(data_dir, "b")
    assert [f[0] for f in files] == ["ok.md"]
    assert len(errors) == 1 and "not valid UTF-8" in errors[0].reason
    assert errors[0].source_file == "caf\\xe9.md"  # printable, and JSON-safe
    errors[0].source_file.encode("utf-8")


def test_a_book_folder_linking_into_another_book_is_refused(data_dir, write_book):
    write_book("real", {"a.md": "# A"})
    os.symlink(data_dir / "real", data_dir / "alias")
    scan = discover_books(data_dir)
    assert scan.book_ids == ("real",)
    assert "into book 'real'" in scan.rejected[0].reason


def test_finding_books_compares_only_linked_folders_with_the_others(
    data_dir, write_book, monkeypatch
):
    """Two plain folders under the data folder cannot overlap: a scan of many books costs
    the books, not every pair of them (the sensor lists them every tick)."""
    from rag_pipeline.sources import crawl

    compared = []
    real = crawl._overlaps
    monkeypatch.setattr(crawl, "_overlaps", lambda *a: compared.append(a) or real(*a))
    for n in range(30):
        write_book(f"book-{n:02d}", {"a.md": "# A"})
    assert len(discover_books(data_dir).book_ids) == 30 and compared == []
    os.symlink(data_dir / "book-07", data_dir / "alias")
    scan = discover_books(data_dir)
    assert len(scan.book_ids) == 30 and "into book 'book-07'" in scan.rejected[0].reason
    assert len(compared) <= 30  # the link, against the others


def test_an_unlistable_folder_is_an_error_and_its_files_are_not_gone(
    data_dir, write_book, monkeypatch
):
    root = write_book("b", {"ok.md": "# ok", "locked/secret.md": "# s"})
    monkeypatch.setattr(os, "scandir", denied(os.scandir, "locked"))
    files, errors = discover_files(data_dir, "b")
    assert [f[0] for f in files] == ["ok.md"]
    assert errors[0].source_file == "locked" and "Permission denied" in errors[0].reason
    assert not path_is_gone(root, "locked/secret.md")
    assert path_is_gone(root, "never-existed.md")


def test_only_a_missing_path_is_gone(tmp_path, monkeypatch):
    (tmp_path / "a.md").write_text("x")
    assert not path_is_gone(tmp_path, "a.md")
    assert path_is_gone(tmp_path, "b.md")
    assert path_is_gone(tmp_path, "a.md/inside.md")  # a file where a folder was
    real_lstat = os.lstat

    def lstat(path, *args, **kwargs):
        if str(path).endswith("c.md"):
            raise PermissionError(errno.EACCES, "Permission denied")
        return real_lstat(path, *args, **kwargs)

    monkeypatch.setattr(os, "lstat", lstat)
    assert not path_is_gone(tmp_path, "c.md")  # cannot tell: not gone


def test_read_source_checks_the_file_actually_opened(tmp_path, data_dir, write_book):
    root = write_book("b", {"ok.md": "# ok", "big.md": "x" * 100})
    folder = os.path.realpath(root)
    assert read_source(str(root / "ok.md"), folder, 1000) == b"# ok"
    with pytest.raises(SourceReadError, match="file too large"):
        read_source(str(root / "big.md"), folder, 50)
    # a link that was inside at scan time and is re-pointed outside before the read
    outside = tmp_path / "secret.md"
    outside.write_text("# secret")
    os.symlink(root / "ok.md", root / "race.md")
    os.unlink(root / "race.md")
    os.symlink(outside, root / "race.md")
    with pytest.raises(SourceReadError, match="outside its book folder"):
        read_source(str(root / "race.md"), folder, 1000)
    os.mkfifo(root / "pipe.md")
    with pytest.raises(SourceReadError, match="not a regular file"):
        read_source(str(root / "pipe.md"), folder, 1000)
    with pytest.raises(SourceReadError, match="cannot read file"):
        read_source(str(root / "gone.md"), folder, 1000)


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
    files, _ = discover_files(data_dir, "b", (r"unit-(?P<chapter>\d+)/topic-(?P<lesson>\d+)",))
    assert files[0][2] == PathMeta(None, 3, 7)


def test_a_huge_number_in_a_path_is_capped_to_a_payload_integer():
    meta = extract_path_meta("chapter-" + "9" * 40 + "-x/a.md", PATTERNS)
    assert meta.chapter is not None and meta.chapter < 2**63


def test_invalid_path_pattern_names_the_pattern():
    with pytest.raises(ValueError, match=r"invalid path pattern '\(\?P<x'"):
        compile_path_patterns(("(?P<x",))


def test_file_hash_matches_bytes(data_dir, write_book):
    import hashlib

    root = write_book("b", {"a.md": b"# caf\xc3\xa9\r\n"})
    files, _ = discover_files(data_dir, "b")
    assert files[0][1] == hashlib.sha256(Path(root / "a.md").read_bytes()).hexdigest()


def test_a_symlink_to_a_fifo_or_a_device_says_what_its_target_is(data_dir, write_book):
    root = write_book("b", {"ok.md": "# ok"})
    os.mkfifo(root / "p.fifo")
    os.symlink(root / "p.fifo", root / "lp.md")
    os.mkfifo(root / "pipe.md")
    os.symlink("/dev/null", root / "null.md")  # outside the book: refused for that first
    os.symlink(root / "missing.md", root / "broken.md")
    files, errors = discover_files(data_dir, "b")
    assert [f[0] for f in files] == ["ok.md"]
    reasons = {e.source_file: e.reason for e in errors}
    assert reasons["lp.md"] == "not a regular file: a symlink to a FIFO (named pipe)"
    assert reasons["pipe.md"] == "not a regular file: a FIFO (named pipe)"
    assert "outside its book folder" in reasons["null.md"]
    assert reasons["broken.md"] == "broken symlink: its target does not exist"


def test_why_a_known_file_that_is_not_gone_could_not_be_read(tmp_path):
    (tmp_path / "was-a-file.md").mkdir()
    os.mkfifo(tmp_path / "pipe.md")
    (tmp_path / "fine.md").write_text("x")
    os.symlink(tmp_path / "loop.md", tmp_path / "loop.md")
    assert not path_is_gone(tmp_path, "was-a-file.md")
    assert unreadable_reason(tmp_path, "was-a-file.md") == "is a directory, not a file"
    assert unreadable_reason(tmp_path, "pipe.md") == "not a regular file: a FIFO (named pipe)"
    assert "loop" in unreadable_reason(tmp_path, "loop.md")
    assert unreadable_reason(tmp_path, "fine.md") == "file exists but could not be read"


def test_why_a_book_folder_that_exists_is_not_a_book(tmp_path, data_dir, write_book):
    write_book("good", {"a.md": "# A"})
    (data_dir / "now-a-file").write_text("was a book")
    os.symlink(data_dir / "now-a-file", data_dir / "link-to-file")
    os.symlink(data_dir / "nowhere", data_dir / "dangling")
    (data_dir / "a..b").mkdir()
    assert discover_books(data_dir).book_ids == ("good",)
    assert book_folder_problem(data_dir, "now-a-file") == "is a file, not a folder"
    assert book_folder_problem(data_dir, "link-to-file") == "is a symlink to a file, not a folder"
    assert book_folder_problem(data_dir, "dangling") == "is a broken symlink"
    assert "contains '..'" in book_folder_problem(data_dir, "a..b")


@pytest.mark.parametrize(
    ("rel", "is_file"),
    [
        ("intro.md", True),
        ("guide/deploy.MDX", True),
        ("guide/image.png", False),
        ("guide/", False),
        (".hidden.md", False),
        ("guide/.draft.md", False),
        (".github/README.md", False),
        ("a.b/c.md", True),
    ],
)
def test_a_path_named_by_a_git_tree_or_an_object_key_is_a_book_file_by_the_crawls_rules(
    rel: str, is_file: bool
) -> None:
    from rag_pipeline.sources.crawl import is_book_path

    assert is_book_path(rel) is is_file

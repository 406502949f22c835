"""Issue 43, item 3: every path the product opens for a book keeps to the book boundary the
crawl keeps (no link out, no ``..``, no device or FIFO). ``lineage`` (the CLI and the service's
``GET /lineage``) used to hash whatever an indexed file's path led to: a file replaced by a link
to any file the service can read gave that file's SHA-256 to any HTTP client."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

import pytest

from rag_pipeline_tests.helpers import Cli, Server, assert_no_trace, index_sample_books

BOOK = "ros2-fundamentals"
OTHER = "humanoid-robotics-ros2"
SECRET = b"root:$6$not-for-you:19000:0:99999:7:::\n"


def _points_by_file(cli: Cli, book: str) -> dict[str, str]:
    """One point id of each file of ``book`` (a grouped search, one group per file)."""
    groups = cli.json("search", "ROS 2", "--book", book, "--group-by", "file", "--limit", "20")
    return {g["source_file"]: g["hits"][0]["id"] for g in groups}


@pytest.mark.integration
def test_lineage_never_hashes_a_file_outside_its_book(tmp_path):
    """Each file of a book replaced by what leaves the boundary: an absolute link out, a
    relative ``..`` link out, a link into another book, a link to a device, a FIFO; then a
    book folder replaced by a link out of the data folder. The CLI and ``GET /lineage`` answer
    ``file_exists: false`` and the refusal, never a hash of what is behind it."""
    books = index_sample_books(tmp_path)
    cli = Cli(tmp_path, books)
    points = _points_by_file(cli, BOOK)
    other_points = _points_by_file(cli, OTHER)
    assert len(points) == 5 and other_points, (points, other_points)
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    other_file = books / OTHER / "index.md"
    files = sorted(points)
    root = books / BOOK
    replaced = {
        files[0]: lambda p: os.symlink(secret, p),  # absolute, out of the data folder
        files[1]: lambda p: os.symlink(os.path.relpath(secret, p.parent), p),  # ../../secret
        files[2]: lambda p: os.symlink(other_file, p),  # into another book
        files[3]: lambda p: os.symlink("/dev/zero", p),  # a device
        files[4]: lambda p: os.mkfifo(p),  # a FIFO where the file was
    }
    for name, make in replaced.items():
        (root / name).unlink()
        make(root / name)
    server = Server(cli)
    try:
        for name, point in points.items():
            served = server.get(f"/lineage/{point}", book=BOOK)
            assert served.status_code == 200, served.text
            answer = served.json()
            assert answer == cli.json("lineage", point, "--book", BOOK)
            assert answer["source_file"] == name
            assert answer["file_exists"] is False, answer
            assert answer["current_file_hash"] is None  # (it was the secret's SHA-256)
            assert answer["file_changed_since_indexed"] is True
            assert (
                "refused" in answer["file_problem"]
                or "not a regular file" in (answer["file_problem"])
            ), answer
        # the other book's folder moved out of the data folder, a link left in its place
        outside = tmp_path / "elsewhere"
        shutil.move(books / OTHER, outside)
        os.symlink(outside, books / OTHER)
        for point in other_points.values():
            answer = server.get(f"/lineage/{point}", book=OTHER).json()
            assert answer["file_exists"] is False and answer["current_file_hash"] is None
            assert "points outside the data directory" in answer["file_problem"], answer
    finally:
        server.stop()
    assert_no_trace(server.log_path.read_text())


@pytest.mark.integration
def test_plan_lists_a_refused_link_once(tmp_path):
    """A file replaced by a link out of its book: the plan names the refusal once (the crawl's
    error, not again as the run's read error), and its reason is the refusal too."""
    books = index_sample_books(tmp_path)
    cli = Cli(tmp_path, books)
    name = "01-chapter-1-ros2-fundamentals/02-setup.md"
    (books / BOOK / name).unlink()
    os.symlink("/etc/hostname", books / BOOK / name)
    plan = cli.json("plan")["books"][BOOK]
    mentions = [e for e in plan["errors"] if name in e]
    assert mentions == [f"{BOOK}/{name}: symlink points outside its book folder; refused"], plan
    assert plan["files"]["unreadable"] == [name]
    assert any("symlink points outside its book folder" in r for r in plan["reasons"]), plan


def test_the_boundary_refuses_before_opening_and_again_on_what_was_opened(tmp_path):
    """:func:`open_in_book`, which every read, hash and look at a book's file goes through."""
    from rag_pipeline.sources.base import RefusedPathError, SourceReadError
    from rag_pipeline.sources.crawl import book_file_path, hash_file, open_in_book, read_source

    book = tmp_path / "book"
    (book / "sub").mkdir(parents=True)
    (book / "ok.md").write_text("# ok")
    (tmp_path / "secret.md").write_bytes(SECRET)
    folder = os.path.realpath(book)
    os.symlink("../secret.md", book / "up.md")
    os.symlink(tmp_path, book / "sub" / "out")
    os.symlink("/dev/zero", book / "zero.md")
    os.mkfifo(book / "pipe.md")
    assert hash_file(book / "ok.md", folder) == hashlib.sha256(b"# ok").hexdigest()
    for path, why in (
        ("up.md", "symlink points outside its book folder"),
        ("sub/out/secret.md", "leads outside its book folder through a symlinked folder"),
        ("zero.md", "symlink points outside its book folder"),
        ("pipe.md", "not a regular file: a FIFO (named pipe)"),
        ("sub", "is a directory, not a file"),
    ):
        for call in (
            lambda p: hash_file(p, folder),
            lambda p: read_source(p, folder, 1000),
            lambda p: open_in_book(p, folder),
        ):
            with pytest.raises(RefusedPathError, match=re.escape(why)):
                call(str(book / path))
    with pytest.raises(RefusedPathError, match="a character device"):  # never opened
        hash_file("/dev/zero", "/dev")
    for name in ("../secret.md", "/etc/passwd", "sub/../../secret.md", "./ok.md", "", "a//b"):
        with pytest.raises(RefusedPathError, match="not a path inside its book folder"):
            book_file_path(book, name)
    with pytest.raises(SourceReadError, match="cannot read file"):
        hash_file(book / "gone.md", folder)


def test_a_file_name_with_dot_dot_from_the_index_is_refused(tmp_path):
    """A name the index holds is looked at through the same rule: a ``..`` never leaves it."""
    from rag_pipeline.sources.folder import FolderSource

    (tmp_path / "books" / "b").mkdir(parents=True)
    (tmp_path / "books" / "c").mkdir()
    (tmp_path / "books" / "c" / "x.md").write_text("# another book's file")
    source = FolderSource(tmp_path / "books")
    now = source.file_now("b", "../c/x.md")
    assert (now.exists, now.sha256) == (False, None)
    assert "not a path inside its book folder" in str(now.problem)
    assert not source.is_gone("b", "../c/x.md")  # never a decision to delete
    assert "not a path inside" in source.why_unreadable("b", "../c/x.md")
    assert Path(source.locate("b", "x.md")).name == "x.md"

"""Issue 30: under pressure the processes wait, shrink or say why. Each case runs the processes
a user would (the query service, a CLI command) against one embedded store, with the machine's
limit lowered the way a test can (a held lock, ``RLIMIT_NOFILE``, a small tmpfs)."""

from __future__ import annotations

import json
import os
import resource
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rag_pipeline_tests.conftest import REPO
from rag_pipeline_tests.helpers import (
    Cli,
    InProcessCli,
    Server,
    assert_no_trace,
    fill_disk,
    fresh_cli,
    index_books,
    index_sample_books,
    small_tmpfs,
)

pytestmark = [pytest.mark.slow, pytest.mark.integration]

BOOKS = ("ros2-fundamentals", "humanoid-robotics-ros2", "third-book", "fourth-book")


def _four_books(root: Path) -> Path:
    """The sample books and two copies, indexed directly into the store of ``root``'s CLI."""
    books = root / "books"
    shutil.copytree(REPO / "data" / "books", books)
    shutil.copytree(books / "ros2-fundamentals", books / "third-book")
    shutil.copytree(books / "humanoid-robotics-ros2", books / "fourth-book")
    index_books(books, str(root / "qdrant"))
    return books


class Hammer:
    """Searches every book in turn through the service until stopped; keeps every status and
    whether the answer had hits."""

    def __init__(self, server: Server, books: tuple[str, ...] = BOOKS) -> None:
        self.server, self.books = server, books
        self.answers: list[tuple[str, int, int]] = []  # (book, status, hits)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        while not self._stop.is_set():
            for book in self.books:
                response = self.server.get("/search", q="nodes and topics", book=book)
                hits = len(response.json()) if response.status_code == 200 else 0
                self.answers.append((book, response.status_code, hits))

    def __enter__(self) -> Hammer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)

    def failures(self) -> list[tuple[str, int, int]]:
        return [a for a in self.answers if a[1] != 200 or a[2] == 0]


@pytest.fixture
def serving(tmp_path: Path) -> Iterator[tuple[Server, Cli]]:
    cli = Cli(tmp_path, _four_books(tmp_path))
    server = Server(cli)
    try:
        for book in BOOKS:  # the service holds every book it served
            assert server.get("/search", q="nodes", book=book).status_code == 200
        yield server, cli
    finally:
        server.stop()


def test_a_plan_of_every_book_under_a_busy_service_waits_and_succeeds(serving):
    """Case 1: a plan that prices a recipe change reads every book while the service answers
    searches over the same books: neither side fails busy (no lock-order deadlock)."""
    server, cli = serving
    cli.env["RAG_HASH_DIMENSION"] = "256"  # a recipe change: the plan reads every book
    cli.env["RAG_BUSY_WAIT_S"] = "20"
    with Hammer(server) as hammer:
        time.sleep(0.3)
        for _ in range(3):
            done = cli("plan", "--json", check=False)
            assert done.returncode == 0, done.stderr[-2000:]
            assert_no_trace(done.stderr)
            plan = json.loads(done.stdout)
            assert set(plan["books"]) == set(BOOKS)
    assert len(hammer.answers) >= 8 and not hammer.failures(), hammer.failures()[:5]


def _small_books(root: Path, count: int) -> Path:
    """``count`` one-file books, indexed directly into the store of ``root``'s CLI."""
    books = root / "books"
    for i in range(count):
        book = books / f"book-{i:03d}"
        book.mkdir(parents=True)
        (book / "a.md").write_text(f"# Book {i}\n\n## Nodes\n\nNodes and topics of book {i}.\n")
    index_books(books, str(root / "qdrant"))
    return books


#: the service's open files: ~16 of its own, and two per book it keeps (SERVED_BOOKS_LOADED:
#: the shard's and the lock's): 48 at most, whatever the number of books
SERVE_FILES_LIMIT = 64


def test_the_service_answers_for_more_books_than_it_may_open_files(tmp_path):
    """Case 3: a service with a low open-files limit answers for many more books than that
    limit (it used to keep one lock file open per book it ever served, then answer 500
    "damaged store ... Too many open files ... rebuild" for every book)."""
    cli = Cli(tmp_path, _small_books(tmp_path, 60))
    server = Server(cli, files_limit=SERVE_FILES_LIMIT)
    try:
        answers = []
        for _ in range(2):
            for i in range(60):
                response = server.get("/search", q="nodes", book=f"book-{i:03d}")
                answers.append((i, response.status_code, response.text[:200]))
        failed = [a for a in answers if a[1] != 200 or "Nodes" not in a[2]]
        assert not failed, failed[:3]
        open_now = len(os.listdir(f"/proc/{server.proc.pid}/fd"))
        assert open_now < SERVE_FILES_LIMIT - 8, open_now
    finally:
        server.stop()
    # a plan that reads every book (a recipe change to price) under the same limit
    env = {**cli.env, "RAG_HASH_DIMENSION": "256"}
    planned = fresh_cli(
        ["plan", "--json"],
        env,
        tmp_path,
        preexec_fn=lambda: resource.setrlimit(
            resource.RLIMIT_NOFILE, (SERVE_FILES_LIMIT, SERVE_FILES_LIMIT)
        ),
    )
    assert planned.returncode == 0, planned.stderr[-2000:]
    assert len(json.loads(planned.stdout)["books"]) == 60


def test_a_rebuild_under_a_busy_service_succeeds_and_searches_never_go_empty(serving):
    """Case 2: `ingest --rebuild` while the service answers searches of every book: the rebuild
    succeeds (it used to exit busy and leave the collection set aside and empty) and every
    answer during and after it has hits: the new collection is swapped in once complete."""
    server, cli = serving
    cli.env["RAG_BUSY_WAIT_S"] = "30"
    before = {book: _hit_ids(server, book) for book in BOOKS}
    with Hammer(server) as hammer:
        time.sleep(0.3)
        done = cli("ingest", "--rebuild", "--json", check=False)
        time.sleep(0.3)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_no_trace(done.stderr)
    report = json.loads(done.stdout)["books"]
    assert {r["status"] for r in report.values()} == {"ingested"}, report
    assert len(hammer.answers) >= 8 and not hammer.failures(), hammer.failures()[:5]
    root = Path(cli.env["RAG_QDRANT_PATH"])
    assert len(list(root.glob("rag_chunks.set-aside-*"))) == 1  # the old one, kept
    assert not (root / ".rebuild-rag_chunks").exists()
    assert {book: _hit_ids(server, book) for book in BOOKS} == before  # same books, same ids


def _hit_ids(server: Server, book: str) -> list[str]:
    response = server.get("/search", q="nodes and topics", book=book, limit=5)
    assert response.status_code == 200, response.text
    return [hit["id"] for hit in response.json()]


def test_a_rebuild_with_a_failed_book_is_not_swapped_in(tmp_path, monkeypatch, quick_step_retries):
    """All or nothing: a rebuild in which a book fails leaves the collection in service as it
    was (exit 1, the report names the book); the next rebuild starts afresh and swaps in."""
    from rag_pipeline.ingest import pipeline as pipeline_module

    cli = InProcessCli(tmp_path, index_sample_books(tmp_path))
    root = Path(cli.env["RAG_QDRANT_PATH"])
    in_service = _generations(root / "rag_chunks")
    write_and_check = pipeline_module.write_and_check

    def failing(store, source, chunked, *args):  # type: ignore[no-untyped-def]
        if chunked.book_id == "humanoid-robotics-ros2":
            raise OSError("the disk said no")
        return write_and_check(store, source, chunked, *args)

    monkeypatch.setattr(pipeline_module, "write_and_check", failing)
    done = cli("ingest", "--rebuild", "--json", check=False)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "not swapped in" in done.stderr
    report = json.loads(done.stdout)["books"]
    assert report["humanoid-robotics-ros2"]["status"] == "failed", report
    assert quick_step_retries  # its waits were shortened: the step failed under its policy
    assert _generations(root / "rag_chunks") == in_service  # untouched
    assert not list(root.glob("rag_chunks.set-aside-*"))
    monkeypatch.setattr(pipeline_module, "write_and_check", write_and_check)
    again = cli("ingest", "--rebuild", "--json")
    assert {r["status"] for r in json.loads(again.stdout)["books"].values()} == {"ingested"}
    assert _generations(root / "rag_chunks").keys() == in_service.keys()
    assert _generations(root / "rag_chunks") != in_service  # a new build of every book
    assert not (root / ".rebuild-rag_chunks").exists()


def _generations(collection: Path) -> dict[str, str]:
    books = collection / "books"
    return {
        b.name: json.loads((b / "current.json").read_text())["generation"]
        for b in sorted(books.iterdir())
    }


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 MiB tmpfs mounted for the test (needs root; skipped otherwise)."""
    with small_tmpfs(tmp_path / "disk", "256m") as mount:
        yield mount


def test_a_full_disk_fails_the_write_with_a_message_and_loses_nothing(tmp_path, small_disk):
    """Case 5: with the store on a full file system an ingest ends with each book's clear
    error in --json (it used to die by SIGBUS, exit 135, with no output: Qdrant Edge writes
    through memory maps), a search of a book says what limit it met or answers, and once space
    is freed the next ingest converges."""
    books = tmp_path / "books"
    shutil.copytree(REPO / "data" / "books", books)
    cli = Cli(tmp_path, books)
    cli.env["RAG_QDRANT_PATH"] = str(small_disk / "qdrant")
    cli("ingest")
    edited = books / "ros2-fundamentals" / "99-quokkatron.md"
    edited.write_text("# Quokkatron\n\n## Flux\n\nThe quokkatron flux needs 1.21 gigawatts.\n")
    filler = fill_disk(small_disk, 1 << 20)
    done = cli("ingest", "--json", check=False)
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    assert_no_trace(done.stderr)
    report = json.loads(done.stdout)["books"]["ros2-fundamentals"]
    assert report["status"] == "failed", report
    assert any("no space left" in m for m in report["error_messages"]), report
    search = cli("search", "nodes", "--book", "humanoid-robotics-ros2", "--json", check=False)
    assert search.returncode in (0, 1), search.stderr
    assert "unexpected" not in search.stderr and "damaged" not in search.stderr, search.stderr
    assert search.returncode == 0 or "no space left" in search.stderr, search.stderr
    filler.unlink()
    assert cli.json("ingest")["books"]["ros2-fundamentals"]["status"] == "ingested"
    hits = cli.json("search", "quokkatron flux", "--book", "ros2-fundamentals", "--limit", "1")
    assert hits and hits[0]["source_file"] == "99-quokkatron.md"

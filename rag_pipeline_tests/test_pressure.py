"""Issue 30: under pressure the processes wait, shrink or say why. Each case runs the processes
a user would (the query service, a CLI command) against one embedded store, with the machine's
limit lowered the way a test can (a held lock, ``RLIMIT_NOFILE``, a small tmpfs)."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rag_pipeline_tests.conftest import REPO
from rag_pipeline_tests.helpers import Cli, assert_no_trace, index_books
from rag_pipeline_tests.test_serve import Server

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

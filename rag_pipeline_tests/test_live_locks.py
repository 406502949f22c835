"""Book locks between the threads of one process (live mode's workers): a run's builder handle
and another worker's plan (the reader handle) hand a book's lock over between their calls,
never wait out RAG_BUSY_WAIT_S for each other, and a waiter never names its own process."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rag_pipeline.resources import StoreOpener
from rag_pipeline.schema import book_filter
from rag_pipeline.store import BookBusyError, VectorStore
from rag_pipeline.store.lock import FolderLock, holding_for
from rag_pipeline.store.sharing import kept_open
from rag_pipeline_tests.conftest import make_recipe, store_config
from rag_pipeline_tests.test_store_shards import points_of


@pytest.fixture
def waits(caplog: pytest.LogCaptureFixture) -> Iterator[Callable[[], list[str]]]:
    """The busy warnings of the lock waits so far (one at the start of each wait)."""
    with caplog.at_level(logging.WARNING, logger="rag_pipeline.store.lock"):
        yield lambda: [r.getMessage() for r in caplog.records if "waiting up to" in r.msg]


@pytest.fixture
def live_store(tmp_path: Path, hash_embedder):  # type: ignore[no-untyped-def]
    """A store opened as live mode's runs open it (kept open; a builder for the runs),
    with book ``x`` written by a run that has ended."""
    recipe = make_recipe(hash_embedder)
    opener = StoreOpener(store_config(tmp_path / "edge"))
    with kept_open():
        with holding_for("the run of book x"), opener.open(recipe=recipe) as builder:
            builder.upsert(points_of("x", 3, recipe.dimension, recipe.signature))
        yield opener, recipe


class OtherWorker:
    """Another worker's run of book ``y``: its builder handle in use (between its steps,
    or in a call of it with ``in_a_call``) until :meth:`end`."""

    def __init__(self, opener: StoreOpener, recipe, in_a_call: bool = False) -> None:  # type: ignore[no-untyped-def]
        self.using = threading.Event()
        self.ended = threading.Event()
        self.store: VectorStore | None = None
        self.thread = threading.Thread(target=self._run, args=(opener, recipe, in_a_call))
        self.thread.start()
        assert self.using.wait(10)

    def _run(self, opener: StoreOpener, recipe, in_a_call: bool) -> None:  # type: ignore[no-untyped-def]
        with holding_for("the run of book y"), opener.open(recipe=recipe) as store:
            self.store = store
            store.upsert(points_of("y", 2, recipe.dimension, recipe.signature))
            if in_a_call:
                with store._lock:  # type: ignore[attr-defined]  # a call under way
                    self.using.set()
                    self.ended.wait(10)
            else:
                self.using.set()
                self.ended.wait(10)

    def end(self) -> None:
        self.ended.set()
        self.thread.join(10)


def test_a_plan_gets_a_book_another_workers_run_keeps_open_without_waiting(live_store, waits):
    """The reported hang: book x's run ended, but the builder it wrote through stays open
    (book y's run uses it, and holds x's lock as a book it wrote); the next plan of x, on the
    reader handle, waited RAG_BUSY_WAIT_S for its own process, then failed as busy."""
    opener, recipe = live_store
    other = OtherWorker(opener, recipe)
    try:
        with opener.open(busy_wait_s=2) as reader:  # the next plan of book x
            assert reader.count(book_filter("x")) == 3
        assert other.store is not None and other.store.folder_lock is not None
        assert other.store.folder_lock.handed_over == 1  # type: ignore[attr-defined]
        assert waits() == []  # not one wait
        with opener.open(recipe=recipe) as builder:  # x's next run: the reader hands back
            builder.upsert(points_of("x", 4, recipe.dimension, recipe.signature))
            assert builder.count(book_filter("x")) == 4
        assert builder is other.store and waits() == []
    finally:
        other.end()


def test_a_handle_in_a_call_keeps_its_book_and_the_wait_names_the_run_not_the_pid(
    live_store, waits
):
    """A call of the other worker's handle is not cut short: the plan waits for it (a short
    critical section), and says the holder is a run of this process, not its own pid."""
    opener, recipe = live_store
    other = OtherWorker(opener, recipe, in_a_call=True)
    try:
        # (the reader handle is kept open: its wait is the one of both reads; a wait for a
        # handle of this process is noticed after 1 s)
        with opener.open(busy_wait_s=1.5) as reader, pytest.raises(BookBusyError) as busy:
            reader.count(book_filter("x"))
        said = str(busy.value)
        assert "another run in this process (the run of book x)" in said, said
        assert f"pid {os.getpid()}" not in said and f"pid {os.getpid()}" not in " ".join(waits())
        assert len(waits()) == 1 and "another run in this process" in waits()[0]
        counted: list[int] = []
        assert other.store is not None and other.store.folder_lock is not None
        with opener.open() as reader:
            read = threading.Thread(target=lambda: counted.append(reader.count(book_filter("x"))))
            read.start()
            deadline = time.monotonic() + 5
            while not other.store.folder_lock.others_waiting():  # it waits: the call ends
                assert time.monotonic() < deadline
                time.sleep(0.005)
            other.ended.set()
            read.join(5)
        assert counted == [3]
    finally:
        other.end()


def test_a_lock_names_the_run_of_the_thread_that_took_it(tmp_path):
    """Two workers' runs at once: each lock says the run of the thread that took it, not the
    run that began last in the process."""
    lock = FolderLock(tmp_path / "book.lock", "book 'y'")
    entered, taken = threading.Event(), threading.Event()

    def other_run() -> None:
        with holding_for("the run of book x"):
            entered.set()
            taken.wait(10)

    with holding_for("the run of book y"):
        thread = threading.Thread(target=other_run)
        thread.start()
        entered.wait(10)  # book x's run began after book y's
        lock.acquire(0)
        taken.set()
    thread.join(10)
    try:
        assert (lock.holder() or {}).get("for") == "the run of book y"
    finally:
        lock.release()


class StoreRuns:
    """``apply`` using the store as live mode's does: each call plans its books on the reader
    handle, then runs them on the builder (a call of a book in ``hold`` is held after its
    writes, its builder in use, as a long embedding holds it)."""

    def __init__(self, opener: StoreOpener, recipe) -> None:  # type: ignore[no-untyped-def]
        self.opener, self.recipe = opener, recipe
        self.hold: set[str] = set()
        self.held, self.release = threading.Event(), threading.Event()
        self.calls: list[list[str]] = []
        self.errors: list[str] = []

    def __call__(self, books: list[str]) -> dict[str, bool]:
        try:
            with kept_open():
                with self.opener.open(busy_wait_s=3) as reader:  # the plan
                    for book in books:
                        reader.count(book_filter(book))
                with self.opener.open(recipe=self.recipe) as builder:  # the run
                    for book in books:
                        builder.upsert(points_of(book, 2, self.recipe.dimension, "r"))
                    if set(books) & self.hold:
                        self.held.set()
                        # longer than any wait of the test: a slow edit fails the test's own
                        # wait for it, not this call (whose retry would come too late)
                        assert self.release.wait(60)
        except Exception as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")
            return dict.fromkeys(books, False)
        self.calls.append(list(books))
        return dict.fromkeys(books, True)


def test_live_workers_apply_a_books_edit_while_another_books_run_holds_the_builder(
    tmp_path, hash_embedder, waits
):
    """The report, through the live loop with two workers: book ``small``'s edit is planned
    and applied while book ``big``'s run is held with the builder in use (the builder still
    holding ``small``, which it wrote before): no wait, no busy error."""
    from rag_pipeline.ingest.live import LiveLoop, LiveTiming
    from rag_pipeline.sources.folder import FolderSource
    from rag_pipeline.sources.scan import clear_scan_cache
    from rag_pipeline_tests.test_live import _until, running

    data = tmp_path / "books"
    (data / "small").mkdir(parents=True)
    (data / "small" / "a.md").write_text("# S\n\none")
    recipe = make_recipe(hash_embedder)
    opener = StoreOpener(store_config(tmp_path / "edge"))
    runs = StoreRuns(opener, recipe)
    with kept_open(), opener.open(recipe=recipe):
        pass  # the collection, as the first run makes it
    clear_scan_cache()
    live = LiveLoop(FolderSource(data), runs, timing=LiveTiming(debounce_s=0.05), workers=2)
    with running(live, data):
        _until(lambda: ["small"] in runs.calls)
        runs.hold = {"big"}
        (data / "big").mkdir()
        (data / "big" / "a.md").write_text("# B\n\nbig")
        assert runs.held.wait(5)
        (data / "small" / "a.md").write_text("# S\n\nan edit")
        try:
            # (a racy look of the edit is applied again once settled: a third call)
            _until(lambda: runs.calls.count(["small"]) >= 2 or bool(runs.errors), timeout=10)
        finally:
            runs.release.set()
        _until(lambda: ["big"] in runs.calls)
    assert runs.errors == [] and waits() == []


@pytest.mark.integration
def test_a_book_another_process_holds_is_still_waited_for_and_named(live_store):
    """The hand-over is between handles of one process: a book another process holds (a
    second run of it) is waited for as ever, and the wait names that process."""
    import subprocess
    import sys

    opener, _ = live_store
    lock_path = opener.config.path + "/rag_chunks/locks/x.lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path;"
            "from rag_pipeline.store.lock import FolderLock;"
            "FolderLock(Path(sys.argv[1]), 'x').acquire(10); print('held', flush=True);"
            "time.sleep(30)",
            lock_path,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with (
            opener.open(busy_wait_s=0.5) as reader,
            pytest.raises(BookBusyError, match=f"pid {holder.pid} "),
        ):
            reader.count(book_filter("x"))
    finally:
        holder.kill()
        holder.communicate()

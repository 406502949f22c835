"""Book locks between the threads of one process (live mode's workers): a run's builder handle
and another worker's plan (the reader handle) hand a book's lock over between their calls,
never wait out RAG_BUSY_WAIT_S for each other, and a waiter never names its own process."""

from __future__ import annotations

import logging
import os
import threading
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
        with opener.open(busy_wait_s=0.3) as reader, pytest.raises(BookBusyError) as busy:
            reader.count(book_filter("x"))
        said = str(busy.value)
        assert "another run in this process (the run of book x)" in said, said
        assert f"pid {os.getpid()}" not in said and f"pid {os.getpid()}" not in " ".join(waits())
        assert len(waits()) == 1 and "another run in this process" in waits()[0]
        released = threading.Timer(0.3, other.ended.set)  # the call ends during the wait
        released.start()
        with opener.open(busy_wait_s=10) as reader:
            assert reader.count(book_filter("x")) == 3
        released.join()
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

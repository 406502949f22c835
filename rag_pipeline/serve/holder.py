"""A store handle held open between requests that steps aside for other processes.

An embedded store folder is locked by whoever has it open (:class:`FolderLock`, exclusive),
so a long-lived reader must not keep it: ingestion runs would wait forever. :class:`StoreHolder`
keeps one handle open while requests come, and closes it as soon as another process waits for
the lock, checked before each request and every ``poll_s`` by a background thread while idle.
The next request opens the folder again (after the waiter got the lock, so a stream of
requests cannot starve it), waiting up to the store's busy wait for the writer to finish: the
answers then reflect the finished run, without a restart. Servers and memory stores have no
folder lock and stay open.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from rag_pipeline.store import VectorStore
from rag_pipeline.store.lock import WatchedLock

__all__ = ["HolderStats", "StoreHolder"]

log = logging.getLogger(__name__)


@dataclass
class HolderStats:
    opens: int = 0
    step_asides: int = 0
    requests: int = 0


class StoreHolder:
    """Shares one store handle among request threads; yields the folder to other processes.

    ``open_store(wait_s)`` opens the store, waiting up to ``wait_s`` seconds for a process that
    holds its folder (then :class:`~rag_pipeline.store.StoreBusyError`)."""

    def __init__(
        self,
        open_store: Callable[[float], VectorStore],
        *,
        busy_wait_s: float,
        poll_s: float = 0.05,
    ) -> None:
        self._open_store = open_store
        self._busy_wait_s = busy_wait_s
        self._poll_s = poll_s
        self._cond = threading.Condition()
        self._store: VectorStore | None = None
        self._users = 0
        self._closing = False
        #: the lock files the handle held, kept after a close to see waiters before reopening
        self._probe: WatchedLock | None = None
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self.stats = HolderStats()

    @property
    def is_open(self) -> bool:
        return self._store is not None

    def start(self) -> None:
        """Start the background thread that steps aside while no request runs."""
        if self._watcher is None:
            self._stop.clear()
            self._watcher = threading.Thread(target=self._watch, name="store-holder", daemon=True)
            self._watcher.start()

    def close(self) -> None:
        """Stop watching and release the store (waits for requests in flight)."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
            self._watcher = None
        with self._cond:
            self._step_aside_locked()

    @contextlib.contextmanager
    def store(self) -> Iterator[VectorStore]:
        """The open store for one request (opened, or reopened after stepping aside)."""
        with self._cond:
            while self._closing:
                self._cond.wait()
            self.stats.requests += 1
            if self._store is not None and self._others_waiting():
                self._step_aside_locked()
            if self._store is None:
                self._open_locked()
            assert self._store is not None
            store = self._store
            self._users += 1
        try:
            yield store
        finally:
            with self._cond:
                self._users -= 1
                self._cond.notify_all()

    # -- internals (called with self._cond held) ----------------------------------------------

    def _others_waiting(self) -> bool:
        lock = self._store.folder_lock if self._store is not None else self._probe
        return lock is not None and lock.others_waiting()

    def _step_aside_locked(self) -> None:
        """Close the handle once the requests in flight are done."""
        if self._store is None or self._closing:
            return
        self._closing = True
        try:
            while self._users > 0:
                self._cond.wait()
            store, self._store = self._store, None
            if store is not None:
                lock = store.folder_lock
                self._probe = lock.probe() if lock is not None else None
                store.close()
                self.stats.step_asides += 1
                log.info("store released for a waiting process")
        finally:
            self._closing = False
            self._cond.notify_all()

    def _open_locked(self) -> None:
        deadline = time.monotonic() + self._busy_wait_s
        # a process we stepped aside for takes the lock first (it polls for it)
        while self._others_waiting() and time.monotonic() < deadline:
            time.sleep(self._poll_s / 2)
        self._store = self._open_store(max(deadline - time.monotonic(), 0.0))
        self.stats.opens += 1

    def _watch(self) -> None:
        while not self._stop.wait(self._poll_s):
            with self._cond:
                if (
                    self._store is not None
                    and self._users == 0
                    and not self._closing
                    and self._others_waiting()
                ):
                    self._step_aside_locked()

"""One open store per configuration per process, shared by every user in the process."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager

from rag_pipeline.store.base import StoreBusyError, VectorStore

__all__ = ["shared_store", "store_key"]

_lock = threading.Lock()
_open: dict[Hashable, tuple[VectorStore, int]] = {}


def store_key(collection: str, path: str, url: str | None, embedded: str) -> Hashable:
    """What makes two store handles the same one (the CLI and the Dagster resource share it)."""
    return ("store", collection, path, url or None, embedded)


@contextmanager
def shared_store(
    key: Hashable, factory: Callable[[], VectorStore], wait_s: float = 0.0
) -> Iterator[VectorStore]:
    """One open store per configuration per process, reference-counted.

    The embedded store locks its folder and loads its points on open, so every step of every
    run in a process shares one handle; the last user closes it and releases the lock.
    """
    with _lock:
        entry = _open.get(key)
        if entry is None:
            deadline = time.monotonic() + wait_s
            while True:
                try:
                    store = factory()
                    break
                except StoreBusyError:
                    if time.monotonic() >= deadline:
                        raise
                    time.sleep(0.5)
            entry = (store, 0)
        _open[key] = (entry[0], entry[1] + 1)
    try:
        yield entry[0]
    finally:
        with _lock:
            store, refs = _open[key]
            if refs <= 1:
                del _open[key]
                store.close()
            else:
                _open[key] = (store, refs - 1)

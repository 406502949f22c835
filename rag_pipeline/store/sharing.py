"""One open store per configuration per process, shared by every user in the process."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from rag_pipeline.config import StoreConfig
from rag_pipeline.store.base import VectorStore

__all__ = ["shared_store", "store_key"]


@dataclass
class _Slot:
    lock: threading.Lock = field(default_factory=threading.Lock)
    store: VectorStore | None = None
    users: int = 0


_registry_lock = threading.Lock()
_slots: dict[Hashable, _Slot] = {}


def store_key(config: StoreConfig) -> Hashable:
    """What makes two store handles the same one (the CLI and the Dagster resources share it)."""
    return ("store", config.collection, config.path, config.url, config.embedded)


@contextmanager
def shared_store(key: Hashable, factory: Callable[[], VectorStore]) -> Iterator[VectorStore]:
    """One open store per configuration per process, reference-counted.

    An embedded store locks its folder from open to close, and a second handle in the same
    process would wait for the first: every user in the process shares one handle, and the
    last one out closes it, which lets other processes in.
    """
    with _registry_lock:
        slot = _slots.setdefault(key, _Slot())
    with slot.lock:  # opening may wait for another process: only this key waits
        if slot.store is None:
            slot.store = factory()
        slot.users += 1
        store = slot.store
    try:
        yield store
    finally:
        with slot.lock:
            slot.users -= 1
            if slot.users == 0 and slot.store is not None:
                closing, slot.store = slot.store, None
                closing.close()

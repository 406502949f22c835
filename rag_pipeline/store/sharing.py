"""One open store per configuration per process, shared by every user in the process.

An embedded store locks what it opens (a folder, or each book it touched on Qdrant Edge) from
open to close, and opening costs the engine a load of what it reads (a Qdrant Edge shard's
fixed ~0.1 s, more for a big book). So every user in the process shares one handle per
configuration, and the last one out closes it, which lets other processes in.

Within :func:`kept_open` (a run: its steps use the store one after another, with parsing and
embedding in between), a handle whose last user is out stays open for the next one, so a run
loads a book's shard once instead of once per step; it is closed as soon as another process
waits for what it holds (checked every 50 ms by a watcher thread), before this process opens
another handle of the same store (one process never waits for its own lock), and when the
block ends. Handles in use by two threads at once (live mode's workers: one run's builder,
another's plan) hand each other a book's lock between their calls
(:meth:`~rag_pipeline.store.lock.LockGroup.share_in_process`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from rag_pipeline.config import StoreConfig
from rag_pipeline.store.base import VectorStore

__all__ = ["kept_open", "shared_store", "store_key"]

log = logging.getLogger(__name__)

#: how often the watcher looks for other processes waiting for a store kept open
WATCH_S = 0.05


@dataclass
class _Slot:
    lock: threading.Lock = field(default_factory=threading.Lock)
    store: VectorStore | None = None
    users: int = 0
    #: the store config the key was made of (handles of one store are kept one at a time)
    group: Hashable = None


_registry_lock = threading.Lock()
_slots: dict[Hashable, _Slot] = {}
_kept = 0  # how many kept_open blocks are active
#: until when (monotonic s) idle handles are kept even for a waiting process (kept_open's hold_s)
_held_until = 0.0
_watcher: threading.Thread | None = None
_stop = threading.Event()


def store_key(config: StoreConfig) -> Hashable:
    """What makes two store handles the same one (the CLI and the Dagster resources share it)."""
    return ("store", config.collection, config.path, config.url, config.embedded)


@contextmanager
def shared_store(
    key: Hashable, factory: Callable[[], VectorStore], *, group: Hashable = None
) -> Iterator[VectorStore]:
    """One open store per ``key`` per process, reference-counted (see the module's docstring).
    ``group``: the store the handle opens (handles of one group are other views of the same
    folder, e.g. a builder of a recipe: an idle one is closed before another is opened)."""
    with _registry_lock:
        slot = _slots.setdefault(key, _Slot(group=group if group is not None else key))
    if slot.store is None:
        _close_idle(slot.group, but=slot)
    with slot.lock:  # opening may wait for another process: only this key waits
        if slot.store is None:
            slot.store = factory()
            slot.store.share_in_process()  # its locks: handed to the process's other handles
        slot.users += 1
        store = slot.store
    try:
        yield store
    finally:
        with slot.lock:
            slot.users -= 1
            if slot.users == 0 and not _kept:
                _close(slot)


@contextmanager
def kept_open(hold_s: float = 0.0) -> Iterator[None]:
    """Keep idle store handles open for the next user while the block runs (see the module's
    docstring); every idle one is closed when the last such block ends. ``hold_s``: for that
    long from the block's start an idle handle is not let go for a waiting process either
    (live mode's edit: its stages use the store between short computations; letting a
    search in between them cost a hand-over and a load of the book's shard on each side,
    each time; a longer block lets go as before)."""
    global _kept, _watcher, _held_until
    with _registry_lock:
        _kept += 1
        _held_until = max(_held_until, time.monotonic() + hold_s)
        if _watcher is None:
            _stop.clear()
            _watcher = threading.Thread(target=_watch, name="store-keeper", daemon=True)
            _watcher.start()
    try:
        yield
    finally:
        with _registry_lock:
            _kept -= 1
            last = _kept == 0
            watcher = _watcher if last else None
            if last:
                _watcher = None
                _held_until = 0.0
                _stop.set()
        if watcher is not None:
            watcher.join(timeout=5)
            _close_idle(None)


def _close(slot: _Slot) -> None:
    """Close the slot's handle (the caller holds ``slot.lock`` and no user is in)."""
    closing, slot.store = slot.store, None
    if closing is not None:
        closing.close()


def _close_idle(group: Hashable, but: _Slot | None = None) -> None:
    """Close every idle handle (of ``group``, or all with None)."""
    with _registry_lock:
        slots = [s for s in _slots.values() if s is not but and (group is None or s.group == group)]
    for slot in slots:
        with slot.lock:
            if slot.users == 0 and slot.store is not None:
                _close(slot)


def _watch() -> None:
    """Close an idle kept handle as soon as another process waits for what it holds."""
    while not _stop.wait(WATCH_S):
        with _registry_lock:
            slots = [] if time.monotonic() < _held_until else list(_slots.values())
        for slot in slots:
            if slot.store is None or slot.users or not slot.lock.acquire(blocking=False):
                continue
            try:
                lock = slot.store.folder_lock if slot.store is not None else None
                if slot.users == 0 and lock is not None and lock.others_waiting():
                    _close(slot)
                    log.info("store released for a waiting process")
            except Exception:  # a watcher must never break the process it serves
                log.debug("store keeper", exc_info=True)
            finally:
                slot.lock.release()

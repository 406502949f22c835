"""Whole-store changes: the layout lock, every book's lock in name order, and ``ingest
--rebuild``'s collection built beside the one in service and swapped in by two renames."""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from rag_pipeline.store import base
from rag_pipeline.store.edge.files import _fsync_folder
from rag_pipeline.store.lock import FolderLock, LockGroup


def layout_lock(root: Path, collection: str) -> FolderLock:
    """The layout-level lock: create, migrate, set aside (readers do not take it)."""
    return FolderLock(root / f"{collection}.lock", f"the Qdrant Edge store at {root / collection}")


def book_locks(folder: Path) -> list[FolderLock]:
    """The lock of every book that has one (for set aside)."""
    locks = folder / "locks"
    if not locks.is_dir():
        return []
    return [
        FolderLock(p, f"book {p.stem!r} of the Qdrant Edge store at {folder}", base.BookBusyError)
        for p in sorted(locks.glob("*.lock"))
    ]


@contextlib.contextmanager
def whole_store_locked(root: Path, collection: str, busy_wait_s: float) -> Iterator[None]:
    """The layout lock, then every book's in name order (the fixed order of whole-store
    changes: set aside, the swap of a rebuild): no handle reads or writes a book meanwhile.
    The query service steps aside for each lock it holds; a reader never waits holding one."""
    held = LockGroup()
    try:
        for lock in [layout_lock(root, collection), *book_locks(root / collection)]:
            lock.acquire(busy_wait_s)
            held.add(lock)
        yield
    finally:
        held.release()


def rebuild_root(root: Path, collection: str) -> Path:
    """Where ``ingest --rebuild`` builds a new collection beside the one in service (a store
    root of its own); it is swapped in only once complete (:func:`swap_in_rebuilt`)."""
    return root / f".rebuild-{collection}"


def rebuild_lock(root: Path, collection: str) -> FolderLock:
    """Held by a rebuild from its start to its swap: one rebuild at a time."""
    return FolderLock(
        root / f".rebuild-{collection}.lock", f"the rebuild of the Qdrant Edge store at {root}"
    )


_REBUILT = "rebuilt"  # in a rebuild root: its build is complete, to be swapped in


def swap_in_rebuilt(root: Path, collection: str, busy_wait_s: float) -> str:
    """The complete collection built in :func:`rebuild_root` put in service: the one in
    service is set aside (renamed, kept for inspection), the new one renamed in its place,
    under :func:`whole_store_locked`. Searches answer from the old collection until the
    rename and from the new one after it: never from a partial one. A kill between the two
    renames is finished by the next opener (:func:`_settle_old_layout`)."""
    staged = rebuild_root(root, collection)
    folder = root / collection
    with whole_store_locked(root, collection, busy_wait_s):
        (staged / _REBUILT).touch()
        _fsync_folder(staged)
        moved = ""
        if folder.exists():
            aside = folder.with_name(f"{collection}.set-aside-{time.strftime('%Y%m%d-%H%M%S')}")
            folder.rename(aside)
            moved = f"; the collection it replaced was moved to {aside}"
        _finish_rebuild(root, collection)
    return f"the rebuilt collection is in service at {folder}{moved}"


def clear_rebuild_root(root: Path, collection: str, busy_wait_s: float) -> Path:
    """An empty :func:`rebuild_root` for a new rebuild (the caller holds
    :func:`rebuild_lock`): a swap killed between its renames is finished first, what a killed
    rebuild left unfinished is removed. Returns the rebuild root."""
    lock = layout_lock(root, collection)
    lock.acquire(busy_wait_s)
    try:
        _finish_rebuild(root, collection)
    finally:
        lock.release()
    staged = rebuild_root(root, collection)
    shutil.rmtree(staged, ignore_errors=True)
    return staged


def _finish_rebuild(root: Path, collection: str) -> None:
    """The second rename of a rebuild's swap (the caller holds the layout lock)."""
    staged = rebuild_root(root, collection)
    folder = root / collection
    if folder.exists() or not (staged / _REBUILT).exists():
        return
    (staged / collection).rename(folder)
    _fsync_folder(root)
    shutil.rmtree(staged, ignore_errors=True)

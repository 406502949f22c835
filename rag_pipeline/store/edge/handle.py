"""A handle's view of one book, and what the handle's parts (the catalog and the generations
of :mod:`.catalog` and :mod:`.generations`) need of the handle (:class:`Handle`)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import qdrant_edge as qe

from rag_pipeline.store.edge.files import _Layout, _Pointer
from rag_pipeline.store.lock import FolderLock

__all__ = ["Handle", "RoutedBook"]


@dataclass
class RoutedBook:
    """One book as this handle routes it (decided once, under the book's lock)."""

    folder: Path
    generation: str | None  # the generation folder read and written (None: none yet)
    pending: bool  # that generation is (or will be) the pending one
    shard: qe.EdgeShard | None = None
    #: the summary is dropped before this handle's first write since it was (re)saved
    summary_dropped: bool = False
    #: a summary saved by this handle, written with its fingerprint once the shard is closed
    summary: dict[str, Any] | None = None
    written: bool = False
    dirty: bool = False  # written since the last flush
    unoptimized: int = 0  # points written since the shard was last optimized
    emptied: bool = False  # written and left without points when its shard was last closed
    #: the points the shard held when :attr:`summary` was saved (what its file promises)
    summary_points: int = 0


class Handle(Protocol):
    """The parts of :class:`~rag_pipeline.store.edge.store.EdgeStore` its mixins use."""

    folder: Path
    books_folder: Path
    _lock: threading.RLock
    _books: dict[str, RoutedBook]
    _recipe: dict[str, str] | None
    _layout: _Layout | None
    _layout_lock: FolderLock
    _busy_wait_s: float

    def _route(self, book: str) -> RoutedBook: ...

    def _absent(self, book: str) -> bool: ...

    def _hold(self, book: str) -> None: ...

    def _forget(self, book: str) -> None: ...

    def _reader(self, book: str) -> qe.EdgeShard | None: ...

    def _call(self, what: str, fn: Any, *args: Any) -> Any: ...

    def _builds_beside(self, current: _Pointer) -> bool: ...

    def _write_summary(self, state: RoutedBook) -> None: ...

    def summary(self, tenant: str) -> dict[str, Any] | None: ...

    def _pointers(self, tenant: str) -> tuple[Path, _Pointer | None, _Pointer | None]: ...

    def _follow_dimension(self, dim: Any) -> None: ...

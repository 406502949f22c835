"""The store on Qdrant Edge (``qdrant-edge-py``): Qdrant's own engine embedded in the process,
one Edge shard per book.

Unlike qdrant-client's local mode it uses the payload indexes, so a book-filtered query stays in
the low milliseconds at 100k points. Opening an Edge shard costs time and memory in proportion
to its points, so each book is its own shard (issue 17): a step opens only the books it
touches. Segments are searched as written (plain index + payload indexes); the HNSW build
(``optimize``) is left out on purpose: it takes minutes at 100k points on two cores and
filtered search is already fast without it.

Layout of ``<path>/<collection>/`` (the *layout root*)::

    layout.json                     {"layout": "book-shards", "version": 1, "dense_dim": N,
                                     "payload_indexes": {field: kind}}
    locks/<book>.lock (+ .wait)     the book's FolderLock
    books/<book>/current.json       {"generation": <folder>, "recipe": {...}|null, "dense_dim": N}
    books/<book>/pending.json       (while a new recipe is built beside) the same shape
    books/<book>/summary.json       the pipeline's catalog entry (see :meth:`save_summary`)
                                    with the fingerprint of the generation it describes
    books/<book>/<generation>/      one EdgeShard folder

``<path>/<collection>.lock`` is the layout lock, held briefly (create, migrate, set aside).
A handle takes a book's lock the first time it touches the book (lazily), under the lock
discipline of :class:`~rag_pipeline.store.lock.LockGroup`: a book it wrote is kept until it
closes; of the books it only read it keeps at most ``loaded_books`` (the least recently used is
let go), and none while it waits for another book's lock. So readers and writers of a book
take turns, runs of different books do not wait for each other, and a handle's descriptors
are bounded whatever the collection's size.
Whole-collection looks (tenants, dimension, indexes) read files and open no shard.

A handle on which :meth:`EdgeStore.ensure_collection` was called with a recipe tag is a
*builder*: a book whose current generation carries another recipe signature is read and
written in a pending generation beside it, until :meth:`EdgeStore.switch` makes it current.
Every other handle reads the current generation.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import threading
import time
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import qdrant_edge as qe

from rag_pipeline.store import base, native
from rag_pipeline.store.errors import resource_limit
from rag_pipeline.store.filters import TenantFilter
from rag_pipeline.store.lock import FolderLock, LockGroup, allow_open_files

__all__ = ["EDGE", "LAYOUT_FILE", "EdgeStore"]

log = logging.getLogger(__name__)

EDGE = native.Dialect(
    models=qe,
    range=qe.RangeFloat,
    has_id=lambda ids: qe.HasIdCondition(point_ids=set(ids)),
    point=qe.Point,
)
LAYOUT_FILE = "layout.json"
LAYOUT_NAME = "book-shards"
LAYOUT_VERSION = 1
_CONFIG_FILE = "edge_config.json"  # an Edge shard's own config: its presence marks a shard
_CURRENT = "current.json"
_PENDING = "pending.json"
_SUMMARY = "summary.json"
#: files of an Edge shard that a read-only load, search, count, scroll or facet rewrites (their
#: times, and edge_config.json's size at the first load; tracker_journal.dat is deleted), as
#: measured on qdrant-edge-py 0.9: left out of a generation's fingerprint. Every other file
#: (vectors, payload pages, sparse store, id tracker, WAL) is written only by writes.
_REWRITTEN_BY_READS = frozenset(
    {
        _CONFIG_FILE,
        "segment.json",
        "tracker.dat",
        "tracker_journal.dat",
        "flags_a.dat",
        "flags_b.dat",
    }
)
#: a summary is written again after this pause (a few times at most) while its file's time is
#: not past the newest file it vouches for: a change in the same clock tick would go unseen
_RACY_PAUSE_S = 0.01
_RACY_TRIES = 3
#: a summary checked (fingerprint and all) is taken again unchecked, by any handle of the
#: process, for this long while its file and the book's generation are the same ones: a plan
#: asks for it three times per book (recipe, files, index), and a CLI ingest's collection
#: look after its runs once more. The pipeline's own writers drop or replace the file, which
#: ends the trust at once; only damage by other hands waits this long to be noticed.
_RECHECK_AFTER_S = 60.0
#: a generation pointer as read: (its folder name, the whole pointer)
_Pointer = tuple[str, dict[str, Any]]
#: (book folder, inode, mtime and size of current.json, then of summary.json) -> (until when,
#: the pointer, the summary's data), for the process
_Seen = tuple[str, int, int, int, int, int, int]
_checked: dict[_Seen, tuple[float, _Pointer, dict[str, Any]]] = {}
_checked_lock = threading.Lock()
_CHECKED_MAX = 100_000
_TRASH = ".trash-"  # a folder being removed: a dot-name is never a book nor a generation
#: a generation folder's name (see _create_shard)
_GENERATION = re.compile(r"g\d{14}-[0-9a-f]{6}")
_REBUILD = "rag-pipeline ingest --rebuild"
#: what a book folder may be named: the pipeline's book ids (a dot-free start, no '..')
_FOLDER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_MIGRATE_PAGE = 512
#: points one engine update carries (a book of a million points is written in batches)
_UPSERT_BATCH = 2_048
#: book shards a handle keeps loaded at once by default, and locks of books it only read
#: (least recently used closed and let go first). A small book's loaded shard holds ~27 MB
#: of its files' pages (its write-ahead log, payload and vector pages) and ~1 MB of memory,
#: so a handle that walks every book (a plan, the collection look) must not keep them all;
#: the query service keeps more (``loaded_books``).
MAX_OPEN_SHARDS = 2


@dataclass
class _Book:
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


@dataclass
class _Layout:
    dense_dim: int | None
    payload_indexes: dict[str, str] = field(default_factory=dict)


class EdgeStore(base.VectorStore):
    """A collection as one Qdrant Edge shard per book under ``<path>/<collection>``."""

    keeps_summaries = True
    keeps_generations = True

    def __init__(
        self,
        collection: str,
        path: str | Path,
        schema: base.CollectionSchema,
        *,
        busy_wait_s: float = 0.0,
        loaded_books: int = MAX_OPEN_SHARDS,
    ) -> None:
        self.collection = collection
        self._loaded_books = max(loaded_books, 1)
        self.schema = schema
        self.root = Path(path)
        self.folder = self.root / collection
        self.books_folder = self.folder / "books"
        self.description = f"Qdrant Edge folder {self.folder}"
        self._busy_wait_s = busy_wait_s
        self._lock = threading.RLock()
        #: the book locks held, at most ``loaded_books`` of books not written (see LockGroup)
        self._locks = LockGroup(cap=self._loaded_books, may_let_go=self._may_let_go)
        allow_open_files()
        self._books: dict[str, _Book] = {}
        self._open: OrderedDict[str, None] = OrderedDict()  # books with a loaded shard, LRU first
        #: book -> (summary file and generation seen, until when, its data): see summary()
        #: the recipe tag of a builder handle (see the module's docstring)
        self._recipe: dict[str, str] | None = None
        self._dense_dim: int | None = None
        self._layout_lock = layout_lock(self.root, collection)
        self._layout_lock.prepare()  # an unusable folder is a setting to fix, said at open
        _settle_old_layout(self, busy_wait_s)
        self._layout = self._read_or_recover_layout()

    def _read_or_recover_layout(self) -> _Layout | None:
        """layout.json, or, when it is lost or unreadable while book shards are there, the
        layout rebuilt from them (their pointers' dimension, the schema's indexes): a cache
        of what the shards say, never read as "nothing indexed"."""
        try:
            layout = _read_layout(self.folder)
        except base.StoreDamagedError as exc:
            problem = str(exc)
        else:
            if layout is not None or not _listed_books(self.books_folder):
                return layout
            problem = f"{self.folder / LAYOUT_FILE} is missing"
        self._layout_lock.acquire(self._busy_wait_s)
        try:
            with contextlib.suppress(base.StoreDamagedError):
                layout = _read_layout(self.folder)  # another process may have rebuilt it
                if layout is not None:
                    return layout
            dims: Counter[int] = Counter()
            for book in _listed_books(self.books_folder):
                with contextlib.suppress(base.StoreDamagedError):
                    pointer = _read_pointer(self.books_folder / book / _CURRENT)
                    dim = None if pointer is None else pointer[1].get("dense_dim")
                    if isinstance(dim, int):
                        dims[dim] += 1
            if not dims:
                raise base.StoreDamagedError(
                    f"{problem}, and no book shard says its dimension: the store is damaged. "
                    f"Rebuild it from the books with `{_REBUILD}`."
                )
            layout = _Layout(dims.most_common(1)[0][0], _index_kinds(self.schema))
            _write_layout(self.folder, layout)
            log.warning("%s; rebuilt from the %d book shards", problem, sum(dims.values()))
            return layout
        finally:
            self._layout_lock.release()

    # -- locks and routing ----------------------------------------------------------------

    @property
    def folder_lock(self) -> LockGroup:
        return self._locks

    def _book_lock(self, book: str) -> FolderLock:
        return FolderLock(
            self.folder / "locks" / f"{book}.lock",
            f"book {book!r} of the Qdrant Edge store at {self.folder}",
            base.BookBusyError,
        )

    def _hold(self, book: str) -> None:
        """Hold the book's lock, under the discipline of :class:`LockGroup` (which may let
        go of other books this handle only read)."""
        while True:
            lock = self._locks.take(self._book_lock(book), self._busy_wait_s)
            if lock.still_named():
                return
            self._locks.drop(lock)  # the store was set aside while we waited: lock the new one
            self._forget(book)

    def _may_let_go(self, lock: FolderLock) -> bool:
        """Drop what this handle keeps of the lock's book, unless it wrote the book (kept
        until close: see :class:`LockGroup`)."""
        book = lock.path.name.removesuffix(".lock")
        state = self._books.get(book)
        if state is not None and state.written:
            return False
        self._forget(book)
        return True

    def _route(self, book: str) -> _Book:
        """Where this handle reads and writes ``book`` (taking its lock the first time)."""
        state = self._books.get(book)
        if state is not None:
            self._locks.take(self._book_lock(book), self._busy_wait_s)  # held: the latest used
            return state
        _check_book_name(book)
        self._hold(book)
        folder = self.books_folder / book
        current = _read_pointer(folder / _CURRENT)
        pending = _read_pointer(folder / _PENDING)
        if pending is not None and current is not None and pending[0] == current[0]:
            pending = None  # a switch died after replacing current.json: done already
        if current is None:
            _check_not_orphaned(folder)
        state = _Book(folder, current[0] if current else None, pending=False)
        if self._recipe is not None and current is not None and self._builds_beside(current):
            ours = (
                pending is not None
                and _signature(pending[1]) == self._recipe[base.RECIPE_SIGNATURE]
            )
            state = _Book(folder, pending[0] if ours and pending else None, pending=True)
        self._books[book] = state
        return state

    def _builds_beside(self, current: tuple[str, dict[str, Any]]) -> bool:
        """Whether the builder's recipe needs a new generation beside ``current``."""
        assert self._recipe is not None
        signature = _signature(current[1])
        if signature is None:  # built before recipes were tagged: adopted in place
            dim = current[1].get("dense_dim")
            return dim is not None and self._dense_dim is not None and dim != self._dense_dim
        return signature != self._recipe[base.RECIPE_SIGNATURE]

    def _reader(self, book: str) -> qe.EdgeShard | None:
        """The shard this handle reads for ``book`` (None: the book holds nothing), checked
        against what its summary promises when loaded (:meth:`_verify`)."""
        state = self._route(book)
        if state.shard is None and state.generation is not None:
            check_space(state.folder, LOAD_SPACE_BYTES, f"loading book {book!r}")
            shard = _load(state.folder / state.generation, self.description)
            try:
                self._verify(book, state, shard)
            except BaseException:
                _close_shard(shard, flush=False)
                raise
            state.shard = shard
        if state.shard is not None:
            self._opened(book)
        return state.shard

    def _verify(self, book: str, state: _Book, shard: qe.EdgeShard) -> None:
        """A loaded shard holds only the book's points, and (for the current generation,
        when its summary file is there: no write since it was saved) exactly as many as that
        summary promises; else :class:`~rag_pipeline.store.errors.BookDamagedError`. An
        emptied or truncated segment loads as a smaller shard without any engine error:
        this is what keeps it from being answered as "nothing found"."""
        total = int(self._call("count", shard.count, qe.CountRequest()))
        if total:
            own = int(
                self._call(
                    "count", shard.count, qe.CountRequest(filter=self._filter(TenantFilter(book)))
                )
            )
            if own != total:
                raise base.BookDamagedError(
                    book,
                    f"its shard {state.folder / str(state.generation)} holds {total - own} "
                    "points of another book (a book folder copied under another name?)",
                )
        if state.pending or state.generation is None:
            return
        promised = _promised_points(state.folder, state.generation)
        if promised is not None and promised != total:
            raise base.BookDamagedError(
                book,
                f"its shard {state.folder / state.generation} holds {total} points where its "
                f"summary promises {promised} (its files were changed or lost)",
            )

    def _opened(self, book: str) -> None:
        """Mark ``book``'s shard as the latest used; close the least recently used past the
        handle's ``loaded_books``."""
        self._open[book] = None
        self._open.move_to_end(book)
        while len(self._open) > self._loaded_books:
            self._unload(next(iter(self._open)))

    def _unload(self, book: str) -> None:
        self._open.pop(book, None)
        state = self._books.get(book)
        if state is None or state.shard is None:
            return
        settled = state.unoptimized > 0  # grown: indexes for its size, segments optimized
        if settled:
            self._settle(state)
        shard, state.shard = state.shard, None
        state.emptied = state.written and not state.pending and _is_empty(shard)
        _close_shard(shard, flush=state.dirty or settled)
        state.dirty = False
        if state.summary is not None:  # flushed and closed: what the fingerprint must see
            self._write_summary(state)

    def _settle(self, state: _Book) -> None:
        """After writes to a book: :func:`_settle_shard`."""
        assert state.shard is not None
        if self._layout is not None:
            self._call("optimize", _settle_shard, state.shard, self.schema, self._layout)
        state.unoptimized = 0

    def _writer(self, book: str) -> qe.EdgeShard:
        """The shard this handle writes for ``book``, created on the first write."""
        if self._layout is None:
            raise base.StoreError(f"collection {self.collection!r} does not exist yet")
        _check_book_name(book, writing=True)
        state = self._route(book)
        if not state.pending and not state.summary_dropped:
            # before the first write: a kill from here on leaves no summary to trust
            _unlink(state.folder / _SUMMARY)
            state.summary_dropped = True
        state.summary = None  # one saved before this write no longer describes the book
        if not state.written:
            _sweep_unnamed_generations(state.folder)
        if state.generation is None:
            self._create_generation(book, state)
        elif not state.written:
            if not state.pending:
                self._stamp_recipe(state)
            shard = self._reader(book)
            if shard is not None:
                self._add_missing_indexes(shard)
        state.written = state.dirty = True
        shard = self._reader(book)
        assert shard is not None
        return shard

    def _add_missing_indexes(self, shard: qe.EdgeShard) -> None:
        """The payload indexes a book's shard should have at its size and lacks, added before
        a handle's first write (an index the schema gained since the shard was made) and after
        its writes (a book that grew): see :func:`_add_indexes`."""
        if self._layout is not None:
            self._call("index creation", _add_indexes, shard, self.schema, self._layout)

    def _create_generation(self, book: str, state: _Book) -> None:
        assert self._layout is not None
        dim = self._dense_dim or self._layout.dense_dim
        if dim is None:
            raise base.StoreError(f"collection {self.collection!r} has no dense dimension yet")
        if state.pending:  # another recipe's unfinished build is abandoned for ours
            stale = _read_pointer(state.folder / _PENDING)
            if stale is not None:
                _unlink(state.folder / _PENDING)
                _remove_folder(state.folder / stale[0])
        name, shard = _create_shard(state.folder, dim, self.schema, self._layout)
        pointer = {"generation": name, "recipe": self._recipe, "dense_dim": dim, "book": book}
        _write_json(state.folder / (_PENDING if state.pending else _CURRENT), pointer)
        state.generation, state.shard, state.written = name, shard, True
        self._opened(book)

    def _stamp_recipe(self, state: _Book) -> None:
        """A builder's first write to a current generation without a recipe tag adopts it."""
        current = _read_pointer(state.folder / _CURRENT)
        if self._recipe is not None and current is not None and _signature(current[1]) is None:
            _write_json(state.folder / _CURRENT, {**current[1], "recipe": self._recipe})

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        """Run an engine call; an engine failure names the store and how to rebuild it."""
        with self._lock:
            try:
                return fn(*args)
            except (base.StoreError, ValueError, TypeError):
                raise
            except Exception as exc:
                limit = resource_limit(exc)
                if limit is not None:
                    raise base.StoreResourceError(
                        f"{self.description}: {what} failed: {limit} ({exc})"
                    ) from exc
                raise base.StoreError(
                    f"{self.description}: {what} failed: {exc}. If the store's files were "
                    f"damaged, rebuild it from the books with `{_REBUILD}`."
                ) from exc

    # -- collection -------------------------------------------------------------------------

    def collection_exists(self) -> bool:
        return self._layout is not None

    def dense_dimension(self) -> int | None:
        return None if self._layout is None else self._layout.dense_dim

    def payload_indexes(self) -> dict[str, str]:
        return {} if self._layout is None else dict(self._layout.payload_indexes)

    def ensure_collection(self, spec: base.CollectionSpec) -> None:
        with self._lock:
            if spec.recipe is not None:  # a new recipe may change the dimension: its books
                self._recipe = dict(spec.recipe)  # are built beside
                for book in [b for b, s in self._books.items() if not s.written]:
                    self._forget(book)  # routed before this handle became a builder
            elif self._recipe is None:  # a builder checks per generation (dimension_of)
                self._check_dimension(self.dense_dimension(), spec)
            self._dense_dim = spec.dense_dim
            wanted = _index_kinds(self.schema)
            if self._layout is not None and wanted.items() <= self._layout.payload_indexes.items():
                return
            self._layout_lock.acquire(self._busy_wait_s)
            try:
                layout = _read_layout(self.folder)
                dim = spec.dense_dim if layout is None else layout.dense_dim
                indexes = {**(layout.payload_indexes if layout else {}), **wanted}
                _write_layout(self.folder, _Layout(dim, indexes))
                self._layout = _Layout(dim, indexes)
            finally:
                self._layout_lock.release()

    def dimension_of(self, tenant: str) -> int | None:
        with self._lock:
            state = self._route(tenant)
            if state.generation is None:
                return None
            pointer = _read_pointer(state.folder / (_PENDING if state.pending else _CURRENT))
            if pointer is None or pointer[0] != state.generation:
                return self.dense_dimension()
            dim = pointer[1].get("dense_dim")
            return dim if isinstance(dim, int) else self.dense_dimension()

    def _forget(self, book: str) -> None:
        """Drop the routing of a book (its lock is the caller's or the LockGroup's to let go)."""
        self._unload(book)
        self._books.pop(book, None)

    def tenants(self) -> list[str]:
        """Books with a current generation, read from the folder listing (no shard opened);
        a book this handle emptied is left out."""
        out = []
        for book in _listed_books(self.books_folder):
            state = self._books.get(book)
            emptied_here = state is not None and state.written and not state.pending
            if emptied_here and self.count(TenantFilter(book)) == 0:
                continue
            out.append(book)
        return out

    # -- summaries, generations, purge -------------------------------------------------------

    def summaries(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for book in _listed_books(self.books_folder):
            data = self.summary(book)
            if data is not None:
                out[book] = data
        return out

    def summary(self, tenant: str) -> dict[str, Any] | None:
        """The book's saved summary while it still describes the generation this handle
        reads: same generation, and that folder's fingerprint unchanged (no shard opened).
        None when absent, stale, damaged, or when this handle builds the book beside."""
        if not _readable(tenant):
            return None
        state = self._books.get(tenant)
        if state is not None and state.summary is not None:
            return dict(state.summary)  # saved by this handle, no write since
        if state is not None and (state.summary_dropped or state.pending):
            return None
        folder = f"{self.books_folder}{os.sep}{tenant}"  # (str: a plan asks per book, 4 times)
        try:  # both files are replaced, never rewritten in place: a new inode at every change
            pointer_st = os.stat(f"{folder}{os.sep}{_CURRENT}")
            summary_st = os.stat(f"{folder}{os.sep}{_SUMMARY}")
        except OSError:
            return None
        seen = (
            folder,
            pointer_st.st_ino,
            pointer_st.st_mtime_ns,
            pointer_st.st_size,
            summary_st.st_ino,
            summary_st.st_mtime_ns,
            summary_st.st_size,
        )
        with _checked_lock:
            checked = _checked.get(seen)
        if checked is not None and time.monotonic() < checked[0]:
            current, data = checked[1], checked[2]  # the same files, checked a moment ago
        else:
            try:
                pointer = _read_pointer(Path(folder) / _CURRENT)
            except base.StoreDamagedError:
                return None  # the full read says so
            read = None if pointer is None else _read_summary(Path(folder), pointer[0])
            if pointer is None or read is None:
                return None
            current, data = pointer, read
            with _checked_lock:
                if len(_checked) > _CHECKED_MAX:  # a long-lived process: forget the oldest
                    for key in list(_checked)[: len(_checked) // 2]:
                        del _checked[key]
                _checked[seen] = (time.monotonic() + _RECHECK_AFTER_S, current, data)
        if self._recipe is not None and self._builds_beside(current):
            return None
        return dict(data)

    def save_summary(self, tenant: str, data: Mapping[str, Any]) -> None:
        """Kept in memory until the book's shard is flushed and closed (unload or close),
        then written with the fingerprint of its generation's files."""
        with self._lock:
            state = self._route(tenant)
            if state.pending or state.generation is None:
                return  # a summary describes the current generation only
            shard = self._reader(tenant)
            if shard is None:
                return
            state.summary_points = int(self._call("count", shard.count, qe.CountRequest()))
            state.summary = dict(data)
            state.summary_dropped = False  # the next write drops it again

    def _write_summary(self, state: _Book) -> None:
        data, state.summary = state.summary, None
        if data is None or state.generation is None or not state.folder.is_dir():
            return
        try:
            _write_summary(state.folder, state.generation, data, state.summary_points)
        except OSError as exc:  # no summary is safe (the book is read): never fail a close
            log.warning("summary of book %s not saved: %s", state.folder.name, exc)

    def current_recipe(self, tenant: str) -> dict[str, str] | None:
        if not _readable(tenant):
            return None
        current = _read_pointer(self.books_folder / tenant / _CURRENT)
        recipe = None if current is None else current[1].get("recipe")
        return dict(recipe) if isinstance(recipe, dict) else None

    def searched_recipe(self, tenant: str) -> dict[str, str] | None:
        """The tag of the generation this handle routed ``tenant`` to (routing takes the
        book's lock, so no switch can come between this answer and the handle's reads)."""
        with self._lock:
            if not _readable(tenant):
                return None
            state = self._route(tenant)
            if state.generation is None:
                return None
            pointer = _read_pointer(state.folder / (_PENDING if state.pending else _CURRENT))
            recipe = None if pointer is None else pointer[1].get("recipe")
            return dict(recipe) if isinstance(recipe, dict) else None

    def adopt_recipe(self, tenant: str, recipe: Mapping[str, str]) -> bool:
        with self._lock:
            _check_book_name(tenant)
            state = self._route(tenant)
            current = _read_pointer(state.folder / _CURRENT)
            if current is None or _signature(current[1]) is not None:
                return False
            _write_json(state.folder / _CURRENT, {**current[1], "recipe": dict(recipe)})
            self._forget(tenant)  # a builder routes it again, now against the tag
            return True

    def pending_recipe(self, tenant: str) -> dict[str, str] | None:
        if not _readable(tenant):
            return None
        folder = self.books_folder / tenant
        pending, current = _read_pointer(folder / _PENDING), _read_pointer(folder / _CURRENT)
        if pending is None or (current is not None and current[0] == pending[0]):
            return None
        recipe = pending[1].get("recipe")
        return dict(recipe) if isinstance(recipe, dict) else None

    def _pointers(self, tenant: str) -> tuple[Path, _Pointer | None, _Pointer | None]:
        """The book's folder and its pending and current pointers, read under the book's
        lock with the handle's routing of it dropped; a pending pointer naming the current
        generation (a switch killed after its replace) is no pending build: None."""
        _check_book_name(tenant)
        self._hold(tenant)
        self._forget(tenant)
        folder = self.books_folder / tenant
        pending, current = _read_pointer(folder / _PENDING), _read_pointer(folder / _CURRENT)
        if pending is not None and current is not None and current[0] == pending[0]:
            pending = None
        return folder, pending, current

    def drop_pending(self, tenant: str) -> bool:
        with self._lock:
            folder, pending, _ = self._pointers(tenant)
            _unlink(folder / _PENDING)  # first: a kill from here on leaves no pending named
            if pending is None:
                return False
            _remove_folder(folder / pending[0])
            log.info("book %s: the pending generation %s was dropped", tenant, pending[0])
            return True

    def switch(self, tenant: str, *, keep_old: bool = False) -> bool:
        with self._lock:
            folder, pending, current = self._pointers(tenant)
            if pending is None:
                _unlink(folder / _PENDING)
                return False
            _unlink(folder / _SUMMARY)  # it described the old generation
            _write_json(folder / _CURRENT, pending[1])  # the switch: one atomic replace
            _unlink(folder / _PENDING)
            self._follow_dimension(pending[1].get("dense_dim"))
            if current is not None:
                old = folder / current[0]
                if keep_old:
                    old.rename(folder / f"old-{current[0]}")
                else:
                    _remove_folder(old)
            log.info("book %s now searches generation %s", tenant, pending[0])
            return True

    def _follow_dimension(self, dim: Any) -> None:
        """layout.json's dimension follows the generations switched in (a new model's)."""
        if not isinstance(dim, int) or self._layout is None or dim == self._layout.dense_dim:
            return
        self._layout_lock.acquire(self._busy_wait_s)
        try:
            layout = _read_layout(self.folder) or self._layout
            self._layout = _Layout(dim, layout.payload_indexes)
            _write_layout(self.folder, self._layout)
        finally:
            self._layout_lock.release()

    def purge(self, where: TenantFilter) -> int:
        """The book's folder removed under its lock (every generation, its summary)."""
        if where.conditions:
            raise ValueError("a purge takes a whole tenant: no further conditions")
        with self._lock:
            if not _FOLDER_NAME.fullmatch(where.tenant) or ".." in where.tenant:
                return 0
            try:
                points = self.count(where)
            except base.BookDamagedError:
                points = 0  # what is left of it is removed all the same
            self._hold(where.tenant)
            self._forget(where.tenant)
            _remove_folder(self.books_folder / where.tenant)
            return points

    def verify(self, tenant: str) -> None:
        """The book's searched generation loaded and checked (:meth:`_verify`), unless its
        summary vouches for its files as they are (then no shard is loaded: a load by a
        later step is checked all the same)."""
        with self._lock:
            if _readable(tenant) and self.summary(tenant) is None:
                self._reader(tenant)

    def discard_damaged(self, tenant: str) -> None:
        """The book's folder removed under its lock without loading it (see
        :meth:`VectorStore.discard_damaged`)."""
        with self._lock:
            _check_book_name(tenant)
            self._hold(tenant)
            state = self._books.pop(tenant, None)
            self._open.pop(tenant, None)
            if state is not None and state.shard is not None:
                _close_shard(state.shard, flush=False)
            log.warning("book %s: its damaged index is removed to be rebuilt", tenant)
            _remove_folder(self.books_folder / tenant)

    # -- primitives -------------------------------------------------------------------------

    def _filter(self, where: TenantFilter) -> Any:
        # the book's shard holds only its points; the tenant condition stays as a second guard
        return native.native_filter(EDGE, self.schema.tenant_field, where)

    def _upsert(self, points: Sequence[base.PointRecord]) -> None:
        by_book: dict[str, list[base.PointRecord]] = defaultdict(list)
        for point in points:
            tenant = point.payload.get(self.schema.tenant_field)
            if not isinstance(tenant, str) or not tenant:
                raise ValueError(
                    f"point {point.id} has no {self.schema.tenant_field!r}: every point belongs "
                    "to a book"
                )
            by_book[tenant].append(point)
        with self._lock:
            for book, group in by_book.items():
                for start in range(0, len(group), _UPSERT_BATCH):
                    batch = group[start : start + _UPSERT_BATCH]
                    dim = self._dense_dim or (self._layout.dense_dim if self._layout else 0)
                    check_space(
                        self.books_folder / book,
                        SPACE_MARGIN_BYTES + _write_bytes(len(batch), dim or 0),
                        f"{len(batch)} points of book {book!r}",
                    )
                    operation = qe.UpdateOperation.upsert_points(
                        [native.native_point(EDGE, p) for p in batch]
                    )
                    self._call("upsert", self._writer(book).update, operation)
                    state = self._books[book]
                    state.unoptimized += len(batch)
                    if state.unoptimized >= OPTIMIZE_EVERY_POINTS:
                        self._settle(state)

    def _flush(self) -> None:
        """Nothing between writes: a book's shard is flushed when the handle unloads or closes
        it (it is locked to this handle until then). Each write is in the shard's write-ahead
        log first, and the log is replayed in order at the next load: a process killed
        between two writes leaves the first ones, never the second without the first, which
        is what the pipeline's write order relies on (test_crash). A flush per write call
        cost three fsyncs per book run."""

    def _delete(self, where: TenantFilter) -> None:
        with self._lock:
            if self._reader(where.tenant) is None:
                return
            operation = qe.UpdateOperation.delete_points_by_filter(self._filter(where))
            self._call("delete", self._writer(where.tenant).update, operation)

    def _count(self, where: TenantFilter) -> int:
        with self._lock:
            shard = self._reader(where.tenant) if _readable(where.tenant) else None
            if shard is None:
                return 0
            return int(
                self._call("count", shard.count, qe.CountRequest(filter=self._filter(where)))
            )

    def _scroll_page(self, page: base.ScrollPage) -> tuple[list[base.StoredRecord], Any]:
        with self._lock:
            shard = self._reader(page.where.tenant) if _readable(page.where.tenant) else None
            if shard is None:
                return [], None
            request = qe.ScrollRequest(
                filter=self._filter(page.where),
                limit=page.limit,
                offset=page.offset,
                with_payload=native.payload_selector(page.fields),
                with_vector=native.vector_selector(page.with_vectors),
            )
            records, next_offset = self._call("scroll", shard.scroll, request)
            return [native.to_record(r) for r in records], next_offset

    def _query_batch(self, queries: Sequence[base.NearestQuery]) -> list[list[base.ScoredRecord]]:
        """One engine call per book the batch asks about, answers in the batch's order."""
        out: list[list[base.ScoredRecord]] = [[] for _ in queries]
        by_book: dict[str, list[int]] = defaultdict(list)
        for i, q in enumerate(queries):
            by_book[q.where.tenant].append(i)
        with self._lock:
            for book, positions in by_book.items():
                shard = self._reader(book) if _readable(book) else None
                if shard is None:
                    continue
                request = qe.QueryBatchRequest([self._request(queries[i]) for i in positions])
                found = self._call("query", shard.query_batch, request)
                for i, points in zip(positions, found, strict=True):
                    out[i] = [native.to_scored(p) for p in points]
        return out

    def _request(self, q: base.NearestQuery) -> qe.QueryRequest:
        flt = self._filter(q.where)
        nearest = [
            qe.Query.Nearest(native.native_vector(EDGE, v), using=name) for v, name in q.nearest
        ]
        shape: dict[str, Any] = {"query": nearest[0], "params": _search_params(q.limit)}
        if q.fusion is not None:
            shape = {
                "query": qe.Fusion.Dbsf()
                if q.fusion.method == "dbsf"
                else qe.Fusion.Rrf(k=q.fusion.rrf_k),
                "prefetches": [
                    qe.Prefetch(
                        query=n,
                        filter=flt,
                        limit=q.prefetch_limit,
                        params=_search_params(q.prefetch_limit),
                    )
                    for n in nearest
                ],
            }
        return qe.QueryRequest(
            limit=q.limit,
            filter=flt,
            score_threshold=q.score_threshold,
            with_payload=native.payload_selector(q.with_payload),
            with_vector=False,
            **shape,
        )

    def _facet(self, key: str, where: TenantFilter | None) -> list[tuple[str, int]]:
        if where is None:  # the whole collection: every book opened (tenants() opens none)
            totals: dict[str, int] = defaultdict(int)
            for book in _listed_books(self.books_folder):
                for value, count in self._facet(key, TenantFilter(book)):
                    totals[value] += count
            return sorted(totals.items())
        with self._lock:
            shard = self._reader(where.tenant) if _readable(where.tenant) else None
            if shard is None:
                return []
            if key not in self._call("info", shard.info).payload_schema:
                return self._facet_by_reading(key, where)  # a small book: not indexed
            request = qe.FacetRequest(
                key=key, limit=1_000_000, exact=True, filter=self._filter(where)
            )
            hits = self._call("facet", shard.facet, request)
        # the keyword index may keep a value whose points were all deleted, with count 0
        return [(str(h.value), int(h.count)) for h in hits]

    def _facet_by_reading(self, key: str, where: TenantFilter) -> list[tuple[str, int]]:
        """What a facet counts (points per value; each value of a list once), read from the
        payloads: a small book's shard has no index of ``key`` (see :func:`_index_params`)."""
        counts: dict[str, int] = defaultdict(int)
        for record in self.scroll(where, fields=[key]):
            value = record.payload.get(key)
            values = value if isinstance(value, list) else [value]
            for one in {str(v) for v in values if v is not None}:
                counts[one] += 1
        return sorted(counts.items())

    def close(self) -> None:
        with self._lock:
            try:
                for book in list(self._open):
                    self._unload(book)
                for book, state in self._books.items():
                    if state.emptied and not (state.folder / _PENDING).exists():
                        _remove_folder(state.folder)  # tenants() lists folders: none left empty
                        log.debug("book %s emptied: its folder removed", book)
            finally:
                self._books.clear()
                self._open.clear()
                self._locks.release()


# -- files --------------------------------------------------------------------------------------


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


def _readable(book: str) -> bool:
    """A tenant that can name a book folder (any other holds nothing)."""
    return bool(_FOLDER_NAME.fullmatch(book)) and ".." not in book


def _check_book_name(book: str, *, writing: bool = False) -> None:
    if not _readable(book):
        raise ValueError(
            f"{book[:80]!r} cannot name a book of {'this' if writing else 'the'} store: use "
            "1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )


def _listed_books(books: Path) -> list[str]:
    if not books.is_dir():
        return []
    return sorted(p.name for p in books.iterdir() if _readable(p.name) and (p / _CURRENT).is_file())


def _signature(pointer: Mapping[str, Any]) -> str | None:
    recipe = pointer.get("recipe")
    return recipe.get(base.RECIPE_SIGNATURE) if isinstance(recipe, dict) else None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return None


def _read_pointer(path: Path) -> _Pointer | None:
    """(generation folder, the whole pointer) of a book's current.json / pending.json, or
    None; a pointer that is unreadable or names another book (a folder copied) is damage."""
    if not path.exists():
        return None
    data = _read_json(path)
    book = path.parent.name
    generation = data.get("generation") if isinstance(data, dict) else None
    if not isinstance(generation, str) or not _readable(generation):
        raise base.BookDamagedError(book, f"{path} is unreadable")
    named = data.get("book")
    if named is not None and named != book:
        raise base.BookDamagedError(
            book, f"{path} belongs to book {named!r} (a book folder copied under another name?)"
        )
    return generation, data


def _write_json(path: Path, data: Any) -> None:
    """Replace ``path`` atomically and durably (tmp + fsync + rename + folder fsync): a kill
    leaves the old file or the new one, and a leftover tmp file is never read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    with open(tmp, "w") as fh:
        json.dump(data, fh, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_folder(path.parent)


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _sweep_unnamed_generations(book_folder: Path) -> None:
    """Remove the book's generation folders that neither pointer names (left by a kill
    between a folder's creation and its pointer, or between a switch or a drop and the
    removal): nothing reads them. Called under the book's lock, before a handle's first
    write; kept ``old-*`` folders are not generations any more and stay."""
    if not book_folder.is_dir():
        return
    named = {
        pointer[0]
        for pointer in (
            _read_pointer(book_folder / _CURRENT),
            _read_pointer(book_folder / _PENDING),
        )
        if pointer is not None
    }
    for child in book_folder.iterdir():
        if _GENERATION.fullmatch(child.name) and child.name not in named and child.is_dir():
            log.info("removing %s: a generation no pointer names", child)
            _remove_folder(child)


def _remove_folder(folder: Path) -> None:
    """Rename to a trash name first, then delete: a kill leaves no half folder read as data."""
    if not folder.exists():
        return
    trash = folder.with_name(f"{_TRASH}{folder.name}-{secrets.token_hex(4)}")
    folder.rename(trash)
    shutil.rmtree(trash, ignore_errors=True)
    for left in folder.parent.glob(f"{_TRASH}*"):  # left by a removal that was killed
        shutil.rmtree(left, ignore_errors=True)


#: folders a fingerprint does not walk: a segment's payload indexes (two thirds of a small
#: shard's files and folders) change only with writes, which reach its WAL and payload
#: storage files too; a plan of 1,000 unchanged books spent ~0.4 CPU s in them
_NOT_FINGERPRINTED = frozenset({"payload_index"})


def _fingerprint(generation: Path) -> dict[str, Any]:
    """What a summary vouches for: (path, size, mtime_ns) of every file of the generation
    folder but those a read rewrites (:data:`_REWRITTEN_BY_READS`) and those of
    :data:`_NOT_FINGERPRINTED`, the presence of its config file and segments folder, as one
    digest; and the newest of those times."""
    entries: list[tuple[str, int, int]] = []
    pending = [(str(generation), "")]  # (folder, its path inside the generation)
    while pending:
        folder, rel = pending.pop()
        in_vectors = rel.endswith("/vectors/") or rel == "vectors/"
        # an optimized segment's vector storage keeps its deletion flags in deleted.dat,
        # whose time a read-only load rewrites (its writes reach the WAL's files anyway)
        in_storage = rel.rsplit("/", 2)[-2].startswith("vector_storage") if rel else False
        with os.scandir(folder) as listing:
            for entry in listing:
                name = entry.name
                if entry.is_dir(follow_symlinks=False):
                    if name not in _NOT_FINGERPRINTED:
                        pending.append((entry.path, f"{rel}{name}/"))
                elif (
                    name not in _REWRITTEN_BY_READS
                    and not (in_vectors and name == "status.dat")
                    and not (in_storage and name == "deleted.dat")
                ):
                    st = entry.stat(follow_symlinks=False)
                    entries.append((rel + name, st.st_size, st.st_mtime_ns))
    entries.sort()
    marks = ((generation / _CONFIG_FILE).is_file(), (generation / "segments").is_dir())
    digest = hashlib.sha256(repr((marks, entries)).encode()).hexdigest()
    return {
        "fingerprint": digest,
        "files": len(entries),
        "newest_ns": max((m for _, _, m in entries), default=0),
    }


_SUMMARY_HEAD = b'{"data": '
_SUMMARY_STAMP = b', "store": '


def _sealed(stamp: dict[str, Any], data: Mapping[str, Any]) -> dict[str, Any]:
    """``stamp`` with the SHA-256 of ``data`` as the summary file holds it and a checksum over
    both: an edit by other hands (a record's hash changed, a count) makes the file unread."""
    body = json.dumps(data, sort_keys=True).encode()  # as _write_json writes it
    sealed = {**stamp, "data_sha256": hashlib.sha256(body).hexdigest()}
    return {**sealed, "checksum": _stamp_checksum(sealed)}


def _stamp_checksum(stamp: Mapping[str, Any]) -> str:
    fields = {k: v for k, v in stamp.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def _intact(raw: bytes, stamp: Mapping[str, Any]) -> bool:
    """The summary file's bytes are what :func:`_sealed` sealed: its data hashed as they lie
    in the file (between ``{"data": `` and the last ``, "store": ``, which no JSON string can
    hold unescaped), not serialized again."""
    end = raw.rfind(_SUMMARY_STAMP)
    if not raw.startswith(_SUMMARY_HEAD) or end < 0:
        return False
    body = raw[len(_SUMMARY_HEAD) : end]
    return (
        stamp.get("checksum") == _stamp_checksum(stamp)
        and stamp.get("data_sha256") == hashlib.sha256(body).hexdigest()
    )


def _write_summary(folder: Path, generation: str, data: Mapping[str, Any], points: int) -> None:
    """``folder/summary.json``: the pipeline's ``data``, the book and generation it describes,
    the points the generation holds, the fingerprint of its (flushed, closed) files and a
    checksum over all of it. Written again after a short pause while its own time is not
    past the newest file it vouches for (a later change in the same tick would keep that
    time)."""
    path = folder / _SUMMARY
    try:
        stamp: dict[str, Any] = {
            "book": folder.name,
            "generation": generation,
            "points": points,
            **_fingerprint(folder / generation),
        }
    except FileNotFoundError:
        return  # the generation went (purged, emptied): nothing to describe
    stamp = _sealed(stamp, data)
    for _ in range(_RACY_TRIES):
        _write_json(path, {"store": stamp, "data": dict(data)})
        if path.stat().st_mtime_ns > stamp["newest_ns"]:
            return
        time.sleep(_RACY_PAUSE_S)
    log.debug("summary of %s left racy: it is read as absent", folder.name)


def _sound_summary(
    folder: Path, generation: str | None
) -> tuple[dict[str, Any], dict[str, Any], int] | None:
    """(stamp, data, the file's mtime) of ``folder/summary.json`` when it is intact (its
    checksum), names this book and ``generation`` (None: any); None otherwise."""
    try:
        with open(folder / _SUMMARY, "rb") as fh:
            written_ns = os.fstat(fh.fileno()).st_mtime_ns  # the time of what is read
            raw = fh.read()
        saved = json.loads(raw)
    except (OSError, ValueError):
        return None
    stamp = saved.get("store") if isinstance(saved, dict) else None
    data = saved.get("data") if isinstance(saved, dict) else None
    if not isinstance(stamp, dict) or not isinstance(data, dict):
        return None  # half written cannot happen (tmp + rename); an old format can
    if not _intact(raw, stamp):
        return None  # edited by other hands, or written before summaries had a checksum
    if stamp.get("book") != folder.name:
        return None
    if generation is not None and stamp.get("generation") != generation:
        return None
    return stamp, data, written_ns


def _check_not_orphaned(folder: Path) -> None:
    """A book without ``current.json`` holds nothing, unless its intact summary names a
    generation that is there: then the pointer was lost (no kill of the pipeline leaves
    that: the pointer is written before the first point, the summary after the last), and
    the book is damaged, not empty."""
    sound = _sound_summary(folder, None)
    named = None if sound is None else sound[0].get("generation")
    if isinstance(named, str) and _readable(named) and (folder / named / _CONFIG_FILE).exists():
        raise base.BookDamagedError(
            folder.name, f"{folder / _CURRENT} is missing while its generation {named} is there"
        )


def _promised_points(folder: Path, generation: str) -> int | None:
    """The points the book's intact summary says ``generation`` held when it was saved
    (None: no such summary). The pipeline removes the summary before its first write to the
    generation, so a summary that is there promises the generation as it is now."""
    sound = _sound_summary(folder, generation)
    points = None if sound is None else sound[0].get("points")
    return points if isinstance(points, int) else None


def _read_summary(folder: Path, generation: str) -> dict[str, Any] | None:
    """The pipeline's data of ``folder/summary.json`` if it is intact and vouches for
    ``generation`` as its files are now; None otherwise (the caller reads the shard)."""
    sound = _sound_summary(folder, generation)
    if sound is None:
        return None
    stamp, data, written_ns = sound
    newest = stamp.get("newest_ns")
    if not isinstance(newest, int):
        return None
    if newest >= written_ns:
        return None  # racy: a change in the tick the summary was written would be unseen
    try:
        now = _fingerprint(folder / generation)
    except FileNotFoundError:
        return None
    return data if now == {k: stamp.get(k) for k in now} else None


def _read_layout(folder: Path) -> _Layout | None:
    path = folder / LAYOUT_FILE
    if not path.exists():
        return None
    data = _read_json(path)
    if not isinstance(data, dict) or data.get("layout") != LAYOUT_NAME:
        raise base.StoreDamagedError(
            f"{path} is unreadable or not a {LAYOUT_NAME} layout: the store is damaged. Rebuild "
            f"it from the books with `{_REBUILD}`."
        )
    if data.get("version") != LAYOUT_VERSION:
        raise base.StoreError(
            f"{path} is layout version {data.get('version')}; this program reads version "
            f"{LAYOUT_VERSION}. Rebuild the store with `{_REBUILD}`."
        )
    dim = data.get("dense_dim")
    return _Layout(int(dim) if dim is not None else None, dict(data.get("payload_indexes") or {}))


def _write_layout(folder: Path, layout: _Layout) -> None:
    _write_json(
        folder / LAYOUT_FILE,
        {
            "layout": LAYOUT_NAME,
            "version": LAYOUT_VERSION,
            "dense_dim": layout.dense_dim,
            "payload_indexes": layout.payload_indexes,
        },
    )


# -- shards -------------------------------------------------------------------------------------


def _index_kinds(schema: base.CollectionSchema) -> dict[str, str]:
    """Every payload index, named as the engine reports its kind."""
    kinds = {schema.tenant_field: "keyword"} | dict(schema.payload_indexes)
    return {name: f"PayloadSchemaType.{kind.capitalize()}" for name, kind in kinds.items()}


#: free space a write needs on the store's file system besides its points' bytes. Qdrant
#: Edge writes through memory maps into sparse files: a page the file system cannot give is a
#: SIGBUS that kills the process with no message (seen on a full disk), never an error it
#: could report. So the space a write may take is checked before it: this margin (a new
#: shard's first pages, its next WAL segment, the summary and pointers) plus what the points
#: take (:func:`_write_bytes`).
SPACE_MARGIN_BYTES = 64 << 20
#: free space a shard's load needs: a load (and the first reads after it) writes too: it
#: opened a new WAL segment and rewrote flags and trackers, ~11 MB for a small book on tmpfs
LOAD_SPACE_BYTES = 32 << 20


def check_space(folder: Path, need: int, what: str) -> None:
    """:class:`StoreResourceError` naming the file system when fewer than ``need`` bytes are
    free for ``what`` (checked before it starts: nothing is written)."""
    place = folder
    while not place.exists() and place != place.parent:
        place = place.parent
    free = shutil.disk_usage(place).free
    if free < need:
        raise base.StoreResourceError(
            f"no space left on the device (ENOSPC) for {what}: {free / 2**20:.0f} MiB free on "
            f"the file system of {place}, about {need / 2**20:.0f} MiB needed. Free disk space "
            "(or point RAG_QDRANT_PATH at a larger disk) and run it again: nothing indexed was "
            "changed."
        )


def _write_bytes(points: int, dim: int) -> int:
    """A generous bound of what writing ``points`` takes on disk: the vectors and a page of
    payload and sparse vector each, twice (the write-ahead log, then the segment)."""
    return points * (dim * 4 + 4096) * 2


def _create_shard(
    book_folder: Path, dim: int, schema: base.CollectionSchema, layout: _Layout
) -> tuple[str, qe.EdgeShard]:
    """A new, empty generation folder of a book (see :func:`_shard_config`) with the payload
    indexes of a book holding nothing yet (:func:`_index_params`)."""
    check_space(book_folder, SPACE_MARGIN_BYTES, f"a new shard of book {book_folder.name!r}")
    name = f"g{time.strftime('%Y%m%d%H%M%S')}-{secrets.token_hex(3)}"
    folder = book_folder / name
    folder.mkdir(parents=True)
    shard = qe.EdgeShard.create(str(folder), _shard_config(dim))
    for field_name, params in _index_params(schema, layout, points=0).items():
        shard.update(qe.UpdateOperation.create_field_index(field_name, params))
    return name, shard


#: a book's shard holds every payload index of the layout from this many points; below, only
#: the schema's core indexes (a filter on another field scans the book's payloads: about 6 ms
#: at 1,000 points, against an index's cost in every small shard: time to create and load,
#: files, ~7 MB of memory; docs/benchmarks.md section 17)
ALL_INDEXES_FROM_POINTS = 1_000
#: past this many points written since the last optimize, a handle optimizes the book's shard
#: before writing more: the appendable segment the writes go to is held in memory (a 1M-point
#: book written at once took 10 GB), the optimized segments are memory-mapped
OPTIMIZE_EVERY_POINTS = 100_000
_COLD = qe.Memory.Cold


def _shard_config(dim: int) -> qe.EdgeConfig:
    """How a book's shard keeps its data (measured at 100k-1M points, docs/benchmarks.md
    section 17): every part memory-mapped, not read at load (``Cold``); dense vectors with
    int8 scalar quantization and an HNSW graph without payload links (one book per shard:
    no filter needs its own graph). Both are built by :meth:`EdgeShard.optimize`, which does
    nothing below Qdrant's indexing threshold (about 6,000 of these vectors): a small book is
    searched exactly, a large one loads in a fraction of a second at 1M points instead of
    20 s and 6 GB."""
    return qe.EdgeConfig(
        vectors={
            base.DENSE_VECTOR: qe.EdgeVectorParams(
                size=dim, distance=qe.Distance.Cosine, memory=_COLD
            )
        },
        sparse_vectors={
            base.SPARSE_VECTOR: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf, memory=_COLD)
        },
        payload_memory=_COLD,
        id_tracker_memory=_COLD,
        hnsw_config=qe.HnswIndexConfig(
            m=16, ef_construct=100, full_scan_threshold=10_000, payload_m=0, memory=_COLD
        ),
        quantization_config=qe.ScalarQuantizationConfig(
            type=qe.ScalarType.Int8, quantile=0.99, memory=_COLD
        ),
    )


def _add_indexes(shard: qe.EdgeShard, schema: base.CollectionSchema, layout: _Layout) -> None:
    """Create the payload indexes a shard of its size should have (:func:`_index_params`) and
    lacks. Reads work without them, only slower."""
    info = shard.info()
    present = set(info.payload_schema)
    for name, params in _index_params(schema, layout, points=int(info.points_count)).items():
        if name not in present:
            shard.update(qe.UpdateOperation.create_field_index(name, params))


def _settle_shard(shard: qe.EdgeShard, schema: base.CollectionSchema, layout: _Layout) -> None:
    """After writes: the payload indexes the book's size calls for, and Qdrant's optimizer (it
    builds the HNSW graph and int8 vectors of a segment past its indexing threshold, and does
    nothing for a small book)."""
    _add_indexes(shard, schema, layout)
    shard.optimize()


def _search_params(limit: int) -> qe.SearchParams:
    """How a large book's optimized segments are searched (small ones are searched exactly,
    and ignore this): the HNSW graph explores at least 128 candidates, and the int8 vectors'
    best twice ``limit`` are scored again with the original vectors."""
    return qe.SearchParams(
        hnsw_ef=max(128, 2 * limit),
        quantization=qe.QuantizationSearchParams(rescore=True, oversampling=2.0),
    )


def _index_params(schema: base.CollectionSchema, layout: _Layout, *, points: int) -> dict[str, Any]:
    """The engine's parameters of the payload indexes a book's shard of ``points`` points
    has: the tenant's and the schema's core ones, and from :data:`ALL_INDEXES_FROM_POINTS`
    every one the layout names."""
    core = schema.core_indexes
    params: dict[str, Any] = {}
    for field_name, kind in layout.payload_indexes.items():
        small = core is not None and field_name not in core and field_name != schema.tenant_field
        if small and points < ALL_INDEXES_FROM_POINTS:
            continue
        if field_name == schema.tenant_field:
            params[field_name] = qe.KeywordIndexParams(is_tenant=True, memory=_COLD)
        elif kind.endswith("Integer"):
            params[field_name] = qe.IntegerIndexParams(lookup=True, range=True, memory=_COLD)
        else:
            params[field_name] = qe.KeywordIndexParams(memory=_COLD)
    return params


def _load(folder: Path, description: str) -> qe.EdgeShard:
    """A book's generation folder loaded; a missing or unloadable one is that book's damage."""
    book = folder.parent.name
    if not (folder / _CONFIG_FILE).exists():
        if _has_data(folder):
            raise base.BookDamagedError(
                book, f"{folder} holds segments but no {_CONFIG_FILE} ({description})"
            )
        raise base.BookDamagedError(
            book, f"{folder.parent / _CURRENT} names {folder.name}, which is not there"
        )
    try:
        return qe.EdgeShard.load(str(folder))
    except Exception as exc:
        limit = resource_limit(exc)
        if limit is not None:  # the machine's limit, not damage: never discarded or rebuilt
            raise base.StoreResourceError(
                f"{description}: cannot open book {book!r}'s shard: {limit} ({exc})"
            ) from exc
        raise base.BookDamagedError(
            book, f"cannot open its shard {folder} ({description}): {exc}"
        ) from exc


def _close_shard(shard: qe.EdgeShard, *, flush: bool = True) -> None:
    try:
        if flush:
            shard.flush()
    finally:
        shard.close()


def _is_empty(shard: qe.EdgeShard) -> bool:
    return int(shard.count(qe.CountRequest())) == 0


def _has_data(folder: Path) -> bool:
    return any(
        (folder / part).is_dir() and any((folder / part).iterdir()) for part in ("segments", "wal")
    )


# -- the old single-shard layout ----------------------------------------------------------------


def _settle_old_layout(store: EdgeStore, busy_wait_s: float) -> None:
    """A collection folder in the single-shard layout (before book shards) is migrated; one
    with segments but no config is damaged. Never read as an empty store."""
    folder = store.folder
    if (folder / LAYOUT_FILE).exists():
        return
    if not folder.exists() and (rebuild_root(store.root, store.collection) / _REBUILT).exists():
        store._layout_lock.acquire(busy_wait_s)  # a rebuild's swap killed between its renames
        try:
            _finish_rebuild(store.root, store.collection)
        finally:
            store._layout_lock.release()
    if _interrupted_migration(store.root, store.collection):
        # finished under the layout lock: a migration in progress holds it between its two
        # renames, and another opener must not complete its swap for it
        store._layout_lock.acquire(busy_wait_s)
        try:
            _finish_interrupted_migration(store.root, store.collection)
        finally:
            store._layout_lock.release()
    if (folder / LAYOUT_FILE).exists():
        return
    single = (folder / _CONFIG_FILE).exists()
    if not single:
        if _has_data(folder):
            raise base.StoreDamagedError(
                f"{store.description} holds segments but no {_CONFIG_FILE}: the store is "
                f"damaged. Rebuild it from the books with `{_REBUILD}`."
            )
        return
    lock = store._layout_lock
    lock.acquire(busy_wait_s)
    try:
        if (folder / _CONFIG_FILE).exists() and not (folder / LAYOUT_FILE).exists():
            migrate_single_shard(store.root, store.collection, store.schema)
    finally:
        lock.release()


def _migrating_name(collection: str) -> str:
    return f".{collection}.migrating"


def _interrupted_migration(root: Path, collection: str) -> bool:
    """A migration killed between its two renames left the new layout complete beside (or
    one in progress is between them)."""
    built = root / _migrating_name(collection)
    return not (root / collection).exists() and (built / LAYOUT_FILE).exists()


def _finish_interrupted_migration(root: Path, collection: str) -> None:
    """The second rename of a killed migration; the caller holds the layout lock."""
    if _interrupted_migration(root, collection):
        (root / _migrating_name(collection)).rename(root / collection)


def migrate_single_shard(root: Path, collection: str, schema: base.CollectionSchema) -> str:
    """Copy every point (both named vectors, payload) of the single-shard folder
    ``root/collection`` into book shards built beside it, then swap them in by renames; the
    old folder is kept as ``<collection>.single-shard-<time>``. The caller holds the layout
    lock. Returns (and logs) what was done."""
    folder = root / collection
    built = root / _migrating_name(collection)
    if built.exists():
        shutil.rmtree(built)  # an unfinished earlier try (no layout.json: never swapped in)
    try:
        old = qe.EdgeShard.load(str(folder))
    except Exception as exc:
        raise base.StoreDamagedError(
            f"cannot migrate the single-shard Qdrant Edge folder {folder} ({exc}): rebuild the "
            f"store from the books with `{_REBUILD}`."
        ) from exc
    try:
        config = json.loads((folder / _CONFIG_FILE).read_text())
        dim = int(config["vectors"][base.DENSE_VECTOR]["size"])
        layout = _Layout(dim, _index_kinds(schema))
        generations: dict[str, str] = {}  # book -> its new generation folder's name
        shards: OrderedDict[str, qe.EdgeShard] = OrderedDict()  # open now, LRU first
        copied = skipped = 0
        try:
            for batch in _all_points(old):
                by_book: dict[str, list[Any]] = defaultdict(list)
                for record in batch:
                    book = (record.payload or {}).get(schema.tenant_field)
                    if not isinstance(book, str) or not _readable(book):
                        skipped += 1
                        continue
                    by_book[book].append(
                        qe.Point(id=record.id, vector=record.vector, payload=record.payload)
                    )
                for book, points in by_book.items():
                    shard = _migration_shard(built, book, dim, schema, layout, generations, shards)
                    shard.update(qe.UpdateOperation.upsert_points(points))
                    copied += len(points)
            while shards:  # closed as they go: memory maps and descriptors stay bounded
                _close_shard(shards.popitem(last=False)[1])
            for book, name in generations.items():  # each settled alone, then closed
                shard = qe.EdgeShard.load(str(built / "books" / book / name))
                try:
                    _settle_shard(shard, schema, layout)
                finally:
                    _close_shard(shard)
        finally:
            for shard in shards.values():
                _close_shard(shard)
        _write_layout(built, layout)  # last: marks the new layout complete
    except base.StoreError:
        raise
    except Exception as exc:
        raise base.StoreDamagedError(
            f"migrating the single-shard Qdrant Edge folder {folder} to one shard per book "
            f"failed ({exc}): rebuild the store from the books with `{_REBUILD}`."
        ) from exc
    finally:
        old.close()
    kept = folder.with_name(f"{collection}.single-shard-{time.strftime('%Y%m%d-%H%M%S')}")
    folder.rename(kept)
    built.rename(folder)
    message = (
        f"migrated the single-shard Qdrant Edge store {folder} to one shard per book "
        f"({copied} points of {len(generations)} books"
        + (f", {skipped} points without a book left out" if skipped else "")
        + f"); the old folder is kept as {kept}"
    )
    log.warning(message)
    return message


#: book shards a migration keeps open at once (each maps its files: a migration of thousands of
#: books that kept them all open ran out of memory maps at Linux's default vm.max_map_count)
MIGRATION_OPEN_SHARDS = 8


def _migration_shard(
    built: Path,
    book: str,
    dim: int,
    schema: base.CollectionSchema,
    layout: _Layout,
    generations: dict[str, str],
    shards: OrderedDict[str, qe.EdgeShard],
) -> qe.EdgeShard:
    """The book's new shard in the layout being built: created the first time, loaded again
    when it was closed; at most :data:`MIGRATION_OPEN_SHARDS` are open (least recently used
    closed first)."""
    need = SPACE_MARGIN_BYTES + _write_bytes(_MIGRATE_PAGE, dim)
    check_space(built, need, f"the migration of book {book!r}")
    shard = shards.get(book)
    if shard is None:
        while len(shards) >= MIGRATION_OPEN_SHARDS:  # first: never one more open
            _close_shard(shards.popitem(last=False)[1])
        book_folder = built / "books" / book
        if book in generations:
            shard = qe.EdgeShard.load(str(book_folder / generations[book]))
        else:
            name, shard = _create_shard(book_folder, dim, schema, layout)
            generations[book] = name
            _write_json(
                book_folder / _CURRENT,
                {"generation": name, "recipe": None, "dense_dim": dim, "book": book},
            )
        shards[book] = shard
    shards.move_to_end(book)
    return shard


def _all_points(shard: qe.EdgeShard) -> Iterator[list[Any]]:
    offset: Any = None
    while True:
        request = qe.ScrollRequest(
            limit=_MIGRATE_PAGE, offset=offset, with_payload=True, with_vector=True
        )
        records, offset = shard.scroll(request)
        if records:
            yield list(records)
        if offset is None:
            return

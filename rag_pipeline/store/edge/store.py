"""The store on Qdrant Edge (see the package docstring): one handle's routing of books to
their generations under the book locks, the core contract's primitives, the catalog and the
generations of :mod:`rag_pipeline.store.capabilities`."""

from __future__ import annotations

import contextlib
import threading
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import qdrant_edge as qe

from rag_pipeline.store import base, native
from rag_pipeline.store.edge.catalog import (
    EdgeCatalog,
    _check_not_orphaned,
    _promised_points,
)
from rag_pipeline.store.edge.common import log
from rag_pipeline.store.edge.engine import (
    _UPSERT_BATCH,
    EDGE,
    OPTIMIZE_EVERY_POINTS,
    SPACE_MARGIN_BYTES,
    _add_indexes,
    _close_shard,
    _create_shard,
    _index_kinds,
    _is_empty,
    _load,
    _load_bytes,
    _search_params,
    _settle_shard,
    _write_bytes,
    check_space,
)
from rag_pipeline.store.edge.files import (
    _CURRENT,
    _DAMAGED,
    _FOLDER_NAME,
    _PENDING,
    _REBUILD,
    _SUMMARY,
    LAYOUT_FILE,
    _check_book_name,
    _fsync_folder,
    _Layout,
    _listed_books,
    _mark_damaged,
    _read_damage,
    _read_layout,
    _read_pointer,
    _readable,
    _remove_folder,
    _signature,
    _sweep_unnamed_generations,
    _unlink,
    _write_json,
    _write_layout,
)
from rag_pipeline.store.edge.generations import EdgeGenerations
from rag_pipeline.store.edge.handle import RoutedBook
from rag_pipeline.store.edge.migration import _settle_old_layout
from rag_pipeline.store.edge.rebuild import layout_lock
from rag_pipeline.store.errors import resource_limit
from rag_pipeline.store.filters import TenantFilter
from rag_pipeline.store.lock import FolderLock, LockGroup, allow_open_files

#: book shards a handle keeps loaded at once by default, and locks of books it only read
#: (least recently used closed and let go first). A small book's loaded shard holds ~27 MB
#: of its files' pages (its write-ahead log, payload and vector pages) and ~1 MB of memory,
#: so a handle that walks every book (a plan, the collection look) must not keep them all;
#: the query service keeps more (``loaded_books``).
MAX_OPEN_SHARDS = 2


class EdgeStore(EdgeCatalog, EdgeGenerations, base.VectorStore):
    """A collection as one Qdrant Edge shard per book under ``<path>/<collection>``, with a
    catalog and generations (:mod:`rag_pipeline.store.capabilities`)."""

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
        self._books: dict[str, RoutedBook] = {}
        self._open: OrderedDict[str, None] = OrderedDict()  # books with a loaded shard, LRU first
        #: books this handle found damaged and discarded: it reads them as their rebuild
        #: leaves them (every other reader is refused until the rebuild is checked)
        self._repairing: set[str] = set()
        #: book -> (summary file and generation seen, until when, its data): see summary()
        #: the recipe tag of a builder handle (see the module's docstring)
        self._recipe: dict[str, str] | None = None
        self._dense_dim: int | None = None
        self._layout_lock = layout_lock(self.root, collection)
        self._layout_lock.prepare()  # an unusable folder is a setting to fix, said at open
        _settle_old_layout(
            self.root, collection, schema, self._layout_lock, busy_wait_s, self.description
        )
        self._layout: _Layout | None = self._read_or_recover_layout()

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

    def share_in_process(self) -> None:
        self._locks.share_in_process(self._hand_over)

    def _hand_over(self, lock: FolderLock) -> bool:
        """Close what this handle keeps of the lock's book, written or not, as :meth:`close`
        would, for another handle of this process (see :class:`LockGroup`); False while a
        call of this handle is under way: never waits for it (its thread may wait for us)."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            book = lock.path.name.removesuffix(".lock")
            state = self._books.get(book)
            if state is not None:
                self._unload(book)
                if state.emptied and not (state.folder / _PENDING).exists():
                    _remove_folder(state.folder)  # tenants() lists folders: none left empty
                self._books.pop(book, None)
            return True
        finally:
            self._lock.release()

    def _route(self, book: str) -> RoutedBook:
        """Where this handle reads and writes ``book`` (taking its lock the first time)."""
        state = self._books.get(book)
        if state is not None:
            self._locks.take(self._book_lock(book), self._busy_wait_s)  # held: the latest used
            return state
        _check_book_name(book)
        self._hold(book)
        folder = self.books_folder / book
        damage = _read_damage(folder)
        if damage is not None and self._recipe is None and book not in self._repairing:
            raise base.BookDamagedError(book, f"{damage} (its rebuild is not complete yet)")
        current = _read_pointer(folder / _CURRENT)
        pending = _read_pointer(folder / _PENDING)
        if pending is not None and current is not None and pending[0] == current[0]:
            pending = None  # a switch died after replacing current.json: done already
        if current is None:
            _check_not_orphaned(folder)
        state = RoutedBook(folder, current[0] if current else None, pending=False)
        if self._recipe is not None and current is not None and self._builds_beside(current):
            ours = (
                pending is not None
                and _signature(pending[1]) == self._recipe[base.RECIPE_SIGNATURE]
            )
            state = RoutedBook(folder, pending[0] if ours and pending else None, pending=True)
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

    def _absent(self, book: str) -> bool:
        """``book`` is neither routed by this handle nor a folder of the store: a read of it
        reads nothing, without its lock (taking it made a lock file, and a wait file, for
        every id a client of the query service named). A run creating the book meanwhile
        is read as before its first write, as when the read had come first."""
        return book not in self._books and not (self.books_folder / book).exists()

    def _reader(self, book: str) -> qe.EdgeShard | None:
        """The shard this handle reads for ``book`` (None: the book holds nothing), checked
        against what its summary promises when loaded (:meth:`_verify`)."""
        if self._absent(book):
            return None
        state = self._route(book)
        if state.shard is None and state.generation is not None:
            folder = state.folder / state.generation
            check_space(state.folder, _load_bytes(folder), f"loading book {book!r}")
            shard = _load(folder, self.description)
            try:
                self._verify(book, state, shard)
            except BaseException:
                _close_shard(shard, flush=False)
                raise
            state.shard = shard
        if state.shard is not None:
            self._opened(book)
        return state.shard

    def _verify(self, book: str, state: RoutedBook, shard: qe.EdgeShard) -> None:
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

    def _settle(self, state: RoutedBook) -> None:
        """After writes to a book: :func:`_settle_shard`."""
        assert state.shard is not None
        if self._layout is not None:
            folder = state.folder / (state.generation or "")
            self._call("optimize", _settle_shard, state.shard, self.schema, self._layout, folder)
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
                self._add_missing_indexes(shard, state.folder / state.generation)
        state.written = state.dirty = True
        shard = self._reader(book)
        assert shard is not None
        return shard

    def _add_missing_indexes(self, shard: qe.EdgeShard, folder: Path) -> None:
        """The payload indexes a book's shard should have at its size and lacks, added before
        a handle's first write (an index the schema gained since the shard was made) and after
        its writes (a book that grew): see :func:`_add_indexes`."""
        if self._layout is not None:
            self._call("index creation", _add_indexes, shard, self.schema, self._layout, folder)

    def _create_generation(self, book: str, state: RoutedBook) -> None:
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

    def _stamp_recipe(self, state: RoutedBook) -> None:
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

    def _known_layout(self) -> _Layout | None:
        """The layout; read again while there is none: another process may create the
        collection after this handle opened, and a long-lived reader (the query service
        started before the first ingest) must then see it, not "no collection" forever."""
        if self._layout is None:
            with contextlib.suppress(base.StoreDamagedError):
                self._layout = _read_layout(self.folder)
        return self._layout

    def collection_exists(self) -> bool:
        return self._known_layout() is not None

    def dense_dimension(self) -> int | None:
        layout = self._known_layout()
        return None if layout is None else layout.dense_dim

    def payload_indexes(self) -> dict[str, str]:
        layout = self._known_layout()
        return {} if layout is None else dict(layout.payload_indexes)

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
            if self._absent(tenant):
                return None
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

    # -- purge and damage -------------------------------------------------------------------

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

    def discard_damaged(self, tenant: str, problem: str) -> None:
        """The book's index removed under its lock without loading it (see
        :meth:`VectorStore.discard_damaged`), its ``damaged.json`` written first: every
        other reader is refused with ``problem`` until :meth:`end_repair`, so the rebuild
        (in place, by the run's builders) is never seen half done nor as an empty book."""
        with self._lock:
            _check_book_name(tenant)
            self._hold(tenant)
            state = self._books.pop(tenant, None)
            self._open.pop(tenant, None)
            if state is not None and state.shard is not None:
                _close_shard(state.shard, flush=False)
            log.warning("book %s: its damaged index is removed to be rebuilt", tenant)
            folder = self.books_folder / tenant
            folder.mkdir(parents=True, exist_ok=True)
            _mark_damaged(folder, problem)  # first: a kill from here on leaves it refused
            # the pointers before the folders they name: a kill never leaves one naming none
            for child in sorted(folder.iterdir(), key=lambda path: path.is_dir()):
                if child.name == _DAMAGED:
                    continue
                if child.is_dir() and not child.is_symlink():
                    _remove_folder(child)
                else:
                    _unlink(child)
            self._repairing.add(tenant)

    def end_repair(self, tenant: str) -> None:
        """The book's rebuild is complete and checked: its ``damaged.json`` removed (one
        unlink), so readers see the rebuilt index; a rebuild that wrote nothing leaves the
        book holding nothing (its folder removed)."""
        if not _readable(tenant) or not (self.books_folder / tenant / _DAMAGED).exists():
            return
        with self._lock:
            self._hold(tenant)
            self._forget(tenant)
            folder = self.books_folder / tenant
            if (folder / _CURRENT).exists():
                _unlink(folder / _DAMAGED)
                _fsync_folder(folder)
            else:
                _remove_folder(folder)
            self._repairing.discard(tenant)
            log.info("book %s: rebuilt from its files and checked: searched again", tenant)

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

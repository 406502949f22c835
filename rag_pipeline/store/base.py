"""The vector store contract: one collection, named dense + sparse vectors, tenant filters.

:class:`VectorStore` is written once for every backend: batching, paging, tenant safety,
count-then-delete, hybrid fusion and the sanity checks on what comes back. A backend implements
only the primitives at the bottom of the class (``_count``, ``_scroll_page``, ``_query_batch``
...), each a thin call into its client library; the native filters, points and records they
exchange are built by :mod:`rag_pipeline.store.native`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from rag_pipeline.store.errors import (
    BookBusyError,
    BookDamagedError,
    StoreBusyError,
    StoreDamagedError,
    StoreError,
    StorePathError,
    StoreResourceError,
    StoreUnavailableError,
)
from rag_pipeline.store.filters import HasIds, TenantFilter

if TYPE_CHECKING:
    from rag_pipeline.store.lock import WatchedLock

__all__ = [
    "DENSE_VECTOR",
    "RECIPE_SIGNATURE",
    "SPARSE_VECTOR",
    "UPSERT_BATCH",
    "BookBusyError",
    "BookDamagedError",
    "CollectionSchema",
    "CollectionSpec",
    "Fusion",
    "FusionMethod",
    "NearestQuery",
    "PointRecord",
    "ScoredRecord",
    "ScrollPage",
    "SparseVector",
    "StoreBusyError",
    "StoreDamagedError",
    "StoreError",
    "StorePathError",
    "StoreResourceError",
    "StoreUnavailableError",
    "StoredRecord",
    "VectorStore",
    "batched",
    "minmax_fuse",
]

DENSE_VECTOR = "dense"
SPARSE_VECTOR = "sparse"
UPSERT_BATCH = 128
#: the key of a recipe tag (CollectionSpec.recipe) that tells two recipes apart
RECIPE_SIGNATURE = "signature"
#: cosine scores are at most 1; anything well above says the stored vectors are not ours
_MAX_COSINE = 1.0 + 1e-3

IndexKind = Literal["keyword", "integer"]


@dataclass(frozen=True, slots=True)
class CollectionSchema:
    """What the store must know of the payload: the tenant key and the fields to index.

    ``core_indexes``: the fields of ``payload_indexes`` that every read, write or facet
    uses (None: all of them). A store that keeps a shard per tenant (Qdrant Edge) indexes
    only those in a small tenant's shard, where a filter on another field costs little (a
    scan of a few hundred payloads) and every index costs its shard files, time to create
    and load, and memory; a tenant's shard gets every index once it grows."""

    tenant_field: str
    payload_indexes: Mapping[str, IndexKind] = field(default_factory=dict)
    core_indexes: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class SparseVector:
    indices: tuple[int, ...]
    values: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class PointRecord:
    """A point to write: an id, optional vectors (document records have none) and payload."""

    id: str
    payload: dict[str, Any]
    dense: np.ndarray | None = None
    sparse: SparseVector | None = None


@dataclass(frozen=True, slots=True)
class StoredRecord:
    id: str
    payload: dict[str, Any]
    dense: np.ndarray | None = None


@dataclass(frozen=True, slots=True)
class ScoredRecord:
    id: str
    score: float
    payload: dict[str, Any]


@dataclass(frozen=True, slots=True)
class CollectionSpec:
    """What the collection must look like for the configured embedder.

    ``recipe`` (optional) tags the index recipe the caller builds with: small strings, compared
    by their ``signature`` key only. A store with generations (Qdrant Edge) then builds a
    book whose current generation has another signature *beside* it (see
    :meth:`VectorStore.switch`); other stores ignore it (writes in place)."""

    name: str
    dense_dim: int
    recipe: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        if self.recipe is not None and not self.recipe.get(RECIPE_SIGNATURE):
            raise ValueError("a recipe tag needs a 'signature'")


FusionMethod = Literal["minmax", "dbsf", "rrf"]
FUSION_METHODS: tuple[FusionMethod, ...] = ("minmax", "dbsf", "rrf")


@dataclass(frozen=True, slots=True)
class Fusion:
    """How a hybrid query combines its dense and sparse candidate lists.

    * ``minmax`` (default): in this process. Each list's scores are min-max normalized to
      [0, 1] (a point missing from a list gets 0 from it) and combined as ``alpha * dense +
      (1 - alpha) * sparse``; ties go to the higher single normalized score, then the point id.
      BEIR SciFact: nDCG@10 0.7355 against 0.7206 for RRF k=60 (p=0.022).
    * ``dbsf``: the engine's distribution-based score fusion (SciFact 0.7328).
    * ``rrf``: the engine's reciprocal rank fusion, ``sum 1 / (rrf_k + rank)``. Qdrant's own
      default k is 2; this project's is 60.
    """

    method: FusionMethod = "minmax"
    rrf_k: int = 60
    alpha: float = 0.5

    def __post_init__(self) -> None:
        if self.method not in FUSION_METHODS:
            raise ValueError(f"unknown fusion {self.method!r}; use {', '.join(FUSION_METHODS)}")
        if self.rrf_k < 1:
            raise ValueError(f"rrf k must be at least 1, not {self.rrf_k}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"fusion alpha must be within [0, 1], not {self.alpha}")

    @property
    def native(self) -> bool:
        """Fused by the engine (a fusion query over two prefetches), not in this process."""
        return self.method != "minmax"


@dataclass(frozen=True, slots=True)
class ScrollPage:
    """One page of a scroll: points matching ``where`` from ``offset`` (None: the start);
    ``fields`` limits the payload returned (None: all of it)."""

    where: TenantFilter
    limit: int
    offset: Any = None
    fields: tuple[str, ...] | None = None
    with_vectors: bool = False


@dataclass(frozen=True, slots=True, eq=False)
class NearestQuery:
    """One request of a query batch: the points nearest to ``dense`` or ``sparse`` that match
    ``where``; with a native ``fusion``, both vectors as prefetches of ``prefetch_limit``
    points each, fused by the engine."""

    where: TenantFilter
    limit: int
    dense: np.ndarray | None = None
    sparse: SparseVector | None = None
    fusion: Fusion | None = None
    prefetch_limit: int = 0
    score_threshold: float | None = None
    #: the whole payload, none, or these fields of it
    with_payload: bool | tuple[str, ...] = True

    @property
    def nearest(self) -> list[tuple[np.ndarray | SparseVector, str]]:
        """The vectors to search, with the name of the vector each is compared with."""
        out: list[tuple[np.ndarray | SparseVector, str]] = []
        if self.dense is not None:
            out.append((self.dense, DENSE_VECTOR))
        if self.sparse is not None:
            out.append((self.sparse, SPARSE_VECTOR))
        return out


class VectorStore(ABC):
    """One Qdrant collection behind a backend-neutral, tenant-safe API."""

    collection: str
    schema: CollectionSchema
    #: what a user should read in the README and error messages, e.g. "Qdrant server URL".
    description: str

    # -- collection -------------------------------------------------------------------------

    @abstractmethod
    def ensure_collection(self, spec: CollectionSpec) -> None:
        """Create the collection with its vectors and payload indexes, or check it matches."""

    @abstractmethod
    def collection_exists(self) -> bool: ...

    @abstractmethod
    def dense_dimension(self) -> int | None:
        """Size of the dense vector of the existing collection, or None if there is none."""

    @abstractmethod
    def payload_indexes(self) -> dict[str, str]:
        """Indexed payload fields and their kinds, as the engine reports them."""

    def _check_dimension(self, existing: int | None, spec: CollectionSpec) -> None:
        if existing is not None and existing != spec.dense_dim:
            raise StoreError(
                f"collection {self.collection!r} holds {existing}-dimensional vectors but "
                f"the embedder makes {spec.dense_dim}: use another RAG_COLLECTION"
            )

    # -- writes -----------------------------------------------------------------------------

    def upsert(self, points: Sequence[PointRecord]) -> int:
        """Write points in batches; returns how many were written."""
        for batch in batched(points):
            self._upsert(batch)
        self._flush()
        return len(points)

    def delete_ids(self, where: TenantFilter, ids: Sequence[str]) -> int:
        """Delete the given ids, but only those that match ``where`` (never another tenant's)."""
        deleted = 0
        for batch in batched(list(ids), 1024):
            deleted += self._count_then_delete(where.with_conditions(HasIds(tuple(batch))))
        self._flush()
        return deleted

    def delete_where(self, where: TenantFilter) -> int:
        """Delete every point matching the filter (always within one tenant)."""
        deleted = self._count_then_delete(where)
        self._flush()
        return deleted

    def _count_then_delete(self, where: TenantFilter) -> int:
        matching = self.count(where)
        if matching:
            self._delete(where)
        return matching

    # -- reads ------------------------------------------------------------------------------

    def scroll(
        self,
        where: TenantFilter,
        *,
        fields: Sequence[str] | None = None,
        with_vectors: bool = False,
        page_size: int = 1024,
    ) -> Iterator[StoredRecord]:
        """Every point matching the filter; ``fields`` limits the payload returned."""
        if not self.collection_exists():
            return
        offset: Any = None
        while True:
            records, offset = self._scroll_page(
                ScrollPage(where, page_size, offset, _fields(fields), with_vectors)
            )
            yield from records
            if offset is None:
                return

    def retrieve(
        self,
        where: TenantFilter,
        ids: Sequence[str],
        *,
        with_vectors: bool = False,
        fields: Sequence[str] | None = None,
    ) -> list[StoredRecord]:
        """Points by id, dropping any that does not match the filter (another tenant's);
        ``fields`` limits the payload returned."""
        if not ids or not self.collection_exists():
            return []
        where = where.with_conditions(HasIds(tuple(ids)))
        records, _ = self._scroll_page(
            ScrollPage(where, len(ids), None, _fields(fields), with_vectors)
        )
        return records

    def count(self, where: TenantFilter) -> int:
        if not self.collection_exists():
            return 0
        return self._count(where)

    def tenants(self) -> list[str]:
        """Tenant values that hold at least one point."""
        if not self.collection_exists():
            return []
        return sorted(
            value for value, count in self._facet(self.schema.tenant_field, None) if count > 0
        )

    def counts_by(self, where: TenantFilter, key: str) -> dict[str, int]:
        """Points matching the filter, counted by each value of a keyword field."""
        if not self.collection_exists():
            return {}
        return {value: count for value, count in self._facet(key, where) if count > 0}

    def query_dense(
        self,
        where: TenantFilter,
        vector: np.ndarray,
        *,
        limit: int,
        score_threshold: float | None = None,
        fields: Sequence[str] | None = None,
    ) -> list[ScoredRecord]:
        """The ``limit`` points nearest to ``vector`` (cosine); ``fields`` limits the payload
        returned (None: all of it)."""
        found = self._run_query(
            NearestQuery(
                where,
                limit,
                dense=_float32(vector),
                score_threshold=score_threshold,
                with_payload=_selector(fields),
            )
        )
        self._check_cosine(found)
        return found

    def query_sparse(
        self,
        where: TenantFilter,
        vector: SparseVector,
        *,
        limit: int,
        score_threshold: float | None = None,
        fields: Sequence[str] | None = None,
    ) -> list[ScoredRecord]:
        """The ``limit`` best BM25 matches (none for a query without terms)."""
        if not vector.indices:
            return []
        found = self._run_query(
            NearestQuery(
                where,
                limit,
                sparse=vector,
                score_threshold=score_threshold,
                with_payload=_selector(fields),
            )
        )
        self._check_finite(found)
        return found

    def query_hybrid(
        self,
        where: TenantFilter,
        dense: np.ndarray,
        sparse: SparseVector,
        *,
        limit: int,
        prefetch_limit: int,
        fusion: Fusion | None = None,
        score_threshold: float | None = None,
        fields: Sequence[str] | None = None,
    ) -> list[ScoredRecord]:
        """The best ``limit`` points of the dense and sparse candidate lists (``prefetch_limit``
        each) fused by ``fusion`` (default: min-max, alpha 0.5; see :class:`Fusion`).

        The lists are asked for in one batched engine call without payloads; the payloads of
        the points returned are read afterwards, in one call (with ``fields``, the candidates
        carry those fields of their payloads instead, and nothing more is read). The
        order is deterministic: equal fused scores are ordered by point id (min-max first by
        the higher single normalized score). ``score_threshold`` applies to the *fused* score:
        min-max scores lie in [0, 1], RRF scores are sums of ``1 / (k + rank)``, DBSF scores
        sums of normalized scores. A dense score no cosine can have raises
        :class:`StoreDamagedError`, whatever the fusion (rank-based fusion would otherwise hide
        a damaged index)."""
        fusion = fusion or Fusion()
        if limit < 1 or prefetch_limit < 1:
            raise ValueError("limit and prefetch_limit must be at least 1")
        if not self.collection_exists():
            return []
        vector = _float32(dense)
        terms = sparse if sparse.indices else None
        # a few payload fields come with the candidates; a whole payload is read afterwards
        # for the points returned only
        light = fields is not None
        carried: bool | tuple[str, ...] = _selector(fields) if light else False
        if fusion.native:
            # the whole fused list (at most both lists' points) is read, so that ties at the
            # cut are broken here by id: the engine returns equal RRF scores in any order
            probe, fused = self._query_batch(
                [
                    NearestQuery(where, 1, dense=vector, with_payload=False),
                    NearestQuery(
                        where,
                        2 * prefetch_limit,
                        dense=vector,
                        sparse=terms,
                        fusion=fusion,
                        prefetch_limit=prefetch_limit,
                        with_payload=carried,
                    ),
                ]
            )
            self._check_cosine(probe)
            self._check_finite(fused)
            lists = [fused]
            ranked = sorted(((r.id, r.score) for r in fused), key=lambda p: (-p[1], p[0]))
        else:
            batch = [NearestQuery(where, prefetch_limit, dense=vector, with_payload=carried)]
            if terms is not None:
                batch.append(
                    NearestQuery(where, prefetch_limit, sparse=terms, with_payload=carried)
                )
            lists = self._query_batch(batch)
            self._check_cosine(lists[0])
            for found in lists[1:]:
                self._check_finite(found)
            ranked = minmax_fuse(
                [[(r.id, r.score) for r in found] for found in lists],
                [fusion.alpha, 1.0 - fusion.alpha][: len(lists)],
            )
        if score_threshold is not None:
            ranked = [(i, score) for i, score in ranked if score >= score_threshold]
        if light:
            payloads = {r.id: r.payload for found in lists for r in found}
            return [ScoredRecord(i, score, payloads[i]) for i, score in ranked[:limit]]
        return self._with_payloads(where, ranked[:limit])

    def _with_payloads(
        self, where: TenantFilter, ranked: Sequence[tuple[str, float]]
    ) -> list[ScoredRecord]:
        """Scored ids with their payloads, in the given order (a point deleted in between is
        left out)."""
        records = {r.id: r for r in self.retrieve(where, [i for i, _ in ranked])}
        return [ScoredRecord(i, s, records[i].payload) for i, s in ranked if i in records]

    def query_batch(self, queries: Sequence[NearestQuery]) -> list[list[ScoredRecord]]:
        """Several queries in one engine call (one result list per query, in order), with
        the same checks as :meth:`query_dense` and :meth:`query_sparse`."""
        if not queries:
            return []
        if not self.collection_exists():
            return [[] for _ in queries]
        results = self._query_batch([_normalized(q) for q in queries])
        for query, found in zip(queries, results, strict=True):
            if query.dense is not None and query.fusion is None:
                self._check_cosine(found)
            else:
                self._check_finite(found)
        return results

    def _run_query(self, query: NearestQuery) -> list[ScoredRecord]:
        if not self.collection_exists():
            return []
        return self._query_batch([query])[0]

    def _check_cosine(self, found: Sequence[ScoredRecord]) -> None:
        for record in found:
            if not math.isfinite(record.score) or abs(record.score) > _MAX_COSINE:
                raise StoreDamagedError(
                    f"{self.description}: point {record.id} scored {record.score:g}, which no "
                    "cosine similarity can be: the stored vectors are damaged. Rebuild the "
                    "index with `rag-pipeline ingest --rebuild`."
                )

    def _check_finite(self, found: Sequence[ScoredRecord]) -> None:
        for record in found:
            if not math.isfinite(record.score):
                raise StoreDamagedError(
                    f"{self.description}: point {record.id} has a non-finite score: the "
                    "stored vectors are damaged. Rebuild with `rag-pipeline ingest --rebuild`."
                )

    def purge(self, where: TenantFilter) -> int:
        """Every point of the filter's tenant gone (a removed book); returns how many."""
        if where.conditions:
            raise ValueError("a purge takes a whole tenant: no further conditions")
        return self.delete_where(where)

    def verify(self, tenant: str) -> None:  # noqa: B027 - optional hook
        """Raise :class:`BookDamagedError` when the tenant's index is not what this program
        wrote, as far as the store can tell (default: it cannot; a server checks its own)."""

    def discard_damaged(self, tenant: str, problem: str) -> None:
        """Remove what is left of a tenant whose index was found damaged
        (:class:`BookDamagedError` saying ``problem``), without reading it, so that its run
        rebuilds it from its files. Default: every point of the tenant deleted (a store that
        can, Qdrant Edge, refuses its other readers with ``problem`` until
        :meth:`end_repair`)."""
        self._delete(TenantFilter(tenant))

    def end_repair(self, tenant: str) -> None:  # noqa: B027 - optional hook
        """The rebuild of a tenant discarded by :meth:`discard_damaged` is written and
        checked: readers may see it (default: they always did)."""

    # -- per tenant ---------------------------------------------------------------------------

    def dimension_of(self, tenant: str) -> int | None:
        """The dense dimension of the index this handle reads and writes for ``tenant``
        (None: it holds none yet). One collection has one: a store with generations has one
        per tenant's generation, so a new model of another dimension is built beside."""
        return self.dense_dimension()

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def folder_lock(self) -> WatchedLock | None:
        """The inter-process lock(s) this handle holds on an embedded folder (None for a
        server or memory): a long-lived holder watches them for waiting processes."""
        return None

    def share_in_process(self) -> None:  # noqa: B027 - optional hook
        """This handle is one of the process's shared handles (:mod:`.sharing`): what it
        locks is handed over to another such handle of the process between its calls, not
        held against it as against another process (an embedded store's locks)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the client, its files and locks."""

    def __enter__(self) -> VectorStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- primitives: what a backend implements ----------------------------------------------
    # Each takes a TenantFilter (turned into a native filter by rag_pipeline.store.native,
    # tenant condition first) and may assume the collection exists.

    @abstractmethod
    def _upsert(self, points: Sequence[PointRecord]) -> None:
        """Write one batch of points."""

    def _flush(self) -> None:  # noqa: B027 - optional hook
        """Make the writes so far durable (engines that buffer)."""

    @abstractmethod
    def _delete(self, where: TenantFilter) -> None:
        """Delete every point matching the filter."""

    @abstractmethod
    def _count(self, where: TenantFilter) -> int:
        """Exact number of points matching the filter."""

    @abstractmethod
    def _scroll_page(self, page: ScrollPage) -> tuple[list[StoredRecord], Any]:
        """One page of matching points and the offset of the next page (None at the end)."""

    @abstractmethod
    def _query_batch(self, queries: Sequence[NearestQuery]) -> list[list[ScoredRecord]]:
        """Every query in one engine call, one list per query in order (a query without a
        native fusion has exactly one of ``dense`` / ``sparse``; dense vectors are float32)."""

    @abstractmethod
    def _facet(self, key: str, where: TenantFilter | None) -> list[tuple[str, int]]:
        """(value, point count) of every value of a keyword field (among matching points)."""


def minmax_fuse(
    lists: Sequence[Sequence[tuple[str, float]]], weights: Sequence[float]
) -> list[tuple[str, float]]:
    """Convex combination of min-max normalized score lists, best first.

    ``lists`` hold ``(id, score)`` best first. Each list's scores are mapped to [0, 1] by its
    own min and max (a list whose scores are all equal maps to 1); a point missing from a list
    gets 0 from it. Ties: the higher best single normalized score first, then the id, so the
    order never depends on the engine's order of equal scores."""
    fused: dict[str, float] = {}
    best: dict[str, float] = {}
    for items, weight in zip(lists, weights, strict=True):
        if not items:
            continue
        scores = [score for _, score in items]
        lo, hi = min(scores), max(scores)
        span = hi - lo
        for point, score in items:
            normalized = (score - lo) / span if span > 0 else 1.0
            fused[point] = fused.get(point, 0.0) + weight * normalized
            best[point] = max(best.get(point, 0.0), normalized)
    order = sorted(fused, key=lambda p: (-fused[p], -best[p], p))
    return [(p, fused[p]) for p in order]


def _fields(fields: Sequence[str] | None) -> tuple[str, ...] | None:
    return None if fields is None else tuple(fields)


def _selector(fields: Sequence[str] | None) -> bool | tuple[str, ...]:
    return True if fields is None else tuple(fields)


def _float32(vector: np.ndarray) -> np.ndarray:
    return np.asarray(vector, dtype=np.float32)


def _normalized(query: NearestQuery) -> NearestQuery:
    """The query with a float32 dense vector and without an empty sparse one."""
    sparse = query.sparse if query.sparse is not None and query.sparse.indices else None
    dense = None if query.dense is None else _float32(query.dense)
    if dense is None and sparse is None:
        raise ValueError("a query needs a dense or a non-empty sparse vector")
    if query.fusion is None and dense is not None and sparse is not None:
        raise ValueError("a query with both vectors needs a native fusion (rrf or dbsf)")
    return NearestQuery(
        query.where,
        query.limit,
        dense,
        sparse,
        query.fusion,
        query.prefetch_limit,
        query.score_threshold,
        query.with_payload,
    )


def batched(items: Sequence[Any], size: int = UPSERT_BATCH) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]

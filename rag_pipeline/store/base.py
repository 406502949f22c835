"""The vector store contract: one collection, named dense + sparse vectors, tenant filters.

:class:`VectorStore` is written once for every backend: batching, paging, tenant safety,
count-then-delete and the sanity checks on what comes back. A backend implements only the
primitives at the bottom of the class (``_count``, ``_scroll_page``, ``_query`` ...), each a
thin call into its client library; the native filters, points and records they exchange are
built by :mod:`rag_pipeline.store.native`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from rag_pipeline.store.filters import HasIds, TenantFilter

__all__ = [
    "DENSE_VECTOR",
    "SPARSE_VECTOR",
    "UPSERT_BATCH",
    "CollectionSchema",
    "CollectionSpec",
    "Fusion",
    "PointRecord",
    "ScoredRecord",
    "SparseVector",
    "StoreBusyError",
    "StoreDamagedError",
    "StoreError",
    "StoreUnavailableError",
    "StoredRecord",
    "VectorStore",
    "batched",
]

DENSE_VECTOR = "dense"
SPARSE_VECTOR = "sparse"
UPSERT_BATCH = 128
#: cosine scores are at most 1; anything well above says the stored vectors are not ours
_MAX_COSINE = 1.0 + 1e-3

IndexKind = Literal["keyword", "integer"]


class StoreError(RuntimeError):
    """The vector store refused or failed an operation."""


class StoreBusyError(StoreError):
    """The embedded store's folder is held by another process (a run, the UI, a CLI)."""


class StoreUnavailableError(StoreError):
    """The Qdrant server cannot be reached."""


class StoreDamagedError(StoreError):
    """The store's files or contents are not what this program wrote: never served as-is."""


@dataclass(frozen=True, slots=True)
class CollectionSchema:
    """What the store must know of the payload: the tenant key and the fields to index."""

    tenant_field: str
    payload_indexes: Mapping[str, IndexKind] = field(default_factory=dict)


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
    """What the collection must look like for the configured embedder."""

    name: str
    dense_dim: int


@dataclass(frozen=True, slots=True)
class Fusion:
    """How a hybrid query combines its dense and sparse candidates (in the engine)."""

    method: Literal["rrf", "dbsf"] = "rrf"
    rrf_k: int = 60


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
            records, offset = self._scroll_page(where, page_size, offset, fields, with_vectors)
            yield from records
            if offset is None:
                return

    def retrieve(
        self, where: TenantFilter, ids: Sequence[str], *, with_vectors: bool = False
    ) -> list[StoredRecord]:
        """Points by id, dropping any that does not match the filter (another tenant's)."""
        if not ids or not self.collection_exists():
            return []
        records, _ = self._scroll_page(
            where.with_conditions(HasIds(tuple(ids))), len(ids), None, None, with_vectors
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
    ) -> list[ScoredRecord]:
        found = self._run_query(where, dense=vector, limit=limit, score_threshold=score_threshold)
        for record in found:
            if not math.isfinite(record.score) or abs(record.score) > _MAX_COSINE:
                raise StoreDamagedError(
                    f"{self.description}: point {record.id} scored {record.score:g}, which no "
                    "cosine similarity can be: the stored vectors are damaged. Rebuild the "
                    "index with `rag-pipeline ingest --rebuild`."
                )
        return found

    def query_sparse(
        self,
        where: TenantFilter,
        vector: SparseVector,
        *,
        limit: int,
        score_threshold: float | None = None,
    ) -> list[ScoredRecord]:
        if not vector.indices:
            return []
        found = self._run_query(where, sparse=vector, limit=limit, score_threshold=score_threshold)
        for record in found:
            if not math.isfinite(record.score):
                raise StoreDamagedError(
                    f"{self.description}: point {record.id} has a non-finite sparse score: the "
                    "stored vectors are damaged. Rebuild with `rag-pipeline ingest --rebuild`."
                )
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
    ) -> list[ScoredRecord]:
        """Dense and sparse candidates fused in the engine (RRF by default, or DBSF)."""
        # a damaged dense index would hide behind the fusion's rank scores: probe it first
        self.query_dense(where, dense, limit=1)
        return self._run_query(
            where,
            dense=dense,
            sparse=sparse if sparse.indices else None,
            limit=limit,
            prefetch_limit=prefetch_limit,
            fusion=fusion or Fusion(),
            score_threshold=score_threshold,
        )

    def _run_query(
        self,
        where: TenantFilter,
        *,
        limit: int,
        dense: np.ndarray | None = None,
        sparse: SparseVector | None = None,
        prefetch_limit: int = 0,
        fusion: Fusion | None = None,
        score_threshold: float | None = None,
    ) -> list[ScoredRecord]:
        if not self.collection_exists():
            return []
        dense32 = None if dense is None else np.asarray(dense, dtype=np.float32)
        return self._query(where, dense32, sparse, limit, prefetch_limit, fusion, score_threshold)

    # -- lifecycle --------------------------------------------------------------------------

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
    def _scroll_page(
        self,
        where: TenantFilter,
        limit: int,
        offset: Any,
        fields: Sequence[str] | None,
        with_vectors: bool,
    ) -> tuple[list[StoredRecord], Any]:
        """One page of matching points and the offset of the next page (None at the end)."""

    @abstractmethod
    def _query(
        self,
        where: TenantFilter,
        dense: np.ndarray | None,
        sparse: SparseVector | None,
        limit: int,
        prefetch_limit: int,
        fusion: Fusion | None,
        score_threshold: float | None,
    ) -> list[ScoredRecord]:
        """Nearest points to ``dense`` or ``sparse``; with ``fusion``, both as prefetches."""

    @abstractmethod
    def _facet(self, key: str, where: TenantFilter | None) -> list[tuple[str, int]]:
        """(value, point count) of every value of a keyword field (among matching points)."""


def batched(items: Sequence[Any], size: int = UPSERT_BATCH) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]

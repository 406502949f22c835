"""The vector store interface: one collection, named dense + sparse vectors, tenant filters."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from rag_pipeline.store.filters import TenantFilter

__all__ = [
    "DENSE_VECTOR",
    "PAYLOAD_INDEXES",
    "SPARSE_VECTOR",
    "UPSERT_BATCH",
    "CollectionSpec",
    "PointRecord",
    "ScoredRecord",
    "SparseVector",
    "StoreBusyError",
    "StoreError",
    "StoreUnavailableError",
    "StoredRecord",
    "VectorStore",
]

DENSE_VECTOR = "dense"
SPARSE_VECTOR = "sparse"
UPSERT_BATCH = 128

IndexType = Literal["keyword", "integer", "tenant"]

# Every field a filter, a change check or a lineage lookup uses is indexed.
PAYLOAD_INDEXES: dict[str, IndexType] = {
    "book_id": "tenant",
    "record_type": "keyword",
    "module": "keyword",
    "chapter": "integer",
    "lesson": "integer",
    "hardware_tier": "integer",
    "proficiency_level": "keyword",
    "tags": "keyword",
    "parent_doc_id": "keyword",
    "source_file": "keyword",
    "source_file_hash": "keyword",
    "content_hash": "keyword",
    "embedding_model": "keyword",
}


class StoreError(RuntimeError):
    """The vector store refused or failed an operation."""


class StoreBusyError(StoreError):
    """The embedded store's folder is held by another process (a run, the UI, a CLI)."""


class StoreUnavailableError(StoreError):
    """The Qdrant server cannot be reached."""


@dataclass(frozen=True, slots=True)
class SparseVector:
    indices: tuple[int, ...]
    values: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class PointRecord:
    """A point to write: an id, optional vectors (documents records have none) and payload."""

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
    shard_number: int | None = None
    replication_factor: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class VectorStore(ABC):
    """One Qdrant collection behind a backend-neutral, tenant-safe API."""

    collection: str
    #: what a user should read in the README and error messages, e.g. "qdrant-client (path)".
    description: str

    @abstractmethod
    def ensure_collection(self, spec: CollectionSpec) -> None:
        """Create the collection with its vectors and payload indexes, or check it matches."""

    @abstractmethod
    def collection_exists(self) -> bool: ...

    @abstractmethod
    def dense_dimension(self) -> int | None:
        """Size of the dense vector of the existing collection, or None if there is none."""

    @abstractmethod
    def upsert(self, points: Sequence[PointRecord]) -> int:
        """Write points (in batches); returns how many were written."""

    @abstractmethod
    def delete_ids(self, where: TenantFilter, ids: Sequence[str]) -> int:
        """Delete the given ids, but only those that belong to ``where.book_id``."""

    @abstractmethod
    def delete_where(self, where: TenantFilter) -> int:
        """Delete every point matching the filter (always within one book)."""

    @abstractmethod
    def scroll(
        self,
        where: TenantFilter,
        *,
        fields: Sequence[str] | None = None,
        with_vectors: bool = False,
        page_size: int = 1024,
    ) -> Iterator[StoredRecord]:
        """Every point matching the filter; ``fields`` limits the payload returned."""

    @abstractmethod
    def retrieve(
        self, where: TenantFilter, ids: Sequence[str], *, with_vectors: bool = False
    ) -> list[StoredRecord]:
        """Points by id, dropping any that does not match the filter (another book's)."""

    @abstractmethod
    def count(self, where: TenantFilter) -> int: ...

    @abstractmethod
    def query_dense(
        self,
        where: TenantFilter,
        vector: np.ndarray,
        *,
        limit: int,
        score_threshold: float | None = None,
    ) -> list[ScoredRecord]: ...

    @abstractmethod
    def query_sparse(
        self,
        where: TenantFilter,
        vector: SparseVector,
        *,
        limit: int,
        score_threshold: float | None = None,
    ) -> list[ScoredRecord]: ...

    @abstractmethod
    def query_hybrid(
        self,
        where: TenantFilter,
        dense: np.ndarray,
        sparse: SparseVector,
        *,
        limit: int,
        prefetch_limit: int,
        rrf_k: int = 60,
        score_threshold: float | None = None,
    ) -> list[ScoredRecord]:
        """Dense and sparse candidates fused with reciprocal rank fusion."""

    @abstractmethod
    def book_ids(self) -> list[str]:
        """Books that have at least one point (facet on the tenant key)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the client, its files and locks."""

    def __enter__(self) -> VectorStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def batched(items: Sequence[Any], size: int = UPSERT_BATCH) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]

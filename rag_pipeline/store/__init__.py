"""Vector stores behind one tenant-safe interface, chosen by settings."""

from __future__ import annotations

from rag_pipeline.config import Settings
from rag_pipeline.store.base import (
    DENSE_VECTOR,
    PAYLOAD_INDEXES,
    SPARSE_VECTOR,
    CollectionSpec,
    PointRecord,
    ScoredRecord,
    SparseVector,
    StoreBusyError,
    StoredRecord,
    StoreError,
    StoreUnavailableError,
    VectorStore,
)
from rag_pipeline.store.filters import SearchFilters, TenantFilter, tenant_filter

__all__ = [
    "DENSE_VECTOR",
    "PAYLOAD_INDEXES",
    "SPARSE_VECTOR",
    "CollectionSpec",
    "PointRecord",
    "ScoredRecord",
    "SearchFilters",
    "SparseVector",
    "StoreBusyError",
    "StoreError",
    "StoreUnavailableError",
    "StoredRecord",
    "TenantFilter",
    "VectorStore",
    "open_store",
    "tenant_filter",
]


def open_store(settings: Settings) -> VectorStore:
    """The store the settings describe: a server URL wins, then ``:memory:``, then a folder."""
    api_key = settings.qdrant_api_key.get_secret_value() if settings.qdrant_api_key else None
    if settings.qdrant_url:
        from rag_pipeline.store.qdrant import QdrantStore

        return QdrantStore(
            settings.collection,
            url=settings.qdrant_url,
            api_key=api_key,
            timeout_s=settings.qdrant_timeout_s,
            retries=settings.qdrant_retries,
            shards=settings.qdrant_shards,
            replication_factor=settings.qdrant_replication_factor,
        )
    if settings.qdrant_embedded == "edge" and settings.qdrant_path != ":memory:":
        from rag_pipeline.store.edge import EdgeStore

        return EdgeStore(settings.collection, settings.qdrant_path)
    from rag_pipeline.store.qdrant import QdrantStore

    return QdrantStore(settings.collection, path=settings.qdrant_path)

"""The store backends, each stated once: which configurations it serves, how it opens, how a
collection is taken out of service, and what it can do beyond the core contract.

:func:`backend_of` picks the first that serves a configuration: a server URL wins, then an
embedded Qdrant Edge folder, then qdrant-client (a local folder, or ``:memory:``). A new
backend is one :class:`Backend` in :data:`BACKENDS`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rag_pipeline.config import StoreConfig
from rag_pipeline.store.base import CollectionSchema, VectorStore

__all__ = ["BACKENDS", "CLIENT", "EDGE_FOLDER", "SERVER", "Backend", "backend_of"]


@dataclass(frozen=True)
class Backend:
    """One kind of store."""

    name: str
    serves: Callable[[StoreConfig], bool]
    open: Callable[[StoreConfig, CollectionSchema], VectorStore]
    #: takes the collection out of service (renamed and kept, or deleted); says what it did
    set_aside: Callable[[StoreConfig], str]
    #: its handles build a book's new recipe beside the searched index (they implement
    #: :class:`~rag_pipeline.store.capabilities.Generations`); else recipes change in place
    generations: bool = False
    #: ``ingest --rebuild`` builds a whole new collection beside the one in service and swaps
    #: it in (else the collection is set aside, then rebuilt in its place)
    rebuilds_beside: bool = False


def _open_server(config: StoreConfig, schema: CollectionSchema) -> VectorStore:
    from rag_pipeline.store.qdrant import QdrantStore

    return QdrantStore(
        config.collection,
        schema,
        url=config.url,
        api_key=config.api_key,
        timeout_s=config.timeout_s,
        retries=config.retries,
        shards=config.shards,
        replication_factor=config.replication_factor,
    )


def _open_client(config: StoreConfig, schema: CollectionSchema) -> VectorStore:
    from rag_pipeline.store.qdrant import QdrantStore

    return QdrantStore(config.collection, schema, path=config.path, busy_wait_s=config.busy_wait_s)


def _drop_collection(config: StoreConfig) -> str:
    """A server's or qdrant-client's collection deleted (nothing of it can be kept aside)."""
    from rag_pipeline.store.qdrant import QdrantStore

    store = backend_of(config).open(config, CollectionSchema(tenant_field=""))
    assert isinstance(store, QdrantStore)
    try:
        store.drop_collection()
    finally:
        store.close()
    return f"deleted collection {config.collection!r} from {store.description}"


def _open_edge(config: StoreConfig, schema: CollectionSchema) -> VectorStore:
    from rag_pipeline.store.edge import EdgeStore

    return EdgeStore(
        config.collection,
        config.path,
        schema,
        busy_wait_s=config.busy_wait_s,
        loaded_books=config.loaded_books,
    )


def _set_aside_edge_folder(config: StoreConfig) -> str:
    """The collection's folder renamed (kept for inspection) under every lock of the store."""
    from rag_pipeline.store.edge import whole_store_locked

    root = Path(config.path)
    folder = root / config.collection
    with whole_store_locked(root, config.collection, config.busy_wait_s):
        if not folder.exists():
            return f"nothing to set aside: {folder} does not exist"
        target = folder.with_name(f"{folder.name}.set-aside-{time.strftime('%Y%m%d-%H%M%S')}")
        folder.rename(target)
    return f"moved {folder} to {target}"


SERVER = Backend("server", lambda config: bool(config.url), _open_server, _drop_collection)
EDGE_FOLDER = Backend(
    "edge",
    lambda config: config.embedded == "edge" and config.path != ":memory:",
    _open_edge,
    _set_aside_edge_folder,
    generations=True,
    rebuilds_beside=True,
)
CLIENT = Backend("client", lambda config: True, _open_client, _drop_collection)

#: in the order they are asked: the first that serves a configuration opens it
BACKENDS = (SERVER, EDGE_FOLDER, CLIENT)


def backend_of(config: StoreConfig) -> Backend:
    """The backend that serves ``config``."""
    return next(backend for backend in BACKENDS if backend.serves(config))

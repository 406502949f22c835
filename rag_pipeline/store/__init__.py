"""Vector stores behind one tenant-safe interface, chosen by a :class:`StoreConfig`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rag_pipeline.config import StoreConfig
from rag_pipeline.store import base as _base
from rag_pipeline.store import filters as _filters
from rag_pipeline.store.base import *  # noqa: F403 - re-exported: its __all__ is the API
from rag_pipeline.store.base import CollectionSchema, StorePathError, VectorStore
from rag_pipeline.store.filters import *  # noqa: F403 - re-exported: its __all__ is the API

__all__ = [*_base.__all__, *_filters.__all__, "open_store", "set_aside"]


def open_store(config: StoreConfig, schema: CollectionSchema) -> VectorStore:
    """The store the config describes: a server URL wins, then ``:memory:``, then a folder.

    An embedded folder is locked for as long as the handle is open (waiting up to
    ``config.busy_wait_s`` for another process), so keep handles short."""
    if config.url:
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
    with _named_path(config):
        if config.embedded == "edge" and config.path != ":memory:":
            from rag_pipeline.store.edge import EdgeStore

            return EdgeStore(
                config.collection,
                config.path,
                schema,
                busy_wait_s=config.busy_wait_s,
                loaded_books=config.loaded_books,
            )
        from rag_pipeline.store.qdrant import QdrantStore

        return QdrantStore(
            config.collection, schema, path=config.path, busy_wait_s=config.busy_wait_s
        )


@contextmanager
def _named_path(config: StoreConfig) -> Iterator[None]:
    """A store folder that cannot be created or locked is a setting to fix: say which."""
    try:
        yield
    except StorePathError as exc:
        raise StorePathError(
            f"RAG_QDRANT_PATH={config.path!r} cannot hold the embedded store: {exc}. "
            "Point it at a writable folder (or :memory:), or use RAG_QDRANT_URL."
        ) from None


def set_aside(config: StoreConfig) -> str:
    """Take the collection out of service so that it can be rebuilt from the books: a Qdrant
    Edge folder is renamed (kept for inspection), any other collection is deleted. Returns
    what was done, for the user."""
    import time
    from pathlib import Path

    if config.embedded == "edge" and not config.url and config.path != ":memory:":
        from rag_pipeline.store.edge import book_locks, layout_lock
        from rag_pipeline.store.lock import LockGroup

        root = Path(config.path)
        folder = root / config.collection
        held = LockGroup()
        try:
            # the layout lock, then every book's: no handle reads or writes a book meanwhile
            for lock in [layout_lock(root, config.collection), *book_locks(folder)]:
                with _named_path(config):
                    lock.acquire(config.busy_wait_s)
                held.add(lock)
            if not folder.exists():
                return f"nothing to set aside: {folder} does not exist"
            target = folder.with_name(f"{folder.name}.set-aside-{time.strftime('%Y%m%d-%H%M%S')}")
            folder.rename(target)
        finally:
            held.release()
        return f"moved {folder} to {target}"
    from rag_pipeline.store.qdrant import QdrantStore

    store = open_store(config, CollectionSchema(tenant_field=""))
    assert isinstance(store, QdrantStore)
    try:
        store.drop_collection()
    finally:
        store.close()
    return f"deleted collection {config.collection!r} from {store.description}"

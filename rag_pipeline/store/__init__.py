"""Vector stores behind one tenant-safe interface, chosen by a :class:`StoreConfig`."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from rag_pipeline.config import StoreConfig
from rag_pipeline.store import base as _base
from rag_pipeline.store import filters as _filters
from rag_pipeline.store.backends import backend_of
from rag_pipeline.store.base import *  # noqa: F403 - re-exported: its __all__ is the API
from rag_pipeline.store.base import CollectionSchema, StorePathError, VectorStore
from rag_pipeline.store.filters import *  # noqa: F403 - re-exported: its __all__ is the API

__all__ = [
    *_base.__all__,
    *_filters.__all__,
    "backend_of",
    "holds_nothing",
    "open_empty_store",
    "open_store",
    "rebuilding_beside",
    "set_aside",
    "swap_in_rebuilt",
]


def open_store(config: StoreConfig, schema: CollectionSchema) -> VectorStore:
    """The store the config describes (see :func:`~.backends.backend_of`: a server URL wins,
    then a Qdrant Edge folder, then qdrant-client's folder or ``:memory:``).

    An embedded folder is locked for as long as the handle is open (waiting up to
    ``config.busy_wait_s`` for another process), so keep handles short."""
    with _named_path(config):
        return backend_of(config).open(config, schema)


def holds_nothing(config: StoreConfig) -> bool:
    """An embedded folder that holds no collection yet (never ingested into: the folder, or
    the collection's, does not exist) where one could be made. A read-only command answers
    it as an empty store (:func:`open_empty_store`) instead of opening it, which creates the
    folders and locks. A path that cannot hold a store (below a file, in a folder this
    process cannot write, on a file system without blocks such as /proc) is opened as
    before, to be refused naming RAG_QDRANT_PATH."""
    backend = backend_of(config)
    if backend.name == "server" or config.path == ":memory:":
        return False
    root = Path(config.path)
    folder = root / config.collection if backend.name == "edge" else root
    if folder.exists() or (root.exists() and not root.is_dir()):
        return False
    existing = root if root.exists() else next(p for p in root.absolute().parents if p.exists())
    try:
        blocks = os.statvfs(existing).f_blocks
    except OSError:
        return False
    return existing.is_dir() and os.access(existing, os.W_OK | os.X_OK) and blocks > 0


def open_empty_store(config: StoreConfig, schema: CollectionSchema) -> VectorStore:
    """A store holding nothing, in memory (nothing is written anywhere): what a reader of a
    store that :func:`holds_nothing` reads."""
    return open_store(replace(config, url=None, path=":memory:", embedded="client"), schema)


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
    """Take the collection out of service so that it can be rebuilt from the books (its
    backend's way: a Qdrant Edge folder is renamed and kept, any other collection is deleted).
    Returns what was done, for the user."""
    with _named_path(config):
        return backend_of(config).set_aside(config)


@contextmanager
def rebuilding_beside(config: StoreConfig) -> Iterator[StoreConfig]:
    """The config of an empty store beside the Qdrant Edge folder ``config`` names, for a
    rebuild to fill while searches keep answering from the folder in service; one rebuild at
    a time (a lock held for the block). Then :func:`swap_in_rebuilt`."""
    from rag_pipeline.store.edge import clear_rebuild_root, rebuild_lock

    root = Path(config.path)
    lock = rebuild_lock(root, config.collection)
    with _named_path(config):
        lock.acquire(config.busy_wait_s)
    try:
        with _named_path(config):
            staged = clear_rebuild_root(root, config.collection, config.busy_wait_s)
        yield replace(config, path=str(staged))
    finally:
        lock.release()


def swap_in_rebuilt(config: StoreConfig) -> str:
    """The complete rebuild put in service in one rename (see :func:`rebuilding_beside`)."""
    from rag_pipeline.store import edge

    return edge.swap_in_rebuilt(Path(config.path), config.collection, config.busy_wait_s)

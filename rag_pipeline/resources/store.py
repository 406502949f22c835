"""Dagster resource for the vector store: a Qdrant server, an embedded folder, or memory."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from dagster import ConfigurableResource
from pydantic import Field

from rag_pipeline.config import load_settings
from rag_pipeline.store import StoreBusyError, VectorStore, open_store

__all__ = ["QdrantStoreResource", "shared_store"]

_lock = threading.Lock()
_open: dict[tuple, tuple[VectorStore, int]] = {}


@contextmanager
def shared_store(key: tuple, factory, wait_s: float = 0.0) -> Iterator[VectorStore]:  # type: ignore[no-untyped-def]
    """One open store per configuration per process, reference-counted.

    The embedded store locks its folder and loads its points on open, so every step of every
    run in a process shares one handle; the last user closes it and releases the lock.
    """
    with _lock:
        entry = _open.get(key)
        if entry is None:
            deadline = time.monotonic() + wait_s
            while True:
                try:
                    store = factory()
                    break
                except StoreBusyError:
                    if time.monotonic() >= deadline:
                        raise
                    time.sleep(0.5)
            entry = (store, 0)
        _open[key] = (entry[0], entry[1] + 1)
    try:
        yield entry[0]
    finally:
        with _lock:
            store, refs = _open[key]
            if refs <= 1:
                del _open[key]
                store.close()
            else:
                _open[key] = (store, refs - 1)


class QdrantStoreResource(ConfigurableResource):
    """Where points live. ``url`` (a Qdrant server) wins; else ``path`` (``:memory:`` allowed)."""

    collection: str = Field("rag_chunks", description="Qdrant collection name")
    path: str = Field(".rag/qdrant", description="embedded store folder, or :memory:")
    url: str | None = Field(None, description="Qdrant server URL; overrides path")
    api_key: str | None = Field(None, description="Qdrant server API key")
    embedded: str = Field("client", description="embedded engine: client (qdrant-client "
                          "local mode) or edge (Qdrant Edge)")
    busy_wait_s: float = Field(60.0, description="how long to wait for a busy embedded store")

    @property
    def target(self) -> str:
        return self.url or (f"{self.embedded}:{self.path}")

    @contextmanager
    def open(self) -> Iterator[VectorStore]:
        settings = load_settings(
            collection=self.collection, qdrant_path=self.path, qdrant_url=self.url,
            qdrant_api_key=self.api_key, qdrant_embedded=self.embedded)
        key = (self.collection, self.path, self.url, self.embedded)
        with shared_store(key, lambda: open_store(settings), self.busy_wait_s) as store:
            yield store

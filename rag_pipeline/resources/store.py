"""Dagster resource for the vector store: a Qdrant server, an embedded folder, or memory."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from dagster import ConfigurableResource
from pydantic import Field

from rag_pipeline.config import load_settings
from rag_pipeline.store import VectorStore, open_store
from rag_pipeline.store.sharing import shared_store, store_key

__all__ = ["QdrantStoreResource"]


class QdrantStoreResource(ConfigurableResource):
    """Where points live. ``url`` (a Qdrant server) wins; else ``path`` (``:memory:`` allowed)."""

    collection: str = Field("rag_chunks", description="Qdrant collection name")
    path: str = Field(".rag/qdrant", description="embedded store folder, or :memory:")
    url: str | None = Field(None, description="Qdrant server URL; overrides path")
    api_key: str | None = Field(None, description="Qdrant server API key")
    embedded: str = Field(
        "edge",
        description="embedded engine: client (qdrant-client local mode) or edge (Qdrant Edge)",
    )
    busy_wait_s: float = Field(30.0, description="how long to wait for a busy embedded store")

    @property
    def target(self) -> str:
        return self.url or (f"{self.embedded}:{self.path}")

    @contextmanager
    def open(self) -> Iterator[VectorStore]:
        settings = load_settings(
            collection=self.collection,
            qdrant_path=self.path,
            qdrant_url=self.url,
            qdrant_api_key=self.api_key,
            qdrant_embedded=self.embedded,
        )
        key = store_key(self.collection, self.path, self.url, self.embedded)
        with shared_store(key, lambda: open_store(settings), self.busy_wait_s) as store:
            yield store

"""The vector store: a Qdrant server, an embedded folder, or memory."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Literal

from dagster import ConfigurableResource
from pydantic import Field

from rag_pipeline.config import Settings, StoreConfig
from rag_pipeline.schema import COLLECTION_SCHEMA
from rag_pipeline.store import VectorStore, open_store
from rag_pipeline.store.sharing import shared_store, store_key

__all__ = ["QdrantStoreResource"]


# Dagster types ConfigurableResource as generic in its own value type, but subclasses are
# declared unparametrized (as its docs do): a parametrized base changes its pydantic model.
class QdrantStoreResource(ConfigurableResource):  # type: ignore[type-arg]
    """Where points live. ``url`` (a Qdrant server) wins; else ``path`` (``:memory:`` allowed).

    An embedded folder is locked while a step has it open, so every step opens it for its own
    store work only: searches and other runs get in between (while a step embeds, say)."""

    collection: str = Field(description="Qdrant collection name (RAG_COLLECTION)")
    path: str = Field(description="embedded store folder, or :memory: (RAG_QDRANT_PATH)")
    url: str | None = Field(description="Qdrant server URL; overrides path (RAG_QDRANT_URL)")
    api_key: str | None = Field(description="Qdrant server API key")
    embedded: Literal["client", "edge"] = Field(description="embedded engine: edge or client")
    busy_wait_s: float = Field(description="how long to wait for a store another process holds")
    timeout_s: float = Field(description="server call timeout")
    retries: int = Field(description="server call attempts")
    shards: int | None = Field(description="shards of a new collection on a cluster")
    replication_factor: int | None = Field(description="replicas of a new collection")

    @classmethod
    def from_settings(cls, settings: Settings) -> QdrantStoreResource:
        c = settings.store()
        return cls(
            collection=c.collection,
            path=c.path,
            url=c.url,
            api_key=c.api_key,
            embedded=c.embedded,
            busy_wait_s=c.busy_wait_s,
            timeout_s=c.timeout_s,
            retries=c.retries,
            shards=c.shards,
            replication_factor=c.replication_factor,
        )

    def config(self) -> StoreConfig:
        return StoreConfig(
            collection=self.collection,
            path=self.path,
            url=self.url,
            api_key=self.api_key,
            embedded=self.embedded,
            busy_wait_s=self.busy_wait_s,
            timeout_s=self.timeout_s,
            retries=self.retries,
            shards=self.shards,
            replication_factor=self.replication_factor,
        )

    @property
    def description(self) -> str:
        return f"collection {self.collection!r} on {self.config().target}"

    @contextmanager
    def open(self, busy_wait_s: float | None = None) -> Iterator[VectorStore]:
        """The store, for one step's work; ``busy_wait_s`` overrides how long to wait for an
        embedded folder another process holds (a sensor tick waits less than a run)."""
        config = self.config()
        if busy_wait_s is not None:
            config = replace(config, busy_wait_s=busy_wait_s)
        with shared_store(
            store_key(config), lambda: open_store(config, COLLECTION_SCHEMA)
        ) as store:
            yield store

"""The vector store: a Qdrant server, an embedded folder, or memory, opened per step."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from rag_pipeline.config import StoreConfig
from rag_pipeline.schema import COLLECTION_SCHEMA
from rag_pipeline.store import VectorStore, open_store
from rag_pipeline.store.sharing import shared_store, store_key

__all__ = ["StoreOpener"]


@dataclass(frozen=True)
class StoreOpener:
    """Where points live. An embedded folder is locked while a step has it open, so every step
    opens it for its own store work only: searches and other runs get in between (while a step
    embeds, say)."""

    config: StoreConfig

    @property
    def collection(self) -> str:
        return self.config.collection

    @property
    def busy_wait_s(self) -> float:
        return self.config.busy_wait_s

    @property
    def description(self) -> str:
        return f"collection {self.collection!r} on {self.config.target}"

    @contextmanager
    def open(self, busy_wait_s: float | None = None) -> Iterator[VectorStore]:
        """The store, for one step's work; ``busy_wait_s`` overrides how long to wait for an
        embedded folder another process holds (a sensor tick waits less than a run)."""
        config = self.config
        if busy_wait_s is not None:
            config = replace(config, busy_wait_s=busy_wait_s)
        with shared_store(
            store_key(config), lambda: open_store(config, COLLECTION_SCHEMA)
        ) as store:
            yield store

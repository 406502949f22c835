"""The vector store: a Qdrant server, an embedded folder, or memory, opened per step."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from rag_pipeline.config import StoreConfig
from rag_pipeline.recipes.recipe import IndexRecipe
from rag_pipeline.schema import COLLECTION_SCHEMA
from rag_pipeline.store import CollectionSpec, VectorStore, backend_of, open_store
from rag_pipeline.store.sharing import shared_store, store_key

__all__ = ["StoreOpener"]


@dataclass(frozen=True)
class StoreOpener:
    """Where points live. An embedded folder is locked while a step has it open, so every step
    opens it for its own store work only: searches and other runs get in between (while a step
    embeds, say). A run keeps its handles open from step to step until another process waits
    for them (:func:`~rag_pipeline.store.sharing.kept_open`, the run's resource)."""

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
    def open(
        self, busy_wait_s: float | None = None, *, recipe: IndexRecipe | None = None
    ) -> Iterator[VectorStore]:
        """The store, for one step's work; ``busy_wait_s`` overrides how long to wait for an
        embedded folder another process holds (a sensor tick waits less than a run).

        ``recipe``: the book's recipe, for the steps of a run. The handle is then a *builder*
        of it (:meth:`VectorStore.ensure_collection` with its tag): a book indexed with
        another recipe is read and written in a generation beside the searched one, until the
        run switches it. A builder is its own handle, never the readers' shared one: a search
        in the same process keeps reading the searched generation."""
        config = self.config
        if busy_wait_s is not None:
            config = replace(config, busy_wait_s=busy_wait_s)
        if recipe is None or not backend_of(config).generations:
            # a store without generations writes every recipe in place: a builder is its
            # reader (and a second handle of memory would be another, empty store)
            key, factory = store_key(config), lambda: open_store(config, COLLECTION_SCHEMA)
        else:
            key, factory = (
                (store_key(config), "builder", recipe.signature),
                _builder(config, recipe),
            )
        with shared_store(key, factory, group=store_key(config)) as store:
            yield store


def _builder(config: StoreConfig, recipe: IndexRecipe) -> Callable[[], VectorStore]:
    def open_builder() -> VectorStore:
        store = open_store(config, COLLECTION_SCHEMA)
        try:
            store.ensure_collection(
                CollectionSpec(config.collection, recipe.dimension, recipe=recipe.tag())
            )
        except BaseException:
            store.close()
            raise
        return store

    return open_builder

"""The index recipe (the embedder, the chunk budget, the sparse encoder), built once per
process, on first use: loading a model costs seconds a sensor tick or a purge never needs."""

from __future__ import annotations

import threading

from rag_pipeline.config import ChunkingConfig, EmbedderConfig
from rag_pipeline.embed import create_embedder
from rag_pipeline.ingest.recipe import IndexRecipe

__all__ = ["LazyRecipe"]


class LazyRecipe:
    """Which embedding model turns chunks into vectors, and the chunk budget it reads."""

    def __init__(
        self, embedding: EmbedderConfig, chunking: ChunkingConfig, recipe: IndexRecipe | None
    ) -> None:
        self.embedding = embedding
        self.chunking = chunking
        self._recipe = recipe
        self._lock = threading.Lock()

    @property
    def provider(self) -> str:
        return self.embedding.provider

    @property
    def description(self) -> str:
        return f"{self.provider} embedder, chunk budget {self.chunking.target_tokens}"

    def get(self) -> IndexRecipe:
        """The recipe, built on first use (loading the model) and kept for the process."""
        with self._lock:
            if self._recipe is None:
                self._recipe = IndexRecipe.build(create_embedder(self.embedding), self.chunking)
            return self._recipe

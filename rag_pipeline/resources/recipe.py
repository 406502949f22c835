"""The index recipe: the embedder (local model, OpenAI or the test hash), the chunk budget and
the sparse encoder, built once per process."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Literal

from dagster import ConfigurableResource
from pydantic import Field, PrivateAttr

from rag_pipeline.config import ChunkingConfig, EmbedderConfig, Settings
from rag_pipeline.embed import create_embedder
from rag_pipeline.ingest.recipe import IndexRecipe

__all__ = ["IndexRecipeResource"]


# Dagster types ConfigurableResource as generic in its own value type, but subclasses are
# declared unparametrized (as its docs do): a parametrized base changes its pydantic model.
class IndexRecipeResource(ConfigurableResource):  # type: ignore[type-arg]
    """Which embedding model turns chunks into vectors, and the chunk budget it reads."""

    provider: Literal["local", "openai", "hash"] = Field(description="RAG_EMBEDDER")
    local_model_dir: str | None = Field(description="sentence-transformers BERT folder")
    cache_dir: str = Field(description="where the built ONNX graph is cached")
    batch_size: int = Field(description="texts per local model batch")
    openai_api_key: str | None = Field(description="OpenAI API key (provider=openai)")
    openai_model: str = Field(description="OpenAI embedding model")
    openai_base_url: str | None = Field(description="OpenAI-compatible endpoint")
    openai_max_retries: int = Field(description="client retries on 429/5xx/timeouts")
    openai_timeout_s: float = Field(description="OpenAI request timeout")
    local_precision: Literal["fp32", "int8", "auto"] = Field(description="RAG_LOCAL_PRECISION")
    openai_concurrency: int = Field(description="OpenAI requests in flight at once")
    openai_requests_per_minute: int | None = Field(description="client-side request limit")
    openai_tokens_per_minute: int | None = Field(description="client-side token limit")
    chunk_target_tokens: int = Field(description="RAG_CHUNK_TARGET_TOKENS")
    chunk_max_tokens: int = Field(description="RAG_CHUNK_MAX_TOKENS")
    chunk_min_tokens: int = Field(description="RAG_CHUNK_MIN_TOKENS")
    chunk_overlap: float = Field(description="RAG_CHUNK_OVERLAP")

    _recipe: IndexRecipe | None = PrivateAttr(default=None)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @classmethod
    def from_settings(
        cls, settings: Settings, recipe: IndexRecipe | None = None
    ) -> IndexRecipeResource:
        """The resource for ``settings``; ``recipe`` is one already built from them."""
        e = settings.embedding()
        c = settings.chunking()
        resource = cls(
            provider=e.provider,
            local_model_dir=str(e.local_model_dir) if e.local_model_dir else None,
            cache_dir=str(e.cache_dir),
            batch_size=e.batch_size,
            openai_api_key=e.openai_api_key,
            openai_model=e.openai_model,
            openai_base_url=e.openai_base_url,
            openai_max_retries=e.openai_max_retries,
            openai_timeout_s=e.openai_timeout_s,
            local_precision=e.local_precision,
            openai_concurrency=e.openai_concurrency,
            openai_requests_per_minute=e.openai_requests_per_minute,
            openai_tokens_per_minute=e.openai_tokens_per_minute,
            chunk_target_tokens=c.target_tokens,
            chunk_max_tokens=c.max_tokens,
            chunk_min_tokens=c.min_tokens,
            chunk_overlap=c.overlap,
        )
        resource._recipe = recipe
        return resource

    def embedder_config(self) -> EmbedderConfig:
        return EmbedderConfig(
            provider=self.provider,
            local_model_dir=Path(self.local_model_dir) if self.local_model_dir else None,
            cache_dir=Path(self.cache_dir),
            batch_size=self.batch_size,
            openai_api_key=self.openai_api_key,
            openai_base_url=self.openai_base_url,
            openai_model=self.openai_model,
            openai_timeout_s=self.openai_timeout_s,
            openai_max_retries=self.openai_max_retries,
            local_precision=self.local_precision,
            openai_concurrency=self.openai_concurrency,
            openai_requests_per_minute=self.openai_requests_per_minute,
            openai_tokens_per_minute=self.openai_tokens_per_minute,
        )

    def chunking(self) -> ChunkingConfig:
        return ChunkingConfig(
            self.chunk_target_tokens,
            self.chunk_max_tokens,
            self.chunk_min_tokens,
            self.chunk_overlap,
        )

    def get(self) -> IndexRecipe:
        """The recipe, built on first use (loading the model) and kept for the process."""
        with self._lock:
            if self._recipe is None:
                self._recipe = IndexRecipe.build(
                    create_embedder(self.embedder_config()), self.chunking()
                )
            return self._recipe

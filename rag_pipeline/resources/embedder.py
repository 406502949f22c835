"""Dagster resource for the embedder: local model (default), OpenAI, or the test hash."""

from __future__ import annotations

import threading

from dagster import ConfigurableResource
from pydantic import Field

from rag_pipeline.config import load_settings
from rag_pipeline.embed import Embedder, create_embedder

__all__ = ["EmbedderResource"]

_lock = threading.Lock()
_cache: dict[tuple, Embedder] = {}


class EmbedderResource(ConfigurableResource):
    """Which embedding model turns chunks into vectors (loaded once per process)."""

    provider: str = Field("local", description="local | openai | hash")
    local_model_dir: str | None = Field(
        None, description="sentence-transformers BERT folder; default: the bundled all-MiniLM-L6-v2"
    )
    cache_dir: str = Field(".rag/cache", description="where the built ONNX graph is cached")
    batch_size: int = Field(32, description="texts per local model batch")
    openai_api_key: str | None = Field(None, description="OpenAI API key (provider=openai)")
    openai_model: str = Field("text-embedding-3-small")
    openai_base_url: str | None = Field(None, description="OpenAI-compatible endpoint")
    openai_max_retries: int = Field(5, description="client retries on 429/5xx/timeouts")
    openai_timeout_s: float = Field(30.0)

    def get(self) -> Embedder:
        key = tuple(sorted(self.model_dump().items()))
        with _lock:
            embedder = _cache.get(key)
            if embedder is None:
                settings = load_settings(
                    embedder=self.provider,
                    local_model_dir=self.local_model_dir,
                    cache_dir=self.cache_dir,
                    embed_batch_size=self.batch_size,
                    openai_api_key=self.openai_api_key,
                    openai_model=self.openai_model,
                    openai_base_url=self.openai_base_url,
                    openai_max_retries=self.openai_max_retries,
                    openai_timeout_s=self.openai_timeout_s,
                )
                embedder = _cache[key] = create_embedder(settings)
            return embedder

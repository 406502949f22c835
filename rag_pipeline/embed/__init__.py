"""Embedding providers behind one interface: ``local`` (default), ``openai`` and ``hash``."""

from __future__ import annotations

from rag_pipeline.config import EmbedderConfig
from rag_pipeline.embed import base as _base
from rag_pipeline.embed.base import *  # noqa: F403 - re-exported: its __all__ is the API
from rag_pipeline.embed.base import Embedder

__all__ = [*_base.__all__, "create_embedder"]


def create_embedder(config: EmbedderConfig) -> Embedder:
    """The provider ``config.provider`` names, configured from it."""
    if config.provider == "hash":
        from rag_pipeline.embed.hashing import HashEmbedder

        return HashEmbedder()
    if config.provider == "openai":
        from rag_pipeline.embed.openai import OpenAIEmbedder

        return OpenAIEmbedder(
            config.openai_api_key,
            model=config.openai_model,
            base_url=config.openai_base_url,
            max_retries=config.openai_max_retries,
            timeout_s=config.openai_timeout_s,
            concurrency=config.openai_concurrency,
            requests_per_minute=config.openai_requests_per_minute,
            tokens_per_minute=config.openai_tokens_per_minute,
        )
    from rag_pipeline.embed.local import LocalEmbedder

    return LocalEmbedder(
        config.local_model_dir,
        batch_size=config.batch_size,
        cache_dir=config.cache_dir / "models",
        precision=config.local_precision,
    )

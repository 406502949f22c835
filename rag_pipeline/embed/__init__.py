"""Embedding providers behind one interface: ``local`` (default), ``openai`` and ``hash``."""

from __future__ import annotations

from rag_pipeline.config import Settings
from rag_pipeline.embed.base import (
    Embedder,
    EmbedError,
    RegexTokenCounter,
    TokenCounter,
)

__all__ = [
    "EmbedError",
    "Embedder",
    "RegexTokenCounter",
    "TokenCounter",
    "create_embedder",
]


def create_embedder(settings: Settings) -> Embedder:
    """The provider ``settings.embedder`` names, configured from settings."""
    if settings.embedder == "hash":
        from rag_pipeline.embed.hashing import HashEmbedder

        return HashEmbedder()
    if settings.embedder == "openai":
        from rag_pipeline.embed.openai import OpenAIEmbedder

        key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else None
        return OpenAIEmbedder(
            key,
            model=settings.openai_model,
            base_url=settings.openai_base_url,
            max_retries=settings.openai_max_retries,
            timeout_s=settings.openai_timeout_s,
            concurrency=settings.openai_concurrency,
            requests_per_minute=settings.openai_requests_per_minute,
            tokens_per_minute=settings.openai_tokens_per_minute,
        )
    from rag_pipeline.embed.local import LocalEmbedder

    return LocalEmbedder(
        settings.local_model_dir,
        batch_size=settings.embed_batch_size,
        cache_dir=settings.cache_dir / "models",
        precision=settings.local_precision,
    )

"""Embedding providers behind one interface: ``local`` (default), ``openai`` and ``hash``."""

from __future__ import annotations

import re
from dataclasses import replace

from rag_pipeline.config import EmbedderConfig
from rag_pipeline.embed import base as _base
from rag_pipeline.embed.base import *  # noqa: F403 - re-exported: its __all__ is the API
from rag_pipeline.embed.base import Embedder

__all__ = [
    *_base.__all__,
    "config_for_model",
    "create_embedder",
    "model_names",
    "usd_per_million_tokens",
]

#: the precisions the local model is produced at (``auto`` picks one of them)
LOCAL_PRECISIONS = ("fp32", "int8")


def model_names(config: EmbedderConfig) -> dict[str, str | None]:
    """Every ``embedding_model`` name the configured provider can embed with, each with the
    local precision that produces it (None for the other providers), without loading a
    model: the local model at both precisions, else the one configured model."""
    if config.provider == "hash":
        from rag_pipeline.embed.hashing import HashEmbedder

        return {HashEmbedder(config.hash_dimension).model_name: None}
    if config.provider == "openai":
        return {config.openai_model: None}
    from rag_pipeline.embed.local import local_model_name

    return {local_model_name(config.local_model_dir, p): p for p in LOCAL_PRECISIONS}


def config_for_model(config: EmbedderConfig, embedding_model: str) -> EmbedderConfig | None:
    """The configuration that embeds with ``embedding_model``, or None when this process
    cannot: the configured provider's models, else any other it can produce with what it
    has (the local model at either precision, offline; the hash embedder of any dimension;
    an OpenAI model when an API key is set). A book indexed with another provider's model
    keeps being searched with it while a change of provider is built beside it."""
    names = model_names(config)
    if embedding_model in names:
        precision = names[embedding_model]
        return config if precision is None else replace(config, local_precision=precision)  # type: ignore[arg-type]
    from rag_pipeline.embed.local import local_model_name

    for precision in LOCAL_PRECISIONS:
        if embedding_model == local_model_name(config.local_model_dir, precision):
            return replace(config, provider="local", local_precision=precision)  # type: ignore[arg-type]
    if hashed := re.fullmatch(r"hash-(\d+)", embedding_model):
        return replace(config, provider="hash", hash_dimension=int(hashed.group(1)))
    from rag_pipeline.embed.openai import OPENAI_MODELS

    if config.openai_api_key and embedding_model in OPENAI_MODELS:
        return replace(config, provider="openai", openai_model=embedding_model)
    return None


def create_embedder(config: EmbedderConfig) -> Embedder:
    """The provider ``config.provider`` names, configured from it."""
    if config.provider == "hash":
        from rag_pipeline.embed.hashing import HashEmbedder

        return HashEmbedder(config.hash_dimension)
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


def usd_per_million_tokens(config: EmbedderConfig) -> float:
    """What the configured provider charges per 1M input tokens (OpenAI's price list in
    :data:`rag_pipeline.embed.openai.OPENAI_MODELS`; 0 for the local and hash embedders)."""
    if config.provider != "openai":
        return 0.0
    from rag_pipeline.embed.openai import OPENAI_MODELS

    known = OPENAI_MODELS.get(config.openai_model)
    return known[1] if known else 0.0

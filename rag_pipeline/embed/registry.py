"""The embedders this program can build, each stated once: what ``RAG_EMBEDDER`` calls it, the
model names it embeds with, their price, and how one is built.

Every choice of an embedder reads this table (:func:`kind_of`): the settings' validation, the
recipe of each book (its recorded model may be another provider's, see
:func:`config_for_model`), the plan's pricing, the query service and the Dagster UI's kind of
the embedding step. A new provider is one :class:`EmbedderKind` in :data:`EMBEDDERS`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from rag_pipeline.config import EmbedderConfig
from rag_pipeline.embed.base import Embedder

__all__ = [
    "EMBEDDERS",
    "HASH",
    "LOCAL",
    "LOCAL_PRECISIONS",
    "OPENAI",
    "EmbedderKind",
    "config_for_model",
    "create_embedder",
    "kind_of",
    "missing_for_model",
    "model_names",
    "usd_per_million_tokens",
]

#: the precisions the local model is produced at (``auto`` picks one of them)
LOCAL_PRECISIONS = ("fp32", "int8")


@dataclass(frozen=True)
class EmbedderKind:
    """One provider of embeddings.

    ``models(config)``: every ``embedding_model`` name it embeds with under ``config``, each
    with the precision that produces it (None where it has no precisions), without loading a
    model. ``claims(config, model)``: the configuration under which it embeds with ``model``
    (the same provider or another one's model, for a book indexed before a change of
    provider), or None when it cannot. ``build(config, threads)``: the embedder
    (``threads``: inference threads, for a provider that runs a model in this process)."""

    name: str  # what RAG_EMBEDDER calls it
    description: str
    #: the kind the Dagster UI shows on the embedding step
    ui_kind: str
    models: Callable[[EmbedderConfig], dict[str, str | None]]
    claims: Callable[[EmbedderConfig, str], EmbedderConfig | None]
    build: Callable[[EmbedderConfig, int | None], Embedder]
    #: US$ per million input tokens of ``config``'s model (0 for a model run here)
    price: Callable[[EmbedderConfig], float] = lambda config: 0.0
    #: the precisions it is produced at, which ``RAG_LOCAL_PRECISION`` chooses among
    precisions: tuple[str, ...] = ()
    #: its model runs in this process (its inference threads are this process's to share)
    runs_here: bool = False


# -- local: all-MiniLM-L6-v2 (or any sentence-transformers BERT folder) on ONNX Runtime ---------


def _local_models(config: EmbedderConfig) -> dict[str, str | None]:
    from rag_pipeline.embed.local import local_model_name

    return {local_model_name(config.local_model_dir, p): p for p in LOCAL_PRECISIONS}


def _local_claims(config: EmbedderConfig, model: str) -> EmbedderConfig | None:
    precision = _local_models(config).get(model)
    if precision is None:
        return None
    return replace(config, provider=LOCAL.name, local_precision=precision)  # type: ignore[arg-type]


def _local_build(config: EmbedderConfig, threads: int | None) -> Embedder:
    from rag_pipeline.embed.local import LocalEmbedder

    return LocalEmbedder(
        config.local_model_dir,
        batch_size=config.batch_size,
        cache_dir=config.cache_dir / "models",
        threads=threads,
        precision=config.local_precision,
    )


LOCAL = EmbedderKind(
    name="local",
    description="all-MiniLM-L6-v2 on ONNX Runtime, offline (fp32 or int8)",
    ui_kind="onnx",
    models=_local_models,
    claims=_local_claims,
    build=_local_build,
    precisions=LOCAL_PRECISIONS,
    runs_here=True,
)


# -- openai: an OpenAI (or compatible) embeddings API ------------------------------------------


def _openai_claims(config: EmbedderConfig, model: str) -> EmbedderConfig | None:
    from rag_pipeline.embed.openai import OPENAI_MODELS

    if config.provider == OPENAI.name and model == config.openai_model:
        return config
    if config.openai_api_key and model in OPENAI_MODELS:
        return replace(config, provider=OPENAI.name, openai_model=model)
    return None


def _openai_build(config: EmbedderConfig, threads: int | None) -> Embedder:
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


def _openai_price(config: EmbedderConfig) -> float:
    from rag_pipeline.embed.openai import OPENAI_MODELS

    known = OPENAI_MODELS.get(config.openai_model)
    return known[1] if known else 0.0


OPENAI = EmbedderKind(
    name="openai",
    description="OpenAI embeddings (text-embedding-3-small by default), with an API key",
    ui_kind="openai",
    models=lambda config: {config.openai_model: None},
    claims=_openai_claims,
    build=_openai_build,
    price=_openai_price,
)


# -- hash: a deterministic word-hashing stand-in, for tests of pipeline mechanics --------------

_HASH_MODEL = re.compile(r"hash-(\d+)")


def _hash_build(config: EmbedderConfig, threads: int | None) -> Embedder:
    from rag_pipeline.embed.hashing import HashEmbedder

    return HashEmbedder(config.hash_dimension)


def _hash_claims(config: EmbedderConfig, model: str) -> EmbedderConfig | None:
    hashed = _HASH_MODEL.fullmatch(model)
    if hashed is None:
        return None
    return replace(config, provider=HASH.name, hash_dimension=int(hashed.group(1)))


HASH = EmbedderKind(
    name="hash",
    description="word hashing (tests of pipeline mechanics only)",
    ui_kind="python",
    models=lambda config: {f"hash-{config.hash_dimension}": None},
    claims=_hash_claims,
    build=_hash_build,
)

#: every embedder, by what RAG_EMBEDDER calls it
EMBEDDERS: dict[str, EmbedderKind] = {kind.name: kind for kind in (LOCAL, OPENAI, HASH)}


def kind_of(config: EmbedderConfig | str) -> EmbedderKind:
    """The provider ``config`` (or a RAG_EMBEDDER value) names; ``ValueError`` for none."""
    name = config if isinstance(config, str) else config.provider
    try:
        return EMBEDDERS[name]
    except KeyError:
        raise ValueError(
            f"unknown embedder {name!r}; use {', '.join(map(repr, EMBEDDERS))}"
        ) from None


def model_names(config: EmbedderConfig) -> dict[str, str | None]:
    """Every ``embedding_model`` name the configured provider embeds with (see
    :class:`EmbedderKind`), without loading a model."""
    return kind_of(config).models(config)


def config_for_model(config: EmbedderConfig, embedding_model: str) -> EmbedderConfig | None:
    """The configuration that embeds with ``embedding_model``, or None when this process
    cannot: the configured provider's models first, else any provider's that can produce it
    with what this process has (the local model at either precision, offline; the hash
    embedder of any dimension; an OpenAI model when an API key is set). A book indexed with
    another provider's model keeps being searched with it while a change of provider is built
    beside it."""
    configured = kind_of(config)
    for kind in (configured, *(k for k in EMBEDDERS.values() if k is not configured)):
        claimed = kind.claims(config, embedding_model)
        if claimed is not None:
            return claimed
    return None


def missing_for_model(config: EmbedderConfig, embedding_model: str) -> str | None:
    """What this process lacks to embed with ``embedding_model`` when it is a model a
    provider knows (an OpenAI model without an API key), for the message that refuses it;
    None when nothing known is missing."""
    from rag_pipeline.embed.openai import OPENAI_MODELS

    if embedding_model in OPENAI_MODELS and not config.openai_api_key:
        return f"{embedding_model!r} is an OpenAI model and OPENAI_API_KEY is not set"
    return None


def create_embedder(config: EmbedderConfig, *, threads: int | None = None) -> Embedder:
    """The embedder ``config`` names, configured from it."""
    return kind_of(config).build(config, threads)


def usd_per_million_tokens(config: EmbedderConfig) -> float:
    """What the configured provider charges per 1M input tokens (0 for a model run here)."""
    return kind_of(config).price(config)

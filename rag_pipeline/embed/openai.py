"""OpenAI embeddings (text-embedding-3-small by default), used when configured.

Batches are bounded by input count and by tokens (counted with tiktoken's cl100k_base, bundled
so counting works offline). Rate limits (429), server errors (5xx), connection errors and
timeouts are retried by the OpenAI client with exponential backoff, ``max_retries`` times; what
still fails becomes an :class:`EmbedError` naming the cause.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tempfile
from collections.abc import Iterator, Sequence
from importlib import resources

import numpy as np

from rag_pipeline.embed.base import Embedder, EmbedError, TokenCounter

__all__ = ["OPENAI_MODELS", "OpenAIEmbedder", "TiktokenCounter"]

# model -> (dimension, US$ per 1M input tokens, max input tokens)
OPENAI_MODELS: dict[str, tuple[int, float, int]] = {
    "text-embedding-3-small": (1536, 0.02, 8191),
    "text-embedding-3-large": (3072, 0.13, 8191),
    "text-embedding-ada-002": (1536, 0.10, 8191),
}
_CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
MAX_INPUTS_PER_REQUEST = 2048
MAX_TOKENS_PER_REQUEST = 300_000


class TiktokenCounter(TokenCounter):
    """cl100k_base token counts, the tokenizer of OpenAI's embedding models."""

    def __init__(self, max_input_tokens: int = 8191) -> None:
        import tiktoken

        _prime_tiktoken_cache()
        self._encoding = tiktoken.get_encoding("cl100k_base")
        self.max_input_tokens = max_input_tokens
        self.special_tokens = 0

    def count(self, texts: Sequence[str]) -> list[int]:
        return [len(ids) for ids in self._encoding.encode_ordinary_batch(list(texts))]

    def split(self, text: str, max_tokens: int) -> list[str]:
        ids = self._encoding.encode_ordinary(text)
        if len(ids) <= max_tokens:
            return [text]
        pieces = []
        for start in range(0, len(ids), max_tokens):
            piece = self._encoding.decode(ids[start : start + max_tokens])
            if piece.strip():
                pieces.append(piece)
        return pieces


def _prime_tiktoken_cache() -> None:
    """Put the bundled cl100k_base ranks where tiktoken looks before it downloads them."""
    cache_dir = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
    if cache_dir == "":
        return
    cache_dir = cache_dir or os.path.join(tempfile.gettempdir(), "data-gym-cache")
    target = os.path.join(cache_dir, hashlib.sha1(_CL100K_URL.encode()).hexdigest())
    if os.path.exists(target):
        return
    data = gzip.decompress(
        resources.files("rag_pipeline.embed").joinpath("data/cl100k_base.tiktoken.gz").read_bytes()
    )
    os.makedirs(cache_dir, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=cache_dir, delete=False) as fh:
        fh.write(data)
    os.replace(fh.name, target)


class OpenAIEmbedder(Embedder):
    """Embeddings from the OpenAI API (or any server speaking its protocol at ``base_url``)."""

    def __init__(
        self,
        api_key: str | None,
        *,
        model: str = "text-embedding-3-small",
        base_url: str | None = None,
        max_retries: int = 5,
        timeout_s: float = 30.0,
        batch_size: int = 256,
        max_batch_tokens: int = 100_000,
    ) -> None:
        import openai

        if not api_key:
            raise EmbedError("RAG_EMBEDDER=openai needs OPENAI_API_KEY")
        if model not in OPENAI_MODELS:
            raise EmbedError(
                f"unknown OpenAI embedding model {model!r}; known: {', '.join(OPENAI_MODELS)}"
            )
        self.dimension, self.usd_per_million_tokens, max_input = OPENAI_MODELS[model]
        self.model_name = model
        self.batch_size = min(batch_size, MAX_INPUTS_PER_REQUEST)
        self.max_batch_tokens = min(max_batch_tokens, MAX_TOKENS_PER_REQUEST)
        self.max_retries = max_retries
        self._tokens = TiktokenCounter(max_input)
        self._client = openai.OpenAI(
            api_key=api_key, base_url=base_url, max_retries=max_retries, timeout=timeout_s
        )
        self.tokens_used = 0

    @property
    def tokenizer(self) -> TokenCounter:
        return self._tokens

    def _batch_bounds(self, lengths: Sequence[int]) -> Iterator[tuple[int, int]]:
        """Consecutive batches bounded by ``batch_size`` inputs and ``max_batch_tokens``."""
        start, tokens = 0, 0
        for i, n in enumerate(lengths):
            if i > start and (i - start >= self.batch_size or tokens + n > self.max_batch_tokens):
                yield start, i
                start, tokens = i, 0
            tokens += n
        if start < len(lengths):
            yield start, len(lengths)

    def _embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        import openai

        try:
            response = self._client.embeddings.create(model=self.model_name, input=list(texts))
        except openai.APIStatusError as exc:
            raise EmbedError(
                f"OpenAI embeddings failed after {self.max_retries} retries: HTTP "
                f"{exc.status_code} {_reason(exc)} from {self._client.base_url}"
            ) from exc
        except openai.APITimeoutError as exc:
            raise EmbedError(
                f"OpenAI embeddings timed out after {self.max_retries} retries "
                f"({self._client.base_url})"
            ) from exc
        except openai.APIConnectionError as exc:
            raise EmbedError(
                f"cannot reach the OpenAI API at {self._client.base_url} after "
                f"{self.max_retries} retries: {exc.__cause__ or exc}"
            ) from exc
        if response.usage is not None:
            self.tokens_used += response.usage.prompt_tokens
        data = sorted(response.data, key=lambda d: d.index)
        if len(data) != len(texts):
            raise EmbedError(f"OpenAI returned {len(data)} embeddings for {len(texts)} inputs")
        return np.asarray([d.embedding for d in data], dtype=np.float32)

    def close(self) -> None:
        self._client.close()


def _reason(exc: Exception) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        message = body.get("message") or (body.get("error") or {}).get("message")
        if message:
            return f"({message})"
    return "(rate limited)" if getattr(exc, "status_code", 0) == 429 else ""

"""The embedder interface shared by every provider, and its token-counting half."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "EmbedError",
    "Embedder",
    "EmbeddingBatch",
    "RegexTokenCounter",
    "TokenCounter",
]


class EmbedError(RuntimeError):
    """An embedding provider failed in a way a retry at this level will not fix."""


class TokenCounter(ABC):
    """Counts tokens the way an embedding model does, so chunks never exceed its input."""

    #: tokens the model adds around every input (e.g. [CLS] and [SEP]).
    special_tokens: int = 0
    #: the most tokens the model reads, special tokens included; more would be truncated.
    max_input_tokens: int

    @abstractmethod
    def count(self, texts: Sequence[str]) -> list[int]:
        """Tokens of each text, special tokens excluded."""

    @abstractmethod
    def split(self, text: str, max_tokens: int) -> list[str]:
        """Cut ``text`` into consecutive pieces of at most ``max_tokens`` tokens each."""


class RegexTokenCounter(TokenCounter):
    """Words and punctuation marks as tokens; only for the deterministic ``hash`` embedder."""

    _token = re.compile(r"\w+|[^\w\s]", re.UNICODE)

    def __init__(self, max_input_tokens: int = 512) -> None:
        self.max_input_tokens = max_input_tokens

    def count(self, texts: Sequence[str]) -> list[int]:
        return [len(self._token.findall(t)) for t in texts]

    def split(self, text: str, max_tokens: int) -> list[str]:
        spans = [m.span() for m in self._token.finditer(text)]
        return _split_at_spans(text, spans, max_tokens)


def _split_at_spans(text: str, spans: Sequence[tuple[int, int]], max_tokens: int) -> list[str]:
    """Cut ``text`` before every ``max_tokens``-th token, moving each cut back to the start of a
    word (a token preceded by a gap) when one is within reach, so words stay whole."""
    if max_tokens < 1:
        raise ValueError("max_tokens must be at least 1")
    if len(spans) <= max_tokens:
        return [text]
    pieces = []
    start_token = 0
    start_char = 0
    while len(spans) - start_token > max_tokens:
        cut = start_token + max_tokens
        for candidate in range(cut, max(start_token + 1, cut - max_tokens // 4), -1):
            if spans[candidate][0] > spans[candidate - 1][1]:
                cut = candidate
                break
        pieces.append(text[start_char : spans[cut][0]])
        start_token, start_char = cut, spans[cut][0]
    pieces.append(text[start_char:])
    return [p for p in pieces if p.strip()]


@dataclass(frozen=True, slots=True)
class EmbeddingBatch:
    """Vectors for a batch of texts, plus what they cost."""

    vectors: np.ndarray  # (n, dim) float32, L2-normalized
    tokens: int


class Embedder(ABC):
    """Turns texts into L2-normalized dense vectors, in batches."""

    #: identifies the model in payloads; vectors of different models are never mixed.
    model_name: str
    dimension: int
    #: US dollars per 1M input tokens (0 for local models).
    usd_per_million_tokens: float = 0.0
    batch_size: int = 32

    @property
    @abstractmethod
    def tokenizer(self) -> TokenCounter:
        """The model's own tokenizer, for chunk budgets."""

    @abstractmethod
    def _embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        """Embed one batch (at most ``batch_size`` texts) into an (n, dim) array."""

    def embed(
        self, texts: Sequence[str], progress: Callable[[int, int], None] | None = None
    ) -> np.ndarray:
        """Embed any number of texts; returns an (n, dim) float32 array, rows L2-normalized.
        ``progress(done, total)`` is called after each batch."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        # Batches of similar length waste less compute on padding; results go back in order.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        ordered = [texts[i] for i in order]
        parts = []
        for batch in self.batches(ordered):
            parts.append(self._embed_batch(batch))
            if progress:
                progress(sum(len(p) for p in parts), len(texts))
        vectors = np.empty((len(texts), self.dimension), dtype=np.float32)
        vectors[order] = np.concatenate(parts)
        return _normalize(vectors)

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed([text])[0]

    def batches(self, texts: Sequence[str]) -> Iterator[Sequence[str]]:
        for start in range(0, len(texts), self.batch_size):
            yield texts[start : start + self.batch_size]

    def count_tokens(self, texts: Sequence[str]) -> int:
        return sum(self.tokenizer.count(texts)) + self.tokenizer.special_tokens * len(texts)

    def cost_usd(self, tokens: int) -> float:
        return tokens * self.usd_per_million_tokens / 1_000_000

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the provider holds (sessions, HTTP pools)."""


def _normalize(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return vectors / norms

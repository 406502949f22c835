"""The embedder interface shared by every provider, and its token-counting half."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

__all__ = [
    "EmbedError",
    "Embedder",
    "ProgressCallback",
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


#: ``progress(done, total)``: texts embedded so far and texts in the call, after each batch.
ProgressCallback = Callable[[int, int], None]


class Embedder(ABC):
    """Turns texts into L2-normalized dense vectors, in batches.

    :meth:`embed` prepares every text once (:meth:`_prepare`: tokenize, count tokens), sorts
    them by token count so each batch holds texts of similar length (little padding), cuts the
    sorted run into batches (:meth:`_batch_bounds`), embeds them (:meth:`_run_batches`) and puts
    the vectors back in input order. Providers implement :meth:`_embed_batch` and may override
    the other hooks (the OpenAI embedder overrides :meth:`embed` itself: a remote API pads
    nothing, so it keeps input order and streams batches as it counts tokens).
    """

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
    def _embed_batch(self, items: Sequence[Any]) -> np.ndarray:
        """Embed one batch of prepared items (see :meth:`_prepare`) into an (n, dim) array."""

    def _prepare(self, texts: Sequence[str]) -> tuple[Sequence[int], Sequence[Any]]:
        """Each text's token count (the sort key) and what :meth:`_embed_batch` takes for it;
        by default the tokenizer's counts and the texts themselves."""
        return self.tokenizer.count(texts), texts

    def _batch_bounds(self, lengths: Sequence[int]) -> Iterator[tuple[int, int]]:
        """``(start, end)`` of consecutive batches over the sorted ``lengths``."""
        for start in range(0, len(lengths), self.batch_size):
            yield start, min(start + self.batch_size, len(lengths))

    def _run_batches(
        self, batches: Iterable[tuple[Sequence[Any], int]]
    ) -> Iterator[tuple[int, np.ndarray]]:
        """Embed ``(items, tokens)`` batches; yields ``(batch number, vectors)`` as each one is
        done, in any order. Sequential here; a provider may run batches concurrently."""
        for number, (items, _tokens) in enumerate(batches):
            yield number, self._embed_batch(items)

    def embed(self, texts: Sequence[str], progress: ProgressCallback | None = None) -> np.ndarray:
        """Embed any number of texts; returns an (n, dim) float32 array, rows L2-normalized, in
        the order of ``texts``. ``progress(done, total)`` is called after each batch."""
        total = len(texts)
        if not total:
            return np.zeros((0, self.dimension), dtype=np.float32)
        lengths, items = self._prepare(texts)
        # Batches of texts with similar token counts waste little compute on padding.
        order = sorted(range(total), key=lengths.__getitem__)
        sorted_lengths = [lengths[i] for i in order]
        rows: list[list[int]] = []
        batches: list[tuple[list[Any], int]] = []
        for start, end in self._batch_bounds(sorted_lengths):
            rows.append(order[start:end])
            batches.append(([items[i] for i in rows[-1]], sum(sorted_lengths[start:end])))
        vectors = np.empty((total, self.dimension), dtype=np.float32)
        done = 0
        for number, part in self._run_batches(batches):
            vectors[rows[number]] = part
            done += len(rows[number])
            if progress is not None:
                progress(done, total)
        return _normalize(vectors)

    def embed_query(self, text: str) -> np.ndarray:
        vector: np.ndarray = self.embed([text])[0]
        return vector

    def cost_usd(self, tokens: int) -> float:
        return tokens * self.usd_per_million_tokens / 1_000_000

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the provider holds (sessions, HTTP pools)."""


def _normalize(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    normalized: np.ndarray = vectors / norms
    return normalized

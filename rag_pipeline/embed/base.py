"""The embedder interface shared by every provider, and its token-counting half."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np

__all__ = [
    "EmbedError",
    "EmbedServiceError",
    "Embedder",
    "EmbedderUnavailableError",
    "EmbeddingAnswerError",
    "ProgressCallback",
    "RegexTokenCounter",
    "TokenCounter",
    "check_query_vector",
    "check_vectors",
    "embedder_source",
]


class EmbedError(RuntimeError):
    """An embedding provider failed in a way a retry at this level will not fix. Raised as
    such (not as a subclass) it is a setting's fault: no API key, an unknown model, a missing
    model folder, a key or model the API refuses."""


class EmbedServiceError(EmbedError):
    """The embedder was set up right but failed the work: not the user's settings (the CLI
    exits 1, not 2)."""


class EmbedderUnavailableError(EmbedServiceError):
    """The embedding service could not be used: a timeout, a refused or lost connection, a
    rate limit (429) or server error (5xx) that outlasted the retries (the service answers
    503)."""


class EmbeddingAnswerError(EmbedServiceError):
    """The embedder answered, but the answer is not one vector per input of the declared
    dimension with finite values and a usable length (see :func:`check_vectors`); nothing is
    stored or searched with it (the service answers 502)."""


def embedder_source(embedder: object) -> str:
    """How messages name an embedder: its ``source`` (e.g. "the API at https://..."), else its
    model name, else its type."""
    source = getattr(embedder, "source", None)
    if isinstance(source, str) and source:
        return source
    name = getattr(embedder, "model_name", None) or type(embedder).__name__
    return f"the {name} embedder"


def check_vectors(vectors: np.ndarray, *, inputs: int, dimension: int | None, source: str) -> None:
    """Raise :class:`EmbeddingAnswerError` unless ``vectors`` holds one row per input (of
    ``inputs``), each of ``dimension`` (None: any) finite values and of a length (L2 norm, in
    float32 as the store computes it) neither zero nor overflowing. Every embedding answer of
    every embedder, for documents and queries alike, passes here before it is stored or
    searched with: a NaN vector is found by no search, a zero one scores 0.0 against all."""
    if vectors.ndim != 2 or len(vectors) != inputs:
        raise EmbeddingAnswerError(
            f"{source} returned {vectors.shape[0] if vectors.ndim else 0} vectors "
            f"(shape {vectors.shape}) for {inputs} inputs"
        )
    if dimension is not None and vectors.shape[1] != dimension:
        raise EmbeddingAnswerError(
            f"{source} returned vectors of dimension {vectors.shape[1]}, not {dimension}, "
            f"for {inputs} inputs"
        )
    with np.errstate(over="ignore", invalid="ignore"):
        rows = np.asarray(vectors, dtype=np.float32)
        finite = np.isfinite(rows).all(axis=1)
        norms = np.linalg.norm(rows, axis=1)
    problems = (
        ("non-finite values", ~finite),
        ("all-zero vectors", finite & (norms == 0)),
        ("vectors whose length overflows float32", finite & np.isinf(norms)),
    )
    for what, bad in problems:
        if bad.any():
            raise EmbeddingAnswerError(
                f"{source} returned {what} for {int(bad.sum())} of {inputs} inputs"
            )


def check_query_vector(vector: np.ndarray, embedder: object) -> np.ndarray:
    """A query vector of ``embedder`` as float32, checked as :func:`check_vectors` checks
    every embedding answer (against the embedder's ``dimension``, when it declares one)."""
    vector = np.asarray(vector, dtype=np.float32)
    dimension = getattr(embedder, "dimension", None)
    check_vectors(
        vector.reshape(1, -1) if vector.ndim == 1 else vector,
        inputs=1,
        dimension=dimension if isinstance(dimension, int) else None,
        source=embedder_source(embedder),
    )
    return vector.reshape(-1)


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


class ProgressCallback(Protocol):
    """Called after each batch: texts embedded so far and texts in the call, and the same in
    tokens where the embedder counts them first (``None`` where it does not: the time a
    local model takes follows its tokens, not its texts, which go shortest first)."""

    def __call__(
        self, done: int, total: int, tokens_done: int | None, tokens_total: int | None
    ) -> None: ...


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

    @property
    def source(self) -> str:
        """Who answers embedding requests, as error messages name it."""
        return f"the {self.model_name} embedder"

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
        the order of ``texts``. ``progress`` is called after each batch."""
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
        done = tokens_done = 0
        tokens_total = sum(sorted_lengths)
        for number, part in self._run_batches(batches):
            check_vectors(
                part, inputs=len(rows[number]), dimension=self.dimension, source=self.source
            )
            vectors[rows[number]] = part
            done += len(rows[number])
            tokens_done += batches[number][1]
            if progress is not None:
                progress(done, total, tokens_done, tokens_total)
        return _normalize(vectors)

    def embed_query(self, text: str) -> np.ndarray:
        """One text's vector, checked as every answer is (see :func:`check_vectors`)."""
        vector: np.ndarray = self.embed([text])[0]
        return vector

    def cost_usd(self, tokens: int) -> float:
        return tokens * self.usd_per_million_tokens / 1_000_000

    def warm_up(self) -> None:  # noqa: B027 - optional hook
        """Load what the first :meth:`embed` would (a model, its runtime), for a long-lived
        process whose first change must not wait for it. Nothing by default: a remote API has
        nothing to load, and a call would cost money."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the provider holds (sessions, HTTP pools)."""


def _normalize(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (every row was checked non-zero by :func:`check_vectors`)."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    norms[norms == 0] = 1.0  # never for a checked row; no division makes a NaN
    normalized: np.ndarray = vectors / norms
    return normalized

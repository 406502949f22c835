"""OpenAI embeddings (text-embedding-3-small by default), used when configured.

Batches are bounded by input count and by tokens (counted with tiktoken's cl100k_base, bundled
so counting works offline), cut in input order as the tokens are counted (the API pads nothing,
so sorting by length gains nothing here). Up to ``concurrency`` requests run at once within one
``embed`` call, the first ones while later texts are still being counted; vectors come back in
input order. An optional client-side :class:`RateLimit` (requests
and tokens per minute) holds each request until it fits, so none goes over the limit in any
window. Rate limits (429), server errors (5xx), connection errors and timeouts are retried
here, ``max_retries`` times, after the server's Retry-After or an exponential backoff (a 429
pauses every request of the embedder, not only the one that got it), and so is an answer that
fails its checks (one embedding per input index, of the model's dimension, finite, of usable
length: a proxy's error page or a truncated body may be transient); what still fails becomes
an :class:`EmbedError` naming the cause: :class:`EmbedderUnavailableError` for a service that
could not be used, :class:`EmbeddingAnswerError` for a bad answer.
"""

from __future__ import annotations

import base64
import email.utils
import gzip
import hashlib
import json
import os
import queue
import random
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np

from rag_pipeline.embed.base import (
    Embedder,
    EmbedderUnavailableError,
    EmbeddingAnswerError,
    EmbedError,
    EmbedServiceError,
    ProgressCallback,
    TokenCounter,
    _normalize,
    check_vectors,
)
from rag_pipeline.urls import shown_url

__all__ = ["OPENAI_MODELS", "OpenAIEmbedder", "RateLimit", "RateLimiter", "TiktokenCounter"]

# model -> (dimension, US$ per 1M input tokens, max input tokens)
OPENAI_MODELS: dict[str, tuple[int, float, int]] = {
    "text-embedding-3-small": (1536, 0.02, 8191),
    "text-embedding-3-large": (3072, 0.13, 8191),
    "text-embedding-ada-002": (1536, 0.10, 8191),
}
_CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
MAX_INPUTS_PER_REQUEST = 2048
MAX_TOKENS_PER_REQUEST = 300_000
# Backoff between retries when the server names no delay (as the OpenAI client does).
INITIAL_RETRY_DELAY_S = 0.5
MAX_RETRY_DELAY_S = 8.0
MAX_RETRY_AFTER_S = 120.0  # a longer Retry-After is not believed; the backoff applies
_RETRYABLE_STATUS = frozenset({408, 409, 429})  # and every 5xx
# Refusals of the settings (API key, its permissions, the model or URL): the user's to fix.
_SETTINGS_STATUS = frozenset({400, 401, 403, 404})
_COUNT_SLICE = 256  # texts whose tokens are counted at a time, as batches are needed


class TiktokenCounter(TokenCounter):
    """cl100k_base token counts, the tokenizer of OpenAI's embedding models."""

    def __init__(self, max_input_tokens: int = 8191) -> None:
        import tiktoken

        _prime_tiktoken_cache()
        self._encoding = tiktoken.get_encoding("cl100k_base")
        self.max_input_tokens = max_input_tokens
        self.special_tokens = 0

    def count(self, texts: Sequence[str]) -> list[int]:
        # One call per text: encode_ordinary_batch starts a thread per text, which spent 2.7x
        # the CPU of this loop for 10k texts (its threads only compete on a small machine).
        encode = self._encoding.encode_ordinary
        return [len(encode(text)) for text in texts]

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


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most ``requests`` requests and ``tokens`` input tokens (None: no limit) in any
    window of ``period_s`` seconds."""

    requests: int | None = None
    tokens: int | None = None
    period_s: float = 60.0

    @classmethod
    def per_minute(cls, requests: int | None, tokens: int | None) -> RateLimit | None:
        return cls(requests, tokens) if requests or tokens else None


class _Slot:
    """One request counted by a :class:`RateLimiter`: in flight until released."""

    __slots__ = ("end", "tokens")

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        self.end: float | None = None  # when its answer (or failure) came back


class RateLimiter:
    """Holds each request until it fits the :class:`RateLimit`, in a sliding window.

    A request counts from when it is granted until ``period_s`` after its answer came back
    (:meth:`release`): the server saw it arrive somewhere in between, so however late the
    network delivered one request and however early the next, no window of ``period_s`` the
    server can measure holds more than the limit. (Counting from the send time instead let a
    server see 6 requests in a second with a limit of 5, on a busy machine.) A small margin
    (1 % of the period) covers clock differences. A request of more tokens than the limit
    waits for an empty window. :meth:`pause_for` holds every request (a 429's Retry-After).
    """

    def __init__(self, limit: RateLimit | None, *, clock: Callable[[], float] = time.monotonic):
        self.limit = limit
        self._clock = clock
        self._changed = threading.Condition()
        self._slots: list[_Slot] = []
        self._paused_until = 0.0
        self._window = limit.period_s * 1.01 if limit else 0.0

    def acquire(self, tokens: int = 0, stop: threading.Event | None = None) -> _Slot | None:
        """Wait until a request of ``tokens`` fits and count it; None if ``stop`` is set
        first. Release the slot when the request is over."""
        with self._changed:
            while True:
                if stop is not None and stop.is_set():
                    return None
                slot, delay = self._try(tokens)
                if slot is not None:
                    return slot
                # a release wakes us early; short waits also notice ``stop``
                self._changed.wait(0.25 if delay is None else min(delay, 0.25))

    def try_acquire(self, tokens: int = 0) -> tuple[_Slot | None, float | None]:
        """The slot if the request may go now, else how long to wait (None: until a request
        in flight is released)."""
        with self._changed:
            return self._try(tokens)

    def release(self, slot: _Slot) -> None:
        with self._changed:
            slot.end = self._clock()
            self._changed.notify_all()

    def pause_for(self, seconds: float) -> None:
        """Hold every request for ``seconds`` from now."""
        with self._changed:
            self._paused_until = max(self._paused_until, self._clock() + seconds)

    def _try(self, tokens: int) -> tuple[_Slot | None, float | None]:
        now = self._clock()
        delay = self._paused_until - now
        blocked = False  # only a release can make room
        limit = self.limit
        if limit is not None:
            horizon = now - self._window
            self._slots = [s for s in self._slots if s.end is None or s.end > horizon]
            done = sorted((s.end, s.tokens) for s in self._slots if s.end is not None)
            in_flight = len(self._slots) - len(done)
            if limit.requests is not None and len(self._slots) >= limit.requests:
                need = len(self._slots) - limit.requests + 1  # slots that must expire first
                if need > len(done):
                    blocked = True
                else:
                    delay = max(delay, done[need - 1][0] + self._window - now)
            used = sum(s.tokens for s in self._slots)
            if limit.tokens is not None and used + tokens > limit.tokens:
                excess, freed, expires = used + tokens - limit.tokens, 0, now - self._window
                for end, n in done:
                    freed, expires = freed + n, end
                    if freed >= excess:
                        break
                if freed < excess and in_flight:
                    blocked = True
                else:  # enough expire, or (too big for the limit) all of them
                    delay = max(delay, expires + self._window - now)
        if blocked:
            return None, None
        if delay > 0:
            return None, delay
        slot = _Slot(tokens)
        if limit is not None:
            self._slots.append(slot)
        return slot, None


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
        concurrency: int = 4,
        requests_per_minute: int | None = None,
        tokens_per_minute: int | None = None,
        rate_limit: RateLimit | None = None,
    ) -> None:
        """``rate_limit`` (any period) overrides ``requests_per_minute``/``tokens_per_minute``."""
        import openai

        if not api_key:
            raise EmbedError("RAG_EMBEDDER=openai needs OPENAI_API_KEY")
        if model not in OPENAI_MODELS:
            raise EmbedError(
                f"unknown OpenAI embedding model {model!r} (RAG_OPENAI_MODEL); known: "
                f"{', '.join(OPENAI_MODELS)}"
            )
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.dimension, self.usd_per_million_tokens, max_input = OPENAI_MODELS[model]
        self.model_name = model
        self.batch_size = min(batch_size, MAX_INPUTS_PER_REQUEST)
        self.max_batch_tokens = min(max_batch_tokens, MAX_TOKENS_PER_REQUEST)
        self.rate_limit = rate_limit or RateLimit.per_minute(requests_per_minute, tokens_per_minute)
        if self.rate_limit is not None and self.rate_limit.tokens is not None:
            # no batch may need more than the whole window's tokens
            self.max_batch_tokens = min(self.max_batch_tokens, self.rate_limit.tokens)
        self.max_retries = max_retries
        self.concurrency = concurrency
        self._tokens = TiktokenCounter(max_input)
        # Retries are ours (see _request), so that each attempt passes the rate limiter.
        self._client = openai.OpenAI(
            api_key=api_key, base_url=base_url, max_retries=0, timeout=timeout_s
        )
        self._limiter = RateLimiter(self.rate_limit)
        self._usage_lock = threading.Lock()
        self.tokens_used = 0

    @property
    def tokenizer(self) -> TokenCounter:
        return self._tokens

    @property
    def source(self) -> str:
        return f"the API at {shown_url(self._client.base_url)} ({self.model_name})"

    def embed(self, texts: Sequence[str], progress: ProgressCallback | None = None) -> np.ndarray:
        """As :meth:`Embedder.embed`, but texts are not sorted (the API pads nothing and bills
        tokens) and batches are cut as their tokens are counted: the first requests go out
        while later texts are still being counted."""
        total = len(texts)
        if not total:
            return np.zeros((0, self.dimension), dtype=np.float32)
        bounds: list[tuple[int, int]] = []

        def batches() -> Iterator[tuple[Sequence[str], int]]:
            for start, end, tokens in self._stream_bounds(texts):
                bounds.append((start, end))
                yield texts[start:end], tokens

        vectors = np.empty((total, self.dimension), dtype=np.float32)
        done = 0
        for number, part in self._run_batches(batches()):
            start, end = bounds[number]
            vectors[start:end] = part
            done += end - start
            if progress is not None:  # tokens are counted as batches go: no total in advance
                progress(done, total, None, None)
        return _normalize(vectors)

    def _stream_bounds(self, texts: Sequence[str]) -> Iterator[tuple[int, int, int]]:
        """``(start, end, tokens)`` of consecutive batches bounded by ``batch_size`` inputs and
        ``max_batch_tokens``; tokens are counted a slice at a time, as batches are needed."""
        start, tokens = 0, 0
        for offset in range(0, len(texts), _COUNT_SLICE):
            counts = self._tokens.count(texts[offset : offset + _COUNT_SLICE])
            for i, n in enumerate(counts, start=offset):
                if i > start and (
                    i - start >= self.batch_size or tokens + n > self.max_batch_tokens
                ):
                    yield start, i, tokens
                    start, tokens = i, 0
                tokens += n
        yield start, len(texts), tokens

    def _embed_batch(self, items: Sequence[Any]) -> np.ndarray:
        return self._request(items, sum(self._tokens.count(items)))

    def _run_batches(
        self, batches: Iterable[tuple[Sequence[Any], int]]
    ) -> Iterator[tuple[int, np.ndarray]]:
        """Up to ``concurrency`` requests in flight, the next batch taken from ``batches`` as
        one finishes; results as they come. After a failure no new request starts, requests
        in flight stop retrying, and the failure is raised."""
        if self.concurrency == 1:
            for number, (items, tokens) in enumerate(batches):
                yield number, self._request(items, tokens)
            return
        stop = threading.Event()
        # Batches are cut (their tokens counted) by a thread of their own: counting in this
        # loop would hold back the next request each time one finishes.
        jobs = enumerate(_read_ahead(batches, self.concurrency, stop))
        pending: dict[Future[np.ndarray], int] = {}
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="openai-embed") as pool:

            def submit_next() -> None:
                job = next(jobs, None)
                if job is not None:
                    number, (items, tokens) = job
                    pending[pool.submit(self._request, items, tokens, stop)] = number

            for _ in range(self.concurrency):
                submit_next()
            try:
                while pending:
                    done, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for future in done:
                        number = pending.pop(future)
                        vectors = future.result()
                        submit_next()
                        yield number, vectors
            finally:
                stop.set()

    def _request(
        self, items: Sequence[Any], tokens: int, stop: threading.Event | None = None
    ) -> np.ndarray:
        """One embeddings request, through the rate limiter, retried on 429/5xx/timeouts and on
        an answer that fails its checks (:meth:`_read_answer`)."""
        import openai

        attempt = 0
        while True:
            slot = self._limiter.acquire(tokens, stop)
            if slot is None:
                raise EmbedServiceError(
                    "OpenAI embeddings cancelled: another request of the call failed"
                )
            failure: openai.APIError | EmbeddingAnswerError | None = None
            try:
                # base64 decoded here: the client's own decoding (to lists of floats, then
                # models) costs about 2 ms of CPU per input, which concurrency cannot hide
                response = self._client.embeddings.with_raw_response.create(
                    model=self.model_name, input=list(items), encoding_format="base64"
                )
                body = response.content
            except (openai.APIStatusError, openai.APIConnectionError) as exc:
                failure = exc
            finally:
                self._limiter.release(slot)  # the request is over, whatever became of it
            if failure is None:
                try:
                    return self._read_answer(body, len(items))
                except EmbeddingAnswerError as exc:
                    failure = exc
            status = getattr(failure, "status_code", None)
            retryable = status is None or status in _RETRYABLE_STATUS or status >= 500
            if not retryable or attempt >= self.max_retries or (stop and stop.is_set()):
                error = self._error(failure, retried=attempt if retryable else None)
                # the message says all there is (the client's reason included): chained, a
                # run's failure would report the deepest cause, the HTTP library's words alone
                raise error from None
            delay = _retry_delay(failure, attempt)
            if status == 429:  # the account is over its limit: every request waits
                self._limiter.pause_for(delay)
            time.sleep(delay)
            attempt += 1

    def _read_answer(self, body: bytes, inputs: int) -> np.ndarray:
        """The vectors of one answer, in input order: its ``index`` fields exactly a
        permutation of the inputs, each embedding decodable, then :func:`check_vectors`.
        Read as plain JSON: the client's models (one per input) cost more CPU than the
        request itself, and that CPU is what concurrency cannot overlap."""
        try:
            payload = json.loads(body)
            data = payload["data"]
            indices = [d["index"] for d in data]
            embeddings = [d["embedding"] for d in data]
            usage = (payload.get("usage") or {}).get("prompt_tokens")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise EmbeddingAnswerError(
                f"{self.source} returned a malformed embeddings response ({exc!r}): "
                f"{bytes(body[:80])!r}"
            ) from None
        if isinstance(usage, int):  # billed, whatever the checks below find
            with self._usage_lock:
                self.tokens_used += usage
        wrong_indices = _index_problems(indices, inputs)
        if wrong_indices:
            raise EmbeddingAnswerError(
                f"{self.source} returned embedding indices that are not one per input "
                f"({len(indices)} embeddings for {inputs} inputs: {wrong_indices})"
            )
        decoded = []
        for embedding in embeddings:
            try:
                decoded.append(_decode(embedding))
            except (ValueError, TypeError) as exc:
                raise EmbeddingAnswerError(
                    f"{self.source} returned an undecodable embedding ({exc})"
                ) from None
        wrong_size = [v.shape for v in decoded if v.shape != (self.dimension,)]
        if wrong_size:
            raise EmbeddingAnswerError(
                f"{self.source} returned vectors of shape {wrong_size[0]}, not "
                f"({self.dimension},), for {len(wrong_size)} of {inputs} inputs"
            )
        vectors = np.empty((inputs, self.dimension), dtype=np.float32)
        vectors[indices] = np.stack(decoded)
        check_vectors(vectors, inputs=inputs, dimension=self.dimension, source=self.source)
        return vectors

    def _error(self, exc: Exception, retried: int | None) -> EmbedError:
        """What a request's last failure becomes: a setting's fault (:class:`EmbedError`),
        the service unavailable, a bad answer, or another refusal of the work."""
        import openai

        after = f" after {retried} retries" if retried is not None else ""
        url = shown_url(self._client.base_url)
        if isinstance(exc, EmbeddingAnswerError):
            return EmbeddingAnswerError(f"{exc}{after}" if retried else str(exc))
        if isinstance(exc, openai.APIStatusError):
            message = (
                f"OpenAI embeddings failed{after}: HTTP {exc.status_code} {_reason(exc)} from {url}"
            )
            if retried is not None:
                return EmbedderUnavailableError(message)
            if exc.status_code in _SETTINGS_STATUS:
                return EmbedError(message)
            return EmbedServiceError(message)
        if isinstance(exc, openai.APITimeoutError):
            return EmbedderUnavailableError(f"OpenAI embeddings timed out{after} ({url})")
        return EmbedderUnavailableError(
            f"cannot reach the OpenAI API at {url}{after}: {exc.__cause__ or exc}"
        )

    def close(self) -> None:
        self._client.close()


def _read_ahead(items: Iterable[Any], depth: int, stop: threading.Event) -> Iterator[Any]:
    """``items``, produced by a thread of its own up to ``depth`` ahead of the consumer; an
    exception of the producer is raised here. Setting ``stop`` ends the producer."""
    ready: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=max(depth, 1))

    def put(entry: tuple[str, Any]) -> bool:
        while not stop.is_set():
            try:
                ready.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put(("item", item)):
                    return
        except BaseException as exc:  # handed to the consumer, raised there
            put(("error", exc))
            return
        put(("end", None))

    threading.Thread(target=produce, name="openai-batches", daemon=True).start()
    while True:
        kind, value = ready.get()
        if kind == "end":
            return
        if kind == "error":
            raise value
        yield value


def _decode(embedding: object) -> np.ndarray:
    """One embedding as float32: base64 of little-endian floats, or a list (servers that
    ignore ``encoding_format``). ``ValueError``/``TypeError`` when it is neither."""
    if isinstance(embedding, str):
        # validate: without it, characters outside the alphabet are dropped silently
        return np.frombuffer(base64.b64decode(embedding, validate=True), dtype="<f4").astype(
            np.float32
        )
    if not isinstance(embedding, list):
        raise TypeError(f"an embedding is a base64 string or a list, not {type(embedding)}")
    return np.asarray(embedding, dtype=np.float32)


def _index_problems(indices: Sequence[object], inputs: int) -> str:
    """What keeps ``indices`` from being exactly ``0 .. inputs-1``, each once ("" if nothing):
    answers are put in input order by index, so a gap or a repeat would give chunks the
    vectors of others."""
    counts = Counter(i if type(i) is int else repr(i) for i in indices)
    missing = [i for i in range(inputs) if i not in counts]
    repeated = [i for i, n in counts.items() if n > 1]
    foreign = [i for i in counts if not (type(i) is int and 0 <= i < inputs)]
    problems = [
        f"{what} {', '.join(str(i) for i in values[:5])}{' ...' if len(values) > 5 else ''}"
        for what, values in (("missing", missing), ("repeated", repeated), ("unknown", foreign))
        if values
    ]
    return "; ".join(problems)


def _retry_delay(exc: Exception, attempt: int) -> float:
    """The server's Retry-After (retry-after-ms, or retry-after in seconds or as a date) when
    it gives a plausible one, else exponential backoff with jitter."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None) or {}
    seconds: float | None = None
    try:
        if headers.get("retry-after-ms"):
            seconds = float(headers["retry-after-ms"]) / 1000
        elif headers.get("retry-after"):
            value = headers["retry-after"]
            try:
                seconds = float(value)
            except ValueError:
                seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
    except (TypeError, ValueError):
        seconds = None
    if seconds is not None and 0 < seconds <= MAX_RETRY_AFTER_S:
        return seconds
    backoff = min(INITIAL_RETRY_DELAY_S * 2.0**attempt, MAX_RETRY_DELAY_S)
    return backoff * (1 - 0.25 * random.random())


def _reason(exc: Exception) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        message = body.get("message") or (body.get("error") or {}).get("message")
        if message:
            return f"({message})"
    return "(rate limited)" if getattr(exc, "status_code", 0) == 429 else ""

"""A deterministic, dependency-free embedder for pipeline mechanics tests only.

Feature hashing of lower-cased words into a fixed number of signed buckets: texts that share
words get similar vectors, which is enough to test ranking plumbing, never to judge quality.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import numpy as np

from rag_pipeline.embed.base import Embedder, RegexTokenCounter, TokenCounter

__all__ = ["HashEmbedder"]

_WORD = re.compile(r"\w+", re.UNICODE)


class HashEmbedder(Embedder):
    """Signed feature hashing of words; same text, same vector, on every machine."""

    def __init__(
        self, dimension: int = 384, *, max_input_tokens: int = 512, batch_size: int = 256
    ) -> None:
        self.dimension = dimension
        self.model_name = f"hash-{dimension}"
        self.batch_size = batch_size
        self._tokens = RegexTokenCounter(max_input_tokens)
        self._cache: dict[str, tuple[int, float]] = {}

    @property
    def tokenizer(self) -> TokenCounter:
        return self._tokens

    def _bucket(self, word: str) -> tuple[int, float]:
        hit = self._cache.get(word)
        if hit is None:
            digest = hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest()
            value = int.from_bytes(digest, "little")
            hit = (value % self.dimension, 1.0 if (value >> 63) & 1 else -1.0)
            if len(self._cache) < 200_000:
                self._cache[word] = hit
        return hit

    def _embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in _WORD.findall(text.lower()):
                index, sign = self._bucket(word)
                out[row, index] += sign
            if not out[row].any():
                out[row, 0] = 1.0
        return out

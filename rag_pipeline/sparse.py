"""BM25-style sparse vectors for Qdrant's sparse index with the IDF modifier.

A document's vector holds, for each stemmed term, BM25's saturated term frequency
``tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avg_len))``; Qdrant multiplies it by the term's
inverse document frequency over the collection at query time (``Modifier.IDF``), and a query's
vector holds 1.0 per distinct term, so the dot product is the BM25 score.
"""

from __future__ import annotations

import re
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import snowballstemmer

from rag_pipeline.store.base import SparseVector

__all__ = ["ENGLISH_STOPWORDS", "Bm25Encoder"]

# Lucene's default English stop set (what BM25 baselines such as Anserini use).
ENGLISH_STOPWORDS = frozenset(
    (
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "but",
        "by",
        "for",
        "if",
        "in",
        "into",
        "is",
        "it",
        "no",
        "not",
        "of",
        "on",
        "or",
        "such",
        "that",
        "the",
        "their",
        "then",
        "there",
        "these",
        "they",
        "this",
        "to",
        "was",
        "will",
        "with",
    )
)
_TERM = re.compile(r"[^\W_]+", re.UNICODE)


@dataclass
class Bm25Encoder:
    """Text to sparse BM25 term-weight vectors (stemmed English, Lucene stop words)."""

    k1: float = 1.2
    b: float = 0.75
    avg_len: float = 200.0
    language: str = "english"
    _stems: dict[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._stemmer = snowballstemmer.stemmer(self.language)

    @property
    def name(self) -> str:
        return f"bm25-{self.language}-k1={self.k1}-b={self.b}-avg={self.avg_len:g}"

    def terms(self, text: str) -> list[str]:
        out = []
        stems = self._stems
        for word in _TERM.findall(text.lower()):
            if word in ENGLISH_STOPWORDS:
                continue
            stem = stems.get(word)
            if stem is None:
                stem = self._stemmer.stemWord(word)
                if len(stems) < 500_000:
                    stems[word] = stem
            out.append(stem)
        return out

    def encode_documents(self, texts: Sequence[str]) -> list[SparseVector]:
        return [self._document(t) for t in texts]

    def encode_query(self, text: str) -> SparseVector:
        ids = sorted({_term_id(t) for t in self.terms(text)})
        return SparseVector(tuple(ids), tuple(1.0 for _ in ids))

    def _document(self, text: str) -> SparseVector:
        terms = self.terms(text)
        if not terms:
            return SparseVector((), ())
        norm = self.k1 * (1 - self.b + self.b * len(terms) / self.avg_len)
        weights: dict[int, float] = {}
        for term, tf in Counter(terms).items():
            index = _term_id(term)
            weights[index] = weights.get(index, 0.0) + tf * (self.k1 + 1) / (tf + norm)
        ids = sorted(weights)
        return SparseVector(tuple(ids), tuple(round(weights[i], 5) for i in ids))


def _term_id(term: str) -> int:
    return zlib.crc32(term.encode("utf-8"))

"""BM25-style sparse vectors for Qdrant's sparse index with the IDF modifier.

A document's vector holds, for each stemmed term, BM25's saturated term frequency
``tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avg_len))``; Qdrant multiplies it by the term's
inverse document frequency over the collection at query time (``Modifier.IDF``), and a query's
vector holds 1.0 per distinct term, so the dot product is the BM25 score (Lucene's formula).

``avg_len`` is the collection's mean chunk length in analysed terms. It must be *measured*
(:func:`measure_avg_len` over the chunks the collection is built from) and then kept with the
collection: it is part of :attr:`Bm25Encoder.name`, which enters the index signature, so a new
value re-encodes every book. On BEIR SciFact the measured 88.4 scores nDCG@10 0.6879 against
0.6738 for the old fixed 200 (scratch study, ``RESULTS.md``).

Two analysers:

* ``"v2"`` (default, name ``bm25v2-...``): tokens as Lucene's StandardTokenizer and
  EnglishPossessiveFilter keep them: a decimal number stays one token ("3.5", "7.5", "1,000"),
  a word keeps an inner apostrophe ("don't") and loses a possessive 's ("patient's" ->
  "patient"); then Lucene's English stop set and Snowball English stemming.
* ``"v1"`` (name ``bm25-...``): the first encoder, runs of letters and digits only; kept so
  that an index written with it can still be described (:meth:`Bm25Encoder.legacy`).
"""

from __future__ import annotations

import re
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, overload

import snowballstemmer

from rag_pipeline.store.base import SparseVector

__all__ = [
    "DEFAULT_AVG_LEN",
    "ENGLISH_STOPWORDS",
    "FALLBACK_TERMS_PER_TARGET_TOKEN",
    "Analyzer",
    "Bm25Encoder",
    "EncodedWhenRead",
    "avg_len_of",
    "fallback_avg_len",
    "measure_avg_len",
]

Analyzer = Literal["v1", "v2"]

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
#: until a collection has chunks to measure, its average is about 0.3 analysed terms per token
#: of the chunk target (measured 0.29-0.35 on SciFact and the two Markdown corpora)
FALLBACK_TERMS_PER_TARGET_TOKEN = 0.3
#: the fallback for the default MiniLM chunk target of 256 tokens
DEFAULT_AVG_LEN = 77.0
_V1_TERM = re.compile(r"[^\W_]+", re.UNICODE)
# decimal numbers whole; words of letters/digits joined by inner apostrophes
_V2_TERM = re.compile(r"\d+(?:[.,]\d+)+|[^\W_]+(?:['\u2019][^\W_]+)*", re.UNICODE)
_POSSESSIVE = ("'s", "\u2019s")
_NAME = re.compile(
    r"^(?P<v>bm25|bm25v2)-(?P<lang>[a-z_]+)-k1=(?P<k1>[0-9.e+-]+)-b=(?P<b>[0-9.e+-]+)"
    r"-avg=(?P<avg>[0-9.e+-]+)$"
)
_STEM_CACHE_MAX = 500_000


@dataclass
class Bm25Encoder:
    """Text to sparse BM25 term-weight vectors (stemmed English, Lucene stop words).

    ``Bm25Encoder()`` is the v2 analyser with the fallback average (:data:`DEFAULT_AVG_LEN`);
    an index should be built with ``Bm25Encoder(avg_len=measure_avg_len(chunk_texts))``.
    Queries do not depend on ``avg_len`` (or ``k1``, ``b``): any encoder of the same analyser
    and language encodes queries for an index.
    """

    k1: float = 1.2
    b: float = 0.75
    avg_len: float = DEFAULT_AVG_LEN
    language: str = "english"
    analyzer: Analyzer = "v2"
    _stems: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.avg_len > 0:
            raise ValueError(f"avg_len must be positive, not {self.avg_len!r}")
        if not self.k1 >= 0 or not 0 <= self.b <= 1:
            raise ValueError(f"BM25 needs k1 >= 0 and 0 <= b <= 1 (k1={self.k1}, b={self.b})")
        if self.analyzer not in ("v1", "v2"):
            raise ValueError(f"unknown analyzer {self.analyzer!r}; use v1 or v2")
        self._stemmer = snowballstemmer.stemmer(self.language)

    @classmethod
    def legacy(cls) -> Bm25Encoder:
        """The first encoder exactly (v1 tokens, fixed ``avg_len`` 200)."""
        return cls(avg_len=200.0, analyzer="v1")

    @classmethod
    def from_name(cls, name: str) -> Bm25Encoder:
        """The encoder a :attr:`name` describes (as recorded in ``sparse_model``)."""
        match = _NAME.match(name.strip())
        if match is None:
            raise ValueError(f"{name!r} is not a BM25 encoder name")
        return cls(
            k1=float(match["k1"]),
            b=float(match["b"]),
            avg_len=float(match["avg"]),
            language=match["lang"],
            analyzer="v2" if match["v"] == "bm25v2" else "v1",
        )

    def with_avg_len(self, avg_len: float) -> Bm25Encoder:
        """This encoding with another average, sharing this encoder's stem cache (a book's
        texts are analysed again as its vectors are written: mostly from the cache)."""
        return replace(self, avg_len=avg_len, _stems=self._stems)

    @property
    def name(self) -> str:
        """Identifies the encoding, average included (recorded in every chunk's
        ``sparse_model``, from which :meth:`from_name` rebuilds the encoder)."""
        return f"{self.family}-avg={self.avg_len:g}"

    @property
    def family(self) -> str:
        """The encoding without its average: tokens, stemmer, k1 and b (the index signature
        holds this; the average is fixed per book when the book is first indexed)."""
        prefix = "bm25v2" if self.analyzer == "v2" else "bm25"
        return f"{prefix}-{self.language}-k1={self.k1}-b={self.b}"

    def terms(self, text: str) -> list[str]:
        """The analysed terms of ``text``, in order (what BM25 counts)."""
        out = []
        stems = self._stems
        v2 = self.analyzer == "v2"
        for found in (_V2_TERM if v2 else _V1_TERM).findall(text.lower()):
            word = found[:-2] if v2 and found.endswith(_POSSESSIVE) else found
            if not word or word in ENGLISH_STOPWORDS:
                continue
            stem = stems.get(word)
            if stem is None:
                stem = self._stemmer.stemWord(word)
                if len(stems) < _STEM_CACHE_MAX:
                    stems[word] = stem
            out.append(stem)
        return out

    def encode_documents(self, texts: Sequence[str]) -> list[SparseVector]:
        return self.encode_analysed(self.terms(t) for t in texts)

    def encode_analysed(self, analysed: Iterable[Sequence[str]]) -> list[SparseVector]:
        """The vectors of texts already analysed: each one's :meth:`terms` as an encoder of
        this analyser and language gives them (they do not depend on k1, b or the average,
        so a book's texts are analysed once for its average and its vectors)."""
        return [self._weigh(terms) for terms in analysed]

    def encode_query(self, text: str) -> SparseVector:
        ids = sorted({_term_id(t) for t in self.terms(text)})
        return SparseVector(tuple(ids), tuple(1.0 for _ in ids))

    def _weigh(self, terms: Sequence[str]) -> SparseVector:
        if not terms:
            return SparseVector((), ())
        norm = self.k1 * (1 - self.b + self.b * len(terms) / self.avg_len)
        weights: dict[int, float] = {}
        for term, tf in Counter(terms).items():
            index = _term_id(term)
            weights[index] = weights.get(index, 0.0) + tf * (self.k1 + 1) / (tf + norm)
        ids = sorted(weights)
        return SparseVector(tuple(ids), tuple(round(weights[i], 5) for i in ids))


@dataclass(frozen=True)
class EncodedWhenRead(Sequence[SparseVector]):
    """The BM25 vectors of ``items`` (``text_of`` each), encoded by ``encoder`` each time one
    is read and never held: a book's write reads them one batch of points at a time, so a run
    holds a batch's vectors, not its book's (about 13 KB a chunk as Python tuples; issue
    40.4's first ingest of a 250k-point book held 10 GB). ``items`` are the chunks themselves:
    their texts are composed as they are read, too."""

    encoder: Bm25Encoder
    items: Sequence[Any]
    text_of: Callable[[Any], str]

    def __len__(self) -> int:
        return len(self.items)

    @overload
    def __getitem__(self, index: int) -> SparseVector: ...

    @overload
    def __getitem__(self, index: slice) -> list[SparseVector]: ...

    def __getitem__(self, index: int | slice) -> SparseVector | list[SparseVector]:
        if isinstance(index, slice):
            return self.encoder.encode_documents([self.text_of(i) for i in self.items[index]])
        return self.encoder.encode_documents([self.text_of(self.items[index])])[0]


def fallback_avg_len(target_tokens: int) -> float:
    """The average to use before a collection has any chunk: 0.3 terms per target token."""
    return round(FALLBACK_TERMS_PER_TARGET_TOKEN * max(target_tokens, 1), 1)


def measure_avg_len(
    texts: Iterable[str],
    *,
    analyzer: Analyzer = "v2",
    language: str = "english",
    fallback: float = DEFAULT_AVG_LEN,
) -> float:
    """The collection constant: mean analysed length of the chunk texts (the text that is
    sparse-encoded, i.e. the chunks' ``embed_text``), rounded to 0.1 so that the signature is
    stable; texts without a term are not counted; ``fallback`` when there is none."""
    encoder = Bm25Encoder(language=language, analyzer=analyzer)
    return avg_len_of((len(encoder.terms(text)) for text in texts), fallback=fallback)


def avg_len_of(lengths: Iterable[int], *, fallback: float = DEFAULT_AVG_LEN) -> float:
    """:func:`measure_avg_len` from the texts' analysed lengths (their :meth:`~Bm25Encoder.
    terms` counted)."""
    total = count = 0
    for n in lengths:
        if n:
            total += n
            count += 1
    return round(total / count, 1) if count else fallback


def _term_id(term: str) -> int:
    return zlib.crc32(term.encode("utf-8"))

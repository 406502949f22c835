"""One search request as the CLI and the query service both take it, and its ``--json`` body.

``rag-pipeline search --json`` and ``GET /search`` build the same :class:`SearchRequest` and
print :func:`results_json` of its results, so their bodies are equal by construction.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rag_pipeline.retrieve.filters import SearchFilters
from rag_pipeline.retrieve.search import (
    DEFAULT_FUSION,
    DEFAULT_GROUP_SIZE,
    DEFAULT_MODE,
    DEFAULT_RRF_K,
    FUSIONS,
    GROUP_KEYS,
    GroupBy,
    Hit,
    HitGroup,
    QueryEmbedder,
    SearchMode,
    search,
    search_groups,
)
from rag_pipeline.sparse import Bm25Encoder
from rag_pipeline.store import FusionMethod, VectorStore

__all__ = ["MAX_LIMIT", "MAX_QUERY_CHARS", "SEARCH_MODES", "SearchRequest", "results_json"]

SEARCH_MODES: tuple[SearchMode, ...] = ("dense", "sparse", "hybrid")
MAX_LIMIT = 1000
MAX_GROUP_SIZE = 100
#: a query's characters at most: the model reads its first 256 tokens (about 1,000
#: characters), BM25 every word; a longer text is refused naming the bound rather than
#: embedded, analysed and kept in the service's query cache whatever its size
MAX_QUERY_CHARS = 8192


@dataclass(frozen=True)
class SearchRequest:
    """A validated search of one book: what to look for, how, and how to shape the answer."""

    query: str
    book_id: str
    filters: SearchFilters = field(default_factory=SearchFilters)
    limit: int = 5
    mode: SearchMode = DEFAULT_MODE
    fusion: FusionMethod = DEFAULT_FUSION
    rrf_k: int = DEFAULT_RRF_K
    score_threshold: float | None = None
    #: with a value, ``limit`` counts groups (files) and each holds up to ``group_size`` hits
    group_by: GroupBy | None = None
    group_size: int = DEFAULT_GROUP_SIZE

    def __post_init__(self) -> None:
        """``ValueError`` naming the first thing wrong (the book id is checked by the search)."""
        if not self.book_id:
            raise ValueError("a book is required: every search is scoped to one book (tenant)")
        if len(self.query) > MAX_QUERY_CHARS:
            raise ValueError(
                f"query is {len(self.query):,} characters long: at most {MAX_QUERY_CHARS:,}"
            )
        # only spaces, control or invisible characters (NUL, zero-width spaces): nothing to
        # search for, whatever a model would make of it
        if not any(ch.isprintable() and not ch.isspace() for ch in self.query):
            raise ValueError("query is empty: give the words to search for")
        if self.score_threshold is not None and not math.isfinite(self.score_threshold):
            raise ValueError(f"score_threshold must be a finite number, not {self.score_threshold}")
        if not 1 <= self.limit <= MAX_LIMIT:
            raise ValueError(f"limit must be within 1..{MAX_LIMIT}, not {self.limit}")
        if self.mode not in SEARCH_MODES:
            raise ValueError(f"unknown mode {self.mode!r}; use {', '.join(SEARCH_MODES)}")
        if self.fusion not in FUSIONS:
            raise ValueError(f"unknown fusion {self.fusion!r}; use {', '.join(FUSIONS)}")
        if self.rrf_k < 1:
            raise ValueError(f"rrf_k must be at least 1, not {self.rrf_k}")
        if self.group_by is not None and self.group_by not in GROUP_KEYS:
            raise ValueError(f"cannot group by {self.group_by!r}; use {', '.join(GROUP_KEYS)}")
        if not 1 <= self.group_size <= MAX_GROUP_SIZE:
            raise ValueError(f"group_size must be within 1..{MAX_GROUP_SIZE}")
        self.filters.conditions()  # raises for a filter that cannot hold

    @property
    def needs_embedder(self) -> bool:
        return self.mode != "sparse"

    def run(
        self,
        store: VectorStore,
        embedder: QueryEmbedder | None,
        sparse_encoder: Bm25Encoder | None = None,
    ) -> list[Hit] | list[HitGroup]:
        """Hits, or groups of hits with ``group_by``. ``ValueError`` for a sparse search of a
        query without a single searchable (BM25) term: it could only answer nothing."""
        if (
            self.mode == "sparse"
            and not (sparse_encoder or Bm25Encoder()).encode_query(self.query).indices
        ):
            raise ValueError(
                f"query {self.query!r} has no searchable words for sparse (BM25) search; "
                "use mode dense or hybrid"
            )
        options: dict[str, Any] = {
            "filters": self.filters,
            "limit": self.limit,
            "score_threshold": self.score_threshold,
            "mode": self.mode,
            "sparse_encoder": sparse_encoder,
            "fusion": self.fusion,
            "rrf_k": self.rrf_k,
        }
        if self.group_by is not None:
            return search_groups(
                store,
                embedder,
                self.query,
                self.book_id,
                group_by=self.group_by,
                group_size=self.group_size,
                **options,
            )
        return search(store, embedder, self.query, self.book_id, **options)


def results_json(results: Sequence[Hit] | Sequence[HitGroup]) -> list[dict[str, Any]]:
    """The ``--json`` body: hit objects, or group objects (each with its hit objects)."""
    return [r.as_dict() for r in results]

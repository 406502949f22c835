"""Retrieval: tenant-scoped search (dense, sparse, hybrid), context expansion, documents.

Every function takes a ``book_id`` and builds its filters through
:func:`rag_pipeline.schema.chunks_of`, so no code path can search, expand or read across books:
a point of another book is never returned, even when its id is asked for by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from rag_pipeline.embed.base import Embedder
from rag_pipeline.retrieve.filters import SearchFilters
from rag_pipeline.schema import HIT_FIELDS, chunks_of
from rag_pipeline.sparse import Bm25Encoder
from rag_pipeline.store import Fusion, Match, Range, ScoredRecord, StoredRecord, VectorStore

__all__ = [
    "DEFAULT_MODE",
    "DEFAULT_RRF_K",
    "Hit",
    "SearchMode",
    "expand_context",
    "get_document",
    "search",
]

SearchMode = Literal["dense", "sparse", "hybrid"]
#: chosen by measurement on BEIR SciFact (docs/benchmarks.md)
DEFAULT_MODE: SearchMode = "hybrid"
DEFAULT_RRF_K = 60


@dataclass(frozen=True, slots=True)
class Hit:
    """One chunk returned by a search, an expansion or a document read."""

    id: str
    score: float | None
    payload: dict[str, Any] = field(repr=False)

    @property
    def book_id(self) -> str:
        return str(self.payload.get("book_id"))

    @property
    def text(self) -> str:
        return str(self.payload.get("text", ""))

    @property
    def chunk_index(self) -> int:
        return int(self.payload.get("chunk_index") or 0)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "score": self.score}
        out.update({k: self.payload.get(k) for k in HIT_FIELDS})
        return out


def _hits(records: Sequence[ScoredRecord | StoredRecord]) -> list[Hit]:
    return [Hit(r.id, getattr(r, "score", None), r.payload) for r in records]


def search(
    store: VectorStore,
    embedder: Embedder | None,
    query: str,
    book_id: str,
    *,
    filters: SearchFilters | None = None,
    limit: int = 10,
    score_threshold: float | None = None,
    mode: SearchMode = DEFAULT_MODE,
    sparse_encoder: Bm25Encoder | None = None,
    rrf_k: int = DEFAULT_RRF_K,
    prefetch_limit: int | None = None,
) -> list[Hit]:
    """Top chunks of one book for ``query``; ``book_id`` is required and always applied."""
    if not book_id:
        raise ValueError("search needs a book id: results are always scoped to one book")
    if limit < 1:
        raise ValueError("limit must be at least 1")
    where = chunks_of(book_id, *(filters or SearchFilters()).conditions())
    encoder = sparse_encoder or Bm25Encoder()
    if mode == "sparse":
        records = store.query_sparse(
            where, encoder.encode_query(query), limit=limit, score_threshold=score_threshold
        )
    else:
        if embedder is None:
            raise ValueError(f"{mode} search needs an embedder")
        vector = embedder.embed_query(query)
        if mode == "dense":
            records = store.query_dense(where, vector, limit=limit, score_threshold=score_threshold)
        elif mode == "hybrid":
            records = store.query_hybrid(
                where,
                vector,
                encoder.encode_query(query),
                limit=limit,
                prefetch_limit=prefetch_limit or max(limit * 5, 50),
                fusion=Fusion("rrf", rrf_k),
                score_threshold=score_threshold,
            )
        else:
            raise ValueError(f"unknown search mode {mode!r}; use dense, sparse or hybrid")
    return _hits(records)


def expand_context(
    store: VectorStore, book_id: str, chunk_id: str, *, prev: int = 1, next: int = 1
) -> list[Hit]:
    """The chunk and up to ``prev`` / ``next`` neighbours along its document's chain, in order.

    Neighbour ids are computable from the chain only hop by hop, but every chunk carries its
    document id and index, so all wanted neighbours come back in one filtered read.
    """
    if prev < 0 or next < 0:
        raise ValueError("prev and next must be >= 0")
    where = chunks_of(book_id)
    found = store.retrieve(where, [chunk_id])
    if not found:
        return []
    center = found[0]
    index = int(center.payload.get("chunk_index") or 0)
    wanted = {index + d for d in range(-prev, next + 1)} - {index}
    doc = center.payload.get("parent_doc_id")
    neighbours: list[StoredRecord] = []
    if wanted and doc:
        lo, hi = min(wanted), max(wanted)
        neighbours = [
            r
            for r in store.scroll(
                where.with_conditions(
                    Match("parent_doc_id", str(doc)), Range("chunk_index", gte=max(lo, 0), lte=hi)
                )
            )
            if int(r.payload.get("chunk_index") or 0) in wanted
        ]
    chain = _walk_chain(center, neighbours, prev, next)
    return _hits(chain)


def _walk_chain(
    center: StoredRecord, candidates: Sequence[StoredRecord], prev: int, next: int
) -> list[StoredRecord]:
    """Follow prev/next ids from the centre through the candidates (robust to stale indexes)."""
    by_id = {r.id: r for r in candidates}
    before: list[StoredRecord] = []
    cursor = center
    for _ in range(prev):
        prev_id = cursor.payload.get("prev_chunk_id")
        if not prev_id or prev_id not in by_id:
            break
        cursor = by_id[prev_id]
        before.append(cursor)
    after: list[StoredRecord] = []
    cursor = center
    for _ in range(next):
        next_id = cursor.payload.get("next_chunk_id")
        if not next_id or next_id not in by_id:
            break
        cursor = by_id[next_id]
        after.append(cursor)
    return [*reversed(before), center, *after]


def get_document(store: VectorStore, book_id: str, parent_doc_id: str) -> list[Hit]:
    """All chunks of one document of one book, ordered by ``chunk_index``."""
    where = chunks_of(book_id, Match("parent_doc_id", parent_doc_id))
    records = sorted(store.scroll(where), key=lambda r: int(r.payload.get("chunk_index") or 0))
    return _hits(records)

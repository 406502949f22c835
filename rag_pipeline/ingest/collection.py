"""The collection as a whole: its schema and, per book, what the index holds against the disk.

Read from document records and per-book counts only (never chunk payloads or vectors), so it
stays cheap for many books. The Dagster layer adds each book's last run and check results.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from rag_pipeline.ingest.index import read_index_state
from rag_pipeline.ingest.migration import describe_recipes
from rag_pipeline.models import InvalidBookIdError, validate_book_id
from rag_pipeline.schema import COLLECTION_SCHEMA, EMBEDDING_MODEL, STATUS_ERROR, chunks_of
from rag_pipeline.store import DENSE_VECTOR, SPARSE_VECTOR, VectorStore

__all__ = ["BookHealth", "CollectionState", "book_summary", "describe_collection"]


@dataclass(frozen=True)
class BookHealth:
    """One book as the index holds it."""

    book_id: str
    on_disk: bool
    points: int  # chunk points held
    chunks: int  # chunk points the document records promise
    files: int  # document records
    errors: int  # files whose record says they failed
    models: tuple[str, ...] = ()
    #: the recipe it is searched with (its embedding model), plus ``→ X pending`` while a
    #: new recipe is built beside it
    recipe: str = ""

    @property
    def consistent(self) -> bool:
        return self.points == self.chunks

    @property
    def state(self) -> str:
        if not self.on_disk:
            return "no folder: purged by the next ingest"
        if not self.files:
            return "not indexed yet"
        if not self.consistent:
            return f"inconsistent: {self.points} points, records promise {self.chunks}"
        return "errors in files" if self.errors else "ok"


@dataclass(frozen=True)
class CollectionState:
    """The collection's schema and every book's health."""

    collection: str
    store: str
    exists: bool
    dense_dim: int | None
    payload_indexes: dict[str, str]
    books: tuple[BookHealth, ...] = field(default=())

    @property
    def totals(self) -> dict[str, int]:
        return {
            "books": len(self.books),
            "points": sum(b.points for b in self.books),
            "chunks": sum(b.chunks for b in self.books),
            "files": sum(b.files for b in self.books),
            "errors": sum(b.errors for b in self.books),
        }

    def schema(self) -> dict[str, Any]:
        return {
            "collection": self.collection,
            "vectors": {
                DENSE_VECTOR: {"size": self.dense_dim, "distance": "cosine"},
                SPARSE_VECTOR: {"kind": "BM25 weights", "modifier": "idf"},
            },
            "tenant_field": COLLECTION_SCHEMA.tenant_field,
            "payload_indexes": self.payload_indexes,
        }


#: what a book's summary holds (see :func:`book_summary`); a summary without them is unread
_SUMMARY_KEYS = ("points_by_model", "documents", "errors", "promised_chunks")


def book_summary(store: VectorStore, book_id: str) -> dict[str, Any]:
    """What the collection look needs of one book, read from its document records and chunk
    counts: the store keeps it (:meth:`VectorStore.save_summary`) until the book's next write."""
    state = read_index_state(store, book_id, documents_only=True)
    return {
        "points_by_model": store.counts_by(chunks_of(book_id), EMBEDDING_MODEL),
        "documents": len(state.documents),
        "errors": sum(1 for d in state.documents.values() if d.status == STATUS_ERROR),
        "promised_chunks": state.promised_chunks,
    }


def _usable(summary: Any) -> bool:
    return isinstance(summary, dict) and all(k in summary for k in _SUMMARY_KEYS)


def describe_collection(store: VectorStore, books_on_disk: Collection[str]) -> CollectionState:
    """Every book on disk or in the index, with its counts (from the books' saved summaries;
    only a book without one is read)."""
    indexed = set()
    for tenant in store.tenants():
        try:
            indexed.add(validate_book_id(tenant))
        except InvalidBookIdError:
            continue  # not a book (nothing this pipeline writes)
    saved = store.summaries()
    books = []
    for book_id in sorted(indexed | set(books_on_disk)):
        kept = saved.get(book_id)
        summary = kept if kept is not None and _usable(kept) else book_summary(store, book_id)
        models = {str(k): int(v) for k, v in dict(summary["points_by_model"]).items()}
        books.append(
            BookHealth(
                book_id,
                book_id in books_on_disk,
                points=sum(models.values()),
                chunks=int(summary["promised_chunks"]),
                files=int(summary["documents"]),
                errors=int(summary["errors"]),
                models=tuple(sorted(models)),
                recipe=describe_recipes(
                    store.current_recipe(book_id),
                    store.pending_recipe(book_id),
                    ", ".join(sorted(models)),
                ),
            )
        )
    return CollectionState(
        store.collection,
        store.description,
        store.collection_exists(),
        store.dense_dimension(),
        store.payload_indexes(),
        tuple(books),
    )

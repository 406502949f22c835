"""The collection as a whole: its schema and, per book, what the index holds against the disk.

Read from the books' catalog entries (:mod:`.catalog`; a book without one is read once) and
per-book counts only (never chunk payloads or vectors), so it stays cheap for many books. The
Dagster layer (``defs/collection.py``) adds each book's last run and check results.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from rag_pipeline.ingest.catalog import book_summary, usable_summary
from rag_pipeline.ingest.migration import describe_recipes
from rag_pipeline.models import InvalidBookIdError, validate_book_id
from rag_pipeline.schema import COLLECTION_SCHEMA, SUMMARY_POINTS_BY_MODEL
from rag_pipeline.store import DENSE_VECTOR, SPARSE_VECTOR, BookDamagedError, VectorStore
from rag_pipeline.store.capabilities import catalog_of, generations_of

__all__ = ["BookHealth", "CollectionState", "describe_collection"]


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
    #: the run that last wrote the book, as its summary says (None: the summary does not say)
    last_run: str | None = None
    #: what is damaged in the book's index (None: nothing found); its next ingest rebuilds it
    damage: str | None = None
    #: the source revision (a git commit) the book was last indexed at, as its summary says
    revision: str | None = None

    @property
    def consistent(self) -> bool:
        return self.damage is None and self.points == self.chunks

    @property
    def state(self) -> str:
        if self.damage is not None:
            return f"damaged: {self.damage}; its next ingest rebuilds it"
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


def describe_collection(store: VectorStore, books_on_disk: Collection[str]) -> CollectionState:
    """Every book on disk or in the index, with its counts (from the books' saved summaries;
    only a book without one is read)."""
    indexed = set()
    for tenant in store.tenants():
        try:
            indexed.add(validate_book_id(tenant))
        except InvalidBookIdError:
            continue  # not a book (nothing this pipeline writes)
    catalog = catalog_of(store)
    generations = generations_of(store)
    saved = {} if catalog is None else catalog.summaries()
    books = []
    for book_id in sorted(indexed | set(books_on_disk)):
        kept = saved.get(book_id)
        if kept is not None and usable_summary(kept):
            summary = kept
        else:  # read once, then kept for the next look (and plan)
            try:
                summary = book_summary(store, book_id)
            except BookDamagedError as exc:
                books.append(
                    BookHealth(book_id, book_id in books_on_disk, 0, 0, 0, 0, damage=exc.problem)
                )
                continue
            if summary["documents"] and catalog is not None:
                catalog.save_summary(book_id, summary)
        models = {str(k): int(v) for k, v in dict(summary[SUMMARY_POINTS_BY_MODEL]).items()}
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
                    *(generations.recipes(book_id) if generations else (None, None)),
                    ", ".join(sorted(models)),
                ),
                last_run=summary.get("last_run") or None,
                revision=summary.get("revision") or None,
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

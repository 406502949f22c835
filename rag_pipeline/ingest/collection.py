"""The collection as a whole: its schema and, per book, what the index holds against the disk.

Read from document records and per-book counts only (never chunk payloads or vectors), so it
stays cheap for many books. The Dagster layer adds each book's last run and check results.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rag_pipeline.ingest.changes import IndexedDocument
from rag_pipeline.ingest.filekeys import key_from_json, settled
from rag_pipeline.ingest.index import IndexState, read_index_state
from rag_pipeline.ingest.migration import describe_recipes
from rag_pipeline.models import FileKey, InvalidBookIdError, SourceFile, validate_book_id
from rag_pipeline.schema import (
    COLLECTION_SCHEMA,
    EMBEDDING_MODEL,
    SOURCE_FILE,
    STATUS_ERROR,
    STATUS_OK,
    chunks_of,
)
from rag_pipeline.store import DENSE_VECTOR, SPARSE_VECTOR, BookDamagedError, VectorStore

__all__ = [
    "BookHealth",
    "CollectionState",
    "book_summary",
    "describe_collection",
    "file_stats_from_summary",
    "index_from_summary",
    "recorded_models",
    "run_summary",
]


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


#: what a book's summary holds (see :func:`book_summary`); a summary without them is unread
_SUMMARY_KEYS = ("points_by_model", "documents", "errors", "promised_chunks")
#: what a plan reads of it instead of the book (see :func:`index_from_summary`)
_INDEX_KEYS = ("records", "signatures", "chunk_points")


def book_summary(store: VectorStore, book_id: str) -> dict[str, Any]:
    """What the collection look and the plan need of one book, read from its document records
    and chunk counts: the store keeps it (:meth:`VectorStore.save_summary`) until the book's
    next write.

    Compact whatever the book's size (no chunk ids): per file ``[sha256, total_chunks,
    signature]`` with the signature as an index into ``signatures`` (one per recipe), and
    ``status, error, error_stage`` after them only for a file that is not plainly ok; the
    chunk points per file only for a book whose total is not what its records promise."""
    state = read_index_state(store, book_id, documents_only=True)
    held = store.count(chunks_of(book_id))
    signatures = sorted({d.signature for d in state.documents.values()})
    summary: dict[str, Any] = {
        "points_by_model": store.counts_by(chunks_of(book_id), EMBEDDING_MODEL),
        "documents": len(state.documents),
        "errors": sum(1 for d in state.documents.values() if d.status == STATUS_ERROR),
        "promised_chunks": state.promised_chunks,
        "chunk_points": held,
        "signatures": signatures,
        "records": {
            name: _record(d, signatures.index(d.signature))
            for name, d in sorted(state.documents.items())
        },
    }
    if held != state.promised_chunks:
        summary["points_by_file"] = store.counts_by(chunks_of(book_id), SOURCE_FILE)
    return summary


def _record(document: IndexedDocument, signature: int) -> list[Any]:
    record: list[Any] = [document.source_file_hash, document.total_chunks, signature]
    if (document.status, document.error, document.error_stage) != (STATUS_OK, None, None):
        record += [document.status, document.error, document.error_stage]
    return record


def index_from_summary(
    summary: Mapping[str, Any] | None, book_id: str
) -> tuple[IndexState, dict[str, int]] | None:
    """The book's document records and chunk points per file as :func:`book_summary` saved
    them (what ``read_book_index`` reads without chunk payloads); None for a summary that
    lacks them (saved by an older version): the caller reads the book."""
    if summary is None or not all(k in summary for k in _INDEX_KEYS):
        return None
    signatures = list(summary["signatures"])
    state = IndexState(book_id)
    for name, record in dict(summary["records"]).items():
        status, error, stage = record[3:6] if len(record) >= 6 else (STATUS_OK, None, None)
        state.documents[name] = IndexedDocument(
            name,
            str(record[0]),
            str(status),
            signatures[int(record[2])],
            int(record[1]),
            error,
            stage,
        )
    if "points_by_file" in summary:
        points = {str(k): int(v) for k, v in dict(summary["points_by_file"]).items()}
    elif int(summary["chunk_points"]) == state.promised_chunks:
        points = {n: d.total_chunks for n, d in state.documents.items() if d.total_chunks > 0}
    else:
        return None  # not what book_summary writes: read the book
    state.chunk_points = sum(points.values())  # as read_book_index counts it from the book
    return state, points


def run_summary(
    store: VectorStore,
    book_id: str,
    *,
    run_id: str | None,
    files: Iterable[SourceFile] = (),
    read_at_ns: int = 0,
) -> dict[str, Any]:
    """:func:`book_summary` as a run leaves the book: with the run (the collection's page
    names it as the book's last run without asking Dagster) and the stat of each of ``files``
    (as the run read them, at ``read_at_ns``) whose hash is the one its document record holds
    and whose stat was settled then (:mod:`.filekeys`): a later plan does not read a file
    whose stat is still exactly that one (as the books sensor does)."""
    summary = book_summary(store, book_id)
    records = summary["records"]
    summary["stats"] = {
        f.source_file: list(f.key)
        for f in files
        if f.key is not None
        and f.source_file in records
        and records[f.source_file][0] == f.sha256
        and settled(f.key, read_at_ns)
    }
    summary["last_run"] = run_id
    return summary


def file_stats_from_summary(summary: Mapping[str, Any] | None) -> dict[str, tuple[FileKey, str]]:
    """source_file -> (stat, sha256) as :func:`run_summary` saved them."""
    if summary is None:
        return {}
    records, stats = summary.get("records"), summary.get("stats")
    if not isinstance(records, dict) or not isinstance(stats, dict):
        return {}
    out: dict[str, tuple[FileKey, str]] = {}
    for name, stat in stats.items():
        record = records.get(name)
        key = key_from_json(stat)
        if isinstance(record, list) and record and key is not None:
            out[str(name)] = (key, str(record[0]))
    return out


def recorded_models(summary: Mapping[str, Any] | None) -> dict[str, int] | None:
    """Chunk points per embedding model, as the book's summary saved them (None: no summary)."""
    if summary is None or "points_by_model" not in summary:
        return None
    return {str(k): int(v) for k, v in dict(summary["points_by_model"]).items()}


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
        if kept is not None and _usable(kept):
            summary = kept
        else:  # read once, then kept for the next look (and plan)
            try:
                summary = book_summary(store, book_id)
            except BookDamagedError as exc:
                books.append(
                    BookHealth(book_id, book_id in books_on_disk, 0, 0, 0, 0, damage=exc.problem)
                )
                continue
            if summary["documents"] and store.keeps_summaries:
                store.save_summary(book_id, summary)
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
                last_run=summary.get("last_run") or None,
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

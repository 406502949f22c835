"""Payloads, the index state of a book, and crash-safe writes of a book's changes.

A file's document record (see :mod:`rag_pipeline.schema`) is its commit mark: a run writes the
file's new chunks, then deletes the ones they replace (read from the store at that moment),
then writes the record. A run that dies anywhere leaves the file looking modified, so the next
run redoes it and converges, reusing every vector already written.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rag_pipeline.ingest.changes import FileChanges, IndexedDocument
from rag_pipeline.ingest.recipe import LineageInfo
from rag_pipeline.models import Chunk, DocumentMeta, FileError, document_id
from rag_pipeline.schema import CHUNK, DOCUMENT, book_filter, chunks_of, documents_of
from rag_pipeline.store import MatchAny, PointRecord, SparseVector, VectorStore

__all__ = [
    "DocumentOutcome",
    "IndexState",
    "WriteReport",
    "chunk_payload",
    "damaged_vectors",
    "document_payload",
    "read_index_state",
    "reusable_vectors",
    "write_book_changes",
]

_STATE_FIELDS = [
    "record_type",
    "source_file",
    "source_file_hash",
    "status",
    "signature",
    "total_chunks",
    "error_stage",
    "content_hash",
    "embedding_model",
    "sparse_model",
    "error",
]


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def chunk_payload(chunk: Chunk, lineage: LineageInfo) -> dict[str, Any]:
    meta = chunk.meta
    return {
        "record_type": CHUNK,
        "book_id": chunk.book_id,
        "source_file": chunk.source_file,
        "source_file_hash": chunk.source_file_hash,
        "parent_doc_id": chunk.parent_doc_id,
        "content_hash": chunk.content_hash,
        "text": chunk.text,
        "title": meta.title,
        "section_title": chunk.section_title,
        "chunk_index": chunk.chunk_index,
        "total_chunks": chunk.total_chunks,
        "prev_chunk_id": chunk.prev_chunk_id,
        "next_chunk_id": chunk.next_chunk_id,
        "token_count": chunk.token_count,
        "module": meta.module,
        "chapter": meta.chapter,
        "lesson": meta.lesson,
        "hardware_tier": meta.hardware_tier,
        "proficiency_level": meta.proficiency_level,
        "tags": list(meta.tags),
        "embedding_model": lineage.embedding_model,
        "embedding_dim": lineage.embedding_dim,
        "sparse_model": lineage.sparse_model,
        "signature": lineage.signature,
        "pipeline_version": lineage.pipeline_version,
        "run_id": lineage.run_id,
        "indexed_at": _now(),
    }


@dataclass(frozen=True, slots=True)
class DocumentOutcome:
    """What the document record of a new, modified or unreadable file will say."""

    source_file: str
    source_file_hash: str
    status: str  # ok | empty | error
    total_chunks: int = 0
    doc_meta: DocumentMeta | None = None
    frontmatter: Mapping[str, Any] = field(default_factory=dict)
    error: FileError | None = None
    warnings: tuple[str, ...] = ()


def document_payload(
    book_id: str, outcome: DocumentOutcome, lineage: LineageInfo
) -> dict[str, Any]:
    error = outcome.error
    payload: dict[str, Any] = {
        "record_type": DOCUMENT,
        "book_id": book_id,
        "source_file": outcome.source_file,
        "source_file_hash": outcome.source_file_hash,
        "parent_doc_id": document_id(book_id, outcome.source_file),
        "status": outcome.status,
        "total_chunks": outcome.total_chunks,
        # an error record with chunks still serves the file's last good version
        "serving_previous_version": outcome.status == "error" and outcome.total_chunks > 0,
        "error": error.reason if error else None,
        "error_stage": error.stage if error else None,
        "warnings": list(outcome.warnings),
        "embedding_model": lineage.embedding_model,
        "embedding_dim": lineage.embedding_dim,
        "signature": lineage.signature,
        "pipeline_version": lineage.pipeline_version,
        "run_id": lineage.run_id,
        "indexed_at": _now(),
    }
    meta = outcome.doc_meta
    if meta is not None:
        payload.update(
            title=meta.title,
            module=meta.module,
            chapter=meta.chapter,
            lesson=meta.lesson,
            hardware_tier=meta.hardware_tier,
            proficiency_level=meta.proficiency_level,
            tags=list(meta.tags),
            description=meta.description,
            frontmatter=dict(outcome.frontmatter),
        )
    return payload


@dataclass
class IndexState:
    """What the index holds for one book, read from payloads (no vectors)."""

    book_id: str
    documents: dict[str, IndexedDocument] = field(default_factory=dict)
    chunk_ids: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    # content hash -> ids of chunk points embedded with the given model
    by_content: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    chunk_points: int = 0
    #: the sparse encoder the book's chunks were encoded with (its BM25 average is the book's)
    sparse_model: str | None = None

    @property
    def orphan_files(self) -> set[str]:
        """Files with chunk points but no document record (left by an interrupted run)."""
        return set(self.chunk_ids) - set(self.documents)

    def chunk_counts(self) -> dict[str, int]:
        return {name: len(ids) for name, ids in self.chunk_ids.items()}

    @property
    def promised_chunks(self) -> int:
        return sum(d.total_chunks for d in self.documents.values())


def read_index_state(
    store: VectorStore,
    book_id: str,
    *,
    embedding_model: str | None = None,
    documents_only: bool = False,
) -> IndexState:
    """Scan a book's payloads once: document records, chunk ids per file, reusable hashes."""
    state = IndexState(book_id)
    where = documents_of(book_id) if documents_only else book_filter(book_id)
    for record in store.scroll(where, fields=_STATE_FIELDS):
        p = record.payload
        source_file = p.get("source_file")
        if not isinstance(source_file, str):
            continue
        if p.get("record_type") == DOCUMENT:
            state.documents[source_file] = IndexedDocument(
                source_file,
                str(p.get("source_file_hash", "")),
                str(p.get("status", "ok")),
                str(p.get("signature", "")),
                _int(p.get("total_chunks")),
                p.get("error"),
                p.get("error_stage"),
            )
        elif p.get("record_type") == CHUNK:
            state.chunk_points += 1
            state.chunk_ids[source_file].add(record.id)
            state.sparse_model = state.sparse_model or p.get("sparse_model")
            digest = p.get("content_hash")
            if digest and (embedding_model is None or p.get("embedding_model") == embedding_model):
                state.by_content[digest].append(record.id)
    return state


def _int(value: object) -> int:
    if isinstance(value, int | float | str):
        try:
            return int(value)
        except ValueError:
            return 0
    return 0


def _sound(vector: np.ndarray | None, dimension: int) -> bool:
    """A stored dense vector this pipeline could have written: finite, unit length."""
    if vector is None or vector.shape != (dimension,) or not np.isfinite(vector).all():
        return False
    return abs(float(np.linalg.norm(vector)) - 1.0) <= 1e-3


def reusable_vectors(
    store: VectorStore,
    book_id: str,
    state: IndexState,
    content_hashes: Iterable[str],
    dimension: int,
) -> dict[str, np.ndarray]:
    """Dense vectors already in the index for these content hashes (one per hash). A stored
    vector that is not finite and unit length is never reused: its text is embedded again."""
    ids = {state.by_content[h][0]: h for h in set(content_hashes) if state.by_content.get(h)}
    out: dict[str, np.ndarray] = {}
    id_list = list(ids)
    for start in range(0, len(id_list), 512):
        batch = id_list[start : start + 512]
        for record in store.retrieve(book_filter(book_id), batch, with_vectors=True):
            dense = record.dense
            if dense is not None and _sound(dense, dimension):
                out[ids[record.id]] = dense
    return out


def damaged_vectors(store: VectorStore, book_id: str, ids: Sequence[str], dimension: int) -> int:
    """How many of these stored chunk vectors are not what this pipeline writes (a cheap probe
    for a damaged store: a few vectors are read, not scored)."""
    if not ids:
        return 0
    found = store.retrieve(chunks_of(book_id), list(ids), with_vectors=True)
    return sum(1 for record in found if not _sound(record.dense, dimension))


@dataclass(frozen=True, slots=True)
class WriteReport:
    """What one write of a book did, with the ids (for the run's lineage metadata)."""

    upserted: int
    deleted: int
    documents: int
    written_ids: tuple[str, ...] = ()
    #: (point id, file) of every chunk point this write deleted
    deleted_points: tuple[tuple[str, str], ...] = ()


def write_book_changes(
    store: VectorStore,
    book_id: str,
    *,
    changes: FileChanges,
    chunks: Sequence[Chunk],
    dense: np.ndarray,
    sparse: Sequence[SparseVector],
    outcomes: Sequence[DocumentOutcome],
    lineage: LineageInfo,
) -> WriteReport:
    """Upsert the new points, delete what they replace, then commit the document records.

    Order matters for readers and for crashes: new chunks first (the book stays fully
    searchable), stale chunks next, document records last (the commit mark). Files whose new
    version failed keep their last good chunks (nothing indexed is lost); their record carries
    the error until the file is fixed.
    """
    points = [
        PointRecord(c.id, chunk_payload(c, lineage), dense[i], sparse[i])
        for i, c in enumerate(chunks)
    ]
    upserted = store.upsert(points)
    new_ids = {c.id for c in chunks}
    failed = {o.source_file for o in outcomes if o.status == "error"}
    # What to replace is read now, not taken from the inventory: if another run of this book
    # wrote in between, its points for these files are replaced too, never left as duplicates.
    touched = tuple(sorted((set(changes.changed) - failed) | set(changes.deleted)))
    current = _chunk_ids_of(store, book_id, (*touched, *sorted(failed)))
    stale = sorted((i, name) for name in touched for i in current.get(name, ()) if i not in new_ids)
    deleted = store.delete_ids(book_filter(book_id), [i for i, _ in stale])
    records = [
        PointRecord(
            document_id(book_id, o.source_file),
            document_payload(
                book_id,
                _keeping(o, len(current.get(o.source_file, ()))) if o.source_file in failed else o,
                lineage,
            ),
        )
        for o in outcomes
    ]
    store.upsert(records)
    if changes.deleted:
        gone = [document_id(book_id, name) for name in changes.deleted]
        deleted += store.delete_ids(book_filter(book_id), gone)
        # chunk points of deleted files that a crashed run may have left without known ids
        deleted += store.delete_where(
            book_filter(book_id, MatchAny("source_file", tuple(changes.deleted)))
        )
    return WriteReport(upserted, deleted, len(records), tuple(c.id for c in chunks), tuple(stale))


def _keeping(outcome: DocumentOutcome, kept: int) -> DocumentOutcome:
    return DocumentOutcome(
        outcome.source_file,
        outcome.source_file_hash,
        outcome.status,
        kept,
        outcome.doc_meta,
        outcome.frontmatter,
        outcome.error,
        outcome.warnings,
    )


def _chunk_ids_of(store: VectorStore, book_id: str, files: Sequence[str]) -> dict[str, set[str]]:
    if not files:
        return {}
    out: dict[str, set[str]] = defaultdict(set)
    for record in store.scroll(
        chunks_of(book_id, MatchAny("source_file", tuple(files))), fields=["source_file"]
    ):
        out[str(record.payload.get("source_file"))].add(record.id)
    return out

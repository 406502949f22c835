"""Qdrant payloads, the index state of a book, and crash-safe writes of a book's changes.

The collection holds two kinds of point per book (``record_type``):

* ``chunk``: a dense + sparse vector and the full lineage payload of one chunk;
* ``document``: one per file, no vector, whose id is the file's ``parent_doc_id``. It records
  the file's hash, the chunker and model it was indexed with, its status (ok / empty / error)
  and its chunk count. It is written last, as the commit mark of the file: a run that dies
  before it leaves the file "modified", so the next run redoes it and converges.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from rag_pipeline.changes import FileChanges, IndexedDocument
from rag_pipeline.models import Chunk, DocumentMeta, FileError, document_id
from rag_pipeline.store.base import PointRecord, SparseVector, VectorStore
from rag_pipeline.store.filters import Match, MatchAny, tenant_filter

__all__ = [
    "CHUNK",
    "DOCUMENT",
    "DocumentOutcome",
    "IndexState",
    "LineageInfo",
    "WriteReport",
    "chunk_payload",
    "document_payload",
    "read_index_state",
    "write_book_changes",
]

CHUNK = "chunk"
DOCUMENT = "document"
_STATE_FIELDS = [
    "record_type",
    "source_file",
    "source_file_hash",
    "status",
    "signature",
    "total_chunks",
    "content_hash",
    "embedding_model",
    "error",
]


@dataclass(frozen=True, slots=True)
class LineageInfo:
    """Where and how a run wrote its points (goes into every payload)."""

    embedding_model: str
    embedding_dim: int
    sparse_model: str
    signature: str
    pipeline_version: str
    run_id: str | None = None


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def chunk_payload(chunk: Chunk, lineage: LineageInfo) -> dict[str, Any]:
    meta = chunk.meta
    payload: dict[str, Any] = {
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
    return payload


@dataclass(frozen=True, slots=True)
class DocumentOutcome:
    """What the document record of a new or modified file will say."""

    source_file: str
    source_file_hash: str
    status: str  # ok | empty | error
    total_chunks: int = 0
    doc_meta: DocumentMeta | None = None
    frontmatter: Mapping[str, Any] = field(default_factory=dict)
    error: FileError | None = None


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

    @property
    def orphan_files(self) -> set[str]:
        """Files with chunk points but no document record (left by an interrupted run)."""
        return set(self.chunk_ids) - set(self.documents)


def read_index_state(
    store: VectorStore,
    book_id: str,
    *,
    embedding_model: str | None = None,
    documents_only: bool = False,
) -> IndexState:
    """Scan a book's payloads once: document records, chunk ids per file, reusable hashes."""
    state = IndexState(book_id)
    where = (
        tenant_filter(book_id, Match("record_type", DOCUMENT))
        if documents_only
        else tenant_filter(book_id)
    )
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
                int(p.get("total_chunks") or 0),
                p.get("error"),
            )
        elif p.get("record_type") == CHUNK:
            state.chunk_points += 1
            state.chunk_ids[source_file].add(record.id)
            digest = p.get("content_hash")
            if digest and (embedding_model is None or p.get("embedding_model") == embedding_model):
                state.by_content[digest].append(record.id)
    return state


def reusable_vectors(
    store: VectorStore, book_id: str, state: IndexState, content_hashes: Iterable[str]
) -> dict[str, np.ndarray]:
    """Dense vectors already in the index for these content hashes (one id per hash)."""
    ids = {state.by_content[h][0]: h for h in set(content_hashes) if state.by_content.get(h)}
    out: dict[str, np.ndarray] = {}
    id_list = list(ids)
    for start in range(0, len(id_list), 512):
        batch = id_list[start : start + 512]
        for record in store.retrieve(tenant_filter(book_id), batch, with_vectors=True):
            if record.dense is not None:
                out[ids[record.id]] = record.dense
    return out


@dataclass(frozen=True, slots=True)
class WriteReport:
    upserted: int
    deleted: int
    documents: int


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
    searchable), stale chunks next, document records last (the commit mark).
    """
    where = tenant_filter(book_id)
    points = [
        PointRecord(c.id, chunk_payload(c, lineage), dense[i], sparse[i])
        for i, c in enumerate(chunks)
    ]
    upserted = store.upsert(points)

    new_ids = {c.id for c in chunks}
    # A file that turned unreadable keeps its last good chunks (nothing indexed is lost); its
    # document record carries the error until the file is fixed.
    failed = {o.source_file for o in outcomes if o.status == "error"}
    kept = {
        name: store.count(
            tenant_filter(book_id, Match("record_type", CHUNK), Match("source_file", name))
        )
        for name in failed
    }
    outcomes = [
        replace(o, total_chunks=kept[o.source_file]) if o.source_file in failed else o
        for o in outcomes
    ]
    # What to replace is read now, not taken from the inventory: if another run of this book
    # wrote in between, its points for these files are replaced too, never left as duplicates.
    touched = tuple(sorted((set(changes.changed) - failed) | set(changes.deleted)))
    stale = set()
    if touched:
        current = store.scroll(
            tenant_filter(book_id, Match("record_type", CHUNK), MatchAny("source_file", touched)),
            fields=["source_file"],
        )
        stale = {record.id for record in current} - new_ids
    deleted = store.delete_ids(where, sorted(stale))

    records = [
        PointRecord(document_id(book_id, o.source_file), document_payload(book_id, o, lineage))
        for o in outcomes
    ]
    store.upsert(records)
    if changes.deleted:
        deleted += store.delete_ids(where, [document_id(book_id, name) for name in changes.deleted])
        # Chunk points of deleted files that a crashed run may have left without ids above.
        deleted += store.delete_where(
            tenant_filter(book_id, MatchAny("source_file", tuple(changes.deleted)))
        )
    return WriteReport(upserted, deleted, len(records))

"""Invariants of a book's points in the index and of the data about to be written there."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rag_pipeline.ingest.changes import IndexedDocument
from rag_pipeline.models import Chunk
from rag_pipeline.schema import (
    CHUNK,
    CHUNK_INDEX,
    CONTENT_HASH,
    DOCUMENT,
    EMBEDDING_DIM,
    ERROR,
    NEXT_CHUNK_ID,
    PARENT_DOC_ID,
    PREV_CHUNK_ID,
    RECORD_TYPE,
    SOURCE_FILE,
    STATUS,
    STATUS_ERROR,
    TOTAL_CHUNKS,
    book_filter,
    chunk_index_of,
    chunks_of,
)
from rag_pipeline.store import MatchAny, VectorStore

__all__ = ["IndexConsistency", "check_chunks", "check_index", "check_vectors"]

_FIELDS = [
    RECORD_TYPE,
    SOURCE_FILE,
    PARENT_DOC_ID,
    CHUNK_INDEX,
    TOTAL_CHUNKS,
    PREV_CHUNK_ID,
    NEXT_CHUNK_ID,
    CONTENT_HASH,
    STATUS,
    ERROR,
    EMBEDDING_DIM,
]


@dataclass
class IndexConsistency:
    """What ``check_index`` found for one book; ``passed`` when every invariant holds."""

    book_id: str
    points: int = 0
    expected: int = 0
    documents: int = 0
    orphans: list[str] = field(default_factory=list)  # "file: reason"
    duplicates: list[str] = field(default_factory=list)
    broken_links: list[str] = field(default_factory=list)
    dimension_errors: list[str] = field(default_factory=list)
    #: files whose document record says they failed (they serve their last good chunks)
    file_errors: dict[str, str] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return (
            self.points == self.expected
            and not self.orphans
            and not self.duplicates
            and not self.broken_links
            and not self.dimension_errors
        )

    def problems(self) -> list[str]:
        out = []
        if self.points != self.expected:
            out.append(f"{self.points} chunk points but document records expect {self.expected}")
        out += [f"orphan: {o}" for o in self.orphans]
        out += [f"duplicate: {d}" for d in self.duplicates]
        out += [f"broken link: {b}" for b in self.broken_links]
        out += self.dimension_errors
        return out


def check_index(
    store: VectorStore,
    book_id: str,
    dimension: int | None = None,
    *,
    written: Collection[str] | None = None,
    others: Mapping[str, IndexedDocument] | None = None,
) -> IndexConsistency:
    """Points == chunks the document records promise; no orphans, duplicates or broken links.

    With ``written`` (the files a run just wrote or deleted) and ``others`` (the document
    records of the book's other files, as the run's assessment found them): the points and
    records of the written files are read and checked, the other files' records are taken
    from ``others`` (checked when they were written, unchanged since) and the book's chunk
    points are counted: a one-file edit's check reads what it wrote, not the whole book
    (issue 40.4), and a chunk point the records do not promise still fails it."""
    report = IndexConsistency(book_id)
    documents: dict[str, dict[str, Any]] = {}
    chunks: dict[str, dict[str, Any]] = {}
    where = book_filter(book_id)
    if written:
        where = book_filter(book_id, MatchAny(SOURCE_FILE, tuple(sorted(written))))
    for record in store.scroll(where, fields=_FIELDS) if written is None or written else ():
        if record.payload.get(RECORD_TYPE) == DOCUMENT:
            documents[str(record.payload.get(SOURCE_FILE))] = record.payload
            if record.payload.get(STATUS) == STATUS_ERROR:
                report.file_errors[str(record.payload.get(SOURCE_FILE))] = str(
                    record.payload.get(ERROR) or "unknown error"
                )
        elif record.payload.get(RECORD_TYPE) == CHUNK:
            chunks[record.id] = record.payload
    report.points = len(chunks)
    report.documents = len(documents)
    report.expected = sum(int(d.get(TOTAL_CHUNKS) or 0) for d in documents.values())
    if written is not None:
        kept = {n: d for n, d in (others or {}).items() if n not in written}
        report.points = store.count(chunks_of(book_id))
        report.documents += len(kept)
        report.expected += sum(d.total_chunks for d in kept.values())
        for name, d in kept.items():
            if d.status == STATUS_ERROR:
                report.file_errors[name] = d.error or "unknown error"

    by_doc: dict[str, list[tuple[str, dict[str, Any]]]] = defaultdict(list)
    for point_id, p in chunks.items():
        source = str(p.get(SOURCE_FILE))
        doc = documents.get(source)
        if doc is None:
            report.orphans.append(f"{source}: chunk {point_id} has no document record")
            continue
        if p.get(PARENT_DOC_ID) != doc.get(PARENT_DOC_ID):
            report.orphans.append(f"{source}: chunk {point_id} names another document")
        by_doc[source].append((point_id, p))
        if dimension is not None and p.get(EMBEDDING_DIM) not in (None, dimension):
            report.dimension_errors.append(
                f"{source}: chunk {point_id} was embedded with {p.get(EMBEDDING_DIM)} "
                f"dimensions, the model makes {dimension}"
            )
    for source, members in sorted(by_doc.items()):
        total = int(documents[source].get(TOTAL_CHUNKS) or 0)
        positions = Counter(chunk_index_of(p) for _, p in members)
        repeated = sorted(i for i, n in positions.items() if n > 1)
        if repeated:
            report.duplicates.append(f"{source}: chunk positions {repeated} held by several points")
        if len(members) != total:
            report.orphans.append(
                f"{source}: {len(members)} chunk points, document record says {total}"
            )
        ids = {point_id for point_id, _ in members}
        for point_id, p in members:
            for link in (PREV_CHUNK_ID, NEXT_CHUNK_ID):
                target = p.get(link)
                if target and target not in ids:
                    report.broken_links.append(f"{source}: {link} of {point_id} -> {target}")
        _check_chain(report, source, dict(members))
    if dimension is not None:
        stored = store.dimension_of(book_id)
        if stored is not None and stored != dimension:
            report.dimension_errors.append(
                f"the book's vectors have {stored} dimensions, the model makes {dimension}"
            )
    return report


def _check_chain(report: IndexConsistency, source: str, members: dict[str, dict[str, Any]]) -> None:
    """Every chunk of a document lies on one prev/next chain from its head. Text may repeat
    within a document (each occurrence has its own id and position), so a point that repeats
    the content of a chunk on the chain but is not on it is a duplicate, not a repetition."""
    heads = [pid for pid, p in members.items() if not p.get(PREV_CHUNK_ID)]
    if len(heads) != 1:
        report.broken_links.append(f"{source}: {len(heads)} chunks start the document's chain")
        return
    reached: list[str] = []
    seen: set[str] = set()
    current: str | None = heads[0]
    while current in members and current not in seen:
        seen.add(current)
        reached.append(current)
        current = members[current].get(NEXT_CHUNK_ID)
    on_chain = {members[pid].get(CONTENT_HASH) for pid in reached}
    for pid in sorted(set(members) - seen):
        if members[pid].get(CONTENT_HASH) in on_chain:
            report.duplicates.append(f"{source}: point {pid} duplicates the content of a chunk")
        else:
            report.broken_links.append(f"{source}: point {pid} is not on the document's chain")


def check_chunks(chunks: Sequence[Chunk], limit: int) -> list[str]:
    """Problems that must stop chunks from being embedded and published."""
    problems = []
    ids = Counter(c.id for c in chunks)
    problems += [f"duplicate chunk id {i}" for i, n in ids.items() if n > 1]
    known = set(ids)
    per_doc: dict[str, list[Chunk]] = defaultdict(list)
    for c in chunks:
        per_doc[c.parent_doc_id].append(c)
        if not c.text.strip():
            problems.append(f"{c.source_file} #{c.chunk_index}: empty text")
        if c.token_count > limit:
            problems.append(
                f"{c.source_file} #{c.chunk_index}: {c.token_count} tokens > limit {limit}"
            )
        for link in (c.prev_chunk_id, c.next_chunk_id):
            if link is not None and link not in known:
                problems.append(f"{c.source_file} #{c.chunk_index}: link to unknown {link}")
    for members in per_doc.values():
        indexes = sorted(c.chunk_index for c in members)
        if indexes != list(range(len(members))) or any(
            c.total_chunks != len(members) for c in members
        ):
            problems.append(f"{members[0].source_file}: chunk_index/total_chunks not 0..n-1")
    return problems


def check_vectors(dense: np.ndarray, expected_dim: int, collection_dim: int | None) -> list[str]:
    problems = []
    if dense.ndim != 2 or (len(dense) and dense.shape[1] != expected_dim):
        problems.append(f"vectors have shape {dense.shape}, the model makes {expected_dim}")
    if collection_dim is not None and collection_dim != expected_dim:
        problems.append(
            f"the collection holds {collection_dim}-dimensional vectors, the model "
            f"makes {expected_dim}: use another RAG_COLLECTION"
        )
    if len(dense):
        if not np.isfinite(dense).all():
            problems.append("vectors contain NaN or infinity")
        norms = np.linalg.norm(dense, axis=1)
        bad = int((np.abs(norms - 1.0) > 1e-3).sum())
        if bad:
            problems.append(f"{bad} vectors are not unit length")
    return problems

"""The index state of a book, and crash-safe writes of a book's changes (the payloads they
write and read are :mod:`rag_pipeline.schema`'s).

A file's document record (see :mod:`rag_pipeline.schema`) is its commit mark: a run writes the
file's new chunks, then deletes the ones they replace (read from the store at that moment),
then writes the record. A run that dies anywhere leaves the file looking modified, so the next
run redoes it and converges, reusing every vector already written.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from rag_pipeline.ingest.changes import FileChanges, IndexedDocument
from rag_pipeline.models import Chunk, document_id
from rag_pipeline.recipes.choice import most_common
from rag_pipeline.recipes.recipe import LineageInfo
from rag_pipeline.schema import (
    CHUNK,
    CONTENT_HASH,
    DOCUMENT,
    EMBEDDING_MODEL,
    ERROR,
    ERROR_STAGE,
    INDEXED_AT,
    PARSE_VERSION,
    READ_OPTIONS,
    RECORD_TYPE,
    SIGNATURE,
    SOURCE_FILE,
    SOURCE_FILE_HASH,
    SOURCE_REVISION,
    SPARSE_MODEL,
    STATUS,
    STATUS_ERROR,
    STATUS_OK,
    TOTAL_CHUNKS,
    DocumentOutcome,
    book_filter,
    chunk_payload,
    chunks_of,
    document_payload,
    documents_of,
    indexed_now,
    int_field,
)
from rag_pipeline.store import (
    Match,
    MatchAny,
    PointRecord,
    SparseVector,
    StoredRecord,
    VectorStore,
)

__all__ = [
    "WRITE_BATCH",
    "DocumentOutcome",
    "IndexState",
    "WriteReport",
    "chunk_payload",
    "damaged_vectors",
    "document_payload",
    "documents_after_write",
    "read_index_state",
    "reusable_vectors",
    "sparse_model_of",
    "write_book_changes",
]

#: what the index state is read from (no text, no vectors)
_STATE_FIELDS = [
    RECORD_TYPE,
    SOURCE_FILE,
    SOURCE_FILE_HASH,
    STATUS,
    SIGNATURE,
    TOTAL_CHUNKS,
    ERROR_STAGE,
    PARSE_VERSION,
    READ_OPTIONS,
    CONTENT_HASH,
    EMBEDDING_MODEL,
    SPARSE_MODEL,
    ERROR,
    SOURCE_REVISION,
    INDEXED_AT,
]


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
    #: source_file -> (indexed_at, source revision) of each document record that names a
    #: revision (a git commit): what :attr:`revision` is decided from
    record_revisions: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: whether ``chunk_ids`` and ``by_content`` were read (a run's assessment reads no chunk
    #: payloads: it looks its reusable vectors up by content hash; a plan's preview reads them)
    chunk_payloads_read: bool = True

    @property
    def revision(self) -> str | None:
        """What the book was last indexed at (a git commit; None: a source without revisions):
        the revision of its newest document record, by (indexed_at, revision). One exact
        answer whichever way the records were read (the book, a saved summary, a run's own
        writes): a total order over the records held now, never the order they were read in,
        and never a record since replaced or deleted."""
        newest = max(self.record_revisions.values(), default=None)
        return None if newest is None else newest[1]

    @property
    def newest_indexed_at(self) -> str:
        """The ``indexed_at`` of the newest of those records ("" when none): the next write
        of the book is stamped later (:func:`~rag_pipeline.schema.indexed_now`)."""
        return max((at for at, _ in self.record_revisions.values()), default="")

    @property
    def orphan_files(self) -> set[str]:
        """Files with chunk points but no document record (left by an interrupted run)."""
        return set(self.chunk_ids) - set(self.documents)

    def chunk_counts(self) -> dict[str, int]:
        return {name: len(ids) for name, ids in self.chunk_ids.items()}

    @property
    def promised_chunks(self) -> int:
        return sum(d.total_chunks for d in self.documents.values())

    @property
    def recorded_signature(self) -> str | None:
        """The recipe signature most of the book's document records carry (None: none)."""
        return most_common(Counter(d.signature for d in self.documents.values() if d.signature))


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
    _read_into(state, store.scroll(where, fields=_STATE_FIELDS), embedding_model)
    return state


def documents_after_write(
    store: VectorStore, before: IndexState, written: Collection[str]
) -> IndexState:
    """The book's document records after a run wrote (or deleted) those of ``written``:
    ``before``'s records of the other files, and those of ``written`` read again (a run's
    reads stay in proportion to its change, issue 40.4)."""
    state = IndexState(
        before.book_id,
        {n: d for n, d in before.documents.items() if n not in written},
        record_revisions={n: r for n, r in before.record_revisions.items() if n not in written},
    )
    if written:
        where = documents_of(before.book_id, MatchAny(SOURCE_FILE, tuple(sorted(written))))
        _read_into(state, store.scroll(where, fields=_STATE_FIELDS), None)
    return state


def _read_into(
    state: IndexState, records: Iterable[StoredRecord], embedding_model: str | None
) -> None:
    for record in records:
        p = record.payload
        source_file = p.get(SOURCE_FILE)
        if not isinstance(source_file, str):
            continue
        if p.get(RECORD_TYPE) == DOCUMENT:
            status = str(p.get(STATUS, STATUS_OK))
            version = p.get(PARSE_VERSION) if status == STATUS_ERROR else None
            state.documents[source_file] = IndexedDocument(
                source_file,
                str(p.get(SOURCE_FILE_HASH, "")),
                status,
                str(p.get(SIGNATURE, "")),
                int_field(p, TOTAL_CHUNKS),
                p.get(ERROR),
                p.get(ERROR_STAGE),
                version if isinstance(version, str) else None,
                options if isinstance(options := p.get(READ_OPTIONS), str) else "",
            )
            revision = p.get(SOURCE_REVISION)
            if isinstance(revision, str) and revision:
                state.record_revisions[source_file] = (str(p.get(INDEXED_AT) or ""), revision)
            else:
                state.record_revisions.pop(source_file, None)
        elif p.get(RECORD_TYPE) == CHUNK:
            state.chunk_points += 1
            state.chunk_ids[source_file].add(record.id)
            state.sparse_model = state.sparse_model or p.get(SPARSE_MODEL)
            digest = p.get(CONTENT_HASH)
            if digest and (embedding_model is None or p.get(EMBEDDING_MODEL) == embedding_model):
                state.by_content[digest].append(record.id)


def _sound(vector: np.ndarray | None, dimension: int) -> bool:
    """A stored dense vector this pipeline could have written: finite, unit length."""
    if vector is None or vector.shape != (dimension,) or not np.isfinite(vector).all():
        return False
    return abs(float(np.linalg.norm(vector)) - 1.0) <= 1e-3


#: chunk points built and upserted at once: a write holds one batch's payloads and sparse
#: vectors, never its book's (a first ingest's peak memory does not grow with the book)
WRITE_BATCH = 512

#: content hashes looked up per store read (a filter's list of values)
_HASHES_PER_READ = 512


def reusable_vectors(
    store: VectorStore,
    book_id: str,
    content_hashes: Iterable[str],
    dimension: int,
    embedding_model: str,
) -> dict[str, np.ndarray]:
    """Dense vectors already in the book for these content hashes, embedded with
    ``embedding_model`` (one per hash), found through the content-hash payload filter: a run
    reads the points that hold its chunks' text, not the book's chunks (issue 40.4: a
    one-file edit's reads do not grow with its book). A stored vector that is not finite and
    unit length is never reused: its text is embedded again."""
    hashes = sorted(set(content_hashes))
    out: dict[str, np.ndarray] = {}
    for start in range(0, len(hashes), _HASHES_PER_READ):
        batch = tuple(h for h in hashes[start : start + _HASHES_PER_READ] if h not in out)
        if not batch:
            continue
        where = chunks_of(
            book_id, MatchAny(CONTENT_HASH, batch), Match(EMBEDDING_MODEL, embedding_model)
        )
        for record in store.scroll(where, fields=[CONTENT_HASH], with_vectors=True):
            digest, dense = record.payload.get(CONTENT_HASH), record.dense
            if isinstance(digest, str) and digest not in out and _sound(dense, dimension):
                assert dense is not None
                out[digest] = dense
    return out


def sparse_model_of(store: VectorStore, book_id: str) -> str | None:
    """The sparse encoder the book's chunks were encoded with (its BM25 average is the
    book's), read from one chunk point (None: the book has none)."""
    for record in store.scroll(chunks_of(book_id), fields=[SPARSE_MODEL], page_size=1):
        model = record.payload.get(SPARSE_MODEL)
        return model if isinstance(model, str) and model else None
    return None


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
    newer_than: str = "",
) -> WriteReport:
    """Upsert the new points, delete what they replace, then commit the document records,
    stamped later than ``newer_than`` (the newest ``indexed_at`` of the book's records,
    :attr:`IndexState.newest_indexed_at`).

    Order matters for readers and for crashes: new chunks first (the book stays fully
    searchable), stale chunks next, document records last (the commit mark). Files whose new
    version failed keep their last good chunks (nothing indexed is lost); their record carries
    the error until the file is fixed.
    """
    upserted = 0
    indexed_at = indexed_now(newer_than)  # one time for the write: its records order as one
    for start in range(0, len(chunks), WRITE_BATCH):
        end = start + WRITE_BATCH
        vectors = sparse[start:end]  # encoded now (EncodedWhenRead): a batch's, not a book's
        points = [
            PointRecord(
                c.id, dict(chunk_payload(c, lineage, indexed_at)), dense[start + i], vectors[i]
            )
            for i, c in enumerate(chunks[start:end])
        ]
        upserted += store.upsert(points)
    new_ids = {c.id for c in chunks}
    failed = {o.source_file for o in outcomes if o.status == STATUS_ERROR}
    # What to replace is read now, not taken from the inventory: if another run of this book
    # wrote in between, its points for these files are replaced too, never left as duplicates.
    touched = tuple(sorted((set(changes.changed) - failed) | set(changes.deleted)))
    current = _chunk_ids_of(store, book_id, (*touched, *sorted(failed)))
    stale = sorted((i, name) for name in touched for i in current.get(name, ()) if i not in new_ids)
    deleted = store.delete_ids(book_filter(book_id), [i for i, _ in stale])
    records = [
        PointRecord(
            document_id(book_id, o.source_file),
            dict(
                document_payload(
                    book_id,
                    _keeping(o, len(current.get(o.source_file, ())))
                    if o.source_file in failed
                    else o,
                    lineage,
                    indexed_at,
                )
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
            book_filter(book_id, MatchAny(SOURCE_FILE, tuple(changes.deleted)))
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
        chunks_of(book_id, MatchAny(SOURCE_FILE, tuple(files))), fields=[SOURCE_FILE]
    ):
        out[str(record.payload.get(SOURCE_FILE))].add(record.id)
    return out

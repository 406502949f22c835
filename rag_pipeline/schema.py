"""The payload schema of the collection, written once: record types, field names, typed
payloads, their builders and readers, indexes.

Each point of the collection is either a **chunk** (dense + sparse vector, :class:`ChunkPayload`)
or a **document record** (one per file, no vector, id = the file's ``parent_doc_id``,
:class:`DocumentPayload`): the commit mark of the file, written last by a run. ``book_id`` is the
tenant key: every read, count and delete goes through :func:`book_filter`, which cannot be built
without a valid book.

Every payload key is spelled here and nowhere else in the package: code that reads a payload
names its keys by the constants below (a test scans the package for spelled keys). The stored
format is a contract (existing indexes must still be read): a test pins each key set.

The store package knows nothing of books: it is handed :data:`COLLECTION_SCHEMA`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol, TypedDict

from rag_pipeline.models import Chunk, DocumentMeta, FileError, document_id, validate_book_id
from rag_pipeline.store.base import CollectionSchema
from rag_pipeline.store.filters import Condition, Match, TenantFilter

__all__ = [
    "BOOK_ID",
    "CHUNK",
    "CHUNK_FIELDS",
    "COLLECTION_SCHEMA",
    "CORE_INDEXES",
    "DOCUMENT",
    "DOCUMENT_FIELDS",
    "DOCUMENT_META_FIELDS",
    "HIT_FIELDS",
    "LINEAGE_FIELDS",
    "PAYLOAD_INDEXES",
    "PAYLOAD_KEYS",
    "SCOPE_FIELDS",
    "STATUS_EMPTY",
    "STATUS_ERROR",
    "STATUS_OK",
    "SUMMARY_POINTS_BY_MODEL",
    "ChunkPayload",
    "DocumentMetaPayload",
    "DocumentOutcome",
    "DocumentPayload",
    "DocumentRecordPayload",
    "DocumentStatus",
    "Lineage",
    "RecordType",
    "book_filter",
    "chunk_index_of",
    "chunk_payload",
    "chunks_of",
    "document_payload",
    "documents_of",
    "indexed_now",
    "int_field",
]

RecordType = Literal["chunk", "document"]
CHUNK: Final = "chunk"
DOCUMENT: Final = "document"
#: what a document record says of its file: chunks written, nothing to write, or it failed
#: (a failed file keeps serving the chunks of its last good version, if any)
DocumentStatus = Literal["ok", "empty", "error"]
STATUS_OK: Final = "ok"
STATUS_EMPTY: Final = "empty"
STATUS_ERROR: Final = "error"

#: the key of a book's catalog entry (its saved summary, ``ingest/catalog.py``) that holds its
#: chunk points per embedding model: what the recipe choice reads of it
SUMMARY_POINTS_BY_MODEL: Final = "points_by_model"

# Field names. Constants (not an enum) so that mypy reads each as its literal: a TypedDict
# indexed by one is checked like one indexed by the spelled key.
#: the tenant key
BOOK_ID: Final = "book_id"
RECORD_TYPE: Final = "record_type"
SOURCE_FILE: Final = "source_file"
SOURCE_FILE_HASH: Final = "source_file_hash"
PARENT_DOC_ID: Final = "parent_doc_id"
CONTENT_HASH: Final = "content_hash"
TEXT: Final = "text"
TITLE: Final = "title"
SECTION_TITLE: Final = "section_title"
CHUNK_INDEX: Final = "chunk_index"
TOTAL_CHUNKS: Final = "total_chunks"
PREV_CHUNK_ID: Final = "prev_chunk_id"
NEXT_CHUNK_ID: Final = "next_chunk_id"
TOKEN_COUNT: Final = "token_count"
MODULE: Final = "module"
CHAPTER: Final = "chapter"
LESSON: Final = "lesson"
HARDWARE_TIER: Final = "hardware_tier"
PROFICIENCY_LEVEL: Final = "proficiency_level"
TAGS: Final = "tags"
EMBEDDING_MODEL: Final = "embedding_model"
EMBEDDING_DIM: Final = "embedding_dim"
SPARSE_MODEL: Final = "sparse_model"
SIGNATURE: Final = "signature"
PIPELINE_VERSION: Final = "pipeline_version"
RUN_ID: Final = "run_id"
INDEXED_AT: Final = "indexed_at"
# where the file's bytes came from, for a source with versions (git: the commit of the book's
# tree the run read, and the file's blob id on every point; an object's ETag on its document
# record); None for a folder book
SOURCE_REVISION: Final = "source_revision"
SOURCE_VERSION: Final = "source_version"
# of document records only
STATUS: Final = "status"
SERVING_PREVIOUS_VERSION: Final = "serving_previous_version"
ERROR: Final = "error"
ERROR_STAGE: Final = "error_stage"
#: the version of the parse rules the record was written under (read back for error records:
#: one written under other rules is read again, see ``ingest.parse.PARSE_RULES_VERSION``)
PARSE_VERSION: Final = "parse_version"
#: the read settings the file was read under (``ParseOptions.key``: path patterns, default
#: hardware tier, file limits; "" or absent for the defaults): a record of other settings that
#: is not an error is read again, so its chunks are a clean build's
READ_OPTIONS: Final = "read_options"
WARNINGS: Final = "warnings"
DESCRIPTION: Final = "description"
FRONTMATTER: Final = "frontmatter"


class ChunkPayload(TypedDict):
    """The payload of a chunk point, keys in the order they are written."""

    record_type: Literal["chunk"]
    book_id: str
    source_file: str
    source_file_hash: str
    parent_doc_id: str
    content_hash: str
    text: str
    title: str
    section_title: str | None
    chunk_index: int
    total_chunks: int
    prev_chunk_id: str | None
    next_chunk_id: str | None
    token_count: int
    module: str | None
    chapter: int | None
    lesson: int | None
    hardware_tier: int | None
    proficiency_level: str | None
    tags: list[str]
    embedding_model: str
    embedding_dim: int
    sparse_model: str
    signature: str
    pipeline_version: str
    run_id: str | None
    indexed_at: str
    source_revision: str | None
    source_version: str | None


class DocumentRecordPayload(TypedDict):
    """What every document record holds, keys in the order they are written."""

    record_type: Literal["document"]
    book_id: str
    source_file: str
    source_file_hash: str
    parent_doc_id: str
    status: DocumentStatus
    total_chunks: int
    serving_previous_version: bool
    error: str | None
    error_stage: str | None
    parse_version: str
    read_options: str
    warnings: list[str]
    embedding_model: str
    embedding_dim: int
    signature: str
    pipeline_version: str
    run_id: str | None
    indexed_at: str
    source_revision: str | None
    source_version: str | None


class DocumentMetaPayload(TypedDict, total=False):
    """The document's metadata, in its record when the file was parsed."""

    title: str
    module: str | None
    chapter: int | None
    lesson: int | None
    hardware_tier: int | None
    proficiency_level: str | None
    tags: list[str]
    description: str | None
    frontmatter: dict[str, Any]


class DocumentPayload(DocumentRecordPayload, DocumentMetaPayload):
    """The payload of a document record."""


#: fields of a chunk's payload, in the order they are written
CHUNK_FIELDS: Final[tuple[str, ...]] = tuple(ChunkPayload.__annotations__)
#: fields of a document record that every record has
DOCUMENT_FIELDS: Final[tuple[str, ...]] = tuple(DocumentRecordPayload.__annotations__)
#: fields a document record adds when its file was parsed
DOCUMENT_META_FIELDS: Final[tuple[str, ...]] = tuple(DocumentMetaPayload.__annotations__)
#: every key this pipeline writes into a payload
PAYLOAD_KEYS: Final = frozenset((*CHUNK_FIELDS, *DOCUMENT_FIELDS, *DOCUMENT_META_FIELDS))

#: every field a filter, a change check or a lineage lookup uses is indexed
PAYLOAD_INDEXES: Final[dict[str, Literal["keyword", "integer"]]] = {
    RECORD_TYPE: "keyword",
    MODULE: "keyword",
    CHAPTER: "integer",
    LESSON: "integer",
    HARDWARE_TIER: "integer",
    PROFICIENCY_LEVEL: "keyword",
    TAGS: "keyword",
    PARENT_DOC_ID: "keyword",
    SOURCE_FILE: "keyword",
    SOURCE_FILE_HASH: "keyword",
    CONTENT_HASH: "keyword",
    EMBEDDING_MODEL: "keyword",
}
#: the indexes every book's shard has: the record type (every read), the file (writes, facets,
#: per-file counts), the model (facets), the document (document reads, expansion); the others
#: serve search filters, and a small book's shard gets them once it grows (store/edge.py)
CORE_INDEXES: Final = frozenset({RECORD_TYPE, SOURCE_FILE, EMBEDDING_MODEL, PARENT_DOC_ID})
COLLECTION_SCHEMA: Final = CollectionSchema(
    tenant_field=BOOK_ID, payload_indexes=PAYLOAD_INDEXES, core_indexes=CORE_INDEXES
)
#: fields every read sets itself (the tenant, the record type): never a free filter
SCOPE_FIELDS: Final = (BOOK_ID, RECORD_TYPE)

#: what a search, expansion or document read returns of each chunk (the ``--json`` contract)
HIT_FIELDS: Final = (
    BOOK_ID,
    TEXT,
    SOURCE_FILE,
    SECTION_TITLE,
    CHUNK_INDEX,
    TOTAL_CHUNKS,
    PARENT_DOC_ID,
    TITLE,
    PREV_CHUNK_ID,
    NEXT_CHUNK_ID,
    MODULE,
    CHAPTER,
    LESSON,
    HARDWARE_TIER,
    PROFICIENCY_LEVEL,
    CONTENT_HASH,
    SOURCE_FILE_HASH,
    EMBEDDING_MODEL,
    RUN_ID,
)
#: what ``lineage`` reports of a point (the ``--json`` contract)
LINEAGE_FIELDS: Final = (
    BOOK_ID,
    RECORD_TYPE,
    SOURCE_FILE,
    SECTION_TITLE,
    TITLE,
    CHUNK_INDEX,
    TOTAL_CHUNKS,
    PARENT_DOC_ID,
    CONTENT_HASH,
    SOURCE_FILE_HASH,
    EMBEDDING_MODEL,
    EMBEDDING_DIM,
    SPARSE_MODEL,
    PIPELINE_VERSION,
    SIGNATURE,
    RUN_ID,
    INDEXED_AT,
    SOURCE_REVISION,
    SOURCE_VERSION,
)


class Lineage(Protocol):
    """Where and how a run writes its points (:class:`rag_pipeline.recipes.recipe.LineageInfo`)."""

    @property
    def embedding_model(self) -> str: ...
    @property
    def embedding_dim(self) -> int: ...
    @property
    def sparse_model(self) -> str: ...
    @property
    def signature(self) -> str: ...
    @property
    def pipeline_version(self) -> str: ...
    @property
    def parse_version(self) -> str: ...
    @property
    def read_options(self) -> str: ...
    @property
    def run_id(self) -> str | None: ...
    @property
    def source_revision(self) -> str | None: ...
    def source_version(self, source_file: str) -> str | None: ...


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")


def indexed_now(after: str = "") -> str:
    """The ``indexed_at`` of the points one write of a book writes (one value for all of
    them): UTC to the microsecond, and later than ``after`` (the newest ``indexed_at`` the
    book's records hold) even when the wall clock says otherwise (stepped back, or the same
    microsecond): a book's writes are ordered exactly, and its indexed revision is that of
    its newest record (:class:`~rag_pipeline.ingest.index.IndexState`). Records written
    before this had whole seconds (``...:05+00:00``), which sort before any written later
    in the same second (``...:05.000001+00:00``: ``+`` is before ``.``)."""
    now = _now()
    try:
        floor = dt.datetime.fromisoformat(after) + dt.timedelta(microseconds=1) if after else None
        if floor is None or dt.datetime.fromisoformat(now) >= floor:
            return now
    except ValueError:  # not a time this pipeline wrote: the clock decides
        return now
    return floor.astimezone(dt.UTC).isoformat(timespec="microseconds")


def chunk_payload(chunk: Chunk, lineage: Lineage, indexed_at: str | None = None) -> ChunkPayload:
    """The payload of a chunk point (``indexed_at``: its write's, :func:`indexed_now`)."""
    meta = chunk.meta
    return ChunkPayload(
        record_type=CHUNK,
        book_id=chunk.book_id,
        source_file=chunk.source_file,
        source_file_hash=chunk.source_file_hash,
        parent_doc_id=chunk.parent_doc_id,
        content_hash=chunk.content_hash,
        text=chunk.text,
        title=meta.title,
        section_title=chunk.section_title,
        chunk_index=chunk.chunk_index,
        total_chunks=chunk.total_chunks,
        prev_chunk_id=chunk.prev_chunk_id,
        next_chunk_id=chunk.next_chunk_id,
        token_count=chunk.token_count,
        module=meta.module,
        chapter=meta.chapter,
        lesson=meta.lesson,
        hardware_tier=meta.hardware_tier,
        proficiency_level=meta.proficiency_level,
        tags=list(meta.tags),
        embedding_model=lineage.embedding_model,
        embedding_dim=lineage.embedding_dim,
        sparse_model=lineage.sparse_model,
        signature=lineage.signature,
        pipeline_version=lineage.pipeline_version,
        run_id=lineage.run_id,
        indexed_at=indexed_at or _now(),
        source_revision=lineage.source_revision,
        source_version=lineage.source_version(chunk.source_file),
    )


@dataclass(frozen=True, slots=True)
class DocumentOutcome:
    """What the document record of a new, modified or unreadable file will say."""

    source_file: str
    source_file_hash: str
    status: DocumentStatus
    total_chunks: int = 0
    doc_meta: DocumentMeta | None = None
    frontmatter: Mapping[str, Any] = field(default_factory=dict)
    error: FileError | None = None
    warnings: tuple[str, ...] = ()


def document_payload(
    book_id: str, outcome: DocumentOutcome, lineage: Lineage, indexed_at: str | None = None
) -> DocumentPayload:
    """The payload of a file's document record (its metadata too when the file was parsed;
    ``indexed_at``: its write's, :func:`indexed_now`)."""
    error = outcome.error
    payload = DocumentPayload(
        record_type=DOCUMENT,
        book_id=book_id,
        source_file=outcome.source_file,
        source_file_hash=outcome.source_file_hash,
        parent_doc_id=document_id(book_id, outcome.source_file),
        status=outcome.status,
        total_chunks=outcome.total_chunks,
        # an error record with chunks still serves the file's last good version
        serving_previous_version=outcome.status == STATUS_ERROR and outcome.total_chunks > 0,
        error=error.reason if error else None,
        error_stage=error.stage if error else None,
        parse_version=lineage.parse_version,
        read_options=lineage.read_options,
        warnings=list(outcome.warnings),
        embedding_model=lineage.embedding_model,
        embedding_dim=lineage.embedding_dim,
        signature=lineage.signature,
        pipeline_version=lineage.pipeline_version,
        run_id=lineage.run_id,
        indexed_at=indexed_at or _now(),
        source_revision=lineage.source_revision,
        source_version=lineage.source_version(outcome.source_file),
    )
    meta = outcome.doc_meta
    if meta is None:
        return payload
    parsed = DocumentMetaPayload(
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
    return {**payload, **parsed}


def int_field(payload: Mapping[str, Any], key: str) -> int:
    """An integer field of a stored payload; 0 when it is missing or not a number (a damaged
    or foreign point must not stop a reader)."""
    value = payload.get(key)
    if isinstance(value, int | float | str):
        try:
            return int(value)
        except ValueError:
            return 0
    return 0


def chunk_index_of(payload: Mapping[str, Any]) -> int:
    """A chunk's position in its document, read from its stored payload (0 when missing)."""
    return int(payload.get(CHUNK_INDEX) or 0)


def book_filter(book_id: str, *conditions: Condition) -> TenantFilter:
    """Points of one book (validated id) that meet every condition."""
    return TenantFilter(validate_book_id(book_id), tuple(conditions))


def chunks_of(book_id: str, *conditions: Condition) -> TenantFilter:
    """Chunk points of one book."""
    return book_filter(book_id, Match(RECORD_TYPE, CHUNK), *conditions)


def documents_of(book_id: str, *conditions: Condition) -> TenantFilter:
    """Document records of one book."""
    return book_filter(book_id, Match(RECORD_TYPE, DOCUMENT), *conditions)

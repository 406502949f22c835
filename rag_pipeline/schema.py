"""The payload schema of the collection, written once: record types, field names, indexes.

Each point of the collection is either a **chunk** (dense + sparse vector, the payload below)
or a **document record** (one per file, no vector, id = the file's ``parent_doc_id``): the
commit mark of the file, written last by a run. ``book_id`` is the tenant key: every read,
count and delete goes through :func:`book_filter`, which cannot be built without a valid book.

The store package knows nothing of books: it is handed :data:`COLLECTION_SCHEMA`.
"""

from __future__ import annotations

from typing import Final, Literal

from rag_pipeline.models import validate_book_id
from rag_pipeline.store.base import CollectionSchema
from rag_pipeline.store.filters import Condition, Match, TenantFilter

__all__ = [
    "BOOK_ID",
    "CHUNK",
    "CHUNK_FIELDS",
    "COLLECTION_SCHEMA",
    "DOCUMENT",
    "DOCUMENT_FIELDS",
    "HIT_FIELDS",
    "LINEAGE_FIELDS",
    "PAYLOAD_INDEXES",
    "RecordType",
    "book_filter",
    "chunks_of",
    "documents_of",
]

RecordType = Literal["chunk", "document"]
CHUNK: Final = "chunk"
DOCUMENT: Final = "document"
#: the tenant key
BOOK_ID: Final = "book_id"

#: every field a filter, a change check or a lineage lookup uses is indexed
PAYLOAD_INDEXES: Final[dict[str, Literal["keyword", "integer"]]] = {
    "record_type": "keyword",
    "module": "keyword",
    "chapter": "integer",
    "lesson": "integer",
    "hardware_tier": "integer",
    "proficiency_level": "keyword",
    "tags": "keyword",
    "parent_doc_id": "keyword",
    "source_file": "keyword",
    "source_file_hash": "keyword",
    "content_hash": "keyword",
    "embedding_model": "keyword",
}
COLLECTION_SCHEMA: Final = CollectionSchema(tenant_field=BOOK_ID, payload_indexes=PAYLOAD_INDEXES)

#: fields of a chunk's payload, in the order they are written
CHUNK_FIELDS: Final = (
    "record_type",
    "book_id",
    "source_file",
    "source_file_hash",
    "parent_doc_id",
    "content_hash",
    "text",
    "title",
    "section_title",
    "chunk_index",
    "total_chunks",
    "prev_chunk_id",
    "next_chunk_id",
    "token_count",
    "module",
    "chapter",
    "lesson",
    "hardware_tier",
    "proficiency_level",
    "tags",
    "embedding_model",
    "embedding_dim",
    "sparse_model",
    "signature",
    "pipeline_version",
    "run_id",
    "indexed_at",
)
#: fields of a document record that every record has (plus the document's metadata when parsed)
DOCUMENT_FIELDS: Final = (
    "record_type",
    "book_id",
    "source_file",
    "source_file_hash",
    "parent_doc_id",
    "status",
    "total_chunks",
    "serving_previous_version",
    "error",
    "error_stage",
    "warnings",
    "embedding_model",
    "embedding_dim",
    "signature",
    "pipeline_version",
    "run_id",
    "indexed_at",
)
#: what a search, expansion or document read returns of each chunk (the ``--json`` contract)
HIT_FIELDS: Final = (
    "book_id",
    "text",
    "source_file",
    "section_title",
    "chunk_index",
    "total_chunks",
    "parent_doc_id",
    "title",
    "prev_chunk_id",
    "next_chunk_id",
    "module",
    "chapter",
    "lesson",
    "hardware_tier",
    "proficiency_level",
    "content_hash",
    "source_file_hash",
    "embedding_model",
    "run_id",
)
#: what ``lineage`` reports of a point
LINEAGE_FIELDS: Final = (
    "book_id",
    "record_type",
    "source_file",
    "section_title",
    "title",
    "chunk_index",
    "total_chunks",
    "parent_doc_id",
    "content_hash",
    "source_file_hash",
    "embedding_model",
    "embedding_dim",
    "sparse_model",
    "pipeline_version",
    "signature",
    "run_id",
    "indexed_at",
)


def book_filter(book_id: str, *conditions: Condition) -> TenantFilter:
    """Points of one book (validated id) that meet every condition."""
    return TenantFilter(validate_book_id(book_id), tuple(conditions))


def chunks_of(book_id: str, *conditions: Condition) -> TenantFilter:
    """Chunk points of one book."""
    return book_filter(book_id, Match("record_type", CHUNK), *conditions)


def documents_of(book_id: str, *conditions: Condition) -> TenantFilter:
    """Document records of one book."""
    return book_filter(book_id, Match("record_type", DOCUMENT), *conditions)

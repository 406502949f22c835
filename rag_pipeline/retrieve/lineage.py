"""Walk from a point back to the file, section and run that produced it."""

from __future__ import annotations

from typing import Any

from rag_pipeline.schema import (
    DOCUMENT,
    LINEAGE_FIELDS,
    PARENT_DOC_ID,
    RECORD_TYPE,
    RUN_ID,
    SOURCE_FILE,
    SOURCE_FILE_HASH,
    STATUS,
    book_filter,
)
from rag_pipeline.sources.base import BookSource
from rag_pipeline.store import VectorStore

__all__ = ["trace_point"]


def trace_point(
    store: VectorStore,
    source: BookSource,
    book_id: str,
    point_id: str,
    *,
    dagster_url: str | None = None,
) -> dict[str, Any] | None:
    """Lineage of one point of one book, and whether its file (in ``source``, where the book
    comes from) changed since."""
    found = store.retrieve(book_filter(book_id), [point_id])
    if not found:
        return None
    payload = found[0].payload
    info: dict[str, Any] = {"point_id": point_id}
    info.update({k: payload.get(k) for k in LINEAGE_FIELDS})
    source_file = str(payload.get(SOURCE_FILE) or "")
    current = source.current_hash(book_id, source_file)
    info["file_path"] = source.locate(book_id, source_file)
    info["file_exists"] = not source.is_gone(book_id, source_file)
    info["current_file_hash"] = current
    info["file_changed_since_indexed"] = current != payload.get(SOURCE_FILE_HASH)
    if payload.get(RECORD_TYPE) != DOCUMENT and payload.get(PARENT_DOC_ID):
        record = store.retrieve(book_filter(book_id), [str(payload[PARENT_DOC_ID])])
        if record:
            info["document_status"] = record[0].payload.get(STATUS)
            info["document_run_id"] = record[0].payload.get(RUN_ID)
    if info.get(RUN_ID):
        info["dagster_run_url_path"] = f"/runs/{info[RUN_ID]}"
        if dagster_url:
            info["dagster_run_url"] = f"{dagster_url.rstrip('/')}/runs/{info[RUN_ID]}"
    return info

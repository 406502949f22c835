"""Walk from a point back to the file, section and run that produced it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rag_pipeline.config import Settings
from rag_pipeline.crawl import hash_file
from rag_pipeline.index import DOCUMENT
from rag_pipeline.store.base import VectorStore
from rag_pipeline.store.filters import tenant_filter

__all__ = ["LINEAGE_FIELDS", "trace_point"]

LINEAGE_FIELDS = (
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


def trace_point(
    store: VectorStore, settings: Settings, book_id: str, point_id: str
) -> dict[str, Any] | None:
    """Lineage of one point of one book, and whether its source file changed since."""
    found = store.retrieve(tenant_filter(book_id), [point_id])
    if not found:
        return None
    payload = found[0].payload
    info: dict[str, Any] = {"point_id": point_id}
    info.update({k: payload.get(k) for k in LINEAGE_FIELDS})
    source_file = str(payload.get("source_file") or "")
    path = Path(settings.data_dir) / book_id / source_file
    info["file_path"] = str(path)
    info["file_exists"] = path.is_file()
    current = hash_file(path) if path.is_file() else None
    info["current_file_hash"] = current
    info["file_changed_since_indexed"] = current != payload.get("source_file_hash")
    if payload.get("record_type") != DOCUMENT and payload.get("parent_doc_id"):
        record = store.retrieve(tenant_filter(book_id), [str(payload["parent_doc_id"])])
        if record:
            info["document_status"] = record[0].payload.get("status")
            info["document_run_id"] = record[0].payload.get("run_id")
    if info.get("run_id"):
        info["dagster_run_url_path"] = f"/runs/{info['run_id']}"
    return info

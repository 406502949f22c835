"""Walk from a point back to the file, section and run that produced it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rag_pipeline.ingest.crawl import hash_file
from rag_pipeline.schema import DOCUMENT, LINEAGE_FIELDS, book_filter
from rag_pipeline.store import VectorStore

__all__ = ["trace_point"]


def trace_point(
    store: VectorStore,
    data_dir: Path,
    book_id: str,
    point_id: str,
    *,
    dagster_url: str | None = None,
) -> dict[str, Any] | None:
    """Lineage of one point of one book, and whether its source file changed since."""
    found = store.retrieve(book_filter(book_id), [point_id])
    if not found:
        return None
    payload = found[0].payload
    info: dict[str, Any] = {"point_id": point_id}
    info.update({k: payload.get(k) for k in LINEAGE_FIELDS})
    source_file = str(payload.get("source_file") or "")
    path = Path(data_dir) / book_id / source_file
    info["file_path"] = str(path)
    info["file_exists"] = path.is_file()
    try:
        current = hash_file(path) if path.is_file() else None
    except OSError:
        current = None
    info["current_file_hash"] = current
    info["file_changed_since_indexed"] = current != payload.get("source_file_hash")
    if payload.get("record_type") != DOCUMENT and payload.get("parent_doc_id"):
        record = store.retrieve(book_filter(book_id), [str(payload["parent_doc_id"])])
        if record:
            info["document_status"] = record[0].payload.get("status")
            info["document_run_id"] = record[0].payload.get("run_id")
    if info.get("run_id"):
        info["dagster_run_url_path"] = f"/runs/{info['run_id']}"
        if dagster_url:
            info["dagster_run_url"] = f"{dagster_url.rstrip('/')}/runs/{info['run_id']}"
    return info

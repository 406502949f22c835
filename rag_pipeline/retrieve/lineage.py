"""Walk from a point back to the file, section and run that produced it.

The run that writes points logs every id it wrote, with its file and section, in messages of
at most :data:`POINTS_PER_MESSAGE` ids (:func:`written_points_messages`); the run page's log
filter finds a message by any text in it, so :func:`point_log_path` (the run page filtered
to the point's id) shows the point's file and section, whatever the size of the run.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import groupby
from typing import Any
from urllib.parse import quote

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

__all__ = ["POINTS_PER_MESSAGE", "point_log_path", "trace_point", "written_points_messages"]

#: ids one log message of a run lists at most (a message a person can read, and the run
#: page's filter shows whole)
POINTS_PER_MESSAGE = 200


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
    # read within the book's boundary, as a run reads: a file replaced by a link out of the
    # book is refused, never hashed (the hash of any file the service can read, otherwise)
    now = source.file_now(book_id, source_file)
    info["file_path"] = source.locate(book_id, source_file)
    info["file_exists"] = now.exists
    info["current_file_hash"] = now.sha256
    info["file_changed_since_indexed"] = now.sha256 != payload.get(SOURCE_FILE_HASH)
    info["file_problem"] = now.problem
    if payload.get(RECORD_TYPE) != DOCUMENT and payload.get(PARENT_DOC_ID):
        record = store.retrieve(book_filter(book_id), [str(payload[PARENT_DOC_ID])])
        if record:
            info["document_status"] = record[0].payload.get(STATUS)
            info["document_run_id"] = record[0].payload.get(RUN_ID)
    if info.get(RUN_ID):
        info["dagster_run_url_path"] = f"/runs/{info[RUN_ID]}"
        info["dagster_point_url_path"] = point_log_path(str(info[RUN_ID]), point_id)
        if dagster_url:
            base = dagster_url.rstrip("/")
            info["dagster_run_url"] = f"{base}/runs/{info[RUN_ID]}"
            info["dagster_point_url"] = base + info["dagster_point_url_path"]
    return info


def point_log_path(run_id: str, point_id: str) -> str:
    """The run's page with its log filtered to the message that lists ``point_id`` (a UI
    path: the filter is the ``logs`` query parameter, free text)."""
    return f"/runs/{run_id}?logs={quote(point_id)}"


def written_points_messages(
    book_id: str,
    points: Iterable[tuple[str, str, str]],
    documents: Sequence[tuple[str, str]] = (),
) -> list[str]:
    """The log messages that list every point a run wrote for a book: ``points`` are
    (point id, file, section), ``documents`` (file, document record id). Lines read
    ``file § section: id, id`` in the order given; a message holds at most
    :data:`POINTS_PER_MESSAGE` ids."""
    #: (file, what of it, id): a chunk point under its section, or the file's document record
    entries = [(file, f"§ {section or '(no heading)'}", pid) for pid, file, section in points]
    entries += [(file, "(its document record)", doc_id) for file, doc_id in documents]
    # each file's lines together, its document record after its chunks (a stable sort)
    first_seen = {file: i for i, (file, _, _) in reversed(list(enumerate(entries)))}
    entries.sort(key=lambda e: first_seen[e[0]])
    out = []
    total, parts = len(entries), -(-len(entries) // POINTS_PER_MESSAGE)
    for i, start in enumerate(range(0, total, POINTS_PER_MESSAGE)):
        part = entries[start : start + POINTS_PER_MESSAGE]
        head = (
            f"[{book_id}] points written by this run, {start + 1}-{start + len(part)} of "
            f"{total} (message {i + 1} of {parts}), as file § section: point ids"
        )
        body = [
            f"{file} {what}: " + ", ".join(e[2] for e in group)
            for (file, what), group in groupby(part, key=lambda e: (e[0], e[1]))
        ]
        out.append("\n".join([head, *body]))
    return out

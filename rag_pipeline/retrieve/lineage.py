"""Walk from a point back to the file, section and run that produced it: :func:`read_point`
reads the index, :func:`describe_point` asks the book's source about the file (a remote may take
seconds: a caller lets go of the store in between).

The run that writes points logs every id it wrote on a short line of its own with its file and
section, :data:`POINTS_PER_MESSAGE` lines a message (:func:`written_points_messages`); the run
page's log filter finds a message by any text in it, so :func:`point_log_path` (the run page
filtered to the point's id) shows the point's line whole, whatever the size of the run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from rag_pipeline.retrieve.view import read_under_one_view
from rag_pipeline.schema import (
    DOCUMENT,
    LINEAGE_FIELDS,
    PARENT_DOC_ID,
    RECORD_TYPE,
    RUN_ID,
    SOURCE_FILE,
    SOURCE_FILE_HASH,
    SOURCE_REVISION,
    STATUS,
    book_filter,
)
from rag_pipeline.sources.base import BookSource
from rag_pipeline.store import VectorStore
from rag_pipeline.urls import link_url

__all__ = [
    "POINTS_PER_MESSAGE",
    "WHERE_CHARS",
    "PointRecord",
    "describe_point",
    "point_log_path",
    "read_point",
    "written_points_messages",
]

#: point lines one log message of a run holds at most: the run page shows about 8 lines of a
#: message before "View full message", so a filtered message shows every line whole; and a run
#: writes one event per 8 points (an event costs the run about 2-10 ms)
POINTS_PER_MESSAGE = 8
#: characters of a line's "file § section" at most, so that a line does not wrap
WHERE_CHARS = 80


@dataclass(frozen=True)
class PointRecord:
    """What the index holds of a point for its lineage: its payload, and its document
    record's (None: the point is a document record, or its record is gone)."""

    point_id: str
    payload: Mapping[str, Any]
    document: Mapping[str, Any] | None


def read_point(store: VectorStore, book_id: str, point_id: str) -> PointRecord | None:
    """The store's part of a point's lineage (None: the book holds no such point). Only the
    index is read: a caller holding the store lets go of it before :func:`describe_point`
    asks the source (a remote git repository or object store may take seconds, and a run
    waiting for the store would fail busy meanwhile). The point and its document record are
    read from one generation of the book
    (:func:`~rag_pipeline.retrieve.view.read_under_one_view`)."""
    return read_under_one_view(
        store, book_id, lambda _: _read_point(store, book_id, point_id), what="lineage read"
    )


def _read_point(store: VectorStore, book_id: str, point_id: str) -> PointRecord | None:
    found = store.retrieve(book_filter(book_id), [point_id])
    if not found:
        return None
    payload = found[0].payload
    document = None
    if payload.get(RECORD_TYPE) != DOCUMENT and payload.get(PARENT_DOC_ID):
        record = store.retrieve(book_filter(book_id), [str(payload[PARENT_DOC_ID])])
        document = record[0].payload if record else None
    return PointRecord(point_id, payload, document)


def describe_point(
    record: PointRecord,
    source: BookSource,
    book_id: str,
    *,
    dagster_url: str | None = None,
) -> dict[str, Any]:
    """Lineage of one point of one book (:func:`read_point`), and whether its file (in
    ``source``, where the book comes from) changed since."""
    payload, point_id = record.payload, record.point_id
    info: dict[str, Any] = {"point_id": point_id}
    info.update({k: payload.get(k) for k in LINEAGE_FIELDS})
    source_file = str(payload.get(SOURCE_FILE) or "")
    # read within the book's boundary, as a run reads: a file replaced by a link out of the
    # book is refused, never hashed (the hash of any file the service can read, otherwise)
    now = source.file_now(book_id, source_file)
    # (a source locates and describes without a URL's credentials: BookSource.locate)
    info["file_path"] = source.locate(book_id, source_file)
    info["file_exists"] = now.exists
    info["current_file_hash"] = now.sha256
    # a file that is there but could not be read (a remote down, a read denied): unknown
    unknown = now.exists and now.sha256 is None
    info["file_changed_since_indexed"] = (
        None if unknown else now.sha256 != payload.get(SOURCE_FILE_HASH)
    )
    info["file_problem"] = now.problem
    revision = payload.get(SOURCE_REVISION)
    if revision:  # a book of a source with revisions (git): the commit the point was read at
        info["source"] = source.describe(book_id)
        commit = source.revision_info(book_id, str(revision)) or {"sha": str(revision)}
        info["commit"] = commit
    # every documented field in every answer (null when unknown): a document record is its
    # own document; a chunk whose record is gone has none
    document = payload if payload.get(RECORD_TYPE) == DOCUMENT else record.document
    info["document_status"] = document.get(STATUS) if document is not None else None
    info["document_run_id"] = document.get(RUN_ID) if document is not None else None
    run_id = info.get(RUN_ID)
    # a link any client of the service reads: the UI's address, never its credentials
    base = link_url(dagster_url).rstrip("/") if dagster_url else None
    info["dagster_run_url_path"] = f"/runs/{run_id}" if run_id else None
    info["dagster_point_url_path"] = point_log_path(str(run_id), point_id) if run_id else None
    info["dagster_run_url"] = f"{base}/runs/{run_id}" if run_id and base else None
    info["dagster_point_url"] = (
        base + point_log_path(str(run_id), point_id) if run_id and base else None
    )
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
    (point id, file, section), ``documents`` (file, document record id). A first message says
    how to read them; then one line a point, ``file § section: id`` (a long file or section
    shortened with '…'), each file's lines together in the order given, its document record
    (``file (its document record): id``) last, :data:`POINTS_PER_MESSAGE` lines a message."""
    #: (file, what of it, id): a chunk point under its section, or the file's document record
    entries = [(file, f"§ {section or '(no heading)'}", pid) for pid, file, section in points]
    entries += [(file, "(its document record)", doc_id) for file, doc_id in documents]
    if not entries:
        return []
    # each file's lines together, its document record after its chunks (a stable sort)
    first_seen = {file: i for i, (file, _, _) in reversed(list(enumerate(entries)))}
    entries.sort(key=lambda e: first_seen[e[0]])
    lines = [f"{_where(file, what)}: {pid}" for file, what, pid in entries]
    messages = [
        "\n".join(lines[start : start + POINTS_PER_MESSAGE])
        for start in range(0, len(lines), POINTS_PER_MESSAGE)
    ]
    head = (
        f"[{book_id}] {len(lines):,} points written by this run, in the {len(messages):,} "
        "messages after this one, one a line: file § section: point id. Filter the log by a "
        "point id to see its line."
    )
    return [head, *messages]


def _where(file: str, what: str) -> str:
    """``file what`` in at most :data:`WHERE_CHARS` characters: a long file keeps the end of
    its path (its name), a long section its start."""
    budget = WHERE_CHARS - 1
    what = _clip(what, max(budget // 2, budget - len(file)))
    file = file if len(file) <= budget - len(what) else "…" + file[-(budget - len(what) - 1) :]
    return f"{file} {what}"


def _clip(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: chars - 1] + "…"

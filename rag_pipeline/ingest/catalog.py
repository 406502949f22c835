"""A book's catalog entry: what its saved summary holds, as this pipeline writes and reads it.

The store keeps one per book (:meth:`~rag_pipeline.store.BookCatalog.save_summary`, where the
backend has a catalog) and vouches for it until the book's next write; the collection look and
the plan read it instead of the book. Compact whatever the book's size: per file ``[sha256,
total_chunks, signature]``, the chunk points per embedding model, the stats of the files as
the run that wrote it read them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rag_pipeline.ingest.changes import IndexedDocument
from rag_pipeline.ingest.index import IndexState, read_index_state
from rag_pipeline.models import SourceFile, VersionKey
from rag_pipeline.schema import (
    EMBEDDING_MODEL,
    SOURCE_FILE,
    STATUS_ERROR,
    STATUS_OK,
    SUMMARY_POINTS_BY_MODEL,
    chunks_of,
)
from rag_pipeline.sources.filekeys import key_from_json, key_to_json, settled
from rag_pipeline.store import VectorStore

__all__ = [
    "SUMMARY_KEYS",
    "book_summary",
    "file_stats_from_summary",
    "index_from_summary",
    "run_summary",
    "usable_summary",
]

#: what a book's summary holds (see :func:`book_summary`); a summary without them is unread
SUMMARY_KEYS = (SUMMARY_POINTS_BY_MODEL, "documents", "errors", "promised_chunks")
#: what a plan reads of it instead of the book (see :func:`index_from_summary`)
_INDEX_KEYS = ("records", "signatures", "chunk_points")


def book_summary(
    store: VectorStore, book_id: str, state: IndexState | None = None
) -> dict[str, Any]:
    """What the collection look and the plan need of one book, read from its document records
    and chunk counts: the store keeps it (:meth:`VectorStore.save_summary`) until the book's
    next write.

    Compact whatever the book's size (no chunk ids): per file ``[sha256, total_chunks,
    signature]`` with the signature as an index into ``signatures`` (one per recipe), and
    ``status, error, error_stage`` after them only for a file that is not plainly ok (and an
    error record's parse rules version after those, when it names one); the
    chunk points per file only for a book whose total is not what its records promise.
    ``state``: the book's document records already known (a run's: those it found and
    those it wrote), else read."""
    if state is None:
        state = read_index_state(store, book_id, documents_only=True)
    held = store.count(chunks_of(book_id))
    signatures = sorted({d.signature for d in state.documents.values()})
    summary: dict[str, Any] = {
        SUMMARY_POINTS_BY_MODEL: store.counts_by(chunks_of(book_id), EMBEDDING_MODEL),
        "documents": len(state.documents),
        "errors": sum(1 for d in state.documents.values() if d.status == STATUS_ERROR),
        "promised_chunks": state.promised_chunks,
        "chunk_points": held,
        "signatures": signatures,
        "records": {
            name: _record(d, signatures.index(d.signature))
            for name, d in sorted(state.documents.items())
        },
    }
    if held != state.promised_chunks:
        summary["points_by_file"] = store.counts_by(chunks_of(book_id), SOURCE_FILE)
    if state.record_revisions:  # a source with revisions (git)
        summary.update(_revisions_of(state))
    return summary


def _revisions_of(state: IndexState) -> dict[str, Any]:
    """What the book was last indexed at (``revision``: :attr:`IndexState.revision`), and
    what it is decided from, compactly: each distinct (indexed_at, revision) of the records
    once (``record_revisions``, oldest first; a write gives all its records one time) and,
    for each record in the order of ``records``, the index of its pair (-1: none), so that a
    run that starts from this summary and replaces or deletes the newest records gets the
    answer a read of the book gives."""
    pairs = sorted(set(state.record_revisions.values()))
    index = {pair: i for i, pair in enumerate(pairs)}
    return {
        "revision": state.revision,
        "record_revisions": [list(pair) for pair in pairs],
        "revision_of_records": [
            index.get(state.record_revisions.get(name, ("", "")), -1)
            for name in sorted(state.documents)
        ],
    }


def _record(document: IndexedDocument, signature: int) -> list[Any]:
    record: list[Any] = [document.source_file_hash, document.total_chunks, signature]
    # positions 3-7 kept only as far as one differs from an ok record of the defaults
    tail = [
        document.status,
        document.error,
        document.error_stage,
        document.parse_version,  # an error record's parse rules
        document.read_options,  # read settings other than the defaults
    ]
    if document.read_options:
        return record + tail
    if document.parse_version is not None:
        return record + tail[:4]
    if tuple(tail[:3]) != (STATUS_OK, None, None):
        return record + tail[:3]
    return record


def index_from_summary(
    summary: Mapping[str, Any] | None, book_id: str
) -> tuple[IndexState, dict[str, int]] | None:
    """The book's document records and chunk points per file as :func:`book_summary` saved
    them (what ``read_book_index`` reads without chunk payloads); None for a summary that
    lacks them (saved by an older version): the caller reads the book."""
    if summary is None or not all(k in summary for k in _INDEX_KEYS):
        return None
    signatures = list(summary["signatures"])
    state = IndexState(book_id)
    for name, record in dict(summary["records"]).items():
        status, error, stage = record[3:6] if len(record) >= 6 else (STATUS_OK, None, None)
        version = record[6] if len(record) >= 7 else None  # a summary before versions: none
        options = record[7] if len(record) >= 8 else ""
        state.documents[name] = IndexedDocument(
            name,
            str(record[0]),
            str(status),
            signatures[int(record[2])],
            int(record[1]),
            error,
            stage,
            None if version is None else str(version),
            str(options or ""),
        )
    if "points_by_file" in summary:
        points = {str(k): int(v) for k, v in dict(summary["points_by_file"]).items()}
    elif int(summary["chunk_points"]) == state.promised_chunks:
        points = {n: d.total_chunks for n, d in state.documents.items() if d.total_chunks > 0}
    else:
        return None  # not what book_summary writes: read the book
    state.chunk_points = sum(points.values())  # as read_book_index counts it from the book
    if "revision" in summary or "record_revisions" in summary:
        revisions = _record_revisions(summary, sorted(state.documents))
        if revisions is None:
            return None  # saved before records' revisions were: read the book
        state.record_revisions = revisions
    return state, points


def _record_revisions(
    summary: Mapping[str, Any], names: list[str]
) -> dict[str, tuple[str, str]] | None:
    """source_file -> (indexed_at, revision) as :func:`_revisions_of` saved them (None: not
    saved, or not what it saves)."""
    pairs, of_records = summary.get("record_revisions"), summary.get("revision_of_records")
    if not isinstance(pairs, list) or not isinstance(of_records, list):
        return None
    if len(of_records) != len(names):
        return None
    out: dict[str, tuple[str, str]] = {}
    for name, i in zip(names, of_records, strict=True):
        if not isinstance(i, int) or not -1 <= i < len(pairs):
            return None
        if i < 0:
            continue
        pair = pairs[i]
        if not isinstance(pair, list) or len(pair) != 2:
            return None
        out[name] = (str(pair[0]), str(pair[1]))
    return out


def run_summary(
    store: VectorStore,
    book_id: str,
    *,
    run_id: str | None,
    files: Iterable[SourceFile] = (),
    read_at_ns: int = 0,
    state: IndexState | None = None,
) -> dict[str, Any]:
    """:func:`book_summary` as a run leaves the book: with the run (the collection's page
    names it as the book's last run without asking Dagster) and the stat of each of ``files``
    (as the run read them, at ``read_at_ns``) whose hash is the one its document record holds
    and whose stat was settled then (:mod:`.filekeys`): a later plan does not read a file
    whose stat is still exactly that one (as the books sensor does)."""
    summary = book_summary(store, book_id, state)
    records = summary["records"]
    summary["stats"] = {
        f.source_file: key_to_json(f.key)
        for f in files
        if f.key is not None
        and f.source_file in records
        and records[f.source_file][0] == f.sha256
        and settled(f.key, read_at_ns)
    }
    summary["last_run"] = run_id
    # no "revision" of the run's own: the book's is its newest record's (book_summary), the
    # answer a read of the book gives (a run that only deletes files writes no record)
    return summary


def file_stats_from_summary(
    summary: Mapping[str, Any] | None,
) -> dict[str, tuple[VersionKey, str]]:
    """source_file -> (stat, sha256) as :func:`run_summary` saved them."""
    if summary is None:
        return {}
    records, stats = summary.get("records"), summary.get("stats")
    if not isinstance(records, dict) or not isinstance(stats, dict):
        return {}
    out: dict[str, tuple[VersionKey, str]] = {}
    for name, stat in stats.items():
        record = records.get(name)
        key = key_from_json(stat)
        if isinstance(record, list) and record and key is not None:
            out[str(name)] = (key, str(record[0]))
    return out


def usable_summary(summary: Any) -> bool:
    """A summary holds what the collection look reads (one saved by an older version may not)."""
    return isinstance(summary, dict) and all(k in summary for k in SUMMARY_KEYS)

"""Is a book's index up to date with its folder? The answer the ingest command needs first.

Reads only document records and counts, never chunk payloads or vectors, so asking about every
book of a corpus costs a fraction of a second. ``quick_check`` answers a whole ingest from the
index alone when nothing needs a run, without loading Dagster (whose import and instance set-up
cost several seconds); otherwise the Dagster runner takes over.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag_pipeline.changes import classify_files
from rag_pipeline.config import SourceConfig
from rag_pipeline.crawl import BookScan, discover_books, discover_files, scan_book
from rag_pipeline.index import CHUNK, IndexState, read_index_state
from rag_pipeline.models import FileError
from rag_pipeline.store import VectorStore, tenant_filter
from rag_pipeline.store.filters import Match

__all__ = [
    "PARTITIONS_MARKER",
    "BookResult",
    "DataDirError",
    "IngestReport",
    "QuickCheck",
    "assess_book",
    "fill_from_index",
    "quick_check",
    "read_partitions_marker",
    "refusing_to_purge_all",
    "scan_data_dir",
    "write_partitions_marker",
]

# The book partitions the Dagster instance in DAGSTER_HOME holds, as of the last ingest through
# Dagster: a no-change ingest needs no partition added, so it can skip loading Dagster.
PARTITIONS_MARKER = "rag_book_partitions.json"


def read_partitions_marker(dagster_home: Path) -> frozenset[str] | None:
    try:
        return frozenset(json.loads((dagster_home / PARTITIONS_MARKER).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def write_partitions_marker(dagster_home: Path, partitions: Collection[str]) -> None:
    (dagster_home / PARTITIONS_MARKER).write_text(json.dumps(sorted(partitions)))


class DataDirError(ValueError):
    """The data folder is missing: nothing can be told apart from "every book was removed"."""


@dataclass
class BookResult:
    book_id: str
    status: str  # ingested | unchanged | failed | removed | missing
    files: int = 0
    errors: int = 0
    chunks: int = 0
    embedded: int = 0
    points: int = 0
    reused: int = 0
    deleted: int = 0
    files_new: int = 0
    files_modified: int = 0
    files_deleted: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    embed_seconds: float = 0.0
    seconds: float = 0.0
    run_id: str | None = None
    error_messages: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "errors": self.errors,
            "chunks": self.chunks,
            "embedded": self.embedded,
            "points": self.points,
            "reused": self.reused,
            "deleted": self.deleted,
            "files_new": self.files_new,
            "files_modified": self.files_modified,
            "files_deleted": self.files_deleted,
            "status": self.status,
            "tokens": self.tokens,
            "cost_usd": round(self.cost_usd, 6),
            "embed_seconds": round(self.embed_seconds, 3),
            "seconds": round(self.seconds, 3),
            "run_id": self.run_id,
            "error_messages": self.error_messages,
        }


@dataclass
class IngestReport:
    books: dict[str, BookResult] = field(default_factory=dict)
    rejected: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not any(b.status in ("failed", "missing") for b in self.books.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "books": {k: v.as_dict() for k, v in self.books.items()},
            "rejected_folders": self.rejected,
            "warnings": self.warnings,
            "seconds": round(self.seconds, 3),
        }


def scan_data_dir(source: SourceConfig) -> BookScan:
    """The book folders, or ``DataDirError`` when the data folder itself is missing."""
    if not source.data_dir.is_dir():
        # an unmounted volume or a typo must not read as "every book was removed"
        raise DataDirError(
            f"data folder {source.data_dir} does not exist or is not a folder (RAG_DATA_DIR); "
            "nothing was ingested or purged"
        )
    return discover_books(source.data_dir)


def assess_book(
    source: SourceConfig, book_id: str, store: VectorStore, signature: str, model: str
) -> BookResult | None:
    """The book's result read from the index when it needs no run, else ``None``.

    No run is needed when every file, the chunker and the model match the book's document
    records and the chunk points are exactly those the records promise (chunks a crashed run
    wrote without their record, or lost ones, need a run). One read of the records serves both
    the decision and the totals."""
    files, crawl_errors = discover_files(source.data_dir, book_id, source.path_patterns)
    state = read_index_state(store, book_id, embedding_model=model, documents_only=True)
    changes = classify_files({f.source_file: f.sha256 for f in files}, state.documents, signature)
    if changes.has_work:
        return None
    points = store.count(tenant_filter(book_id, Match("record_type", CHUNK)))
    if points != sum(d.total_chunks for d in state.documents.values()):
        return None
    result = BookResult(book_id, "unchanged")
    _set_totals(result, len(files), crawl_errors, state, points)
    return result


def fill_from_index(
    result: BookResult, source: SourceConfig, store: VectorStore, book_id: str
) -> None:
    """Totals after the run, read back from the index (what a reader will see)."""
    files, crawl_errors = scan_book(source.data_dir, book_id)
    state = read_index_state(store, book_id, documents_only=True)
    points = store.count(tenant_filter(book_id, Match("record_type", CHUNK)))
    _set_totals(result, len(files), crawl_errors, state, points)


def _set_totals(
    result: BookResult,
    files: int,
    crawl_errors: Sequence[FileError],
    state: IndexState,
    points: int,
) -> None:
    doc_errors = [d for d in state.documents.values() if d.status == "error"]
    result.files = files
    result.errors = len(crawl_errors) + len(doc_errors)
    result.chunks = sum(d.total_chunks for d in state.documents.values())
    result.points = points
    result.error_messages.extend(str(e) for e in crawl_errors)
    result.error_messages.extend(f"{result.book_id}/{d.source_file}: {d.error}" for d in doc_errors)


@dataclass
class QuickCheck:
    """What the index alone says about an ingest: the books that need no run (their results
    read back from the index), and the whole report when nothing needs Dagster."""

    unchanged: dict[str, BookResult] = field(default_factory=dict)
    report: IngestReport | None = None


def quick_check(
    source: SourceConfig,
    store: VectorStore,
    book_ids: Sequence[str] | None,
    signature: str,
    model: str,
    known_partitions: Collection[str],
) -> QuickCheck:
    """Check every target book against the index. ``report`` is set when no book needs a run,
    nothing is to be purged and every book already has its Dagster partition; otherwise the
    Dagster runner takes over and reuses ``unchanged`` instead of checking those books again."""
    started = time.perf_counter()
    scan = scan_data_dir(source)
    on_disk = set(scan.book_ids)
    targets = list(book_ids) if book_ids else list(scan.book_ids)
    check = QuickCheck()
    # a missing or removed book, or a partition to add: the runner decides
    complete = all(b in on_disk and b in known_partitions for b in targets)
    warnings = []
    if not book_ids:
        removed = [b for b in store.book_ids() if b not in on_disk]
        if removed and on_disk:
            complete = False
        elif removed:
            warnings.append(refusing_to_purge_all(source, len(removed)))
    for book_id in targets:
        if book_id not in on_disk:
            continue
        t0 = time.perf_counter()
        result = assess_book(source, book_id, store, signature, model)
        if result is None:
            complete = False
            continue
        result.seconds = time.perf_counter() - t0
        check.unchanged[book_id] = result
    if complete:
        check.report = IngestReport(
            books={b: check.unchanged[b] for b in targets},
            rejected=[str(e) for e in scan.rejected],
            warnings=warnings,
            seconds=time.perf_counter() - started,
        )
    return check


def refusing_to_purge_all(source: SourceConfig, count: int) -> str:
    return (
        f"no book folder under {source.data_dir}: refusing to purge all {count} indexed books "
        "at once; purge books one by one with `rag-pipeline ingest --book ID`"
    )

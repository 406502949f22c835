"""Run the ingest job for many books from one process (what ``rag-pipeline ingest`` does).

Per-book Dagster runs keep per-book lineage, metadata and run keys, but a run costs Dagster
start-up time, and the embedded store costs a load on open. So this runner

* executes runs in-process, one after another, against the instance in ``DAGSTER_HOME``;
* holds one store handle and one embedder for all of them (the resources share them);
* skips a book whose files, chunker and model all match its document records in the index,
  so an unchanged corpus launches no run at all.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dagster import DagsterInstance, Definitions

from rag_pipeline.changes import classify_files
from rag_pipeline.chunk import ChunkBudget
from rag_pipeline.config import ChunkingConfig, Settings, SourceConfig, load_settings
from rag_pipeline.crawl import discover_books, discover_files, scan_book, validate_book_id
from rag_pipeline.defs.jobs import INGEST_JOB_NAME, PURGE_JOB_NAME, purge_run_config
from rag_pipeline.defs.partitions import BOOKS_PARTITIONS_NAME
from rag_pipeline.index import CHUNK, read_index_state
from rag_pipeline.pipeline import index_signature
from rag_pipeline.resources import BookSourceResource, EmbedderResource, QdrantStoreResource
from rag_pipeline.sparse import Bm25Encoder
from rag_pipeline.store import VectorStore, tenant_filter
from rag_pipeline.store.filters import Match

__all__ = ["BookResult", "IngestReport", "ensure_dagster_home", "ingest_books"]

log = logging.getLogger(__name__)
QUIET_RUN_CONFIG: dict[str, Any] = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}
DEFAULT_DAGSTER_YAML = "telemetry:\n  enabled: false\n"


def ensure_dagster_home(default: Path | str = ".dagster_home") -> Path:
    """``DAGSTER_HOME`` (set to ``./.dagster_home`` when unset), with a dagster.yaml in it."""
    home = Path(os.environ.get("DAGSTER_HOME") or Path(default).resolve())
    home.mkdir(parents=True, exist_ok=True)
    os.environ["DAGSTER_HOME"] = str(home)
    config = home / "dagster.yaml"
    if not config.exists():
        project_yaml = Path("dagster.yaml")
        config.write_text(
            project_yaml.read_text() if project_yaml.is_file() else DEFAULT_DAGSTER_YAML
        )
    return home


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
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not any(b.status in ("failed", "missing") for b in self.books.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "books": {k: v.as_dict() for k, v in self.books.items()},
            "rejected_folders": self.rejected,
            "seconds": round(self.seconds, 3),
        }


def ingest_books(
    book_ids: Sequence[str] | None = None,
    *,
    force: bool = False,
    settings: Settings | None = None,
    chunking: ChunkingConfig | None = None,
    instance: DagsterInstance | None = None,
    definitions: Definitions | None = None,
    purge_removed: bool = True,
) -> IngestReport:
    """Bring the index of the named books (default: every book folder) in step with the files."""
    from rag_pipeline.definitions import build_definitions

    started = time.perf_counter()
    settings = settings or load_settings()
    defs = definitions or build_definitions(settings, chunking)
    instance = instance or DagsterInstance.get()
    scan = discover_books(defs.resources["books"].data_dir)  # type: ignore[attr-defined]
    report = IngestReport(rejected=[str(e) for e in scan.rejected])
    on_disk = set(scan.book_ids)
    targets = [validate_book_id(b) for b in book_ids] if book_ids else list(scan.book_ids)

    qdrant: QdrantStoreResource = defs.resources["qdrant"]  # type: ignore[assignment]
    embedder_res: EmbedderResource = defs.resources["embedder"]  # type: ignore[assignment]
    books_res: BookSourceResource = defs.resources["books"]  # type: ignore[assignment]
    source = books_res.source()
    embedder = embedder_res.get()
    budget = ChunkBudget.for_tokenizer(books_res.chunking(), embedder.tokenizer)
    signature = index_signature(embedder, budget, Bm25Encoder())
    ingest_job = defs.resolve_job_def(INGEST_JOB_NAME)
    purge_job = defs.resolve_job_def(PURGE_JOB_NAME)

    known = set(instance.get_dynamic_partitions(BOOKS_PARTITIONS_NAME))
    missing = [b for b in targets if b in on_disk and b not in known]
    if missing:
        instance.add_dynamic_partitions(BOOKS_PARTITIONS_NAME, missing)

    with qdrant.open() as store:  # held for every run of this process
        removed = []
        if purge_removed and not book_ids:
            removed = [b for b in store.book_ids() if b not in on_disk]
        for book_id in targets:
            if book_id not in on_disk:
                if book_id in store.book_ids():
                    removed.append(book_id)
                else:
                    report.books[book_id] = BookResult(
                        book_id,
                        "missing",
                        error_messages=[f"no book folder {book_id!r} under {source.data_dir}"],
                    )
                continue
            t0 = time.perf_counter()
            if not force and not _has_work(source, book_id, store, signature, embedder.model_name):
                result = BookResult(book_id, "unchanged")
            else:
                result = _run_book(ingest_job, instance, book_id)
            _fill_from_index(result, source, store, book_id)
            result.seconds = time.perf_counter() - t0
            report.books[book_id] = result
        for book_id in removed:
            t0 = time.perf_counter()
            outcome = purge_job.execute_in_process(
                run_config={**QUIET_RUN_CONFIG, **purge_run_config(book_id)},
                instance=instance,
                raise_on_error=False,
                tags={"rag/book": book_id},
            )
            result = BookResult(
                book_id, "removed" if outcome.success else "failed", run_id=outcome.run_id
            )
            if outcome.success:
                result.deleted = int(outcome.output_for_node("purge_book_points"))
                if book_id in set(instance.get_dynamic_partitions(BOOKS_PARTITIONS_NAME)):
                    instance.delete_dynamic_partition(BOOKS_PARTITIONS_NAME, book_id)
            else:
                result.error_messages.append(_failure_message(outcome))
            result.seconds = time.perf_counter() - t0
            report.books[book_id] = result
    report.seconds = time.perf_counter() - started
    return report


def _has_work(
    source: SourceConfig, book_id: str, store: VectorStore, signature: str, model: str
) -> bool:
    files, _ = discover_files(source.data_dir, book_id, source.path_patterns)
    state = read_index_state(store, book_id, embedding_model=model, documents_only=True)
    changes = classify_files({f.source_file: f.sha256 for f in files}, state.documents, signature)
    return changes.has_work


def _run_book(job: Any, instance: DagsterInstance, book_id: str) -> BookResult:
    outcome = job.execute_in_process(
        partition_key=book_id, instance=instance, run_config=QUIET_RUN_CONFIG, raise_on_error=False
    )
    result = BookResult(book_id, "ingested" if outcome.success else "failed", run_id=outcome.run_id)
    for event in outcome.get_asset_materialization_events():
        meta = {k: v.value for k, v in event.materialization.metadata.items()}
        name = event.materialization.asset_key.to_user_string()
        if name == "source_files":
            result.files_new = int(meta.get("files_new", 0))
            result.files_modified = int(meta.get("files_modified", 0))
            result.files_deleted = int(meta.get("files_deleted", 0))
        elif name == "chunk_embeddings":
            result.embedded = int(meta.get("chunks_embedded", 0))
            result.reused = int(meta.get("chunks_reused", 0))
            result.tokens = int(meta.get("embedder_tokens", 0))
            result.cost_usd = float(meta.get("cost_usd_estimate", 0.0))
            result.embed_seconds = float(meta.get("embed_seconds", 0.0))
        elif name == "qdrant_points":
            result.deleted = int(meta.get("points_deleted", 0))
    if not outcome.success:
        result.error_messages.append(_failure_message(outcome))
    return result


def _failure_message(outcome: Any) -> str:
    for event in outcome.all_events:
        if event.is_step_failure and event.step_failure_data is not None:
            error = event.step_failure_data.error
            if error is not None:
                cause = error
                while cause.cause is not None:
                    cause = cause.cause
                return f"step {event.step_key} failed: {cause.message.strip()}"
    return "run failed"


def _fill_from_index(
    result: BookResult, source: SourceConfig, store: VectorStore, book_id: str
) -> None:
    """Totals after the run, read back from the index (what a reader will see)."""
    files, crawl_errors = scan_book(source.data_dir, book_id)
    state = read_index_state(store, book_id, documents_only=True)
    result.files = len(files)
    doc_errors = [d for d in state.documents.values() if d.status == "error"]
    result.errors = len(crawl_errors) + len(doc_errors)
    result.chunks = sum(d.total_chunks for d in state.documents.values())
    result.points = store.count(tenant_filter(book_id, Match("record_type", CHUNK)))
    result.error_messages.extend(str(e) for e in crawl_errors)
    result.error_messages.extend(f"{book_id}/{d.source_file}: {d.error}" for d in doc_errors)

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
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dagster import DagsterInstance, Definitions

from rag_pipeline.chunk import ChunkBudget
from rag_pipeline.config import ChunkingConfig, Settings, ensure_dagster_home, load_settings
from rag_pipeline.crawl import validate_book_id
from rag_pipeline.defs.jobs import INGEST_JOB_NAME, PURGE_JOB_NAME, purge_run_config
from rag_pipeline.defs.partitions import BOOKS_PARTITIONS_NAME
from rag_pipeline.freshness import (
    BookResult,
    DataDirError,
    IngestReport,
    assess_book,
    fill_from_index,
    refusing_to_purge_all,
    scan_data_dir,
    write_partitions_marker,
)
from rag_pipeline.pipeline import index_signature
from rag_pipeline.resources import BookSourceResource, EmbedderResource, QdrantStoreResource
from rag_pipeline.sparse import Bm25Encoder

__all__ = [
    "BookResult",
    "DataDirError",
    "IngestReport",
    "ensure_dagster_home",
    "ingest_books",
]

log = logging.getLogger(__name__)
QUIET_RUN_CONFIG: dict[str, Any] = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}


def ingest_books(
    book_ids: Sequence[str] | None = None,
    *,
    force: bool = False,
    settings: Settings | None = None,
    chunking: ChunkingConfig | None = None,
    instance: DagsterInstance | None = None,
    definitions: Definitions | None = None,
    purge_removed: bool = True,
    dagster_home: Path | None = None,
    unchanged: Mapping[str, BookResult] | None = None,
) -> IngestReport:
    """Bring the index of the named books (default: every book folder) in step with the files.

    ``unchanged`` holds books the caller has just found up to date (``freshness.quick_check``
    in the same process, same store handle); they are not checked again."""
    from rag_pipeline.definitions import build_definitions

    started = time.perf_counter()
    settings = settings or load_settings()
    defs = definitions or build_definitions(settings, chunking)
    instance = instance or DagsterInstance.get()
    books_res: BookSourceResource = defs.resources["books"]  # type: ignore[assignment]
    source = books_res.source()
    scan = scan_data_dir(source)
    report = IngestReport(rejected=[str(e) for e in scan.rejected])
    on_disk = set(scan.book_ids)
    targets = [validate_book_id(b) for b in book_ids] if book_ids else list(scan.book_ids)

    qdrant: QdrantStoreResource = defs.resources["qdrant"]  # type: ignore[assignment]
    embedder_res: EmbedderResource = defs.resources["embedder"]  # type: ignore[assignment]
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
            if removed and not on_disk:
                report.warnings.append(refusing_to_purge_all(source, len(removed)))
                removed = []
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
            if not force and unchanged and book_id in unchanged:
                report.books[book_id] = unchanged[book_id]  # checked just before, in process
                continue
            t0 = time.perf_counter()
            assessed = (
                None
                if force
                else assess_book(source, book_id, store, signature, embedder.model_name)
            )
            if assessed is not None:
                result = assessed
            else:
                result = _run_book(ingest_job, instance, book_id)
                fill_from_index(result, source, store, book_id)
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
    if dagster_home is not None:  # the instance is the one in DAGSTER_HOME
        write_partitions_marker(
            dagster_home, instance.get_dynamic_partitions(BOOKS_PARTITIONS_NAME)
        )
    report.seconds = time.perf_counter() - started
    return report


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

"""The Qdrant collection as one unpartitioned asset: schema, per-book health, and checks.

Book runs each report on their own partition, so a failing check of one book vanishes from
sight once another book runs. ``qdrant_collection`` puts every book on one page: points,
chunks, files, errors, its last run and the result of its last checks, plus totals. It is
refreshed after every book run and purge (by ``collection_sensor`` under the daemon, and at the
end of a CLI ingest that ran anything).
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dagster import (
    AllPartitionMapping,
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetDep,
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    AssetRecordsFilter,
    DagsterInstance,
    DagsterRunStatus,
    DefaultSensorStatus,
    MarkdownMetadataValue,
    MaterializeResult,
    MetadataValue,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SkipReason,
    asset,
    define_asset_job,
    sensor,
)
from dagster._core.event_api import PartitionKeyFilter
from dagster._core.storage.asset_check_execution_record import (
    COMPLETED_ASSET_CHECK_EXECUTION_RECORD_STATUSES,
    AssetCheckExecutionRecordStatus,
)

from rag_pipeline.defs.assets import OWNERS, STORE_POOL, qdrant_points
from rag_pipeline.defs.jobs import INGEST_JOB_NAME, PURGE_JOB_NAME
from rag_pipeline.defs.metadata import md_table
from rag_pipeline.ingest.collection import BookHealth, describe_collection
from rag_pipeline.ingest.crawl import DataDirError, discover_books
from rag_pipeline.resources import BooksResource, QdrantStoreResource

__all__ = [
    "BOOK_CHECKS",
    "COLLECTION_JOB_NAME",
    "collection_job",
    "collection_sensor",
    "qdrant_collection",
    "report_collection",
]

COLLECTION_JOB_NAME = "refresh_collection"
#: the per-book checks whose latest result the collection shows
BOOK_CHECKS = (
    ("documents", "parse_errors"),
    ("chunks", "chunks_valid"),
    ("chunk_embeddings", "vector_dimension"),
    ("qdrant_points", "index_consistency"),
)


#: the collection asset's own group: the ingestion group is all per-book assets
COLLECTION_GROUP = "collection"


@asset(
    group_name=COLLECTION_GROUP,
    owners=OWNERS,
    kinds={"qdrant"},
    pool=STORE_POOL,
    deps=[AssetDep(qdrant_points, partition_mapping=AllPartitionMapping())],
    description="The whole Qdrant collection: its schema and payload indexes, and per book "
    "(on disk or in the index) its points, chunks, files, file errors, last run and the result "
    "of its last checks, with totals. Refreshed after every book run and purge.",
    check_specs=[
        AssetCheckSpec(
            "books_indexed",
            asset="qdrant_collection",
            description="Every book on disk is indexed, and holds exactly the chunk points its "
            "document records promise.",
        ),
        AssetCheckSpec(
            "book_checks_pass",
            asset="qdrant_collection",
            description="Warns, naming the books, when a book's latest checks did not pass.",
        ),
        AssetCheckSpec(
            "no_orphan_books",
            asset="qdrant_collection",
            description="Warns when the index holds a book whose folder is gone (the next "
            "ingest purges it).",
        ),
    ],
)
def qdrant_collection(
    context: AssetExecutionContext, books: BooksResource, qdrant: QdrantStoreResource
) -> Iterator[MaterializeResult[Any] | AssetCheckResult]:
    page = collection_page(context.instance, books, qdrant, warn=context.log.warning)
    yield MaterializeResult(metadata=page.metadata)
    for name, (passed, severity, metadata) in page.checks.items():
        yield AssetCheckResult(check_name=name, passed=passed, severity=severity, metadata=metadata)


@dataclass(frozen=True)
class CollectionPage:
    """What the collection asset records: its metadata and its checks' results."""

    metadata: dict[str, Any]
    checks: dict[str, tuple[bool, AssetCheckSeverity, dict[str, Any]]]


def collection_page(
    instance: DagsterInstance,
    books: BooksResource,
    qdrant: QdrantStoreResource,
    warn: Callable[[str], None] = lambda message: None,
) -> CollectionPage:
    """The collection's schema and per-book table (with each book's last run and checks)."""
    try:
        on_disk = set(discover_books(books.source().data_dir).book_ids)
    except DataDirError as exc:
        warn(str(exc))
        on_disk = set()
    with qdrant.open() as store:
        state = describe_collection(store, on_disk)
    rows = []
    failing: dict[str, list[str]] = {}
    for book in state.books:
        run_id, checks = _last_run(instance, book.book_id), _check_results(instance, book.book_id)
        bad = [name for name, result in checks.items() if result not in ("passed", "-")]
        if bad:
            failing[book.book_id] = bad
        rows.append(_row(book, run_id, checks))
    totals = state.totals
    missing = [b for b in state.books if b.on_disk and (not b.files or not b.consistent)]
    orphans = [b.book_id for b in state.books if not b.on_disk]
    return CollectionPage(
        metadata={
            "book_table": md_table(rows, limit=500),
            "books": totals["books"],
            "points": totals["points"],
            "chunks": totals["chunks"],
            "files": totals["files"],
            "file_errors": totals["errors"],
            "books_with_failing_checks": len(failing),
            "schema": MetadataValue.json(state.schema()),
            "store": state.store,
        },
        checks={
            "books_indexed": (
                not missing,
                AssetCheckSeverity.ERROR,
                {
                    "books": _md_list(
                        [f"{b.book_id}: {b.state}" for b in missing],
                        "every book on disk is indexed and consistent",
                    )
                },
            ),
            "book_checks_pass": (
                not failing,
                AssetCheckSeverity.WARN,
                {"books": _md_list([f"{b}: {', '.join(c)}" for b, c in sorted(failing.items())])},
            ),
            "no_orphan_books": (
                not orphans,
                AssetCheckSeverity.WARN,
                {"books": _md_list(orphans)},
            ),
        },
    )


def report_collection(
    instance: DagsterInstance, books: BooksResource, qdrant: QdrantStoreResource
) -> None:
    """Record the collection's page without a run (what a CLI ingest does at its end: a
    whole Dagster run for it would cost more than the book runs' own bookkeeping)."""
    page = collection_page(instance, books, qdrant)
    key = AssetKey("qdrant_collection")
    instance.report_runless_asset_event(AssetMaterialization(asset_key=key, metadata=page.metadata))
    for name, (passed, severity, metadata) in page.checks.items():
        instance.report_runless_asset_event(
            AssetCheckEvaluation(
                asset_key=key,
                check_name=name,
                passed=passed,
                severity=severity,
                metadata=metadata,
            )
        )


def _md_list(items: list[str], empty: str = "(none)") -> MarkdownMetadataValue:
    return MetadataValue.md("\n".join(f"- {item}" for item in items) or empty)


def _row(book: BookHealth, run_id: str | None, checks: dict[str, str]) -> dict[str, Any]:
    return {
        "book": book.book_id,
        "state": book.state,
        "points": book.points,
        "chunks": book.chunks,
        "files": book.files,
        "errors": book.errors,
        "last run": f"[{run_id[:8]}](/runs/{run_id})" if run_id else "",
        **checks,
    }


def _last_run(instance: DagsterInstance, book_id: str) -> str | None:
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey("qdrant_points"), asset_partitions=[book_id]),
        limit=1,
    ).records
    return records[0].run_id if records else None


def _check_results(instance: DagsterInstance, book_id: str) -> dict[str, str]:
    """check name -> passed | failed | warned | - (never ran): the latest completed result of
    each of the book's checks (a run in flight does not hide the last known state)."""
    out = {}
    for asset_name, check_name in BOOK_CHECKS:
        history = instance.event_log_storage.get_asset_check_execution_history(
            AssetCheckKey(AssetKey(asset_name), check_name),
            limit=1,
            status=COMPLETED_ASSET_CHECK_EXECUTION_RECORD_STATUSES,
            partition_filter=PartitionKeyFilter(key=book_id),
        )
        out[check_name] = _result(history[0]) if history else "-"
    return out


def _result(record: Any) -> str:
    if record.status == AssetCheckExecutionRecordStatus.SUCCEEDED:
        return "passed"
    evaluation = record.event.dagster_event.event_specific_data if record.event else None
    severity = getattr(evaluation, "severity", None)
    return "warned" if severity == AssetCheckSeverity.WARN else "failed"


collection_job = define_asset_job(
    COLLECTION_JOB_NAME,
    selection=[qdrant_collection],
    description="Refresh the collection asset (schema, per-book health, checks).",
)


@sensor(
    name="collection_sensor",
    job=collection_job,
    minimum_interval_seconds=15,
    default_status=DefaultSensorStatus.RUNNING,
    description="Refreshes the collection asset after book runs and purges finish.",
)
def collection_sensor(context: SensorEvaluationContext) -> RunRequest | SkipReason:
    after = float(context.cursor) if context.cursor else 0.0
    finished = [
        record
        for job_name in (INGEST_JOB_NAME, PURGE_JOB_NAME)
        for record in context.instance.get_run_records(
            RunsFilter(
                job_name=job_name,
                statuses=[DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE],
                updated_after=datetime.fromtimestamp(after, UTC),
            ),
            limit=1,
        )
    ]
    if not finished:
        return SkipReason("no book run or purge finished since the last refresh")
    newest = max(r.update_timestamp.timestamp() for r in finished)
    context.update_cursor(str(newest))
    return RunRequest(run_key=f"collection:{newest:.3f}", tags={"rag/trigger": "collection_sensor"})

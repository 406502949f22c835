"""The Qdrant collection as one unpartitioned asset: schema, per-book health, and checks.

Book runs each report on their own partition, so a failing check of one book vanishes from
sight once another book runs. ``qdrant_collection`` puts every book on one page, as a table
whose first rows are the books with a problem: health, points, chunks, files, errors, its last
run and the result of its last checks, plus totals; its checks fail (an inconsistent or
unindexed book, a failed book check) or warn (a book check that warned: broken files) for as
long as any book is in that state, whichever book ran last. ``collection_sensor`` refreshes it
within one interval of any run of a book finishing (sensor, asset graph, backfill, Launchpad,
CLI, purge) as events reported by the sensor itself, so refreshes add no runs to the run list;
a CLI ingest refreshes it at its end as well.
"""

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
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
    AssetMaterialization,
    AssetRecordsFilter,
    DagsterEventType,
    DagsterInstance,
    DagsterRunStatus,
    DefaultSensorStatus,
    MarkdownMetadataValue,
    MaterializeResult,
    MetadataValue,
    ResourceParam,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    asset,
    define_asset_job,
    sensor,
)

from rag_pipeline.defs._dagster_private import (
    COMPLETED_ASSET_CHECK_EXECUTION_RECORD_STATUSES,
    AssetCheckExecutionRecordStatus,
    PartitionKeyFilter,
)
from rag_pipeline.defs.assets import (
    BOOK_CHECK_KEYS,
    NO_RUN_CONFIG,
    OWNERS,
    STORE_POOL,
    qdrant_points,
)
from rag_pipeline.defs.metadata import (
    breakable,
    escape_markdown,
    link,
    markdown_list,
    markdown_table,
    shorten,
)
from rag_pipeline.defs.runs import book_runs_path, explain_queue
from rag_pipeline.ingest.overview import BookHealth, describe_collection
from rag_pipeline.ingest.pipeline import IngestPipeline
from rag_pipeline.sources.base import SourceUnavailableError
from rag_pipeline.store import StoreBusyError
from rag_pipeline.store.lock import holding_for

__all__ = [
    "BOOK_CHECKS",
    "COLLECTION_JOB_NAME",
    "collection_job",
    "collection_sensor",
    "qdrant_collection",
    "report_collection",
]

COLLECTION_JOB_NAME = "refresh_collection"
#: the per-book checks whose latest result the collection shows: every ingestion asset's, in
#: the order of the assets
BOOK_CHECKS = BOOK_CHECK_KEYS


#: the collection asset's own group: the ingestion group is all per-book assets
COLLECTION_GROUP = "collection"


@asset(
    config_schema=NO_RUN_CONFIG,
    group_name=COLLECTION_GROUP,
    owners=OWNERS,
    kinds={"qdrant"},
    pool=STORE_POOL,
    deps=[AssetDep(qdrant_points, partition_mapping=AllPartitionMapping())],
    description="The whole Qdrant collection: its schema and payload indexes, and per book "
    "(on disk or in the index) its points, chunks, files, file errors, last run and the result "
    "of its last checks, with totals; books with a problem first. Refreshed by collection_sensor "
    "after every run of a book or purge ends, whoever started it.",
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
            description="Fails (red), naming the books and checks, when a book's latest check "
            "failed (blocking, consistency); warns (yellow: warned, not failed) when a book's "
            "only problem is a warning check (broken or empty files, the rest of the book "
            'indexed). The UI labels any result that did not pass "Failed": its severity '
            "and its result entry say which it is.",
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
    context: AssetExecutionContext,
    pipeline: ResourceParam[IngestPipeline],
) -> Iterator[MaterializeResult[Any] | AssetCheckResult]:
    page = collection_page(context.instance, pipeline, warn=context.log.warning)
    yield MaterializeResult(metadata=page.metadata)
    for name, (passed, severity, metadata) in page.checks.items():
        yield AssetCheckResult(
            check_name=name,
            passed=passed,
            severity=severity,
            metadata=metadata,
            description=_description(metadata),
        )


@dataclass(frozen=True)
class CollectionPage:
    """What the collection asset records: its metadata and its checks' results."""

    metadata: dict[str, Any]
    checks: dict[str, tuple[bool, AssetCheckSeverity, dict[str, Any]]]

    def events(self) -> list[AssetMaterialization | AssetCheckEvaluation]:
        """The page as events reported without a run (by the CLI and the sensor)."""
        key = qdrant_collection.key
        events: list[AssetMaterialization | AssetCheckEvaluation] = [
            AssetMaterialization(asset_key=key, metadata=self.metadata)
        ]
        events += [
            AssetCheckEvaluation(
                asset_key=key,
                check_name=name,
                passed=passed,
                severity=severity,
                metadata=meta,
                description=_description(meta),
            )
            for name, (passed, severity, meta) in self.checks.items()
        ]
        return events


def _description(metadata: dict[str, Any]) -> str | None:
    """A check's ``result`` line, also its description: the check's page and its row in the
    Checks tab show it beside the status, without opening the metadata."""
    result = metadata.get("result")
    return result if isinstance(result, str) else None


#: a book's health on the collection's page, worst first: the order of the table's rows
HEALTH_ORDER = ("failed", "warned", "ok")
#: the collection table's columns: the book, its health and why, counts, its last run and
#: every run of it (links); the checks that did not pass are named in "why", each book's
#: recipe is in ``recipes``. A markdown table, opened in a dialog: table metadata cannot
#: link, and at 1,280 px the asset page's value column is too narrow for it
BOOK_COLUMNS = (
    "book",
    "health",
    "why",
    "points",
    "chunks",
    "files",
    "errors",
    "source",
    "last_run",
    "runs",
)
#: what the collection table's columns mean, under it
BOOK_TABLE_LEGEND = (
    "**health**: failed (not indexed, inconsistent, or a check failed), warned (broken or "
    "empty files, a warning check, or no folder: the rest of the book is indexed), ok. "
    "**why**: the book's state and its checks whose latest result did not pass. **points**: "
    "in the index; **chunks**: what its document records promise; **files**: on disk; "
    "**errors**: files that did not parse or read. **source**: where the book comes from "
    "(a folder, a git repository and ref) and, for git, the commit last indexed. "
    "**last_run**: the run of its latest qdrant_points materialization; **runs**: every run "
    "that wrote or purged it (the Runs page filtered to the tag rag-book/BOOK=yes)."
)
#: books named on the one-line ``problems`` entry (the table lists every one, problems first)
PROBLEMS_NAMED = 5
#: the longest "why" the ``problems`` line quotes for a book
PROBLEM_WHY_CHARS = 60
#: books listed in a check's result (under the UI's 1,000 characters, so shown without a click)
CHECK_BOOKS_LISTED = 12
#: rows of the per-book table (books with a problem come first, so they are always shown)
BOOK_ROWS = 200


def _health(book: BookHealth, checks: dict[str, str]) -> str:
    """failed (not indexed, inconsistent, a check failed), warned (broken files, a warning
    check, no folder) or ok."""
    if book.on_disk and (not book.files or not book.consistent):
        return "failed"
    if "failed" in checks.values():
        return "failed"
    if book.errors or "warned" in checks.values() or not book.on_disk:
        return "warned"
    return "ok"


def collection_page(
    instance: DagsterInstance,
    pipeline: IngestPipeline,
    warn: Callable[[str], None] = lambda message: None,
    busy_wait_s: float | None = None,
) -> CollectionPage:
    """The collection's schema and per-book table (with each book's last run and checks)."""
    try:
        on_disk = set(pipeline.source.list_books().book_ids)
    except SourceUnavailableError as exc:
        warn(str(exc))
        on_disk = set()
    with pipeline.store.open(busy_wait_s=busy_wait_s) as store:
        state = describe_collection(store, on_disk)
    rows = []
    failing: dict[str, list[str]] = {}
    book_ids = [book.book_id for book in state.books]
    # a fixed number of instance queries for the whole collection, plus one per check of a
    # book whose latest check did not pass: a refresh costs the same after one book's run
    # at 30 books as at 3
    # a book's last run is in its summary; Dagster is asked only about a book whose summary
    # does not say (written by an older version, or after a read)
    unsaid = [book.book_id for book in state.books if book.last_run is None]
    last_runs, all_checks = _last_runs(instance, unsaid), _check_results(instance, book_ids)
    for book in state.books:
        run_id, checks = book.last_run or last_runs.get(book.book_id), all_checks[book.book_id]
        bad = [f"{name} {result}" for name, result in checks.items() if result not in _GOOD]
        if bad:
            failing[book.book_id] = bad
        rows.append(_row(book, run_id, checks, _source_of(pipeline, book)))
    rows.sort(key=lambda row: (HEALTH_ORDER.index(row["health"]), row["book"]))
    totals = state.totals
    missing = [b for b in state.books if b.on_disk and (not b.files or not b.consistent)]
    orphans = [b.book_id for b in state.books if not b.on_disk]
    problems = [r for r in rows if r["health"] != "ok"]
    failed = {b for b, checks in failing.items() if any(c.endswith(" failed") for c in checks)}
    return CollectionPage(
        metadata={
            "problems": MetadataValue.text(_problems_line(problems, len(rows))),
            "book_table": markdown_table(
                [_linked(r) for r in rows[:BOOK_ROWS]], BOOK_COLUMNS, BOOK_TABLE_LEGEND
            ),
            "books": totals["books"],
            "books_with_problems": len(problems),
            "points": totals["points"],
            "chunks": totals["chunks"],
            "files": totals["files"],
            "file_errors": totals["errors"],
            "books_with_failing_checks": len(failed),
            "books_with_warning_checks": len(set(failing) - failed),
            "recipes": MetadataValue.md(_recipes(state.books)),
            "schema": MetadataValue.json(state.schema()),
            "store": breakable(state.store),
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
                # a failed check (a blocking one, or the index's consistency) fails this one;
                # warnings (broken files) warn
                AssetCheckSeverity.ERROR if failed else AssetCheckSeverity.WARN,
                {
                    "result": _checks_verdict(failed, set(failing) - failed),
                    "books": _md_list(
                        _listed([f"{b}: {', '.join(c)}" for b, c in sorted(failing.items())])
                    ),
                },
            ),
            "no_orphan_books": (
                not orphans,
                AssetCheckSeverity.WARN,
                {"books": _md_list(orphans)},
            ),
        },
    )


#: check results that are not a problem: passed, or never ran
_GOOD = ("passed", "-")


def report_collection(instance: DagsterInstance, pipeline: IngestPipeline) -> None:
    """Record the collection's page without a run (what a CLI ingest does at its end: a
    whole Dagster run for it would cost more than the book runs' own bookkeeping)."""
    for event in collection_page(instance, pipeline).events():
        instance.report_runless_asset_event(event)


def _problems_line(problems: list[dict[str, Any]], books: int) -> str:
    """One short line: how many books have a problem, the first few and why."""
    if not problems:
        return f"none: all {books} books ok"
    named = [
        f"{r['book']} ({r['health']}: {shorten(r['why'], PROBLEM_WHY_CHARS)})"
        for r in problems[:PROBLEMS_NAMED]
    ]
    more = len(problems) - len(named)
    tail = f"; and {more} more (book_table lists them first)" if more else ""
    return f"{len(problems)} of {books} books: " + "; ".join(named) + tail


def _linked(row: dict[str, Any]) -> dict[str, Any]:
    """A row of the collection table with its runs as links."""
    run_id = row["last_run"]
    return {
        **row,
        "last_run": link(run_id, f"/runs/{run_id}") if run_id else "",
        "runs": link("all runs", book_runs_path(row["book"])),
    }


def _recipes(books: Sequence[BookHealth]) -> str:
    """Each index recipe in use and how many books it built."""
    counts = Counter(b.recipe for b in books if b.recipe)
    return "\n".join(
        f"- {escape_markdown(r)}: {n} book{'s' * (n != 1)}" for r, n in counts.most_common()
    )


def _checks_verdict(failed: set[str], warned: set[str]) -> str:
    """What book_checks_pass found, in the words of its severity, naming the books (the first
    :data:`CHECK_BOOKS_LISTED` of each kind)."""
    parts = []
    if failed:
        parts.append(f"failed: {_books(failed)} with a failed check")
    if warned:
        parts.append(
            f"warned, not failed: {_books(warned)} with a warning check only "
            "(broken or empty files; the rest of each book is indexed)"
        )
    return "; ".join(parts) or "passed: every book's latest checks passed"


def _books(books: set[str]) -> str:
    """'1 book (a)', '3 books (a, b, c)', '20 books (a, ..., l and 8 more)'."""
    named = sorted(books)[:CHECK_BOOKS_LISTED]
    more = f" and {len(books) - len(named)} more" if len(books) > len(named) else ""
    return f"{len(books)} book{'s' * (len(books) != 1)} ({', '.join(named)}{more})"


def _listed(items: list[str]) -> list[str]:
    """The first :data:`CHECK_BOOKS_LISTED` items, then how many more."""
    shown = items[:CHECK_BOOKS_LISTED]
    more = len(items) - len(shown)
    return [*shown, f"... and {more} more: see book_table"] if more else shown


def _md_list(items: list[str], empty: str = "(none)") -> MarkdownMetadataValue:
    return markdown_list(items, empty)


def _source_of(pipeline: IngestPipeline, book: BookHealth) -> str:
    """Where the book comes from, with the commit it was last indexed at (git)."""
    if not book.on_disk:
        return ""
    described = pipeline.source.describe(book.book_id)
    where = " ".join(v for k, v in described.items() if v and k != "path")
    if described.get("path"):
        where += f":{described['path']}"
    return where + (f" @ {book.revision[:12]}" if book.revision else "")


def _row(
    book: BookHealth, run_id: str | None, checks: dict[str, str], source: str = ""
) -> dict[str, Any]:
    why = [] if book.state == "ok" else [book.state]
    why += [f"{name} {result}" for name, result in checks.items() if result not in _GOOD]
    return {
        "book": book.book_id,
        "health": _health(book, checks),
        "why": "; ".join(why),
        "points": book.points,
        "chunks": book.chunks,
        "files": book.files,
        "errors": book.errors,
        "source": source,
        "last_run": run_id or "",
    }


#: how many storage ids one look-up of materializations names (SQLite's bound-variable limit)
_IDS_PER_QUERY = 500


def _last_runs(instance: DagsterInstance, book_ids: Sequence[str]) -> dict[str, str]:
    """book -> the run of its latest ``qdrant_points`` materialization (books never
    materialized are left out): two queries per 500 books, not one per book."""
    wanted = set(book_ids)
    if not wanted:
        return {}
    latest = {
        storage_id: book
        for book, storage_id in instance.get_latest_storage_id_by_partition(
            qdrant_points.key, DagsterEventType.ASSET_MATERIALIZATION
        ).items()
        if book in wanted
    }
    ids = sorted(latest)
    out = {}
    for start in range(0, len(ids), _IDS_PER_QUERY):
        batch = ids[start : start + _IDS_PER_QUERY]
        records = instance.fetch_materializations(
            AssetRecordsFilter(asset_key=qdrant_points.key, storage_ids=batch), limit=len(batch)
        ).records
        out.update({latest[r.storage_id]: r.run_id for r in records})
    return out


def _check_results(instance: DagsterInstance, book_ids: Sequence[str]) -> dict[str, dict[str, str]]:
    """book -> check name -> passed | failed | warned | - (never ran): the latest completed
    result of each of the book's checks (a run in flight does not hide the last known state).

    One query per check for every book says which latest results passed; only a book whose
    latest is anything else (failed, warned, in flight) has that check's history read."""
    storage = instance.event_log_storage
    latest = {
        (info.check_key, info.partition_key): info.latest_execution_status
        for info in storage.get_asset_check_partition_info(list(BOOK_CHECKS))
    }
    out: dict[str, dict[str, str]] = {}
    for book_id in book_ids:
        results = out.setdefault(book_id, {})
        for check in BOOK_CHECKS:
            status = latest.get((check, book_id))
            if status is None:
                results[check.name] = "-"
            elif status == AssetCheckExecutionRecordStatus.SUCCEEDED:
                results[check.name] = "passed"
            else:
                results[check.name] = _latest_completed(instance, check, book_id)
    return out


def _latest_completed(instance: DagsterInstance, check: AssetCheckKey, book_id: str) -> str:
    history = instance.event_log_storage.get_asset_check_execution_history(
        check,
        limit=1,
        status=COMPLETED_ASSET_CHECK_EXECUTION_RECORD_STATUSES,
        partition_filter=PartitionKeyFilter(key=book_id),
    )
    return _result(history[0]) if history else "-"


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

#: run states after which the collection may have changed
_ENDED = [DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED]
#: how long the sensor waits for an embedded store a run holds before trying again next tick
SENSOR_STORE_WAIT_S = 5.0


COLLECTION_SENSOR_NAME = "collection_sensor"


@sensor(
    name=COLLECTION_SENSOR_NAME,
    minimum_interval_seconds=15,
    default_status=DefaultSensorStatus.RUNNING,
    description="Refreshes the collection asset (its per-book table and checks) after any run "
    "of a book or a purge ends, whoever started it; the page is reported by the sensor, so "
    "refreshes add no runs.",
)
def collection_sensor(
    context: SensorEvaluationContext,
    pipeline: ResourceParam[IngestPipeline],
) -> SensorResult | SkipReason:
    explain_queue(context.instance)
    after = float(context.cursor) if context.cursor else 0.0
    # one query, whatever the number of books: the runs that ended since the last refresh
    ended = context.instance.get_run_records(
        RunsFilter(statuses=_ENDED, updated_after=datetime.fromtimestamp(after, UTC)),
        limit=1,
        order_by="update_timestamp",
        ascending=False,
    )
    if not ended:
        return SkipReason("no run ended since the last refresh")
    newest = ended[0].update_timestamp.timestamp()
    try:
        # a query service waiting meanwhile names this, not the code server's command line
        with holding_for(f"{COLLECTION_SENSOR_NAME}, refreshing the qdrant_collection page"):
            page = collection_page(
                context.instance, pipeline, context.log.warning, busy_wait_s=SENSOR_STORE_WAIT_S
            )
    except StoreBusyError as exc:  # a run is writing: the next tick refreshes
        return SkipReason(f"store busy, refreshed next tick: {exc}")
    return SensorResult(asset_events=page.events(), cursor=str(newest))

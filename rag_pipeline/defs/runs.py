"""Run tags that make every run of a book findable and say who started it, however it started.

Dagster tags every partitioned run with ``dagster/partition`` (the one filter that finds all
runs of a book: sensor, backfill, asset graph, Launchpad, CLI). The first step of each run adds
``rag/book`` and ``rag/trigger`` (books_sensor, backfill, ui, cli, ...) when whoever launched
it did not, and the retry strategy ``dagster/retry_strategy=ALL_STEPS``; steps whose checks
did not pass tag the run ``rag/checks``; a run that builds its book with another recipe (a
migration, built beside the searched index) is tagged ``rag/migration`` with what changes.
"""

from collections.abc import Mapping

from dagster import (
    AssetExecutionContext,
    DagsterInstance,
    DagsterRunStatus,
    OpExecutionContext,
    RunsFilter,
)

__all__ = [
    "BOOK_RUN_TAGS",
    "BOOK_TAG",
    "CHECKS_TAG",
    "MIGRATION_TAG",
    "PARTITION_TAG",
    "RETRY_ALL_STEPS",
    "RETRY_STRATEGY_TAG",
    "RUNS_IN_FLIGHT",
    "TRIGGER_TAG",
    "books_with_runs_in_flight",
    "tag_checks",
    "tag_migration",
    "tag_run",
    "trigger_of",
]

BOOK_TAG = "rag/book"
#: the tag Dagster gives every run of one partition (no public constant names it)
PARTITION_TAG = "dagster/partition"
TRIGGER_TAG = "rag/trigger"
CHECKS_TAG = "rag/checks"
#: a run that builds its book with another recipe; the value says what changes
#: (``old-model -> new-model``, or ``recipe <old signature> -> <new signature>``)
MIGRATION_TAG = "rag/migration"
#: the run retry strategy tag, as Dagster's run retry docs spell it and its values (a public
#: contract, as ``dagster/partition`` is, though only a private constant names it)
RETRY_STRATEGY_TAG = "dagster/retry_strategy"
#: the tag that makes run retries (``run_retries``, the daemon) re-run every step instead of
#: only the failed ones: step outputs live in the run's memory (defs/io.py), so the earlier
#: run's outputs are gone; every step is idempotent, and vectors in the index are reused
RETRY_ALL_STEPS = {RETRY_STRATEGY_TAG: "ALL_STEPS"}


def trigger_of(tags: Mapping[str, str]) -> str:
    """Who or what started a run, from the tags Dagster gave it."""
    if TRIGGER_TAG in tags:
        return tags[TRIGGER_TAG]
    if "dagster/backfill" in tags:
        return "backfill"
    if "dagster/sensor_name" in tags:
        return tags["dagster/sensor_name"]
    if "dagster/schedule_name" in tags:
        return "schedule"
    if any(k.startswith("dagster/auto") or "automation" in k for k in tags):
        return "automation"
    if "dagster/parent_run_id" in tags:
        return "retry"
    return "ui"


def tag_run(context: AssetExecutionContext | OpExecutionContext, book_id: str) -> None:
    """Tag the run with its book, its trigger and the retry strategy: runs launched outside the
    jobs (the asset graph, a backfill of selected assets) do not carry the jobs' tags."""
    tags = context.run.tags
    wanted = {BOOK_TAG: book_id, TRIGGER_TAG: trigger_of(tags), **RETRY_ALL_STEPS}
    missing = {k: v for k, v in wanted.items() if tags.get(k) != v}
    if missing:
        context.instance.add_run_tags(context.run.run_id, missing)


def tag_checks(context: AssetExecutionContext, outcome: str) -> None:
    """Mark the run in the run list: ``warned`` (a warning check) or ``failed``."""
    if context.run.tags.get(CHECKS_TAG) != "failed":
        context.instance.add_run_tags(context.run.run_id, {CHECKS_TAG: outcome})


def tag_migration(context: AssetExecutionContext, label: str) -> None:
    """Mark a run that builds its book with another recipe (however it was started: the
    sensor and the UI cannot know before the run looks at the store)."""
    if context.run.tags.get(MIGRATION_TAG) != label:
        context.instance.add_run_tags(context.run.run_id, {MIGRATION_TAG: label})


#: the states of a run that is queued or running: a book with such a run must keep its partition
RUNS_IN_FLIGHT = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
]
#: the tags that name a run's book: its partition (an ingest, however started), or the book tag
#: (a purge, which has no partition)
BOOK_RUN_TAGS = (PARTITION_TAG, BOOK_TAG)


def books_with_runs_in_flight(instance: DagsterInstance) -> set[str]:
    """Every book with a run queued or running, in one query (what a sensor tick asks, whatever
    the number of books)."""
    runs = instance.get_runs(RunsFilter(statuses=RUNS_IN_FLIGHT))
    return {run.tags[tag] for run in runs for tag in BOOK_RUN_TAGS if tag in run.tags}

"""Run tags that make every run of a book findable and say who started it, however it started.

Dagster tags every run of one partition with ``dagster/partition`` (the one filter that finds
all runs of a book: sensor, backfill, asset graph, Launchpad, CLI), and a run of several (a
batch: a range of partitions) with ``dagster/asset_partition_range_start`` and ``_end``. The
first step of each run adds ``rag/book`` (one book) or ``rag/batch`` (the number of books of
a batch), ``rag-book/<book id>=yes`` for every book the run writes or purges (the one filter
that finds every run of a book, batches included: Dagster's run filter matches a tag's key and
value exactly, so a key per book is the only way one filter finds a book inside a range),
``rag/trigger`` (books_sensor, backfill, ui, cli, ...) when whoever launched it
did not, and the retry strategy ``dagster/retry_strategy=ALL_STEPS``; steps whose checks did
not pass tag the run ``rag/checks``; a run that builds its books with another recipe (a
migration, built beside the searched index) is tagged ``rag/migration`` with what changes.

Those are the tags a person reads or filters by; tags only the project reads (which process
executes a run: :mod:`rag_pipeline.defs.reaper`) are hidden (:data:`HIDDEN_TAG_PREFIX`). The
CLI's and live mode's runs name their launcher as the UI's "Launched by" column reads it
(:func:`launcher_tags`).
"""

import hashlib
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import NamedTuple
from urllib.parse import quote

from dagster import (
    AssetExecutionContext,
    DagsterInstance,
    DagsterRunStatus,
    OpExecutionContext,
    RunRecord,
    RunsFilter,
)

from rag_pipeline.ui_terminal import RUN_LINE_PREFIX

__all__ = [
    "BATCH_TAG",
    "BOOK_KEY_PREFIX",
    "BOOK_KEY_VALUE",
    "BOOK_RUN_TAGS",
    "BOOK_TAG",
    "CHECKS_TAG",
    "HIDDEN_TAG_PREFIX",
    "LAUNCHED_BY_TAG",
    "MAX_RETRIES_TAG",
    "MIGRATION_TAG",
    "PARENT_RUN_TAG",
    "PARTITION_TAG",
    "QUEUE_TAG",
    "RANGE_END_TAG",
    "RANGE_START_TAG",
    "RETRY_ALL_STEPS",
    "RETRY_STRATEGY_TAG",
    "RUNS_IN_FLIGHT",
    "TRIGGER_TAG",
    "BooksInFlight",
    "batch_tags",
    "book_key",
    "book_keys",
    "book_runs_path",
    "books_in_flight",
    "books_of_run",
    "books_with_runs_in_flight",
    "explain_queue",
    "launcher_tags",
    "note_queue_wait",
    "one_book_tags",
    "one_label",
    "run_ended_line",
    "run_started_line",
    "tag_checks",
    "tag_migration",
    "tag_run",
    "trigger_of",
]

BOOK_TAG = "rag/book"
#: the key of the tag every run that writes or purges a book carries, one per book: the Runs
#: page's filter ``tag:rag-book/<id>=yes`` finds every run of the book, batches included
BOOK_KEY_PREFIX = "rag-book/"
BOOK_KEY_VALUE = "yes"
#: a run of several books (a batch): how many
BATCH_TAG = "rag/batch"
#: the tag Dagster gives every run of one partition (no public constant names it)
PARTITION_TAG = "dagster/partition"
#: how often the daemon retries a failed run (``run_retries``); a batch the sensor requests
#: sets 0: the sensor runs a failed batch's books one by one instead
MAX_RETRIES_TAG = "dagster/max_retries"
#: the tags of a run of a range of partitions, first and last key (in the order they were
#: added), as Dagster's backfills write them and its run creation reads them
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"
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
#: tags under this prefix are kept with the run but never shown: Dagster's GraphQL API leaves
#: them out of a run's tags (its HIDDEN_TAG_PREFIX, as its ``.dagster/repository`` tag is)
HIDDEN_TAG_PREFIX = ".dagster/"
#: the tag the UI's "Launched by" column shows as who launched a run (its ``user`` tag; the
#: others it reads name a schedule, a sensor or an automation condition of the code location)
LAUNCHED_BY_TAG = "user"
#: the tag of a re-execution (the UI's, ``run_retries``'), naming the run it re-executes; it
#: copies that run's tags
PARENT_RUN_TAG = "dagster/parent_run_id"


def launcher_tags(launcher: str, files: Sequence[str]) -> dict[str, str]:
    """The "Launched by" of a run the CLI or live mode executes: ``launcher`` (the command),
    and the first of the files that changed (``book/path``), e.g. ``live mode:
    ros2/00-intro.md``. Such a run is retried by the CLI (a batch book by book) or by live
    mode, not by the daemon's ``run_retries``: that would run the book a second time."""
    name = launcher
    if files:
        more = len(files) - 1
        name += f": {files[0]}" + (f" and {more} more file{'s' * (more > 1)}" if more else "")
    return {LAUNCHED_BY_TAG: name, MAX_RETRIES_TAG: "0"}


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
    if PARENT_RUN_TAG in tags:
        return "retry"
    return "ui"


def tag_run(context: AssetExecutionContext | OpExecutionContext, books: list[str]) -> None:
    """Tag the run with its book (or the size of its batch), its trigger and the retry
    strategy: runs launched outside the jobs (the asset graph, a backfill of selected assets)
    do not carry the jobs' tags."""
    note_queue_wait(context.instance, context.run.run_id)
    tags = context.run.tags
    which = (
        one_book_tags(books[0])
        if len(books) == 1
        else {BATCH_TAG: f"{len(books)} books", **book_keys(books)}
    )
    wanted = {**which, TRIGGER_TAG: trigger_of(tags), **RETRY_ALL_STEPS}
    missing = {k: v for k, v in wanted.items() if tags.get(k) != v}
    if missing:
        context.instance.add_run_tags(context.run.run_id, missing)


#: the most characters Dagster allows in a section of a tag key (a longer one is deprecated)
TAG_KEY_SECTION_CHARS = 63


def book_key(book: str) -> str:
    """The tag key of ``book``'s runs: ``rag-book/<id>``; an id longer than a tag key section
    may be (book ids reach 128 characters) is cut to its first 54 characters, a '.' and 8 hex
    digits of its SHA-256, so two long ids never share a key."""
    if len(book) > TAG_KEY_SECTION_CHARS:
        book = f"{book[:54]}.{hashlib.sha256(book.encode()).hexdigest()[:8]}"
    return f"{BOOK_KEY_PREFIX}{book}"


def book_keys(books: Sequence[str]) -> dict[str, str]:
    """One tag per book the run writes or purges (``rag-book/<id>=yes``, :func:`book_key`)."""
    return {book_key(book): BOOK_KEY_VALUE for book in books}


def one_book_tags(book: str) -> dict[str, str]:
    """The tags of a run of one book (an ingest of its partition, or its purge)."""
    return {BOOK_TAG: book, **book_keys([book])}


def book_runs_path(book: str) -> str:
    """The Runs page filtered to every run that wrote or purged ``book`` (a UI path)."""
    token = quote(f"tag:{book_key(book)}={BOOK_KEY_VALUE}", safe=":/=")
    return f"/runs?q[0]={token}"


def batch_tags(books: Sequence[str]) -> dict[str, str]:
    """The tags that make a run materialize ``books`` (two or more, adjacent keys in partition
    order): the range from the first to the last, and the size of the batch. A run of one
    book is asked for by its partition key instead."""
    if len(books) < 2:
        raise ValueError("a batch holds two books or more; ask for one by its partition key")
    return {
        RANGE_START_TAG: books[0],
        RANGE_END_TAG: books[-1],
        BATCH_TAG: f"{len(books)} books",
        **book_keys(books),
    }


def books_of_run(tags: Mapping[str, str], order: Sequence[str]) -> list[str]:
    """The books a run is about, from its tags: its partition, the range of a batch (resolved
    in ``order``, the partition keys in the order they were added; a key no longer there
    resolves to nothing), or the book of a purge."""
    start, end = tags.get(RANGE_START_TAG), tags.get(RANGE_END_TAG)
    if start is not None and end is not None:
        try:
            first, last = order.index(start), order.index(end)
        except ValueError:
            return [b for b in (start, end) if b in order]
        return list(order[first : last + 1])
    return [tags[tag] for tag in BOOK_RUN_TAGS if tag in tags][:1]


def tag_checks(context: AssetExecutionContext, outcome: str) -> None:
    """Mark the run in the run list: ``warned`` (a warning check) or ``failed``."""
    if context.run.tags.get(CHECKS_TAG) != "failed":
        context.instance.add_run_tags(context.run.run_id, {CHECKS_TAG: outcome})


def one_label(labels: Sequence[str]) -> str:
    """The ``rag/migration`` tag of a run whose books change recipe: what changes, once (the
    books of a batch usually share it)."""
    distinct = sorted(set(labels))
    return distinct[0] if len(distinct) == 1 else f"{len(distinct)} changes: {distinct[0]}, ..."


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
RUNS_IN_FLIGHT_FILTER = RunsFilter(statuses=RUNS_IN_FLIGHT)


class BooksInFlight(NamedTuple):
    """The books with a run queued or running, and those of them in a batch's run."""

    books: set[str]
    #: in a run of several books: no tag limit of the run queue covers a range of partitions,
    #: so no other run of these books may be requested until it ends
    in_batches: set[str]


def books_in_flight(instance: DagsterInstance, order: Sequence[str]) -> BooksInFlight:
    """Every book with a run queued or running, in one query (what a sensor tick asks, whatever
    the number of books); a batch's books are resolved in ``order`` (the partition keys)."""
    books: set[str] = set()
    in_batches: set[str] = set()
    for run in instance.get_runs(RUNS_IN_FLIGHT_FILTER):
        of_run = books_of_run(run.tags, order)
        books.update(of_run)
        if RANGE_START_TAG in run.tags:
            in_batches.update(of_run)
    return BooksInFlight(books, in_batches)


def books_with_runs_in_flight(instance: DagsterInstance, order: Sequence[str]) -> set[str]:
    """Every book with a run queued or running (see :func:`books_in_flight`)."""
    return books_in_flight(instance, order).books


#: the tag that says what a queued run waits for (the UI only says it "will start soon"), and
#: once it started, what it waited for: set only on a run that really waited behind another
QUEUE_TAG = "rag/waiting_for"
#: how many queued and running runs a look at the queue reads (two queries, whatever the history)
_QUEUE_LOOK = 50
#: run states after which a run no longer holds others back
_ENDED = [DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED]


def explain_queue(instance: DagsterInstance) -> None:
    """Tag each queued run with the run in progress it waits for: one of the same book (one
    run per book), or any (one run at a time on an embedded store). A queued run with nothing
    ahead of it is left untagged (a tag set earlier says so): it starts at the daemon's next
    pass."""
    queued = instance.get_run_records(
        RunsFilter(statuses=[DagsterRunStatus.QUEUED]), limit=_QUEUE_LOOK
    )
    if not queued:
        return
    running = instance.get_run_records(
        RunsFilter(statuses=[DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]),
        limit=_QUEUE_LOOK,
    )
    for record in queued:
        run = record.dagster_run
        reason = _waits_for(_books_of(run.tags), running)
        if reason is None and QUEUE_TAG not in run.tags:
            continue
        reason = reason or "nothing now: no run in progress, it starts at the daemon's next pass"
        if run.tags.get(QUEUE_TAG) != reason:
            instance.add_run_tags(run.run_id, {QUEUE_TAG: reason})


def note_queue_wait(instance: DagsterInstance, run_id: str) -> None:
    """At a run's start, turn what it waited for into the past tense: how long it was queued
    and the runs that finished meanwhile (what held it back). A run that waited for no other
    run gets no tag (or, if it was tagged while queued, one that says it waits for nothing).
    Two queries a run."""
    record = instance.get_run_record_by_id(run_id)
    if record is None or record.start_time is None:
        return
    created = record.create_timestamp
    if created.tzinfo is None:  # run storage keeps UTC
        created = created.replace(tzinfo=UTC)
    started = datetime.fromtimestamp(record.start_time, UTC)
    ahead = instance.get_run_records(
        RunsFilter(statuses=_ENDED, updated_after=created, updated_before=started), limit=3
    )
    if not ahead and QUEUE_TAG not in record.dagster_run.tags:
        return
    waited = f"{(started - created).total_seconds():.1f} s"
    note = (
        f"nothing now: waited {waited} in the queue while "
        + ", ".join(_name(r) for r in ahead)
        + " finished"
        if ahead
        else f"nothing now: started {waited} after it was queued, behind no other run"
    )
    instance.add_run_tags(run_id, {QUEUE_TAG: note})


def _waits_for(books: set[str], running: Sequence[RunRecord]) -> str | None:
    # compared by key: a batch's tags name a long id only by its cut key
    keys = {book_key(b) for b in books}
    same = [r for r in running if keys & {book_key(b) for b in _books_of(r.dagster_run.tags)}]
    if same:
        return f"a run of the same book in progress: {_name(same[0])} (one run per book)"
    if running:
        shown = ", ".join(_name(r) for r in running[:3])
        return f"runs in progress: {shown} (max_concurrent_runs in dagster.yaml)"
    return None


def _name(record: RunRecord) -> str:
    run = record.dagster_run
    books = sorted(_books_of(run.tags))
    of = (
        books[0]
        if len(books) == 1
        else (f"{len(books)} books" if books else run.tags.get(BATCH_TAG, run.job_name))
    )
    return f"run {run.run_id[:8]} ({of})"


def _books_of(tags: Mapping[str, str]) -> set[str]:
    """The books a run is tagged with: its book tag or its partition, and its book keys (a
    long id's cut key counted once, as the id its book tag names)."""
    named = {v for k in (BOOK_TAG, PARTITION_TAG) if (v := tags.get(k))}
    named_keys = {book_key(b) for b in named}
    keyed = {
        k[len(BOOK_KEY_PREFIX) :]
        for k in tags
        if k.startswith(BOOK_KEY_PREFIX) and k not in named_keys
    }
    return keyed | named


def run_started_line(run_id: str, job_name: str, tags: Mapping[str, str]) -> str:
    """The terminal's line for a run that starts: its id, job, books and who started it."""
    books = sorted(_books_of(tags))
    named = ", ".join(books[:3]) + (f" and {len(books) - 3} more" if len(books) > 3 else "")
    if not books and RANGE_START_TAG in tags:  # a backfill's range, before its first step
        named = f"books {tags[RANGE_START_TAG]} to {tags.get(RANGE_END_TAG, '?')}"
    return (
        f"{RUN_LINE_PREFIX} run {run_id[:8]} started: {job_name}"
        + (f", {named}" if named else "")
        + f" (by {trigger_of(tags)})"
    )


def run_ended_line(run_id: str, seconds: float, *, failed: bool) -> str:
    """The terminal's line for a run that ends, and where to read it in the UI."""
    outcome = f"failed, see /runs/{run_id}" if failed else "done"
    return f"{RUN_LINE_PREFIX} run {run_id[:8]} ended after {seconds:.1f} s: {outcome}"

"""Execute an ingest plan through Dagster, from one process (what ``rag-pipeline ingest`` does).

Per-book Dagster runs keep per-book lineage, metadata, checks and run history, but a run costs
Dagster start-up time. So the runner

* is handed the plan (only books that need it run) and the pipeline the CLI already built
  (one model, one store configuration for every run);
* executes the runs in-process, one after another, against the instance in ``DAGSTER_HOME``;
* first marks failed the runs whose process died (they would hold their pool slots forever);
  while a run executes, a step waiting for a pool held by another live run is reported every
  ``busy_wait_s`` seconds, naming that run (see :class:`PoolWatch`);
* reads each run's result as the pipeline's own typed :class:`BookResult`;
* keeps Dagster's console quiet: the report names every failure, and a run's event log in
  ``DAGSTER_HOME`` keeps its full error (the UI shows it). Only while this process logs at INFO
  (the CLI's ``-v``) does the console print Dagster's errors, with their stack traces.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from dagster import (
    AssetCheckEvaluation,
    DagsterEventType,
    DagsterInstance,
    ExecuteInProcessResult,
    JobDefinition,
)

from rag_pipeline.config import BatchConfig
from rag_pipeline.defs._dagster_private import (
    LocationRun,
    create_location_run,
    execute_created_run,
    location_job_origin,
    without_output_capture,
)
from rag_pipeline.defs.assets import EMBEDDING_POOL, STORE_POOL, qdrant_points
from rag_pipeline.defs.collection import report_collection
from rag_pipeline.defs.instance import DagsterHomeFullError, home_full, open_home_instance
from rag_pipeline.defs.jobs import (
    INGEST_JOB_NAME,
    PURGE_JOB_NAME,
    ingest_run_config,
    purge_book_points,
    purge_run_config,
)
from rag_pipeline.defs.location import (
    LOCATION_ATTRIBUTE,
    LOCATION_MODULE,
    LOCATION_NAME,
    build_defs,
    fixed_resources,
)
from rag_pipeline.defs.partition_marker import forget_partitions_marker, write_partitions_marker
from rag_pipeline.defs.partitions import BOOKS_PARTITIONS_NAME
from rag_pipeline.defs.reaper import free_slots, process_tags, reap_dead_runs, run_worker
from rag_pipeline.defs.runs import (
    MIGRATION_TAG,
    TRIGGER_TAG,
    batch_tags,
    books_with_runs_in_flight,
    launcher_tags,
    one_book_tags,
    one_label,
)
from rag_pipeline.ingest.batches import batch_books, split_after
from rag_pipeline.ingest.pipeline import IngestPipeline
from rag_pipeline.ingest.plan import IngestPlan
from rag_pipeline.ingest.report import BookResult, IngestReport
from rag_pipeline.phases import Phases

__all__ = [
    "CLI_LAUNCHER",
    "PoolWatch",
    "add_book_partitions",
    "book_runs_in_flight",
    "console_run_config",
    "execute_plan",
]

log = logging.getLogger(__name__)
#: Dagster's console logger level without -v: above every level Dagster logs at, so its failure
#: events (whose text carries a ``Stack Trace:`` block) never reach stderr
QUIET_CONSOLE_LEVEL = "CRITICAL"
#: with -v: a run's errors in full, not its DEBUG events
VERBOSE_CONSOLE_LEVEL = "ERROR"
#: who launched the runs of ``rag-pipeline ingest`` (the UI's "Launched by")
CLI_LAUNCHER = "rag-pipeline ingest"


#: the reason of a book whose folder went away while its run read it (purged after the run)
REMOVED_DURING_ITS_RUN = "book folder removed while its run read it: purged after the run"


def execute_plan(
    plan: IngestPlan,
    pipeline: IngestPipeline,
    instance: DagsterInstance | None = None,
    *,
    dagster_home: Path | None = None,
    trigger: str = "cli",
    launcher: str = CLI_LAUNCHER,
    notify: Callable[[str], None] | None = None,
    batching: BatchConfig | None = None,
    stopping: Callable[[], bool] = lambda: False,
    work_first: bool = False,
    phases: Phases | None = None,
) -> IngestReport:
    """Run and purge the books the plan says (and purge a book removed while its run read
    it); unchanged and missing books are reported as planned. Books to run go through runs of
    several books where they are adjacent in partition order (``batching``,
    :mod:`rag_pipeline.ingest.batches`); a batch that fails for one of its books is run again
    book by book. Once ``stopping()`` says so (asked before each run), no further run starts:
    the books left are ``deferred``. Returns the ingest report. Without ``instance``, the one
    in ``DAGSTER_HOME``. ``trigger`` and ``launcher``: the runs' trigger tag and who launched
    them (:func:`~rag_pipeline.defs.runs.launcher_tags`). ``work_first`` (live mode): each
    ingest run is recorded, then its stages done and its points written under its id, then
    its steps executed on what was done (:func:`_run_books`). ``phases``: the ends of the
    instance's opening, the runs and the collection's refresh are marked on it."""
    batching = batching or BatchConfig()
    if instance is None:
        try:
            with open_home_instance() as home_instance:
                # this process's steps log through Dagster's logger, not print: capturing
                # its output would start two `tail` processes a run, as live mode's runs
                without_output_capture(home_instance)
                return execute_plan(
                    plan,
                    pipeline,
                    home_instance,
                    dagster_home=dagster_home,
                    trigger=trigger,
                    launcher=launcher,
                    notify=notify,
                    batching=batching,
                    stopping=stopping,
                    work_first=work_first,
                    phases=phases,
                )
        except DagsterHomeFullError as exc:  # before any run: every book that needed one failed
            (notify or log.warning)(str(exc))
            return _not_recorded(plan, exc)
    started = time.perf_counter()
    phases = phases or Phases()
    phases.mark("instance_open")
    say = notify or log.warning
    report = IngestReport(rejected=list(plan.rejected), warnings=list(plan.warnings))
    results: dict[str, BookResult] = {}
    vanished: list[str] = []
    full: DagsterHomeFullError | None = None
    if dagster_home is not None:  # written again at the end
        forget_partitions_marker(dagster_home)
    try:
        how = _How(trigger, launcher, say, batching, stopping, work_first)
        _run_plan(plan, pipeline, instance, results, vanished, report, how)
    except Exception as exc:
        # a full DAGSTER_HOME: Dagster can record nothing more. Named, and the report says
        # what was done; a run it left unfinished is reaped by the next ingest
        full = home_full(dagster_home or Path(instance.root_directory), exc)
        if full is None:
            raise
        say(str(full))
        report.warnings.append(str(full))
        for book_id, book in plan.books.items():
            if book_id not in results:
                planned = book.action in ("unchanged", "missing")
                results[book_id] = book.result() if planned else _failed(book_id, None, str(full))
    phases.mark("runs")
    for book_id, book in plan.books.items():  # in the plan's order
        report.books[book_id] = results[book_id]
        if book.action in ("run", "purge"):
            report.books[book_id].reasons = list(book.reasons)
        if book_id in vanished:
            report.books[book_id].reasons.append(REMOVED_DURING_ITS_RUN)

    if plan.needs_runs and full is None:  # one refresh of the collection's page
        try:
            report_collection(instance, pipeline)
        except Exception as exc:  # the books are ingested; only the overview is late
            report.warnings.append(f"the collection asset was not refreshed: {exc}")
    if dagster_home is not None and full is None:  # a hint for the next ingest: best effort
        problem = write_partitions_marker(
            dagster_home, instance.get_dynamic_partitions(BOOKS_PARTITIONS_NAME)
        )
        if problem is not None:
            report.warnings.append(problem)
    phases.mark("collection")
    report.seconds = plan.seconds + time.perf_counter() - started
    return report


class _How(NamedTuple):
    """How :func:`execute_plan` runs: the runs' trigger tag and launcher, where it reports,
    which books share a run, and when to stop starting runs."""

    trigger: str
    launcher: str
    say: Callable[[str], None]
    batching: BatchConfig
    stopping: Callable[[], bool]
    work_first: bool = False


def _run_plan(
    plan: IngestPlan,
    pipeline: IngestPipeline,
    instance: DagsterInstance,
    results: dict[str, BookResult],
    vanished: list[str],
    report: IngestReport,
    how: _How,
) -> None:
    """The runs and purges of :func:`execute_plan`: each book's result in ``results`` as it
    comes (what an error part way leaves is what was done), the books purged because they
    went away while their run read them in ``vanished``."""
    trigger, launcher, say, batching, stopping, work_first = how
    ingest_job, purge_job = _jobs(pipeline)

    for run_id in reap_dead_runs(instance, log=say):
        report.warnings.append(f"run {run_id} had died with its process; marked failed")
    to_run = plan.with_action("run")
    # every book folder of the plan has its partition (as the books sensor gives it): a book
    # indexed without one (another instance, a DAGSTER_HOME reset) is seen in the UI, and the
    # next no-change ingest answers without Dagster
    add_book_partitions(instance, [*to_run, *plan.with_action("unchanged")])
    tags = {TRIGGER_TAG: trigger, **process_tags()}
    wait_s = pipeline.store.busy_wait_s

    def watched(run_id: str) -> PoolWatch:
        return PoolWatch(instance, run_id, [STORE_POOL, EMBEDDING_POOL], wait_s, say)

    for book_id, book in plan.books.items():
        if book.action in ("unchanged", "missing"):
            results[book_id] = book.result()
    # a book with no folder and no points (its runs all failed, or a purge that had to wait
    # for a run of it left its partition): nothing to purge, its partition goes
    order = instance.get_dynamic_partitions(BOOKS_PARTITIONS_NAME)
    dropped = [
        b
        for b in plan.partitions_to_drop(pipeline.source, order)
        if _drop_idle_partition(instance, b)
    ]
    order = [b for b in order if b not in dropped]  # read once: what was deleted, left out
    files = {b: len(plan.books[b].changes.changed) for b in to_run}

    def run(books: list[str]) -> _Ran:
        migrations = [m for b in books if (m := plan.books[b].migration) is not None]
        # (its first step tags it too, but later)
        migration = {MIGRATION_TAG: one_label(migrations)} if migrations else {}
        changed = [f"{b}/{f}" for b in books for f in plan.books[b].changes.changed]
        launched = launcher_tags(launcher, changed)
        first = pipeline if work_first else None
        run_tags = {**tags, **launched, **migration}
        return _run_books(ingest_job, instance, books, plan.force, run_tags, watched, first)

    for batch in batch_books(to_run, order, batching, files):
        if stopping():
            results.update({b: _deferred(b) for b in batch})
            continue
        t0 = time.perf_counter()
        ran = run(batch)
        if ran.split:  # a batch failed for one of its books: each book alone
            say(f"a run of {len(batch)} books failed ({ran.message}); running them one by one")
            ran = _Ran({b: _deferred(b) if stopping() else run([b]).results[b] for b in batch})
        share = (time.perf_counter() - t0) / len(batch)  # a book's part of the batch's time
        for book_id in batch:
            results[book_id] = ran.results[book_id]
            results[book_id].seconds = share
    # a book removed (or renamed) while its run read it: the run wrote nothing (a "missing"
    # result); it is purged now, as the next plan would purge it: a change like any other,
    # not a failure (a rebuild is swapped in, and its catch-up ingests a renamed book)
    vanished += [b for b in to_run if results[b].status == "missing" and pipeline.source.is_gone(b)]
    for book_id in [*plan.with_action("purge"), *vanished]:
        if stopping():
            results[book_id] = _deferred(book_id)
            continue
        t0 = time.perf_counter()
        run_id = str(uuid.uuid4())
        with watched(run_id):
            purge_tags = {**tags, **launcher_tags(launcher, []), **one_book_tags(book_id)}
            results[book_id] = _purge_book(purge_job, instance, run_id, book_id, purge_tags)
        results[book_id].seconds = time.perf_counter() - t0


def _deferred(book_id: str) -> BookResult:
    return BookResult(book_id, "deferred", warnings=["not run: the process was stopping"])


@functools.lru_cache(maxsize=2)
def _jobs(pipeline: IngestPipeline) -> tuple[JobDefinition, JobDefinition]:
    """The ingest and purge jobs bound to ``pipeline``, built once per pipeline: a live
    process runs them at every change."""
    defs = build_defs(fixed_resources(pipeline), embedder=_provider(pipeline))
    return defs.resolve_job_def(INGEST_JOB_NAME), defs.resolve_job_def(PURGE_JOB_NAME)


def _provider(pipeline: IngestPipeline) -> str:
    """The configured embedder (the kind the UI shows on the embedding step)."""
    return str(getattr(pipeline.recipes, "provider", "python"))


def add_book_partitions(instance: DagsterInstance, book_ids: Sequence[str]) -> None:
    """Add the books' partitions that do not exist yet. Another process (a second ingest, the
    sensor) may add the same ones at the same moment: the loser of that race reads again."""
    for attempt in range(3):
        known = set(instance.get_dynamic_partitions(BOOKS_PARTITIONS_NAME))
        missing = [b for b in book_ids if b not in known]
        if not missing:
            return
        try:
            instance.add_dynamic_partitions(BOOKS_PARTITIONS_NAME, missing)
            return
        except Exception as exc:  # sqlalchemy's IntegrityError on the unique partition index
            if attempt == 2 or "unique" not in str(exc).lower():
                raise
            time.sleep(0.1)


def console_run_config() -> dict[str, Any]:
    """The run config of Dagster's console logger for a run of this process: quiet, unless
    this process logs at INFO (``rag-pipeline -v``). The event log is not affected."""
    level = VERBOSE_CONSOLE_LEVEL if log.isEnabledFor(logging.INFO) else QUIET_CONSOLE_LEVEL
    return {"loggers": {"console": {"config": {"log_level": level}}}}


@dataclass
class _Ran:
    """What the runs of a batch did to each book; ``split``: it failed in a way that running
    its books one by one may narrow down (:func:`~rag_pipeline.ingest.batches.split_after`)."""

    results: dict[str, BookResult]
    split: bool = False
    message: str = ""


def _run_books(
    job: JobDefinition,
    instance: DagsterInstance,
    books: list[str],
    force: bool,
    tags: dict[str, str],
    watched: Callable[[str], PoolWatch],
    work_first: IngestPipeline | None = None,
) -> _Ran:
    """One run of ``books`` (one partition, or a range of adjacent ones).

    With ``work_first`` (live mode's pipeline, the one the job is bound to) the run is
    recorded first (NOT_STARTED, this process's tags on it), then its stages are done and its
    points written under its id (searchable at once), then the run executes, its steps handed
    what was done: the same events, materializations and checks, off the critical path. A
    process killed between the write and the run's end leaves a run recorded with the id its
    points carry, which the next ``watch`` or ``ingest`` marks failed (:func:`reap_dead_runs`);
    the book, left ``applying``, is applied again (its points are the files': nothing runs)."""
    run_id = str(uuid.uuid4())
    one = len(books) == 1
    run_tags = {**tags, **(one_book_tags(books[0]) if one else batch_tags(books))}
    with watched(run_id), _failed_if_left(instance, run_id):
        with _CREATING, _planned_per_run(not one):
            created = _create(
                job,
                instance,
                run_id,
                ingest_run_config(force=force),
                run_tags,
                partition_key=books[0] if one else None,
            )
        if work_first is None:
            outcome = execute_created_run(created, instance)
        else:
            prepared = work_first.prepare(books, run_id=run_id, force=force)
            with work_first.replaying(prepared):
                outcome = execute_created_run(created, instance)
    if not outcome.success:
        failure = _failure(outcome)
        failed = {b: _failed(b, outcome.run_id, failure.message) for b in books}
        return _Ran(failed, split=not one and split_after(failure.classes), message=failure.message)
    results: dict[str, BookResult] = outcome.output_for_node(qdrant_points.op.name)
    for result in results.values():
        result.run_id = outcome.run_id
    return _Ran(results)


#: With this set, Dagster's event log storage records one "materialization planned" event per
#: asset of a run instead of one per partition (it reads it when the run is created): a batch's
#: creation logged five events per book. The price, as Dagster says: the books of a batch that
#: fails are not marked failed on their partitions; the runner then runs each of them alone,
#: and those runs mark theirs.
PLANNED_PER_RUN = "DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS"


#: this process's runs are created one at a time (live mode executes runs in threads):
#: :data:`PLANNED_PER_RUN`, set for a batch's creation, is read by no other creation
_CREATING = threading.Lock()


@contextmanager
def _planned_per_run(batch: bool) -> Iterator[None]:
    """:data:`PLANNED_PER_RUN` for the creation of a batch's run (runs are created one at a
    time: :data:`_CREATING`)."""
    if not batch or os.environ.get(PLANNED_PER_RUN) is not None:
        yield
        return
    os.environ[PLANNED_PER_RUN] = "1"
    try:
        yield
    finally:
        os.environ.pop(PLANNED_PER_RUN, None)


@contextmanager
def _failed_if_left(instance: DagsterInstance, run_id: str) -> Iterator[None]:
    """A run that an error escaping its execution left unfinished (its failure could not be
    recorded: a full ``DAGSTER_HOME``) is marked failed now where the instance can still
    record that; where it cannot, the next ingest's :func:`reap_dead_runs` does."""
    try:
        yield
    except Exception:
        with contextlib.suppress(Exception):  # the error that escaped is the one to report
            run = instance.get_run_by_id(run_id)
            if run is not None and not run.is_finished:
                instance.report_run_failed(run, "the process could not record this run's end")
                free_slots(instance, run_id)
        raise


def _create(
    job: JobDefinition,
    instance: DagsterInstance,
    run_id: str,
    run_config: dict[str, Any],
    tags: dict[str, str],
    partition_key: str | None = None,
) -> LocationRun:
    """Record one run of ``job`` under ``run_id``, to execute in this process on the home
    instance (:func:`execute_created_run`: its failure reported, not raised). The run is
    recorded as a run of the code location's job, as the sensor's are: the UI lists it under
    the job and in the Timeline, and can re-execute it (the job built here is the one the
    code location serves: the same snapshot). Dagster's public APIs cannot record that
    origin (README: Dagster)."""
    origin = location_job_origin(LOCATION_NAME, LOCATION_MODULE, LOCATION_ATTRIBUTE, job.name)
    return create_location_run(
        job,
        origin,
        instance=instance,
        run_id=run_id,
        run_config={**console_run_config(), **run_config},
        tags=tags,
        partition_key=partition_key,
    )


def _execute(
    job: JobDefinition,
    instance: DagsterInstance,
    run_id: str,
    run_config: dict[str, Any],
    tags: dict[str, str],
) -> ExecuteInProcessResult:
    """Record one run of ``job`` (:func:`_create`) and execute it."""
    return execute_created_run(_create(job, instance, run_id, run_config, tags), instance)


def _purge_book(
    job: JobDefinition, instance: DagsterInstance, run_id: str, book_id: str, tags: dict[str, str]
) -> BookResult:
    with _failed_if_left(instance, run_id):
        outcome = _execute(job, instance, run_id, purge_run_config(book_id), tags)
    if not outcome.success:
        return _failed(book_id, outcome.run_id, _failure_message(outcome))
    warnings = []
    if not _drop_idle_partition(instance, book_id):
        warnings.append(
            f"partition {book_id!r} kept while another run of the book is in flight; "
            "the sensor removes it after that run, as does the next `rag-pipeline ingest`"
        )
    return BookResult(
        book_id,
        "removed",
        deleted=int(outcome.output_for_node(purge_book_points.name)),
        run_id=outcome.run_id,
        warnings=warnings,
    )


def _drop_idle_partition(instance: DagsterInstance, book_id: str) -> bool:
    """Delete the partition of a book with no folder (and no points), unless a run of it is
    in flight: deleting a partition under a running run fails that run. False when kept."""
    if book_id not in set(instance.get_dynamic_partitions(BOOKS_PARTITIONS_NAME)):
        return True
    if book_runs_in_flight(instance, book_id):
        return False
    instance.delete_dynamic_partition(BOOKS_PARTITIONS_NAME, book_id)
    return True


def book_runs_in_flight(instance: DagsterInstance, book_id: str) -> bool:
    """Whether a run of the book (an ingest of it alone or in a batch, or a purge) is queued
    or running: its partition must not be deleted under it. The same runs the sensor's
    :func:`~rag_pipeline.defs.runs.books_with_runs_in_flight` finds."""
    order = instance.get_dynamic_partitions(BOOKS_PARTITIONS_NAME)
    return book_id in books_with_runs_in_flight(instance, order)


def _not_recorded(plan: IngestPlan, full: DagsterHomeFullError) -> IngestReport:
    """The report of a plan none of whose runs could be recorded: unchanged and missing
    books as planned, every other one failed, naming the full ``DAGSTER_HOME``."""
    report = IngestReport(
        rejected=list(plan.rejected), warnings=[*plan.warnings, str(full)], seconds=plan.seconds
    )
    for book_id, book in plan.books.items():
        if book.action in ("unchanged", "missing"):
            report.books[book_id] = book.result()
        else:
            report.books[book_id] = _failed(book_id, None, str(full))
            report.books[book_id].reasons = list(book.reasons)
    return report


def _failed(book_id: str, run_id: str | None, message: str) -> BookResult:
    return BookResult(book_id, "failed", run_id=run_id, error_messages=[message])


@dataclass(frozen=True)
class _Failure:
    message: str
    #: the class names of the error and its causes, outermost first
    classes: tuple[str, ...] = ()


def _failure(outcome: ExecuteInProcessResult) -> _Failure:
    for event in outcome.all_events:
        if event.is_step_failure and event.step_failure_data is not None:
            error = event.step_failure_data.error
            if error is not None:
                classes = [error.cls_name]
                cause = error
                while cause.cause is not None:
                    cause = cause.cause
                    classes.append(cause.cls_name)
                said = _without_module(cause.message.strip(), cause.cls_name or "")
                message = f"step {event.step_key} failed: {said}"
                reasons = _failed_check_reasons(outcome)
                if reasons:
                    message += f" ({'; '.join(reasons)})"
                return _Failure(message, tuple(c for c in classes if c))
    for event in outcome.all_events:
        if event.is_run_failure and event.message:
            return _Failure(event.message)
    return _Failure("run failed")


def _failed_check_reasons(outcome: ExecuteInProcessResult) -> list[str]:
    """Each failed check's reason in words (its description), with its book: what a
    blocking check's failure of a step means (Dagster's error names only the check)."""
    reasons = []
    for event in outcome.all_events:
        if event.event_type != DagsterEventType.ASSET_CHECK_EVALUATION:
            continue
        data = event.asset_check_evaluation_data
        failed = isinstance(data, AssetCheckEvaluation) and data.blocking and not data.passed
        if failed and data.description:
            book = data.partition or ""
            reasons.append(f"{book}: {data.description}" if book else data.description)
    return reasons


def _without_module(message: str, cls_name: str) -> str:
    """An error's message as Dagster records it (``traceback``'s words: a class outside the
    builtins named with its module, ``rag_pipeline.sources.base.BookUnavailableError: ...``)
    with the class named as every other message names one: ``BookUnavailableError: ...``."""
    head, sep, rest = message.partition(": ")
    if sep and cls_name and head.endswith(f".{cls_name}") and " " not in head:
        return f"{cls_name}: {rest}"
    return message


def _failure_message(outcome: ExecuteInProcessResult) -> str:
    return _failure(outcome).message


class PoolWatch:
    """While a run executes in this process, watch its steps' pool claims: a step that waits
    for a pool is reported every ``every_s`` seconds, naming the runs that hold it, and runs
    whose process died are reaped on the way, so their slots come free."""

    def __init__(
        self,
        instance: DagsterInstance,
        run_id: str,
        pools: Sequence[str],
        every_s: float,
        notify: Callable[[str], None],
    ) -> None:
        self.instance = instance
        self.run_id = run_id
        self.pools = list(pools)
        self.every_s = max(every_s, 1.0)
        self.notify = notify
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="pool-watch", daemon=True)

    def __enter__(self) -> PoolWatch:
        if self.instance.event_log_storage.supports_global_concurrency_limits:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _watch(self) -> None:
        waiting_since: float | None = None
        reported = 0.0
        while not self._stop.wait(1.0):
            try:
                waiting = self._waiting_steps()
            except Exception:  # a watcher must never break the run it watches
                continue
            if not waiting:
                waiting_since = None
                continue
            now = time.monotonic()
            waiting_since = waiting_since or now
            if now - waiting_since >= self.every_s and now - reported >= self.every_s:
                reported = now
                holders = "; ".join(
                    f"pool {pool} held by {who}"
                    for pool, who in _busy_pools(self.instance, list(waiting)).items()
                )
                steps = ", ".join(sorted(set(waiting.values())))
                self.notify(
                    f"run {self.run_id}: step {steps} has waited {now - waiting_since:.0f}s "
                    f"for a pool slot ({holders or 'held by other steps'})"
                )
                reap_dead_runs(self.instance, log=self.notify)

    def _waiting_steps(self) -> dict[str, str]:
        """pool -> step of this run that waits for a slot of it."""
        out = {}
        infos = self.instance.event_log_storage.get_concurrency_infos(self.pools)
        for pool, info in infos.items():
            for step in info.pending_steps:
                if step.run_id == self.run_id and step.assigned_timestamp is None:
                    out[pool] = step.step_key
        return out


def _busy_pools(instance: DagsterInstance, pools: Sequence[str]) -> dict[str, str]:
    busy = {}
    for pool, info in instance.event_log_storage.get_concurrency_infos(list(pools)).items():
        if info.limit is None or len(info.claimed_slots) < info.limit:
            continue
        run_ids = sorted(info.active_run_ids)
        busy[pool] = ", ".join(_describe_run(instance, r) for r in run_ids) or "unknown runs"
    return busy


def _describe_run(instance: DagsterInstance, run_id: str) -> str:
    run = instance.get_run_by_id(run_id)
    if run is None:
        return f"run {run_id} (no longer recorded)"
    worker = run_worker(instance, run)
    return f"run {run_id} ({run.job_name}, {run.status.value}" + (f", {worker})" if worker else ")")

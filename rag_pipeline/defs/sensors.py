"""The books sensor: keeps book partitions and runs in step with the folders on disk.

Each tick it stats every Markdown file (no reads), and hashes a file only when its stat differs
from what the previous tick saw. The cursor stays compact: one entry per book,
``[stat digest, content digest]``, a request counter, and the books whose latest ingest run
failed (:class:`FailedBooks`). Then:

* a new book folder      -> add its partition, request an ingest run;
* a book whose content digest changed -> request an ingest run keyed by that digest and the
  counter, so an unchanged book never gets a second run (a ``touch`` changes the stat digest,
  not the content), while content that comes back (an edit reverted, a book restored after its
  purge) is a new request and does run;
* a book written (its stat digest moved, its content digest not) while a run of it was in
  flight or since the previous tick -> run again: that run may have read a version in
  between (so a ``touch`` just after a run costs one run that embeds nothing);
* a removed book folder  -> delete its partition and request a ``purge_book`` run that deletes
  its points (the sensor opens the store for no purge: runs hold its lock);
* a book whose latest ingest runs all failed -> a new run once its back-off has passed;
* a book holding an error record written under other parse rules (an upgrade changed them:
  :attr:`~rag_pipeline.recipes.choice.RecipeSource.parse_version`), or a file parsed under
  other read settings (``ParseOptions.key``: path patterns, default tier, file limits) -> a
  run, decided once per parse-rules version and read settings from each book's saved summary
  (the cursor records what its books were checked against, and the books the store was too
  busy to show);
* a book whose searched index was built with another recipe than the configured one (a
  settings change: model, precision, dimension, chunk budget) -> a run, decided once per
  configured recipe (:func:`configured_recipe_key`, read from the settings without loading
  a model) from each book's recorded recipe
  (:func:`~rag_pipeline.ingest.plan.books_of_other_recipes`), as for the parse rules;
* a changed or removed book in a batch run in flight -> nothing until that run ends (no tag
  limit of the run queue covers a range of partitions, and two runs of one book never run at
  once); a changed book with a run of its own in flight -> a run of it alone, which the run
  queue's per-book limits hold until the other ends.

A tick asks the instance a constant number of questions, whatever the number of books: the
known partitions, the ingest runs finished since the previous tick, and, only when a book is
due for a retry or a removed book's partition waits, the runs in flight. It opens the store
only for the parse-rules and recipe checks, once after the parse rules or the configured recipe
changed (a run holding the store makes it wait for a later tick).

The purge policy is the one ``rag-pipeline plan`` and ``ingest`` apply
(:func:`rag_pipeline.ingest.plan.decide_purges`): a missing data folder, or one holding none
of the known books (empty, unmounted, the wrong folder), purges nothing and starts nothing
until an operator acts (far more often a mistake than a decision to replace every book), and a
book folder that exists but cannot be used keeps its points.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dagster import (
    AddDynamicPartitionsRequest,
    DagsterEventType,
    DagsterInstance,
    DagsterRunStatus,
    DefaultSensorStatus,
    DeleteDynamicPartitionsRequest,
    ResourceParam,
    RunRecord,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from rag_pipeline.config import DEFAULT_SENSOR_INTERVAL_S, BatchConfig
from rag_pipeline.defs.jobs import ingest_books_job, purge_book_job, purge_run_config
from rag_pipeline.defs.partitions import BOOKS_PARTITIONS_NAME
from rag_pipeline.defs.runs import (
    MAX_RETRIES_TAG,
    PARTITION_TAG,
    RANGE_START_TAG,
    TRIGGER_TAG,
    BooksInFlight,
    batch_tags,
    books_in_flight,
    books_of_run,
    one_book_tags,
)
from rag_pipeline.embed.base import EmbedError
from rag_pipeline.ingest.batches import batch_books, split_after
from rag_pipeline.ingest.live import LiveMark
from rag_pipeline.ingest.pipeline import IngestPipeline
from rag_pipeline.ingest.plan import (
    RulesCheck,
    books_of_other_parse_rules,
    books_of_other_recipes,
    decide_purges,
)
from rag_pipeline.models import book_id_problem, is_book_id
from rag_pipeline.recipes.choice import FixedRecipe, RecipeSource
from rag_pipeline.recipes.lazy import LazyRecipe
from rag_pipeline.sources.base import BookSource, SourceUnavailableError
from rag_pipeline.sources.scan import PURGING, BookScanState, scan_books
from rag_pipeline.store import VectorStore
from rag_pipeline.store.errors import StoreError
from rag_pipeline.store.lock import holding_for

__all__ = [
    "FailedBooks",
    "build_books_sensor",
    "configured_recipe_key",
    "live_mark",
    "read_cursor",
    "read_failed_books",
    "read_live_generation",
    "read_parse_check",
    "read_recipe_check",
    "write_cursor",
]

#: after a book's runs failed (retries included), the sensor tries again after this long,
#: doubling per consecutive failure: an outage heals without anyone touching the book
RETRY_AFTER_S = 300.0
RETRY_AFTER_MAX_S = 6 * 3600.0
#: consecutive failures counted at most (the back-off is at its maximum long before)
MAX_FAILURES = 32
#: finished ingest runs one tick reads at most: a long history is caught up over several ticks
RUNS_PER_TICK = 500
#: each tick reads again the runs that finished this long before the newest one it saw: a run
#: whose end was committed late, with an earlier timestamp, is not missed (a run read twice
#: changes nothing)
RUNS_OVERLAP_S = 60.0
#: how long the parse-rules check waits for a store a run holds (else: the next tick)
PARSE_CHECK_STORE_WAIT_S = 1.0
_FINISHED = [DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED]


class FailedBooks:
    """Books whose latest finished ingest run failed, followed from one run query per tick.

    ``books`` maps a book to ``[storage id of its latest failed run, consecutive failures,
    end time]`` (0 failures: its batch failed for one of its books, so it is retried alone at
    once); ``since`` is where the next tick's query starts (a run update timestamp).
    The state lives in the sensor's cursor, so a tick reads only the runs that finished since
    the previous one instead of every book's run history.
    """

    __slots__ = ("books", "finished", "since")

    def __init__(self, books: Mapping[str, list[float]] | None = None, since: float = 0.0):
        self.books = {b: list(v) for b, v in (books or {}).items()}
        self.since = since
        #: the books of the runs :meth:`follow` read (not kept in the cursor)
        self.finished: set[str] = set()

    def to_json(self) -> dict[str, Any]:
        return {"failed": dict(sorted(self.books.items())), "since": self.since}

    def follow(self, instance: DagsterInstance, order: Sequence[str]) -> bool:
        """Apply the ingest runs that finished since the previous tick (one query; a failed
        batch costs one more, for its error). False while a long history is still being
        caught up (its latest runs are not read yet). ``order``: the partition keys, which
        resolve a batch's range to its books."""
        records = instance.get_run_records(
            RunsFilter(
                job_name=ingest_books_job.name,
                statuses=_FINISHED,
                updated_after=datetime.fromtimestamp(self.since, UTC) if self.since else None,
            ),
            limit=RUNS_PER_TICK,
            order_by="update_timestamp",
            ascending=True,
        )
        # in the order the runs were created (the latest run of a book is the one created
        # last), whatever order their ends were stamped in
        for record in sorted(records, key=lambda r: r.storage_id):
            self._apply(instance, record, order)
        if not records:
            return True
        stamps = [r.update_timestamp.timestamp() for r in records]
        if len(records) == RUNS_PER_TICK:  # more to read: the next tick goes on from here,
            # reading again the runs stamped like the last one (the page may end among them)
            earlier = [t for t in stamps if t < stamps[-1]]
            self.since = max(self.since, earlier[-1] if earlier else stamps[-1])
            return False
        self.since = max(self.since, stamps[-1] - RUNS_OVERLAP_S)
        return True

    def _apply(self, instance: DagsterInstance, record: RunRecord, order: Sequence[str]) -> None:
        run = record.dagster_run
        if PARTITION_TAG not in run.tags and RANGE_START_TAG not in run.tags:
            return  # not a run of book partitions
        books = books_of_run(run.tags, order)
        self.finished.update(books)
        failed = run.status == DagsterRunStatus.FAILURE
        # a batch that failed for one of its books: its books are run one by one at once
        split = failed and len(books) > 1 and split_after(_failure_classes(instance, run.run_id))
        for book_id in books:
            entry = self.books.get(book_id)
            if entry is not None and entry[0] >= record.storage_id:
                continue  # this run, or one created before the failure already counted
            if not failed:  # succeeded, or canceled by a person: not retried
                self.books.pop(book_id, None)
                continue
            ended = float(record.end_time or record.update_timestamp.timestamp())
            failures = 0 if split else min(int(entry[1]) + 1 if entry else 1, MAX_FAILURES)
            self.books[book_id] = [record.storage_id, failures, ended]

    def due(self, now: float) -> set[str]:
        """Books whose back-off since their latest failure has passed (at once for the books
        of a batch that failed for one of them: 0 failures of their own yet)."""
        return {
            book_id
            for book_id, (_, failures, ended) in self.books.items()
            if failures == 0
            or now - ended >= min(RETRY_AFTER_S * 2.0 ** (failures - 1), RETRY_AFTER_MAX_S)
        }

    def keep_only(self, book_ids: set[str]) -> None:
        self.books = {b: v for b, v in self.books.items() if b in book_ids}


def _failure_classes(instance: DagsterInstance, run_id: str) -> list[str]:
    """The class names of the errors of the run's failed steps and their causes (none for a
    run that failed without a step failing, e.g. a worker that died)."""
    classes = []
    for entry in instance.all_logs(run_id, of_type=DagsterEventType.STEP_FAILURE):
        data = entry.dagster_event.step_failure_data if entry.dagster_event else None
        error = data.error if data is not None else None
        while error is not None:
            if error.cls_name:
                classes.append(error.cls_name)
            error = error.cause
    return classes


#: the trigger tag of the runs the sensor requests (deploy/dagster.postgres.yaml limits them),
#: and of its retries of failed books
SENSOR_TRIGGER = "books_sensor"
SENSOR_RETRY_TRIGGER = "books_sensor_retry"


def read_cursor(cursor: str | None) -> tuple[dict[str, list[str]], int]:
    """(per-book ``[stat digest, content digest]``, request counter) from a cursor; a cursor
    that cannot be read starts afresh (every book is looked at once more)."""
    data = _cursor_data(cursor)
    if "books" in data and "seq" in data:
        try:
            return dict(data["books"]), int(data["seq"])
        except (ValueError, TypeError):
            return {}, 0
    return data, 0  # the first cursor format: the per-book map alone


def read_failed_books(cursor: str | None) -> FailedBooks:
    """The failed books a cursor follows; an older or unreadable cursor follows them afresh
    (the first tick reads the run history from its start, ``RUNS_PER_TICK`` runs a tick)."""
    runs = _cursor_data(cursor).get("runs") or {}
    try:
        return FailedBooks(dict(runs["failed"]), float(runs["since"]))
    except (KeyError, ValueError, TypeError):
        return FailedBooks()


def _cursor_data(cursor: str | None) -> dict[str, Any]:
    if not cursor:
        return {}
    try:
        data = json.loads(cursor)
    except (ValueError, TypeError):
        return {}
    return data if isinstance(data, dict) else {}


def write_cursor(
    books: Mapping[str, list[str]],
    seq: int,
    failed: FailedBooks | None = None,
    *,
    live: str | None = None,
    parse: tuple[str, Sequence[str]] | None = None,
    recipe: tuple[str, Sequence[str]] | None = None,
) -> str:
    """``live``: the generation of the stopped live process whose state the cursor took
    over (:class:`~rag_pipeline.ingest.live.LiveMark`), so it is taken over once.
    ``parse``: the parse-rules version the books were checked against, and the books not
    checked yet (see :func:`read_parse_check`); ``recipe``: the same for the configured
    recipe (see :func:`read_recipe_check`)."""
    data: dict[str, Any] = {"books": books, "seq": seq}
    if failed is not None:
        data["runs"] = failed.to_json()
    if live:
        data["live"] = live
    if parse is not None:
        data["parse"] = {"version": parse[0], "unchecked": sorted(parse[1])}
    if recipe is not None:
        data["recipe"] = {"key": recipe[0], "unchecked": sorted(recipe[1])}
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def read_live_generation(cursor: str | None) -> str | None:
    """The generation of the live process whose state the cursor took over, if any."""
    live = _cursor_data(cursor).get("live")
    return live if isinstance(live, str) else None


def read_parse_check(cursor: str | None) -> tuple[str | None, set[str]]:
    """The parse-rules version a cursor's books were checked against (None: never, an older
    cursor: every book is checked once) and the books still to check against it."""
    return _read_check(cursor, "parse", "version")


def read_recipe_check(cursor: str | None) -> tuple[str | None, set[str]]:
    """The configured recipe (:func:`configured_recipe_key`) a cursor's books were checked
    against (None: never, an older cursor: every book is checked once) and the books still
    to check against it."""
    return _read_check(cursor, "recipe", "key")


def _read_check(cursor: str | None, entry: str, field: str) -> tuple[str | None, set[str]]:
    check = _cursor_data(cursor).get(entry)
    if not isinstance(check, dict) or not isinstance(check.get(field), str):
        return None, set()
    unchecked = check.get("unchecked")
    books = {b for b in unchecked if isinstance(b, str)} if isinstance(unchecked, list) else set()
    return check[field], books


def configured_recipe_key(recipes: RecipeSource) -> str:
    """What identifies the configured recipe, known without loading a model: the signature
    of a recipe handed to the process, else a digest of the settings a recipe is built from
    (embedder, model, precision, dimension, chunk budget; whether an API key is set, so that
    setting one checks again the books a missing key left; never the key itself). A model
    folder whose files are replaced under the same path is not seen (its runs see it)."""
    fixed = recipes.recipe if isinstance(recipes, FixedRecipe) else None
    if isinstance(recipes, LazyRecipe):
        fixed = recipes.fixed
        if fixed is None:
            e, c = recipes.embedding, recipes.chunking
            settings = (
                e.provider,
                str(e.local_model_dir),
                e.openai_model,
                e.openai_api_key is not None,
                e.local_precision,
                e.hash_dimension,
                c.target_tokens,
                c.max_tokens,
                c.min_tokens,
                c.overlap,
                c.max_blocks,
            )
            return "settings:" + hashlib.sha256(repr(settings).encode()).hexdigest()[:16]
    if fixed is not None:
        return fixed.signature
    return f"source:{type(recipes).__qualname__}"  # another source: checked once


def _check_parse_rules(
    context: SensorEvaluationContext, pipeline: IngestPipeline, book_ids: Sequence[str]
) -> RulesCheck:
    """Which of ``book_ids`` hold an error record of other parse rules, or a file parsed
    under other read settings."""
    version, options = pipeline.recipes.parse_version, pipeline.parsing.key
    return _check_books(
        context,
        pipeline,
        book_ids,
        "parse rules",
        lambda store: books_of_other_parse_rules(store, book_ids, version, options),
    )


def _rules_key(pipeline: IngestPipeline) -> str:
    """What a book's records are checked against once (kept in the cursor): the parse rules,
    and the read settings when they are not the defaults."""
    options = pipeline.parsing.key
    return pipeline.recipes.parse_version + (f" | {options}" if options else "")


def _check_recipes(
    context: SensorEvaluationContext,
    pipeline: IngestPipeline,
    book_ids: Sequence[str],
    building: Sequence[str],
) -> RulesCheck:
    """Which of ``book_ids`` are searched with another recipe than they are built with now
    (a recipe that cannot be built: none, with a warning, as their runs would fail)."""
    try:
        return _check_books(
            context,
            pipeline,
            book_ids,
            "recipes",
            lambda store: books_of_other_recipes(store, book_ids, pipeline.recipes, set(building)),
        )
    except EmbedError as exc:
        context.log.warning(f"recipe check of {len(book_ids)} books skipped: {exc}")
        return RulesCheck()


def _check_books(
    context: SensorEvaluationContext,
    pipeline: IngestPipeline,
    book_ids: Sequence[str],
    what: str,
    check: Callable[[VectorStore], RulesCheck],
) -> RulesCheck:
    """``check`` of ``book_ids`` (their ``what``) on the store, opened for it; the store
    busy: every one left for a later tick."""
    if not book_ids:
        return RulesCheck()
    try:
        with (
            holding_for(f"books_sensor, checking the books' {what}"),
            pipeline.store.open(busy_wait_s=PARSE_CHECK_STORE_WAIT_S) as store,
        ):
            return check(store)
    except StoreError as exc:
        context.log.info(f"{what} check of {len(book_ids)} books waits: {exc}")
        return RulesCheck(busy=tuple(book_ids))


def live_mark(instance: DagsterInstance, source: BookSource) -> LiveMark:
    """The live-mode lock and state of the instance's home, for ``source``'s books."""
    return LiveMark(Path(instance.root_directory), source)


def build_books_sensor(
    *,
    interval_s: int = DEFAULT_SENSOR_INTERVAL_S,
    name: str = "books_sensor",
    batching: BatchConfig | None = None,
    watch: bool = True,
) -> Any:
    """The sensor for the books of the ``pipeline`` resource's source (on by default under
    the daemon); books that change in the same tick share runs as ``batching`` allows.
    ``watch``: stat only the books the source's notifications name (and each book at least
    every minute: see :mod:`rag_pipeline.sources.watch`); else every book at every tick."""
    batching = batching or BatchConfig()

    @sensor(
        name=name,
        jobs=[ingest_books_job, purge_book_job],
        minimum_interval_seconds=interval_s,
        default_status=DefaultSensorStatus.RUNNING,
        description="Watches the book source (RAG_DATA_DIR) for new, changed and removed books; "
        "starts only the runs needed (run keys are content digests, so an unchanged book never "
        "runs twice); books that change together share a run.",
    )
    def books_sensor(
        context: SensorEvaluationContext, pipeline: ResourceParam[IngestPipeline]
    ) -> SensorResult | SkipReason:
        started = time.perf_counter()
        source = pipeline.source
        # (an ephemeral instance has no home that a live process could share)
        live = None if context.instance.is_ephemeral else live_mark(context.instance, source)
        holder = live.holder() if live is not None else None
        if live is not None and holder is not None:  # one process starts a change's runs
            return SkipReason(
                f"live mode applies every change ({live.describe(holder)}): "
                "this sensor resumes when it stops"
            )
        previous, seq = read_cursor(context.cursor)
        left = live.left() if live is not None else None
        taken_over = None
        if left is not None and left.generation != read_live_generation(context.cursor):
            # a live process stopped: what it applied is this tick's "before" (its books
            # being applied never match, so they run), the sensor's own purges kept
            previous = {**{b: v for b, v in previous.items() if v == PURGING}, **left.books}
            taken_over = left.generation
        try:
            states, rejected = scan_books(source, previous, source.watcher() if watch else None)
        except SourceUnavailableError as exc:
            return SkipReason(str(exc))
        for refused in rejected:
            context.log.warning(f"refused book folder: {refused}")
        partitions = list(context.instance.get_dynamic_partitions(BOOKS_PARTITIONS_NAME))
        # a partition that is no book id (added by hand in the UI) holds no points (the store
        # refuses such an id): deleted at once, never purged by a run that could only fail
        invalid = [p for p in partitions if not is_book_id(p)]
        partitions = [p for p in partitions if p not in set(invalid)]
        known = set(partitions)
        new_books = sorted(b for b in states if b not in known)
        order = partitions + new_books  # the partition order once this tick's are added
        decision = decide_purges(source, set(states), known | set(previous))
        for warning in decision.warnings:
            context.log.warning(warning)
        if decision.halt:  # empty, or none of the known books: a wrong folder or mount
            return SkipReason(decision.warnings[0])
        for key in invalid:  # said where the deletion is returned (a halted tick deletes none)
            context.log.warning(f"deleted partition {key!r}: {book_id_problem(key)}")
        removed = list(decision.purge)
        # Run history costs a constant number of queries per tick, whatever the number of
        # books: the runs finished since the last tick, and (only when needed) those in flight.
        failed = read_failed_books(context.cursor)
        caught_up = failed.follow(context.instance, partitions)
        failed.keep_only(set(states))
        in_flight: BooksInFlight | None = None

        def runs_in_flight() -> BooksInFlight:
            nonlocal in_flight
            if in_flight is None:
                in_flight = books_in_flight(context.instance, partitions)
            return in_flight

        # (no retry from a history read only in part: a later run may have succeeded)
        due = failed.due(time.time()) if caught_up else set()
        changed: dict[str, int] = {}  # book -> files its run reads (about)
        retried: list[str] = []
        for book_id, state in sorted(states.items()):
            before = previous.get(book_id)
            if book_id in new_books or before is None:
                changed[book_id] = state.files
            # or written (its stat moved) while a run of it was in flight, its content digest
            # as before: that run may have read a version in between (saved as it started,
            # reverted after it read), which no digest shows. What is recorded as indexed
            # must be what a run read, so the book runs again (unchanged files embed nothing)
            elif before[1] != state.content_digest or (
                before[0] != state.stat_digest
                and (book_id in failed.finished or book_id in runs_in_flight().books)
            ):
                changed[book_id] = max(state.hashed, 1)
            # a book with a run queued or running is not retried: that run may succeed
            elif book_id in due and book_id not in runs_in_flight().books:
                retried.append(book_id)
        # After the parse rules changed (an upgrade), a book whose error records were written
        # under other rules runs once, as a plan says it must, and so does a book parsed under
        # other read settings: checked once per version, not per tick (the books that run
        # anyway are not checked)
        rules_key = _rules_key(pipeline)
        checked, unchecked = read_parse_check(context.cursor)
        rules = _check_parse_rules(
            context,
            pipeline,
            [
                b
                for b in sorted(states)
                if b not in changed
                and b not in retried
                and (checked != rules_key or b in unchecked)
            ],
        )
        for book_id in rules.stale:
            changed[book_id] = max(states[book_id].files, 1)
        # After the configured recipe changed (a settings change and a restart), a book whose
        # searched index is of another recipe runs once (built beside, switched): checked
        # once per configured recipe, not per tick (the books that run anyway are not checked)
        recipe_key = configured_recipe_key(pipeline.recipes)
        recipe_checked, recipe_unchecked = read_recipe_check(context.cursor)
        to_check = [
            b
            for b in sorted(states)
            if b not in changed
            and b not in retried
            and (recipe_checked != recipe_key or b in recipe_unchecked)
        ]
        recipes = _check_recipes(
            context, pipeline, to_check, sorted(runs_in_flight().books) if to_check else []
        )
        for book_id in recipes.stale:
            changed[book_id] = max(states[book_id].files, 1)
        # Runs of different books run side by side; two runs of one book never do. The run
        # queue's per-book tag limits hold a run of one book behind another run of it, but no
        # tag limit covers a batch (a range of partitions): a book in a batch in flight is not
        # requested until that run ends (its cursor entry is kept, so the next tick after it
        # sees the change), and a book with a run of its own in flight is requested alone.
        touched = [*changed, *removed]
        held = {b for b in touched if b in runs_in_flight().in_batches} if touched else set()
        alone = [b for b in changed if b not in held and b in runs_in_flight().books]
        together = {b: n for b, n in changed.items() if b not in held and b not in alone}
        batches = batch_books(list(together), order, batching, together)
        run_requests: list[RunRequest] = []
        for batch in [*batches, *([b] for b in alone)]:
            seq += 1
            run_requests.append(_ingest_request(batch, states, seq, SENSOR_TRIGGER))
        for book_id in retried:  # alone: a retry narrows a failure down to its book
            seq += 1
            run_requests.append(_ingest_request([book_id], states, seq, SENSOR_RETRY_TRIGGER))
        for book_id in removed:
            if previous.get(book_id) == PURGING or book_id in held:
                continue  # its purge was requested by an earlier tick, or waits for a batch
            seq += 1
            run_requests.append(
                RunRequest(
                    job_name=purge_book_job.name,
                    run_key=f"purge:{book_id}:{seq}",
                    run_config=purge_run_config(book_id),
                    tags={**one_book_tags(book_id), TRIGGER_TAG: SENSOR_TRIGGER},
                )
            )
        partition_requests: list[AddDynamicPartitionsRequest | DeleteDynamicPartitionsRequest] = []
        if invalid:
            partition_requests.append(
                DeleteDynamicPartitionsRequest(BOOKS_PARTITIONS_NAME, invalid)
            )
        if new_books:
            partition_requests.append(AddDynamicPartitionsRequest(BOOKS_PARTITIONS_NAME, new_books))
        # A removed book's partition goes once none of its runs is in flight: an ingest run
        # still writing it, or the purge just requested (queued runs count). Until then the
        # cursor marks it PURGING, and later ticks only retry the partition's deletion.
        purging = {
            b
            for b in removed
            if b in known
            and b not in held
            and (previous.get(b) != PURGING or b in runs_in_flight().books)
        }
        gone = [b for b in removed if b in known and b not in purging and b not in held]
        if gone:
            partition_requests.append(DeleteDynamicPartitionsRequest(BOOKS_PARTITIONS_NAME, gone))
        kept = {b: previous[b] for b in decision.kept if b in previous}
        cursor = write_cursor(
            {
                **kept,
                **{b: PURGING for b in sorted(purging)},
                **{b: [s.stat_digest, s.content_digest] for b, s in states.items()},
                # as before the tick: seen again once their batch ends
                **{b: previous[b] for b in held if b in previous},
            },
            seq,
            failed,
            live=taken_over or read_live_generation(context.cursor),
            # a book the store did not show, or one held behind a batch, is checked again
            parse=(rules_key, [*rules.busy, *(b for b in rules.stale if b in held)]),
            recipe=(recipe_key, [*recipes.busy, *(b for b in recipes.stale if b in held)]),
        )
        hashed = sum(s.hashed for s in states.values())
        context.log.info(
            f"scanned {len(states)} books ({sum(s.files for s in states.values())} files, "
            f"{hashed} hashed) in {time.perf_counter() - started:.3f}s; "
            f"{len(run_requests)} run requests"
        )
        if not run_requests and not partition_requests:
            # Nothing to start: a skip, whatever the cursor took in (finished runs, a file's
            # stat settling after a racy look): the daemon keeps an updated cursor.
            if cursor != context.cursor:
                context.update_cursor(cursor)
            return SkipReason(f"no change in {len(states)} books")
        return SensorResult(
            run_requests=run_requests, dynamic_partitions_requests=partition_requests, cursor=cursor
        )

    return books_sensor


def _ingest_request(
    books: list[str], states: Mapping[str, BookScanState], seq: int, trigger: str
) -> RunRequest:
    """The run of one book, keyed by its content digest, or of a batch of adjacent books
    (keyed by theirs; never retried by the daemon: the next tick runs its books one by one
    if it fails for one of them)."""
    if len(books) == 1:
        book_id = books[0]
        return RunRequest(
            job_name=ingest_books_job.name,
            partition_key=book_id,
            run_key=f"ingest:{book_id}:{states[book_id].content_digest}:{seq}",
            tags={**one_book_tags(book_id), TRIGGER_TAG: trigger},
        )
    digest = hashlib.sha256("".join(states[b].content_digest for b in books).encode())
    return RunRequest(
        job_name=ingest_books_job.name,
        run_key=f"ingest:{books[0]}..{books[-1]}:{digest.hexdigest()[:32]}:{seq}",
        tags={**batch_tags(books), TRIGGER_TAG: trigger, MAX_RETRIES_TAG: "0"},
    )

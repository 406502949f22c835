"""Live mode's Dagster side: each change :class:`~rag_pipeline.ingest.live.LiveLoop` finds
becomes runs of the ingest (or purge) job, executed in this long-lived process on the instance
in ``DAGSTER_HOME``: the UI lists them beside the sensor's, with their metadata, checks and
the run id on every point they write. What makes it fast is what the process keeps from one
change to the next: Dagster imported and its definitions built, the model loaded, the
instance open. A change is planned (:meth:`IngestPipeline.plan`) and executed
(:func:`~rag_pipeline.defs.runner.execute_plan`) as ``rag-pipeline ingest`` does, with one
difference: each run is recorded, then its points written under its id, then its events
(``work_first``): an edit is searchable as soon as it is embedded.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dagster import DagsterInstance

from rag_pipeline.config import BatchConfig
from rag_pipeline.defs._dagster_private import without_output_capture
from rag_pipeline.defs.instance import open_home_instance
from rag_pipeline.defs.runner import execute_plan
from rag_pipeline.ingest.handoff import HEARTBEAT_S, HandOffServer
from rag_pipeline.ingest.live import LiveLoop, LiveMark, LiveTiming
from rag_pipeline.ingest.pipeline import IngestPipeline
from rag_pipeline.ingest.report import BookResult, IngestReport
from rag_pipeline.models import validate_book_id
from rag_pipeline.store.lock import holding_for

__all__ = ["LIVE_LAUNCHER", "LIVE_TRIGGER", "Applied", "LiveRuns", "handed_report", "run_live"]

log = logging.getLogger(__name__)

#: the trigger tag of live mode's runs
LIVE_TRIGGER = "live"
#: who launched them (the UI's "Launched by", with the file that changed)
LIVE_LAUNCHER = "live mode"


@dataclass
class LiveRuns:
    """``apply`` of the live loop: plan the books, run what the plan says, report."""

    pipeline: IngestPipeline
    instance: DagsterInstance
    home: Path
    batching: BatchConfig
    notify: Callable[[str], None]
    on_report: Callable[[IngestReport], None]
    #: set when the process is asked to stop: no run starts after the one in hand
    stop: threading.Event = field(default_factory=threading.Event)
    #: the live loop's workers call this at once for different books: their reports are
    #: handed on one at a time (one JSON line, one block of lines each)
    _reporting: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, books: list[str]) -> dict[str, bool]:
        # the store locks its plan takes name its books (a worker beside it that waits for
        # one says "another run in this process (live mode, book 'x')")
        said = ", ".join(repr(b) for b in books)
        with holding_for(f"live mode, book{'s' if len(books) > 1 else ''} {said}"):
            return self._apply(books)

    def _apply(self, books: list[str]) -> dict[str, bool]:
        try:
            with self.pipeline.store.open() as store:
                plan = self.pipeline.plan(store, books)
            report = execute_plan(
                plan,
                self.pipeline,
                self.instance,
                dagster_home=self.home,
                trigger=LIVE_TRIGGER,
                launcher=LIVE_LAUNCHER,
                notify=self.notify,
                batching=self.batching,
                stopping=self.stop.is_set,
                work_first=True,
            )
        except Exception as exc:  # a store busy past its wait, a damaged instance: retried
            log.debug("live mode could not apply %s", books, exc_info=True)
            message = f"{type(exc).__name__}: {exc}"
            report = IngestReport(
                {b: BookResult(b, "failed", error_messages=[message]) for b in books}
            )
        with self._reporting:
            self.on_report(report)
        return Applied(
            {b: r.status not in ("failed", "deferred") for b, r in report.books.items()}, report
        )


class Applied(dict[str, bool]):
    """What :class:`LiveRuns` says of each book, with the report it came from (handed to a
    ``rag-pipeline ingest`` that asked for the books)."""

    def __init__(self, done: dict[str, bool], report: IngestReport) -> None:
        super().__init__(done)
        self.report = report


def handed_report(
    loop: LiveLoop, books: list[str] | None, beat: Callable[[list[str]], None]
) -> IngestReport | None:
    """Apply ``books`` (None: every book) now for a ``rag-pipeline ingest`` that handed them
    over, and return their report as an ingest of them would (None: not all applied, the
    process is stopping, or a book name is invalid: the CLI then runs them itself)."""
    try:
        for book_id in books or ():
            validate_book_id(book_id)
    except ValueError:
        return None  # the CLI says what is wrong with it, as ever
    ticket = loop.request(books)
    while not ticket.done.wait(HEARTBEAT_S):
        beat(ticket.waiting)
    if ticket.refused:
        return None
    reports = [o.report for o in ticket.outcomes if isinstance(o, Applied)]
    results: dict[str, BookResult] = {}
    for report in reports:  # in the order the calls ended: a later result is newer
        results.update(report.books)
    if any(b not in results or results[b].status == "deferred" for b in ticket.resolved):
        return None
    warnings = list(dict.fromkeys(w for r in reports for w in r.warnings))
    # the folders refused as books, as the plans of the calls saw them (the look's, when no
    # call was needed: a data folder without a book)
    rejected = sorted({f for r in reports for f in r.rejected} if reports else ticket.rejected)
    return IngestReport(
        {b: results[b] for b in ticket.resolved},
        rejected,
        warnings,
        sum(r.seconds for r in reports),
    )


def _indexed_books(pipeline: IngestPipeline) -> list[str]:
    """The books the index holds now (what ``ingest`` compares the folder with)."""
    with pipeline.store.open() as store:
        return store.tenants()


def python_log_handlers_once(instance: DagsterInstance) -> None:
    """Build the instance's Python log handlers (``python_logs`` of dagster.yaml) once, not
    at every run. Dagster builds them with ``logging.config.dictConfig`` whenever it starts a
    run's execution, which closes every handler of the process and takes each one's lock
    while it holds logging's own: two runs executing at once in threads of this process
    deadlocked there (one run starting, the other logging an event through its handler,
    which takes logging's lock to get a logger)."""
    handlers = list(instance.get_yaml_python_handlers())
    setattr(instance, "get_yaml_python_handlers", lambda: handlers)  # noqa: B010 (a method)


def run_live(
    pipeline: IngestPipeline,
    *,
    home: Path,
    stop: threading.Event,
    batching: BatchConfig | None = None,
    timing: LiveTiming | None = None,
    notify: Callable[[str], None] = log.warning,
    on_report: Callable[[IngestReport], None] = lambda report: None,
    on_ready: Callable[[LiveLoop], None] = lambda loop: None,
    workers: int = 2,
    handoff_key: str | None = None,
) -> None:
    """Apply the pipeline's source's changes until ``stop`` is set: hold the live lock of
    ``home`` (:class:`~rag_pipeline.ingest.live.LiveBusyError` if another live process holds
    it), load the model, catch up with every book, then follow the notifications. Up to
    ``workers`` changes of different books are applied at once, each by runs executed in a
    thread of this process on the one instance, pipeline and model (the store's book locks,
    shared handle and Dagster's pools are what two runs in one process share; the ONNX
    session runs calls of two threads at once). With ``handoff_key`` (the settings' key,
    :func:`~rag_pipeline.ingest.handoff.settings_key`), a ``rag-pipeline ingest`` of the same
    settings hands its books to this process (:mod:`rag_pipeline.ingest.handoff`)."""
    mark = LiveMark(home, pipeline.source)
    with mark.hold(), open_home_instance() as instance:
        python_log_handlers_once(instance)
        if workers > 1:  # runs at once: none may redirect the process's output
            without_output_capture(instance)
        pipeline.warm_up()
        runs = LiveRuns(
            pipeline, instance, home, batching or BatchConfig(), notify, on_report, stop
        )
        loop = LiveLoop(
            pipeline.source,
            runs,
            timing=timing or LiveTiming(),
            save=mark.save,
            notify=notify,
            workers=workers,
            indexed=lambda: _indexed_books(pipeline),
        )
        server = None
        if handoff_key is not None:
            server = HandOffServer(
                home,
                handoff_key,
                lambda books, beat: handed_report(loop, books, beat),
                work_cpu_s=loop.work_cpu_s,
            )
            try:
                server.start()
            except OSError as exc:  # the CLI then runs its changes itself, as without
                notify(f"`rag-pipeline ingest` cannot hand its changes over: {exc}")
                server = None
        try:
            loop.run(stop, on_ready=lambda: on_ready(loop))
        finally:
            if server is not None:
                server.close()

"""``rag-pipeline watch``: live mode, a saved change searchable in about a second, each change
still a recorded Dagster run (:mod:`rag_pipeline.defs.live`)."""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING

import click

from rag_pipeline.cli.app import _settings, book_pipeline, err, main, shown
from rag_pipeline.json_text import json_text

if TYPE_CHECKING:
    from pathlib import Path

    from rag_pipeline.config import Settings
    from rag_pipeline.ingest.handoff import Handed
    from rag_pipeline.ingest.live import LiveLoop
    from rag_pipeline.ingest.report import IngestReport


@main.command()
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="print one JSON object a line: {'event': 'ready', ...} once every book is caught up, "
    "then {'event': 'applied', 'report': <ingest --json>} for each change applied",
)
def watch(as_json: bool) -> None:
    """Live mode: apply every change of the books as soon as it is saved, until stopped.

    A long-lived process keeps Dagster, the model and the instance loaded, follows the data
    folder's notifications and runs the ingest (or purge) job in process for each change:
    each change is a Dagster run in the UI, with its metadata, checks and lineage. While it
    runs, the books sensor of the same DAGSTER_HOME defers to it; when it stops (or dies), the
    sensor takes over from what it applied. Changes of different books are applied side by
    side (RAG_LIVE_WORKERS, default 2); one book's, one after another. Ctrl-C or SIGTERM stops
    it after the changes in hand. `rag-pipeline ingest` with the same settings hands its
    books to this process and prints its report."""
    from rag_pipeline.config import ensure_dagster_home
    from rag_pipeline.defs.live import run_live
    from rag_pipeline.ingest.handoff import settings_key

    settings = _settings()
    home = ensure_dagster_home()
    pipeline = book_pipeline(settings)
    stop = threading.Event()

    def stopping(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():  # a second Ctrl-C: now
            raise KeyboardInterrupt
        stop.set()
        say("stopping after the changes in hand")

    signal.signal(signal.SIGINT, stopping)
    signal.signal(signal.SIGTERM, stopping)

    def emit(event: dict[str, object]) -> None:
        click.echo(json_text(event))
        sys.stdout.flush()

    def say(message: str, tag: str = "") -> None:
        # the message names files (data): printed as written; ``tag`` is this module's style
        say_markup(f"{tag}{shown(message)}")

    def say_markup(line: str) -> None:
        """``line`` whose data is escaped already (:func:`report_lines`)."""
        err.print(f"{time.strftime('%H:%M:%S')} [dim]live[/] {line}", highlight=False)

    def ready(loop: LiveLoop) -> None:
        event = ready_event(loop, settings.data_dir)
        if as_json:
            emit(event)
        say(
            f"ready: {event['books']} books in step; watching {pipeline.source.description} "
            "(the books sensor defers to this process; Ctrl-C stops)"
        )

    def applied(report: IngestReport) -> None:
        if as_json and applies_something(report):
            emit({"event": "applied", "report": report.as_dict()})
        for line in report_lines(report):
            say_markup(line)

    def live() -> None:
        run_live(
            pipeline,
            home=home,
            stop=stop,
            batching=settings.batching(),
            timing=settings.live_timing(),
            notify=lambda message: say(message, "[yellow]note[/] "),
            on_report=applied,
            on_ready=ready,
            workers=settings.live_workers,
            handoff_key=settings_key(settings),
        )

    say(f"starting: {pipeline.description}")
    in_worker_thread(live)
    say("stopped")


@main.command(name="init-instance", hidden=True)
def init_instance() -> None:
    """Create the Dagster instance in DAGSTER_HOME once (its databases created and stamped):
    what `make ui` runs before it starts `dg dev` and live mode, which would otherwise both
    create them at the same moment. A damaged instance exits 1 naming the file."""
    from rag_pipeline.config import ensure_dagster_home
    from rag_pipeline.defs.instance import prepare_home_instance

    ensure_dagster_home()
    prepare_home_instance()


def hand_to_live(
    settings: Settings, home: Path, books: list[str] | None, notes: list[str] | None = None
) -> Handed | None:
    """The report of the live process of ``home`` after it applied ``books`` (None: every
    book) for this ingest; None where none runs for these settings or it did not answer:
    the ingest then runs them itself. A live process that accepted and then hung or fell
    silent is said on stderr and added to ``notes`` (the report's warnings). Imports no
    Dagster."""
    from rag_pipeline.ingest.handoff import ask_live, settings_key

    def notify(message: str) -> None:
        err.print(f"[yellow]note[/] {shown(message)}", highlight=False)
        if notes is not None:
            notes.append(message)

    return ask_live(home, books, settings_key(settings), notify=notify)


def ready_event(loop: LiveLoop, data_dir: Path) -> dict[str, object]:
    """``watch --json``'s ready line: ``books`` counts the data folder's books in step with
    the index, not the books the index holds (a halt keeps those whose folder is gone)."""
    return {"event": "ready", "books": len(loop.in_step), "data_dir": str(data_dir)}


def applies_something(report: IngestReport) -> bool:
    """Whether ``report`` is news for ``watch --json``: a book ran, was purged, failed or was
    deferred, or a warning. A look that found its books unchanged (the first look at books
    already in step, a handed-over ingest's) applied nothing: no event, as no line."""
    return bool(report.warnings) or any(r.status != "unchanged" for r in report.books.values())


def in_worker_thread(work: Callable[[], None]) -> None:
    """Run ``work`` in a thread while this (the main) thread keeps the signal handlers; its
    exception is raised here.

    Dagster's in-process execution, run from the main thread, takes SIGINT and SIGTERM for
    the run it executes: the run fails as interrupted and the handler that would stop the
    live process after the change in hand never hears of it, so the process runs on. From
    any other thread Dagster leaves the signals alone. A second Ctrl-C raises
    KeyboardInterrupt here and the process exits at once (the thread is a daemon; the
    kernel releases its locks, as after a kill)."""
    failure: list[BaseException] = []

    def target() -> None:
        try:
            work()
        except BaseException as exc:  # handed to the main thread, which reports it
            failure.append(exc)

    worker = threading.Thread(target=target, name="live", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(timeout=0.25)  # a signal's handler runs in this thread, between waits
    if failure:
        raise failure[0]


def report_lines(report: IngestReport) -> list[str]:
    """One line per book that ran or failed (unchanged books are not news), then the
    report's notes: Rich markup, the report's data (messages naming files) escaped."""
    lines = []
    deferred = [b for b, r in report.books.items() if r.status == "deferred"]
    for book_id, r in report.books.items():
        if r.status in ("unchanged", "deferred"):
            continue
        run = f", run {r.run_id}" if r.run_id else ""
        if r.status == "failed":
            why = shown("; ".join(r.error_messages) or "failed")
            lines.append(f"[red]{book_id} failed[/]: {why}{run}")
            continue
        counts = f"{r.embedded} embedded, {r.reused} reused, {r.deleted} deleted"
        errors = f", [yellow]{r.errors} file errors[/]" if r.errors else ""
        lines.append(f"{book_id} {r.status}: {counts}{errors} in {r.seconds:.1f}s{run}")
        lines += [f"[yellow]{book_id}[/]: {shown(m)}" for m in r.error_messages]
    if deferred:
        lines.append(
            f"{len(deferred)} books not applied (stopping): the next start, or the books "
            "sensor, applies them"
        )
    lines += [f"[yellow]note[/] {shown(w)}" for w in report.warnings]
    return lines

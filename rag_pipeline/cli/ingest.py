"""``rag-pipeline ingest``, ``plan`` and ``books``: what runs, decided by the pipeline's plan,
executed through Dagster."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.table import Table

from rag_pipeline.cli.app import (
    _settings,
    book_pipeline,
    book_recipes,
    emit_json,
    err,
    fail,
    main,
    opened_store,
    out,
    shown,
)
from rag_pipeline.cli.live import hand_to_live
from rag_pipeline.config import Settings
from rag_pipeline.phases import Phases

if TYPE_CHECKING:
    from rag_pipeline.ingest.pipeline import IngestPipeline
    from rag_pipeline.ingest.plan import IngestPlan
    from rag_pipeline.ingest.report import IngestReport


@main.command()
@click.option("--book", "books", multiple=True, help="book id (folder name); repeatable")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@click.option(
    "--force",
    is_flag=True,
    help="rebuild the books whatever the index says: every file is "
    "read again and every chunk embedded again",
)
@click.option(
    "--rebuild",
    is_flag=True,
    help="set the whole collection aside (an embedded folder is renamed, a server collection "
    "deleted) and ingest every book into a new one: for a damaged store",
)
def ingest(books: tuple[str, ...], as_json: bool, force: bool, rebuild: bool) -> None:
    """Materialize the ingestion assets through Dagster for every book (or the named ones)."""
    from rag_pipeline.config import ensure_dagster_home

    phases = Phases()
    phases.mark("imports")  # the CLI's (Python's start included)
    settings = _settings()
    home = ensure_dagster_home()
    rebuilt: IngestReport | None = None
    # where live mode runs, it applies the books (rag_pipeline/ingest/handoff.py)
    notes: list[str] = []  # a live process that took the books and hung (said, then run here)
    handed = None if force or rebuild else hand_to_live(settings, home, list(books) or None, notes)
    if handed is not None:
        report = handed.report
        phases.mark("live")  # asked, and waited for its report
    else:
        if rebuild:
            if books:
                fail("--rebuild rebuilds the whole collection; it takes no --book")
            rebuilt = _rebuild(settings, home, phases)
        if rebuilt is not None and not rebuilt.ok:
            report = rebuilt  # not swapped in: the collection in service is untouched
        else:
            # after a rebuild's swap: the books changed while it built are caught up here
            report = _ingest(settings, home, list(books) or None, force=force, phases=phases)
            if rebuilt is not None:
                report = rebuilt.followed_by(report)
    phases.mark("report")
    if as_json:  # (printed on stderr as it happened, for the table)
        report.warnings[:0] = [n for n in notes if n not in report.warnings]
        by = {} if handed is None else {"applied_by": handed.applied_by}
        emit_json({**report.as_dict(), "phases": phases.as_dict(), **by})
    else:
        _print_ingest(report)
        if handed is not None:
            err.print(f"applied by {shown(handed.applied_by)}", highlight=False)
    if not report.ok:
        sys.exit(1)


def _ingest(
    settings: Settings, home: Path, books: list[str] | None, *, force: bool, phases: Phases
) -> IngestReport:
    """Plan the books against the store, then run what the plan says in Dagster."""
    from rag_pipeline.defs.partition_marker import read_partitions_marker

    pipeline = book_pipeline(settings)
    with pipeline.store.open() as store:  # released before any run: runs open it per step
        plan = pipeline.plan(store, books, force=force)
    phases.mark("plan")
    known = read_partitions_marker(home)
    on_disk = [b for b, p in plan.books.items() if p.action in ("run", "unchanged")]
    if (
        not plan.needs_runs
        and known is not None
        and set(on_disk) <= known
        and not plan.partitions_to_drop(pipeline.source, known)  # a partition to delete
    ):
        return plan.report()  # nothing to run: answered without loading Dagster
    return _execute(plan, settings, pipeline, home, phases)


def _rebuild(settings: Settings, home: Path, phases: Phases) -> IngestReport | None:
    """``--rebuild``. On a Qdrant Edge folder every book is ingested into a new collection
    beside the one in service, which is swapped in only when every book succeeded: searches
    answer from the old collection until then, never from a partial one (the report of a
    failed rebuild is returned as it is, nothing swapped). Any other store's collection is
    deleted first (None: the ingest that follows rebuilds it)."""
    from rag_pipeline.store import backend_of, set_aside

    config = settings.store()
    if not backend_of(config).rebuilds_beside:
        err.print(f"[yellow]set aside[/] {shown(set_aside(config))}", highlight=False)
        return None
    from rag_pipeline.store import rebuilding_beside, swap_in_rebuilt

    with rebuilding_beside(config) as staged:
        err.print(f"[yellow]rebuilding[/] every book into {shown(staged.path)}", highlight=False)
        beside = settings.model_copy(update={"qdrant_path": staged.path})
        report = _ingest(beside, home, None, force=False, phases=phases)
        if not report.ok:
            err.print(
                "[red]the rebuild is not swapped in[/]: some books failed (below); the "
                "collection in service is unchanged. Fix them and run `rag-pipeline ingest "
                f"--rebuild` again (the partial build stays in {shown(staged.path)} until then).",
                highlight=False,
            )
            return report
        err.print(f"[yellow]rebuilt[/]: {shown(swap_in_rebuilt(config))}", highlight=False)
        return report


def _execute(
    plan: IngestPlan, settings: Settings, pipeline: IngestPipeline, home: Path, phases: Phases
) -> IngestReport:
    from rag_pipeline.defs.runner import execute_plan

    phases.mark("dagster_import")
    return execute_plan(
        plan,
        pipeline,
        dagster_home=home,
        notify=lambda m: err.print(f"[yellow]note[/] {shown(m)}", highlight=False),
        batching=settings.batching(),
        phases=phases,
    )


#: unchanged books the ingest summary lists one by one; past it, one line counts them
LISTED_UNCHANGED = 20


def _print_ingest(report: IngestReport) -> None:
    table = Table(title="Ingest summary", title_justify="left")
    columns = ("book", "status", "files", "errors", "chunks", "embedded", "reused", "deleted")
    for column in (*columns, "points", "seconds"):
        table.add_column(column, justify="left" if column in ("book", "status") else "right")
    unchanged_count = sum(1 for r in report.books.values() if r.status == "unchanged")
    for book_id, r in report.books.items():
        if r.status == "unchanged" and unchanged_count > LISTED_UNCHANGED:
            continue  # counted below: a thousand rows of "unchanged" hide what did change
        style = {"failed": "red", "missing": "red", "unchanged": "dim"}.get(r.status, "")
        table.add_row(
            book_id,
            f"[{style}]{r.status}[/]" if style else r.status,
            str(r.files),
            str(r.errors),
            str(r.chunks),
            str(r.embedded),
            str(r.reused),
            str(r.deleted),
            str(r.points),
            f"{r.seconds:.1f}",
        )
    out.print(table)
    for book_id, r in report.books.items():
        if r.status == "unchanged" and r.chunks:
            continue
        for reason in r.reasons:
            err.print(f"[cyan]{book_id}[/]: {shown(reason)}", highlight=False)
    for book_id, r in report.books.items():
        for message in r.error_messages:
            err.print(f"[yellow]{book_id}[/]: {shown(message)}", highlight=False)
        for warning in r.warnings:
            err.print(f"[yellow]{book_id}[/] warning: {shown(warning)}", highlight=False)
    _print_notes(report.rejected, report.warnings)
    unchanged = [r for r in report.books.values() if r.status == "unchanged"]
    if unchanged:
        held = sum(r.chunks for r in unchanged)
        out.print(f"{len(unchanged)} books unchanged: {held} chunks already indexed, 0 embedded")
    out.print(f"done in {report.seconds:.1f}s")


@main.command()
@click.option("--book", "books", multiple=True, help="book id; repeatable (default: all)")
@click.option("--json", "as_json", is_flag=True)
@click.option("--force", is_flag=True, help="plan an ingest --force")
def plan(books: tuple[str, ...], as_json: bool, force: bool) -> None:
    """Show what the next ingest would do, without embedding or writing anything.

    The same code decides both: each book is run, unchanged, purged or missing, with the
    reason; books that will run are also read and chunked to count the work."""
    from rag_pipeline.embed import usd_per_million_tokens

    settings = _settings()
    recipe = book_recipes(settings)
    from rag_pipeline.ingest.pipeline import IngestPipeline

    pipeline = IngestPipeline.from_settings(settings, recipe)
    with opened_store(settings) as store:  # a read: a store that holds nothing is not created
        the_plan = pipeline.plan(store, list(books) or None, force=force, detail=True)
    price = usd_per_million_tokens(settings.embedding())
    model = recipe.choose(None).embedding_model  # what a new book gets
    if as_json:
        emit_json(
            {
                "books": {k: p.as_dict(price) for k, p in the_plan.books.items()},
                "embedding_model": model,
                "rejected_folders": the_plan.rejected,
                "warnings": the_plan.warnings,
                "recipe_change": the_plan.recipe_change(price),
            }
        )
    else:
        _print_plan(the_plan, model, price)
    if the_plan.with_action("missing"):
        sys.exit(1)


def _print_plan(the_plan: IngestPlan, model: str, price: float) -> None:
    table = Table(title=f"Plan ({model} for new books)", title_justify="left")
    columns = ("book", "action", "new", "modified", "deleted", "unreadable", "unchanged")
    more = ("chunks", "to embed", "reused", "tokens", "cost $", "to delete")
    for column in (*columns, *more):
        table.add_column(column, justify="left" if column in ("book", "action") else "right")
    for book_id, p in the_plan.books.items():
        d = p.as_dict(price)
        table.add_row(
            book_id,
            p.action,
            str(d["files_new"]),
            str(d["files_modified"]),
            str(d["files_deleted"]),
            str(d["files_unreadable"]),
            str(d["files_unchanged"]),
            str(d["chunks"]),
            str(d["chunks_to_embed"]),
            str(d["chunks_reused"]),
            str(d["tokens_to_embed"]),
            f"{d['cost_usd']:.4f}",
            str(d["points_to_delete"]),
        )
    out.print(table)
    _print_recipe_change(the_plan, price)
    for book_id, p in the_plan.books.items():
        for reason in p.reasons if p.action != "unchanged" else ():
            err.print(f"[cyan]{book_id}[/]: {shown(reason)}", highlight=False)
        for message in p.errors:
            err.print(f"[yellow]{book_id}[/]: {shown(message)}", highlight=False)
    _print_notes(the_plan.rejected, the_plan.warnings)


def _print_notes(rejected: Sequence[str], warnings: Sequence[str]) -> None:
    """The folders refused as books, and the warnings of the whole command, on stderr."""
    for folder in rejected:
        err.print(f"[yellow]skipped folder[/] {shown(folder)}", highlight=False)
    for warning in warnings:
        err.print(f"[yellow]warning[/] {shown(warning)}", highlight=False)


def _print_recipe_change(the_plan: IngestPlan, price: float) -> None:
    """Per book and in total, what embedding books again with another recipe costs."""
    total = the_plan.recipe_change(price)
    if not total["books_affected"]:
        out.print("recipe change: none (every indexed book keeps its recipe)")
        return
    for book_id, p in the_plan.books.items():
        cost = p.recipe_change_cost(price)
        if cost is not None:
            out.print(
                f"recipe change [cyan]{book_id}[/]: {cost['from']} -> {cost['to']}: "
                f"{cost['chunks_to_embed']} chunks, {cost['tokens_to_embed']} tokens to embed, "
                f"${cost['cost_usd']:.4f}",
                highlight=False,
            )
    out.print(
        f"recipe change in total: {total['books_affected']} books, "
        f"{total['chunks_to_embed']} chunks, {total['tokens_to_embed']} tokens to embed, "
        f"${total['cost_usd']:.4f}",
        highlight=False,
    )


@main.command()
@click.option("--first", is_flag=True, help="print only the first book id")
@click.option("--json", "as_json", is_flag=True)
def books(first: bool, as_json: bool) -> None:
    """List the book folders under RAG_DATA_DIR (and refused folder names)."""
    settings = _settings()
    scan = settings.source().list_books()
    if first:
        # the settings are good (an empty data folder is listed, planned and ingested as
        # empty, exit 0); what was asked does not exist: exit 1, as an id no book holds
        if not scan.book_ids:
            refused = "".join(f"; refused: {shown(str(r))}" for r in scan.rejected)
            fail(
                f"no book folders under {settings.data_dir} (RAG_DATA_DIR): each book is a "
                f"folder of its own, {settings.data_dir}/<book_id>/*.md{refused}",
                1,
            )
        click.echo(scan.book_ids[0])
        return
    if as_json:
        emit_json({"books": list(scan.book_ids), "rejected": [str(e) for e in scan.rejected]})
        return
    for book_id in scan.book_ids:
        click.echo(book_id)
    for rejected in scan.rejected:
        err.print(f"refused: {shown(rejected)}", highlight=False)

"""``rag-pipeline``: plan and ingest books through Dagster, search them, walk lineage, evaluate.

Every command reads the same environment as the Dagster code location (README: Configuration).
``--json`` output is a stable contract documented in the README; human output uses tables.
Dagster is imported only by the commands that run it, so searches start fast.

No command prints a Python traceback: bad input and bad settings exit 2 with a message naming
what is wrong, failed work exits 1 (``-v`` adds the traceback of an unexpected error); output
whose reader exits early (``| head``) stops quietly with 141.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, cast

import click
from rich.console import Console
from rich.table import Table

from rag_pipeline import __version__
from rag_pipeline.config import DagsterStateError, Settings, SettingsError, load_settings
from rag_pipeline.retrieve.params import CONTEXT_PARAMS, SEARCH_PARAMS, Param
from rag_pipeline.schema import CHUNK_INDEX, SECTION_TITLE, SOURCE_FILE, TEXT

if TYPE_CHECKING:
    from rag_pipeline.evaluation.metrics import EvalReport
    from rag_pipeline.ingest.pipeline import IngestPipeline
    from rag_pipeline.ingest.plan import IngestPlan
    from rag_pipeline.ingest.report import IngestReport
    from rag_pipeline.recipes.lazy import LazyRecipe
    from rag_pipeline.recipes.recipe import IndexRecipe
    from rag_pipeline.retrieve.search import Hit, HitGroup, SearchMode
    from rag_pipeline.store import FusionMethod, VectorStore

__all__ = ["SIGPIPE_EXIT", "main"]

#: exit code when stdout's reader goes away early (128 + SIGPIPE, as a shell reports it)
SIGPIPE_EXIT = 141


def _reader_gone() -> NoReturn:
    """stdout's reader exited early (``| head``): stop quietly with 141 (128 + SIGPIPE, what a
    shell reports for a command killed by it). stdout goes to /dev/null so that Python's final
    flush does not complain."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # a stdout without a descriptor (tests)
        pass
    sys.exit(SIGPIPE_EXIT)


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """stdout's reader is gone: stop as :func:`_reader_gone` says (rich would exit 1).
        stderr's: its messages are lost, the work goes on."""
        self.quiet = True
        if not self.stderr:
            _reader_gone()


# Piped output keeps full tables instead of wrapping at 80 columns.
out = _Console(width=None if sys.stdout.isatty() else 160)
err = _Console(stderr=True, width=None if sys.stderr.isatty() else 160)


def fail(message: str, code: int = 2) -> NoReturn:
    err.print(f"[bold red]error:[/] {message}", highlight=False, markup=True, soft_wrap=True)
    sys.exit(code)


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors that are the input's or the environment's fault: exit 2 with their message
    (unless one of :func:`_failed_work_errors`)."""
    from rag_pipeline.embed import EmbedError
    from rag_pipeline.models import InvalidBookIdError
    from rag_pipeline.sources.base import SourceUnavailableError
    from rag_pipeline.store import StoreError

    return (SettingsError, InvalidBookIdError, SourceUnavailableError, StoreError, EmbedError)


def _failed_work_errors() -> tuple[type[BaseException], ...]:
    """Failed work with a clear message of its own: exit 1, no traceback. Checked first: an
    embedding service's failure (timeout, 429, a bad answer) is an EmbedError, but not the
    settings' fault as a missing API key is."""
    from rag_pipeline.embed import EmbedServiceError
    from rag_pipeline.store import BookDamagedError, StoreResourceError

    # a book's damaged index (its next ingest rebuilds it), a limit of the machine (open
    # files, memory, disk space): what is asked cannot be answered now
    return (DagsterStateError, EmbedServiceError, BookDamagedError, StoreResourceError)


class _Commands(click.Group):
    """Turns every exception into a message and an exit code, never a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            result = super().invoke(ctx)
            sys.stdout.flush()  # a reader gone early is seen here, not at exit
            return result
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit):
            raise
        except KeyboardInterrupt:
            fail("interrupted", 130)
        except BrokenPipeError:
            _reader_gone()
        except Exception as exc:
            if isinstance(exc, _failed_work_errors()):
                fail(str(exc), 1)
            from rag_pipeline.store.errors import resource_limit

            limit = resource_limit(exc) if isinstance(exc, OSError) else None
            if limit is not None:  # a limit of the machine met outside the store's own calls
                fail(f"{limit}: {exc}", 1)
            if isinstance(exc, _user_errors()):
                fail(str(exc), 2)
            if ctx.obj and ctx.obj.get("verbose"):
                traceback.print_exc()
            fail(f"unexpected {type(exc).__name__}: {exc} (run with -v for the traceback)", 1)


def _settings() -> Settings:
    return load_settings()


@contextmanager
def opened_store(settings: Settings) -> Iterator[VectorStore]:
    """The configured store, for the time of one read (an embedded folder is locked while
    open: a busy one is waited for up to RAG_BUSY_WAIT_S)."""
    from rag_pipeline.schema import COLLECTION_SCHEMA
    from rag_pipeline.store import open_store
    from rag_pipeline.store.sharing import shared_store, store_key

    config = settings.store()
    with shared_store(store_key(config), lambda: open_store(config, COLLECTION_SCHEMA)) as store:
        yield store


def book_recipes(settings: Settings) -> LazyRecipe:
    """The recipes of the configured settings, one per book as its record decides
    (:func:`rag_pipeline.recipes.choice.choose_book_model`), each model loaded on first use."""
    from rag_pipeline.recipes.lazy import LazyRecipe

    return LazyRecipe(settings.embedding(), settings.chunking())


def book_pipeline(settings: Settings) -> IngestPipeline:
    """The one ingest pipeline, as the settings describe it (every run goes through it)."""
    from rag_pipeline.ingest.pipeline import IngestPipeline

    return IngestPipeline.from_settings(settings, book_recipes(settings))


_LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"


class _TracelessFormatter(logging.Formatter):
    """A log record without -v: its message and the one line of its exception, never a
    traceback, a stack, or the ``Stack Trace:`` block Dagster writes into failure messages."""

    _TRACE_STARTS = ("\nStack Trace:", "\nTraceback (most recent call last):")

    def __init__(self) -> None:
        super().__init__(_LOG_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        for start in self._TRACE_STARTS:
            message = message.split(start, 1)[0]
        message = message.rstrip()
        error = record.exc_info[1] if record.exc_info else None
        if error is not None:
            message += f" ({type(error).__name__}: {error})"
        bare = logging.makeLogRecord(
            {**record.__dict__, "msg": message, "args": (), "exc_info": None}
        )
        bare.exc_text = bare.stack_info = None
        return super().format(bare)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rag-pipeline")
@click.option("-v", "--verbose", is_flag=True, help="log progress to stderr")
@click.pass_context
def main(ctx: click.Context, verbose: bool) -> None:
    """Markdown books -> Dagster assets -> Qdrant; tenant-safe retrieval on top."""
    ctx.obj = {"verbose": verbose}
    stderr = logging.StreamHandler(sys.stderr)
    stderr.setFormatter(logging.Formatter(_LOG_FORMAT) if verbose else _TracelessFormatter())
    # INFO also lets Dagster's console print the errors of runs in full (defs/runner.py)
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[stderr])
    # progress of long steps (embedding) is worth seeing without -v
    logging.getLogger("rag_pipeline.progress").setLevel(logging.INFO)


# -- ingest / plan ----------------------------------------------------------------------------


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

    settings = _settings()
    home = ensure_dagster_home()
    rebuilt: IngestReport | None = None
    if rebuild:
        if books:
            fail("--rebuild rebuilds the whole collection; it takes no --book")
        rebuilt = _rebuild(settings, home)
    if rebuilt is not None and not rebuilt.ok:
        report = rebuilt  # not swapped in: the collection in service is untouched
    else:
        # after a rebuild's swap: the books changed while it built are caught up here
        report = _ingest(settings, home, list(books) or None, force=force)
        if rebuilt is not None:
            report = rebuilt.followed_by(report)
    if as_json:
        emit_json(report.as_dict())
    else:
        _print_ingest(report)
    if not report.ok:
        sys.exit(1)


def _ingest(
    settings: Settings, home: Path, books: list[str] | None, *, force: bool
) -> IngestReport:
    """Plan the books against the store, then run what the plan says in Dagster."""
    from rag_pipeline.defs.partition_marker import read_partitions_marker

    pipeline = book_pipeline(settings)
    with pipeline.store.open() as store:  # released before any run: runs open it per step
        plan = pipeline.plan(store, books, force=force)
    known = read_partitions_marker(home)
    on_disk = [b for b, p in plan.books.items() if p.action in ("run", "unchanged")]
    if not plan.needs_runs and known is not None and set(on_disk) <= known:
        return plan.report()  # nothing to run: answered without loading Dagster
    return _execute(plan, settings, pipeline, home)


def _rebuild(settings: Settings, home: Path) -> IngestReport | None:
    """``--rebuild``. On a Qdrant Edge folder every book is ingested into a new collection
    beside the one in service, which is swapped in only when every book succeeded: searches
    answer from the old collection until then, never from a partial one (the report of a
    failed rebuild is returned as it is, nothing swapped). Any other store's collection is
    deleted first (None: the ingest that follows rebuilds it)."""
    from rag_pipeline.store import backend_of, set_aside

    config = settings.store()
    if not backend_of(config).rebuilds_beside:
        err.print(f"[yellow]set aside[/] {set_aside(config)}", highlight=False)
        return None
    from rag_pipeline.store import rebuilding_beside, swap_in_rebuilt

    with rebuilding_beside(config) as staged:
        err.print(f"[yellow]rebuilding[/] every book into {staged.path}", highlight=False)
        beside = settings.model_copy(update={"qdrant_path": staged.path})
        report = _ingest(beside, home, None, force=False)
        if not report.ok:
            err.print(
                "[red]the rebuild is not swapped in[/]: some books failed (below); the "
                "collection in service is unchanged. Fix them and run `rag-pipeline ingest "
                f"--rebuild` again (the partial build stays in {staged.path} until then).",
                highlight=False,
            )
            return report
        err.print(f"[yellow]rebuilt[/]: {swap_in_rebuilt(config)}", highlight=False)
        return report


def _execute(
    plan: IngestPlan, settings: Settings, pipeline: IngestPipeline, home: Path
) -> IngestReport:
    from rag_pipeline.defs.runner import execute_plan

    return execute_plan(
        plan,
        pipeline,
        dagster_home=home,
        notify=lambda m: err.print(f"[yellow]note[/] {m}", highlight=False),
        batching=settings.batching(),
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
            err.print(f"[cyan]{book_id}[/]: {reason}", highlight=False)
    for book_id, r in report.books.items():
        for message in r.error_messages:
            err.print(f"[yellow]{book_id}[/]: {message}", highlight=False)
        for warning in r.warnings:
            err.print(f"[yellow]{book_id}[/] warning: {warning}", highlight=False)
    for rejected in report.rejected:
        err.print(f"[yellow]skipped folder[/] {rejected}", highlight=False)
    for warning in report.warnings:
        err.print(f"[yellow]warning[/] {warning}", highlight=False)
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
    with pipeline.store.open() as store:
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
            err.print(f"[cyan]{book_id}[/]: {reason}", highlight=False)
        for message in p.errors:
            err.print(f"[yellow]{book_id}[/]: {message}", highlight=False)
    for rejected in the_plan.rejected:
        err.print(f"[yellow]skipped folder[/] {rejected}", highlight=False)
    for warning in the_plan.warnings:
        err.print(f"[yellow]warning[/] {warning}", highlight=False)


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
        if not scan.book_ids:
            fail(f"no book folders under {settings.data_dir}")
        click.echo(scan.book_ids[0])
        return
    if as_json:
        emit_json({"books": list(scan.book_ids), "rejected": [str(e) for e in scan.rejected]})
        return
    for book_id in scan.book_ids:
        click.echo(book_id)
    for rejected in scan.rejected:
        err.print(f"refused: {rejected}", highlight=False)


# -- retrieval --------------------------------------------------------------------------------


class _OneValueCommand(click.Command):
    """A command whose options that take one value may each be given once
    (:func:`~rag_pipeline.retrieve.params.repeated`: click would keep the last silently, so
    ``--book a --book b`` would read book b where a wrapper checked a). Which options those
    are comes from the command's own parameters (not ``multiple``, not a flag or a count), so
    an option added later is covered."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        from rag_pipeline.retrieve.params import repeated

        if not ctx.resilient_parsing:  # shell completion parses half-typed lines
            _, _, order = self.make_parser(ctx).parse_args(args=list(args))
            options = {p: max(p.opts, key=len) for p in order if isinstance(p, click.Option)}
            single = {options[p] for p in options if _takes_one_value(p)}
            twice = repeated([options[p] for p in order if p in options], single)
            if twice is not None:
                raise click.UsageError(
                    f"{twice[0]} is given {twice[1]} times: it takes one value", ctx
                )
        return super().parse_args(ctx, args)


def _takes_one_value(param: click.Parameter) -> bool:
    return (
        isinstance(param, click.Option)
        and not param.multiple
        and not param.count
        and not param.is_flag
    )


def _book_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    from rag_pipeline.retrieve.params import BOOK

    return click.option(BOOK.flag, "book_id", default=None, help=BOOK.help)(fn)


def _require_book(book_id: str | None) -> str:
    from rag_pipeline.models import validate_book_id

    if not book_id:
        fail("--book is required: every search is scoped to one book (tenant)")
    return validate_book_id(book_id)


def _point_id(value: str) -> str:
    from rag_pipeline.store.filters import check_point_id

    try:
        return check_point_id(value)
    except ValueError as exc:
        fail(str(exc))


def _declared(params: Sequence[Param]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The options of ``params`` (:mod:`rag_pipeline.retrieve.params`), in their order."""

    def options(fn: Callable[..., Any]) -> Callable[..., Any]:
        for p in reversed(params):
            fn = click.option(
                p.flag,
                p.name,
                type=_click_type(p),
                multiple=p.repeatable,
                default=() if p.repeatable else p.default,
                show_default=p.default is not None,
                help=p.help.replace("group_by", "--group-by").replace("limit best", "--limit best"),
            )(fn)
        return fn

    return options


def _click_type(p: Param) -> Any:
    if p.choices is not None:
        return click.Choice(list(p.choices))
    if p.kind is int and (p.minimum is not None or p.maximum is not None):
        return click.IntRange(p.minimum, p.maximum)
    return p.kind


def _fusion_option(multiple: bool = False) -> Callable[..., Any]:
    fusion = next(p for p in SEARCH_PARAMS if p.name == "fusion")
    return click.option(
        fusion.flag,
        "fusion",
        type=click.Choice(list(fusion.choices or ())),
        multiple=multiple,
        default=() if multiple else fusion.default,
        help=fusion.help + ("; repeatable" if multiple else ""),
    )


@main.command(cls=_OneValueCommand)
@click.argument("query")
@_book_option
@_declared(SEARCH_PARAMS)
@click.option("--json", "as_json", is_flag=True)
def search(query: str, book_id: str | None, as_json: bool, **values: Any) -> None:
    """Search one book for QUERY."""
    from rag_pipeline.retrieve.params import search_request
    from rag_pipeline.retrieve.request import results_json

    book = _require_book(book_id)
    settings = _settings()
    try:
        request = search_request(query, book, values)
    except ValueError as exc:
        fail(str(exc))
    with opened_store(settings) as store:
        # the query is embedded by the model the book records, never compared across models
        recipe = (
            book_recipes(settings).for_book(store, book, purpose="search").recipe
            if request.needs_embedder
            else None
        )
        try:
            results = request.run(
                store,
                recipe.embedder if recipe else None,
                recipe.sparse if recipe else None,
            )
        except ValueError as exc:  # a query or filter the search cannot answer
            fail(str(exc))
        if not results:
            _hint_if_not_indexed(store, book)
    if as_json:
        emit_json(results_json(results))
        return
    label = request.mode + (f", {request.fusion}" if request.mode == "hybrid" else "")
    if request.group_by is None:
        _print_hits(cast("list[Hit]", results), f"{len(results)} hits in {book} ({label})")
        return
    for group in cast("list[HitGroup]", results):
        _print_hits(
            list(group.hits),
            f"{group.source_file} (best {group.score:.4f}, {len(group.hits)} hits)",
        )
    out.print(f"{len(results)} files in {book} ({label})")


def _hint_if_not_indexed(store: VectorStore, book: str) -> None:
    """No hits because the book has nothing indexed: say so on stderr (the answer stays [])."""
    from rag_pipeline.schema import chunks_of

    if store.count(chunks_of(book)):
        return
    books = store.tenants()
    shown = ", ".join(books[:20]) + (f" (and {len(books) - 20} more)" if len(books) > 20 else "")
    err.print(
        f"[yellow]note[/] book {book} has nothing indexed"
        + (f"; indexed books: {shown}" if books else "; the index is empty")
        + " (rag-pipeline ingest indexes the books under RAG_DATA_DIR)",
        highlight=False,
    )


def _print_hits(hits: Sequence[Hit], title: str, show_score: bool = True) -> None:
    table = Table(title=title, title_justify="left", show_lines=True)
    if show_score:
        table.add_column("score", justify="right")
    table.add_column("source")
    table.add_column("text")
    for h in hits:
        p = h.payload
        source = (
            f"{p.get(SOURCE_FILE)} #{p.get(CHUNK_INDEX)}\n"
            f"[dim]{p.get(SECTION_TITLE) or ''}[/]\n[dim]{h.id}[/]"
        )
        text = " ".join(str(p.get(TEXT, "")).split())
        row = [source, text[:400] + ("…" if len(text) > 400 else "")]
        table.add_row(*([f"{h.score:.4f}"] if show_score and h.score is not None else []), *row)
    out.print(table)


@main.command(cls=_OneValueCommand)
@click.argument("chunk_id")
@_book_option
@_declared(CONTEXT_PARAMS)
@click.option("--json", "as_json", is_flag=True)
def context(chunk_id: str, book_id: str | None, as_json: bool, **values: int) -> None:
    """A chunk with its neighbours along the document's prev/next chain."""
    from rag_pipeline.retrieve import expand_context

    _show_chunks(
        chunk_id,
        book_id,
        as_json,
        lambda store, book, point: expand_context(
            store, book, point, prev=values["prev"], next=values["next"]
        ),
        missing="no chunk {point} in book {book}",
        title=lambda point, hits: f"context of {point}",
    )


@main.command(cls=_OneValueCommand)
@click.argument("parent_doc_id")
@_book_option
@click.option("--json", "as_json", is_flag=True)
def document(parent_doc_id: str, book_id: str | None, as_json: bool) -> None:
    """All chunks of one document, in order."""
    from rag_pipeline.retrieve import get_document

    _show_chunks(
        parent_doc_id,
        book_id,
        as_json,
        get_document,
        missing="no document {point} in book {book}",
        title=lambda point, hits: f"document {point} ({len(hits)} chunks)",
    )


def _show_chunks(
    point_id: str,
    book_id: str | None,
    as_json: bool,
    read: Callable[[VectorStore, str, str], Sequence[Hit]],
    *,
    missing: str,
    title: Callable[[str, Sequence[Hit]], str],
) -> None:
    """What ``context`` and ``document`` share: read chunks of one book by a point id, exit 1
    when there are none, print them as JSON or a table."""
    book = _require_book(book_id)
    point = _point_id(point_id)
    with opened_store(_settings()) as store:
        hits = read(store, book, point)
    if not hits:
        fail(missing.format(point=point, book=book), code=1)
    if as_json:
        emit_json([h.as_dict() for h in hits])
        return
    _print_hits(hits, title(point, hits), show_score=False)


@main.command(cls=_OneValueCommand)
@click.argument("point_id")
@_book_option
@click.option("--json", "as_json", is_flag=True)
def lineage(point_id: str, book_id: str | None, as_json: bool) -> None:
    """Where a point came from: file, section, hashes, run, model; and if its file changed."""
    from rag_pipeline.retrieve.lineage import trace_point

    book = _require_book(book_id)
    point = _point_id(point_id)
    settings = _settings()
    with opened_store(settings) as store:
        info = trace_point(store, settings.source(), book, point, dagster_url=settings.dagster_url)
    if info is None:
        fail(f"no point {point} in book {book}", code=1)
    if as_json:
        emit_json(info)
        return
    table = Table(title=f"lineage of {point}", title_justify="left", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    for key, value in info.items():
        table.add_row(key, "" if value is None else str(value))
    out.print(table)


# -- query service ---------------------------------------------------------------------------


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option(
    "--cache-size",
    type=click.IntRange(0, 1_000_000),
    default=1024,
    show_default=True,
    help="query embeddings kept (LRU; 0: none)",
)
@click.option(
    "--model-threads",
    type=click.IntRange(1, 256),
    default=None,
    help="threads per query inference of the local model; one inference runs at a time per "
    "that many cores [default: every core, one inference at a time: the lowest latency; "
    "1 serves many concurrent clients a little faster]",
)
@click.option("--access-log", is_flag=True, help="log every request to stderr")
def serve(
    host: str, port: int, cache_size: int, model_threads: int | None, access_log: bool
) -> None:
    """Serve search, context, document and lineage over HTTP as JSON (OpenAPI docs at /docs).

    Bodies are the commands' --json output; every request names its book (?book=...). An
    embedded store is held open between requests and released whenever an ingest (or any
    other process) waits for it, then reopened: answers follow finished runs without a
    restart."""
    from rag_pipeline.serve import create_app, query_recipe
    from rag_pipeline.serve import serve as run_server

    settings = _settings()
    recipe, parallel = query_recipe(settings, model_threads)
    app = create_app(settings, recipe, cache_size=cache_size, parallel=parallel)
    err.print(
        f"serving {settings.store().target} on http://{host}:{port} (docs: /docs)",
        highlight=False,
    )
    run_server(app, host, port, access_log=access_log)


# -- evaluation -------------------------------------------------------------------------------


@main.command(name="eval")
@click.option(
    "--dataset",
    "dataset_dir",
    required=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="BEIR folder: corpus.jsonl, queries.jsonl, qrels/<split>.tsv",
)
@click.option("--split", default="test", show_default=True)
@click.option(
    "--mode",
    "modes",
    multiple=True,
    type=click.Choice(["dense", "sparse", "hybrid"]),
    help="repeatable; default: the default search mode",
)
@_fusion_option(multiple=True)
@click.option(
    "--rrf-k",
    type=click.IntRange(1, 100_000),
    default=60,
    show_default=True,
    help="k of --fusion rrf",
)
@click.option(
    "--collection",
    default=None,
    help="collection for the evaluation index [default: RAG_COLLECTION + '_eval']",
)
@click.option(
    "--compare",
    is_flag=True,
    help="evaluate the current recipe and a candidate (the --candidate-* options) side by "
    "side, each indexed once in the evaluation collection",
)
@click.option(
    "--candidate-precision",
    type=click.Choice(["fp32", "int8"]),
    default=None,
    help="with --compare: the candidate's local model precision [default: the current one]",
)
@click.option(
    "--candidate-target-tokens",
    type=click.IntRange(16, 100_000),
    default=None,
    help="with --compare: the candidate's chunk target tokens [default: RAG_CHUNK_TARGET_TOKENS]",
)
@click.option("--json", "as_json", is_flag=True)
def eval_command(
    dataset_dir: Path,
    split: str,
    modes: tuple[str, ...],
    fusion: tuple[str, ...],
    rrf_k: int,
    collection: str | None,
    compare: bool,
    candidate_precision: str | None,
    candidate_target_tokens: int | None,
    as_json: bool,
) -> None:
    """nDCG@10, recall@10/100 and MRR@10 on a BEIR dataset (indexed as one book).

    The dataset goes into its own collection, apart from the books: an ingest purges books
    without a folder, and an evaluation corpus has none. The current recipe is the one a book
    gets (the recorded precision wins over auto); --compare also evaluates a candidate recipe,
    indexed as a book of its own beside it, so a team sees what a change does before making
    it."""
    from rich.progress import Progress

    from rag_pipeline.evaluation.beir import load_beir
    from rag_pipeline.evaluation.run import (
        EvalRun,
        candidate_book_id,
        eval_book_id,
        eval_runs,
        run_evaluation,
    )

    if not compare and (candidate_precision or candidate_target_tokens):
        fail("--candidate-precision and --candidate-target-tokens need --compare")
    if compare and not (candidate_precision or candidate_target_tokens):
        fail("--compare needs a candidate: --candidate-precision and/or --candidate-target-tokens")
    base = _settings()
    settings = load_settings(collection=collection or f"{base.collection}_eval")
    try:
        dataset = load_beir(dataset_dir, split)
    except (FileNotFoundError, ValueError, KeyError) as exc:
        fail(f"cannot read the BEIR dataset at {dataset_dir}: {exc}")
    runs = eval_runs(
        cast("list[SearchMode]", list(modes)), cast("list[FusionMethod]", list(fusion))
    )
    pipeline = book_pipeline(settings)
    with Progress(console=err, transient=True) as progress:

        def evaluate_as(recipe: IndexRecipe, book_id: str) -> tuple[IndexRecipe, list[EvalReport]]:
            task = progress.add_task(f"embedding {dataset.name}", total=None)

            def querying(run: EvalRun) -> Callable[[int, int], None]:
                label = run[0] + (f", {run[1]}" if run[1] else "")
                return _advance(progress, progress.add_task(f"queries ({label})", total=None))

            return run_evaluation(
                pipeline,
                recipe,
                dataset,
                runs,
                split=split,
                rrf_k=rrf_k,
                indexing=lambda done, total: progress.update(task, completed=done, total=total),
                querying=querying,
                book_id=book_id,
            )

        with pipeline.store.open() as store:
            current = pipeline.recipes.for_book(store, eval_book_id(dataset)).recipe
        candidate = (
            _candidate_recipe(settings, current, candidate_precision, candidate_target_tokens)
            if compare
            else None
        )
        recipe, reports = evaluate_as(current, eval_book_id(dataset))
        compared = (
            evaluate_as(candidate, candidate_book_id(dataset, candidate)) if candidate else None
        )
    if compared is not None:
        _print_comparison(dataset.name, split, (recipe, reports), compared, as_json)
        return
    if as_json:
        emit_json(
            reports[0].as_dict() if len(reports) == 1 else {"runs": [r.as_dict() for r in reports]}
        )
        return
    table = Table(title=f"{dataset.name} ({split}, {recipe.embedding_model})", title_justify="left")
    for column in ("mode", "fusion", "nDCG@10", "recall@10", "recall@100", "MRR@10", "queries"):
        table.add_column(column, justify="right")
    table.add_column("s", justify="right")
    for r in reports:
        table.add_row(
            r.mode,
            r.fusion or "",
            f"{r.ndcg_at_10:.4f}",
            f"{r.recall_at_10:.4f}",
            f"{r.recall_at_100:.4f}",
            f"{r.mrr_at_10:.4f}",
            str(r.queries),
            f"{r.seconds:.1f}",
        )
    out.print(table)


def _candidate_recipe(
    settings: Settings,
    current: IndexRecipe,
    precision: str | None,
    target_tokens: int | None,
) -> IndexRecipe:
    """The current recipe with the candidate's precision and chunk target (exit 2 for a
    candidate that cannot be built, or that is the current recipe)."""
    from dataclasses import replace

    from rag_pipeline.embed import kind_of, model_names
    from rag_pipeline.recipes.lazy import LazyRecipe
    from rag_pipeline.recipes.recipe import IndexRecipe

    embedding, chunking = settings.embedding(), settings.chunking()
    if target_tokens is not None:
        if target_tokens > chunking.max_tokens:
            fail(
                f"--candidate-target-tokens {target_tokens} is above RAG_CHUNK_MAX_TOKENS "
                f"({chunking.max_tokens})"
            )
        if target_tokens < chunking.min_tokens:
            fail(
                f"--candidate-target-tokens {target_tokens} is below RAG_CHUNK_MIN_TOKENS "
                f"({chunking.min_tokens})"
            )
        chunking = replace(chunking, target_tokens=target_tokens)
    names = model_names(embedding)
    if precision is None or names.get(current.embedding_model) == precision:
        candidate = IndexRecipe.build(current.embedder, chunking)  # the same model, loaded once
    elif not kind_of(embedding).precisions:
        fail(f"--candidate-precision is the local model's; RAG_EMBEDDER is {embedding.provider}")
    else:
        model = next(name for name, p in names.items() if p == precision)
        candidate = LazyRecipe(embedding, chunking).for_model(model)
    if candidate.signature == current.signature:
        fail(
            f"the candidate is the current recipe ({current.embedding_model}, chunk target "
            f"{current.budget.target} tokens): name a different one"
        )
    return candidate


def _recipe_json(recipe: IndexRecipe, reports: Sequence[EvalReport]) -> dict[str, Any]:
    return {
        "embedding_model": recipe.embedding_model,
        "chunk_target_tokens": recipe.budget.target,
        "signature": recipe.signature,
        "runs": [r.as_dict() for r in reports],
    }


def _print_comparison(
    name: str,
    split: str,
    current: tuple[IndexRecipe, list[EvalReport]],
    candidate: tuple[IndexRecipe, list[EvalReport]],
    as_json: bool,
) -> None:
    """The current and the candidate recipe's metrics side by side, with the difference."""
    from rag_pipeline.evaluation.metrics import METRICS, compare_reports

    deltas = compare_reports(current[1], candidate[1])
    if as_json:
        emit_json(
            {
                "dataset": name,
                "split": split,
                "current": _recipe_json(*current),
                "candidate": _recipe_json(*candidate),
                "delta": deltas,
            }
        )
        return
    title = (
        f"{name} ({split}): current {current[0].embedding_model} "
        f"(chunk target {current[0].budget.target}) -> candidate "
        f"{candidate[0].embedding_model} (chunk target {candidate[0].budget.target})"
    )
    table = Table(title=title, title_justify="left")
    for column in ("mode", "fusion", *METRICS):
        table.add_column(column, justify="right")
    for now, then, delta in zip(current[1], candidate[1], deltas, strict=True):
        a, b = now.as_dict(), then.as_dict()
        cells = [f"{a[m]:.4f} -> {b[m]:.4f} ({delta[m]:+.4f})" for m in METRICS]
        table.add_row(now.mode, now.fusion or "", *cells)
    out.print(table)


def _advance(progress: Any, task: Any) -> Callable[[int, int], None]:
    return lambda done, total: progress.update(task, completed=done, total=total)


if __name__ == "__main__":
    main()

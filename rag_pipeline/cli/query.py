"""The retrieval commands (``search``, ``context``, ``document``, ``lineage``) and ``serve``:
their options are :mod:`rag_pipeline.retrieve.params`'s declarations."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

import click
from rich.table import Table

from rag_pipeline.cli.app import (
    SIGPIPE_EXIT,
    _settings,
    book_recipes,
    emit_json,
    err,
    fail,
    main,
    opened_store,
    out,
    shown,
)
from rag_pipeline.retrieve.params import (
    BOOK,
    CONTEXT_PARAMS,
    SEARCH_PARAMS,
    Param,
    param,
    repeated,
    search_request,
)
from rag_pipeline.schema import CHUNK_INDEX, SECTION_TITLE, SOURCE_FILE, TEXT

if TYPE_CHECKING:
    from rag_pipeline.retrieve.search import Hit, HitGroup
    from rag_pipeline.store import VectorStore


class _OneValueCommand(click.Command):
    """A command whose options that take one value may each be given once
    (:func:`~rag_pipeline.retrieve.params.repeated`: click would keep the last silently, so
    ``--book a --book b`` would read book b where a wrapper checked a). Which options those
    are comes from the command's own parameters (not ``multiple``, not a flag or a count), so
    an option added later is covered."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
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
                type=_ParamType(p),
                multiple=p.repeatable,
                default=() if p.repeatable else p.default,
                show_default=p.default is not None,
                help=p.help.replace("group_by", "--group-by").replace("limit best", "--limit best"),
            )(fn)
        return fn

    return options


class _ParamType(click.ParamType[Any]):
    """A parameter's value read as the service reads it (:meth:`Param.read`: one rule, so
    the CLI and the service accept and refuse the same values)."""

    def __init__(self, p: Param) -> None:
        self.param = p
        self.name = p.kind.__name__

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        if self.param.choices:
            return "[" + "|".join(self.param.choices) + "]"
        kind = {int: "INTEGER", float: "FLOAT"}.get(self.param.kind, "TEXT")
        low, high = self.param.minimum, self.param.maximum
        if low is None and high is None:
            return kind
        return f"{kind} [{'' if low is None else low}..{'' if high is None else high}]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):  # a default, already a value
            return value
        try:
            return self.param.read(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def _fusion_option(multiple: bool = False) -> Callable[..., Any]:
    fusion = param("fusion")
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
    from rag_pipeline.retrieve.request import results_json
    from rag_pipeline.retrieve.view import read_under_one_view

    book = _require_book(book_id)
    settings = _settings()
    try:
        request = search_request(query, book, values)
    except ValueError as exc:
        fail(str(exc))
    recipes = book_recipes(settings)
    with opened_store(settings) as store:

        def search_under(_: str | None) -> list[Hit] | list[HitGroup]:
            # the query is embedded by the model the book records, never compared across
            # models. Under the store: only the store says which model that is (embedding
            # first with the configured model loaded, or called the API of, a model a book
            # not migrated yet does not use); the query service embeds first, with what it
            # learnt of the book
            recipe = (
                recipes.for_book(store, book, purpose="search").recipe
                if request.needs_embedder
                else None
            )
            return request.run(
                store,
                recipe.embedder if recipe else None,
                recipe.sparse if recipe else None,
            )

        try:
            with _exit_if_switched_under_every_read():
                results = read_under_one_view(store, book, search_under, what="search")
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
            f"{shown(group.source_file)} (best {group.score:.4f}, {len(group.hits)} hits)",
        )
    out.print(f"{len(results)} files in {book} ({label})")


@contextmanager
def _exit_if_switched_under_every_read() -> Iterator[None]:
    """A book switched to another recipe under every try of an answer
    (:class:`~rag_pipeline.retrieve.view.BookViewError`) is exit 1 naming it."""
    from rag_pipeline.retrieve.view import BookViewError

    try:
        yield
    except BookViewError as exc:
        fail(str(exc), code=1)


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
            f"{shown(p.get(SOURCE_FILE))} #{p.get(CHUNK_INDEX)}\n"
            f"[dim]{shown(p.get(SECTION_TITLE) or '')}[/]\n[dim]{h.id}[/]"
        )
        text = " ".join(str(p.get(TEXT, "")).split())
        row = [source, shown(text[:400] + ("…" if len(text) > 400 else ""))]
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
    with opened_store(_settings()) as store, _exit_if_switched_under_every_read():
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
    from rag_pipeline.retrieve.lineage import describe_point, read_point

    book = _require_book(book_id)
    point = _point_id(point_id)
    settings = _settings()
    with opened_store(settings) as store, _exit_if_switched_under_every_read():
        record = read_point(store, book, point)
    if record is None:
        fail(f"no point {point} in book {book}", code=1)
    # the source is asked with the store closed (a remote may take seconds)
    info = describe_point(record, settings.source(), book, dagster_url=settings.dagster_url)
    if as_json:
        emit_json(info)
        return
    table = Table(title=f"lineage of {point}", title_justify="left", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    for key, value in info.items():
        if isinstance(value, dict):  # the source, the commit: one line, its fields in order
            value = ", ".join(f"{k} {v}" for k, v in value.items() if v)
        table.add_row(key, "" if value is None else shown(value))
    out.print(table)


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
    from rag_pipeline.serve import create_app, query_recipe, warm_up
    from rag_pipeline.serve import serve as run_server

    settings = _settings()
    _check_address(host, port)
    recipe, parallel = query_recipe(settings, model_threads)
    # the model loaded here, not in uvicorn's start-up: a model or cache folder that cannot be
    # used is a message and exit 2, not uvicorn's traceback (the app's warm-up then finds it)
    warm_up(recipe.get(), settings.embedding())
    app = create_app(settings, recipe, cache_size=cache_size, parallel=parallel)
    err.print(
        f"serving {shown(settings.store().target)} on http://{host}:{port} (docs: /docs)",
        highlight=False,
    )
    try:
        run_server(
            app,
            host,
            port,
            access_log=access_log,
            read_timeout_s=settings.serve_read_timeout_s,
            max_connections=settings.serve_max_connections,
        )
    except SystemExit as exc:
        # uvicorn ends a failed start with its own codes (3: startup failure, after its
        # message): failed work is exit 1, as for every command
        if exc.code not in (None, 0, 1, 2, 130, SIGPIPE_EXIT):
            fail(f"the service stopped at its start (uvicorn exit {exc.code})", 1)
        raise


def _check_address(host: str, port: int) -> None:
    """Exit 2 naming ``--host`` when it is not an address to listen on (uvicorn exited 3)."""
    import socket

    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        fail(f"--host {host!r} is not an address to listen on: {reason}")

"""``rag-pipeline``: ingest books through Dagster, search them, walk lineage, evaluate.

Every command reads the same environment as the Dagster code location (README: Configuration).
``--json`` output is a stable contract documented in the README; human output uses tables.
Dagster is imported only by the commands that run it, so searches start fast.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.table import Table

from rag_pipeline import __version__
from rag_pipeline.config import Settings, load_settings

__all__ = ["main"]

# Piped output keeps full tables instead of wrapping at 80 columns.
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


def fail(message: str, code: int = 2) -> NoReturn:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    sys.exit(code)


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))


@contextmanager
def opened_store(settings: Settings) -> Iterator[Any]:
    """The configured store; a busy embedded store is waited for. Store and embedder failures
    inside the block end the command with their message, not a traceback."""
    from rag_pipeline.embed import EmbedError
    from rag_pipeline.store import StoreError, open_store
    from rag_pipeline.store.sharing import shared_store

    key = ("cli", settings.collection, settings.qdrant_path, settings.qdrant_url)
    try:
        with shared_store(key, lambda: open_store(settings), settings.busy_wait_s) as store:
            yield store
    except (StoreError, EmbedError) as exc:
        fail(str(exc))


def make_embedder(settings: Settings):  # type: ignore[no-untyped-def]
    from rag_pipeline.embed import EmbedError, create_embedder

    try:
        return create_embedder(settings)
    except EmbedError as exc:
        fail(str(exc))


def _settings() -> Settings:
    try:
        return load_settings()
    except Exception as exc:  # pydantic validation errors name the variable
        fail(f"invalid configuration: {exc}")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rag-pipeline")
@click.option("-v", "--verbose", is_flag=True, help="log progress to stderr")
def main(verbose: bool) -> None:
    """Markdown books -> Dagster assets -> Qdrant; tenant-safe retrieval on top."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        stream=sys.stderr,
        format="%(levelname)s %(name)s: %(message)s",
    )


# -- ingest / plan ----------------------------------------------------------------------------


@main.command()
@click.option("--book", "books", multiple=True, help="book id (folder name); repeatable")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@click.option("--force", is_flag=True, help="run books even when nothing changed")
def ingest(books: tuple[str, ...], as_json: bool, force: bool) -> None:
    """Materialize the ingestion assets through Dagster for every book (or the named ones)."""
    from rag_pipeline.config import ensure_dagster_home
    from rag_pipeline.crawl import InvalidBookIdError, validate_book_id
    from rag_pipeline.embed import EmbedError
    from rag_pipeline.freshness import DataDirError
    from rag_pipeline.store import StoreError, open_store
    from rag_pipeline.store.sharing import shared_store, store_key

    settings = _settings()
    home = ensure_dagster_home()
    key = store_key(
        settings.collection, settings.qdrant_path, settings.qdrant_url, settings.qdrant_embedded
    )
    try:
        targets = [validate_book_id(b) for b in books] or None
        # one store handle for the whole command: the Dagster resources reuse it
        with shared_store(key, lambda: open_store(settings), settings.busy_wait_s) as store:
            check = None if force else _quick_check(settings, store, targets, home)
            if check is not None and check.report is not None:
                report = check.report
            else:
                from rag_pipeline.defs.runner import ingest_books

                report = ingest_books(
                    targets,
                    force=force,
                    settings=settings,
                    dagster_home=home,
                    unchanged=check.unchanged if check else None,
                )
    except (InvalidBookIdError, DataDirError, StoreError, EmbedError) as exc:
        fail(str(exc))
    if as_json:
        emit_json(report.as_dict())
    else:
        _print_ingest(report)
    if not report.ok:
        sys.exit(1)


def _quick_check(settings: Settings, store: Any, targets: Any, home: Path) -> Any:
    """What the index alone says (``rag_pipeline.freshness.quick_check``): the whole report
    when nothing needs Dagster, else the books that need no run. ``None`` when the instance's
    partitions are not known (a new DAGSTER_HOME): then Dagster decides everything."""
    from rag_pipeline.freshness import quick_check, read_partitions_marker
    from rag_pipeline.pipeline import default_budget, index_signature
    from rag_pipeline.sparse import Bm25Encoder

    known = read_partitions_marker(home)
    if known is None:
        return None
    embedder = make_embedder(settings)
    signature = index_signature(embedder, default_budget(embedder), Bm25Encoder())
    return quick_check(settings.source(), store, targets, signature, embedder.model_name, known)


def _print_ingest(report: Any) -> None:
    table = Table(title="Ingest summary", title_justify="left")
    for column in (
        "book",
        "status",
        "files",
        "errors",
        "chunks",
        "embedded",
        "reused",
        "deleted",
        "points",
        "seconds",
    ):
        table.add_column(column, justify="left" if column in ("book", "status") else "right")
    for book_id, r in report.books.items():
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
        for message in r.error_messages:
            err.print(f"[yellow]{book_id}[/]: {message}", highlight=False)
    for rejected in report.rejected:
        err.print(f"[yellow]skipped folder[/] {rejected}", highlight=False)
    for warning in report.warnings:
        err.print(f"[yellow]warning[/] {warning}", highlight=False)
    out.print(f"done in {report.seconds:.1f}s")


@main.command()
@click.option("--book", "books", multiple=True, help="book id; repeatable (default: all)")
@click.option("--json", "as_json", is_flag=True)
def plan(books: tuple[str, ...], as_json: bool) -> None:
    """Show what the next ingest would do, without embedding or writing anything."""
    settings = _settings()
    from rag_pipeline.crawl import discover_books, validate_book_id
    from rag_pipeline.pipeline import default_budget, plan_book
    from rag_pipeline.sparse import Bm25Encoder

    targets = [validate_book_id(b) for b in books] or list(
        discover_books(settings.data_dir).book_ids
    )
    embedder = make_embedder(settings)
    budget = default_budget(embedder)
    plans = {}
    with opened_store(settings) as store:
        for book_id in targets:
            plans[book_id] = plan_book(
                settings.source(), book_id, store, embedder, budget, Bm25Encoder()
            )
    if as_json:
        emit_json(
            {
                "books": {k: p.as_dict() for k, p in plans.items()},
                "embedding_model": embedder.model_name,
            }
        )
        return
    table = Table(title=f"Plan ({embedder.model_name})", title_justify="left")
    for column in (
        "book",
        "new",
        "modified",
        "deleted",
        "unchanged",
        "chunks",
        "to embed",
        "reused",
        "tokens",
        "cost $",
        "to delete",
    ):
        table.add_column(column, justify="left" if column == "book" else "right")
    for book_id, p in plans.items():
        c = p.changes
        table.add_row(
            book_id,
            str(len(c.new)),
            str(len(c.modified)),
            str(len(c.deleted)),
            str(len(c.unchanged)),
            str(p.chunks_total),
            str(p.chunks_to_embed),
            str(p.chunks_reused),
            str(p.tokens_to_embed),
            f"{p.cost_usd:.4f}",
            str(p.points_to_delete),
        )
    out.print(table)


@main.command()
@click.option("--first", is_flag=True, help="print only the first book id")
@click.option("--json", "as_json", is_flag=True)
def books(first: bool, as_json: bool) -> None:
    """List the book folders under RAG_DATA_DIR (and refused folder names)."""
    settings = _settings()
    from rag_pipeline.crawl import discover_books

    scan = discover_books(settings.data_dir)
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


def _book_option(fn: Callable) -> Callable:
    return click.option(
        "--book", "book_id", default=None, help="book id; required: results never cross books"
    )(fn)


def _require_book(book_id: str | None) -> str:
    from rag_pipeline.crawl import InvalidBookIdError, validate_book_id

    if not book_id:
        fail("--book is required: every search is scoped to one book (tenant)")
    try:
        return validate_book_id(book_id)
    except InvalidBookIdError as exc:
        fail(str(exc))


@main.command()
@click.argument("query")
@_book_option
@click.option("--module", default=None, help="exact module")
@click.option("--chapter-min", type=int, default=None)
@click.option("--chapter-max", type=int, default=None)
@click.option("--lesson", type=int, default=None)
@click.option("--hardware-tier", type=int, default=None, help="this tier or lower")
@click.option("--proficiency", multiple=True, help="any of these levels; repeatable")
@click.option("--where", "equals", multiple=True, help="payload equality filter key=value")
@click.option("--limit", type=click.IntRange(1, 1000), default=5, show_default=True)
@click.option("--score-threshold", type=float, default=None)
@click.option(
    "--mode",
    type=click.Choice(["dense", "sparse", "hybrid"]),
    default=None,
    help="default: hybrid (chosen by measurement)",
)
@click.option("--json", "as_json", is_flag=True)
def search(
    query: str,
    book_id: str | None,
    module: str | None,
    chapter_min: int | None,
    chapter_max: int | None,
    lesson: int | None,
    hardware_tier: int | None,
    proficiency: tuple[str, ...],
    equals: tuple[str, ...],
    limit: int,
    score_threshold: float | None,
    mode: str | None,
    as_json: bool,
) -> None:
    """Search one book for QUERY."""
    book = _require_book(book_id)
    settings = _settings()
    from rag_pipeline.retrieve import DEFAULT_MODE
    from rag_pipeline.retrieve import search as run_search
    from rag_pipeline.store.filters import SearchFilters, parse_equals

    try:
        filters = SearchFilters(
            module=module,
            chapter_min=chapter_min,
            chapter_max=chapter_max,
            lesson=lesson,
            hardware_tier=hardware_tier,
            proficiency_levels=tuple(proficiency),
            equals=parse_equals(equals),
        )
        filters.conditions()
    except ValueError as exc:
        fail(str(exc))
    chosen = mode or DEFAULT_MODE
    embedder = make_embedder(settings) if chosen != "sparse" else None
    with opened_store(settings) as store:
        hits = run_search(
            store,
            embedder,
            query,
            book,
            filters=filters,
            limit=limit,
            score_threshold=score_threshold,
            mode=chosen,
        )  # type: ignore[arg-type]
    if as_json:
        emit_json([h.as_dict() for h in hits])
        return
    _print_hits(hits, f"{len(hits)} hits in {book} ({chosen})")


def _print_hits(hits: Sequence[Any], title: str, show_score: bool = True) -> None:
    table = Table(title=title, title_justify="left", show_lines=True)
    if show_score:
        table.add_column("score", justify="right")
    table.add_column("source")
    table.add_column("text")
    for h in hits:
        p = h.payload
        source = (
            f"{p.get('source_file')} #{p.get('chunk_index')}\n"
            f"[dim]{p.get('section_title') or ''}[/]\n[dim]{h.id}[/]"
        )
        text = " ".join(str(p.get("text", "")).split())
        row = [source, text[:400] + ("…" if len(text) > 400 else "")]
        table.add_row(*([f"{h.score:.4f}"] if show_score else []), *row)
    out.print(table)


@main.command()
@click.argument("chunk_id")
@_book_option
@click.option("--prev", "prev_n", type=click.IntRange(0, 100), default=1, show_default=True)
@click.option("--next", "next_n", type=click.IntRange(0, 100), default=1, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def context(chunk_id: str, book_id: str | None, prev_n: int, next_n: int, as_json: bool) -> None:
    """A chunk with its neighbours along the document's prev/next chain."""
    book = _require_book(book_id)
    settings = _settings()
    from rag_pipeline.retrieve import expand_context

    with opened_store(settings) as store:
        hits = expand_context(store, book, chunk_id, prev=prev_n, next=next_n)
    if not hits:
        fail(f"no chunk {chunk_id} in book {book}", code=1)
    if as_json:
        emit_json([h.as_dict() for h in hits])
        return
    _print_hits(hits, f"context of {chunk_id}", show_score=False)


@main.command()
@click.argument("parent_doc_id")
@_book_option
@click.option("--json", "as_json", is_flag=True)
def document(parent_doc_id: str, book_id: str | None, as_json: bool) -> None:
    """All chunks of one document, in order."""
    book = _require_book(book_id)
    settings = _settings()
    from rag_pipeline.retrieve import get_document

    with opened_store(settings) as store:
        hits = get_document(store, book, parent_doc_id)
    if not hits:
        fail(f"no document {parent_doc_id} in book {book}", code=1)
    if as_json:
        emit_json([h.as_dict() for h in hits])
        return
    _print_hits(hits, f"document {parent_doc_id} ({len(hits)} chunks)", show_score=False)


@main.command()
@click.argument("point_id")
@_book_option
@click.option("--json", "as_json", is_flag=True)
def lineage(point_id: str, book_id: str | None, as_json: bool) -> None:
    """Where a point came from: file, section, hashes, run, model; and if its file changed."""
    book = _require_book(book_id)
    settings = _settings()
    from rag_pipeline.lineage import trace_point

    with opened_store(settings) as store:
        info = trace_point(store, settings, book, point_id)
    if info is None:
        fail(f"no point {point_id} in book {book}", code=1)
    if as_json:
        emit_json(info)
        return
    table = Table(title=f"lineage of {point_id}", title_justify="left", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    for key, value in info.items():
        table.add_row(key, "" if value is None else str(value))
    out.print(table)


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
@click.option("--rrf-k", type=int, default=60, show_default=True)
@click.option(
    "--collection",
    default=None,
    help="collection for the evaluation index [default: RAG_COLLECTION + '_eval']",
)
@click.option("--json", "as_json", is_flag=True)
def eval_command(
    dataset_dir: Path,
    split: str,
    modes: tuple[str, ...],
    rrf_k: int,
    collection: str | None,
    as_json: bool,
) -> None:
    """nDCG@10, recall@10/100 and MRR@10 on a BEIR dataset (indexed as one book).

    The dataset goes into its own collection, apart from the books: an ingest purges books
    without a folder, and an evaluation corpus has none."""
    from rich.progress import Progress

    from rag_pipeline.evaluate import evaluate, index_corpus, load_beir
    from rag_pipeline.pipeline import default_budget
    from rag_pipeline.retrieve import DEFAULT_MODE
    from rag_pipeline.sparse import Bm25Encoder

    settings = _settings()
    settings = settings.model_copy(
        update={"collection": collection or f"{settings.collection}_eval"}
    )
    try:
        dataset = load_beir(dataset_dir, split)
    except FileNotFoundError as exc:
        fail(str(exc))
    embedder = make_embedder(settings)
    sparse = Bm25Encoder()
    book_id = "eval-" + "".join(c if c.isalnum() or c in "-_." else "-" for c in dataset.name)
    chosen = list(modes) or [DEFAULT_MODE]
    reports = []
    with opened_store(settings) as store, Progress(console=err, transient=True) as progress:
        task = progress.add_task(f"indexing {dataset.name}", total=len(dataset.corpus))
        index_corpus(
            store,
            book_id,
            dataset.corpus,
            embedder,
            default_budget(embedder),
            sparse,
            progress=lambda done, total: progress.update(task, completed=done, total=total),
        )
        progress.update(task, completed=len(dataset.corpus))
        for mode in chosen:
            qtask = progress.add_task(f"queries ({mode})", total=len(dataset.qrels))
            reports.append(
                evaluate(
                    store,
                    embedder,
                    dataset,
                    book_id,
                    mode=mode,
                    split=split,  # type: ignore[arg-type]
                    sparse=sparse,
                    rrf_k=rrf_k,
                    progress=lambda done, total, t=qtask: progress.update(t, completed=done),
                )
            )
    if as_json:
        emit_json(
            reports[0].as_dict() if len(reports) == 1 else {"runs": [r.as_dict() for r in reports]}
        )
        return
    table = Table(title=f"{dataset.name} ({split}, {embedder.model_name})", title_justify="left")
    for column in ("mode", "nDCG@10", "recall@10", "recall@100", "MRR@10", "queries", "s"):
        table.add_column(column, justify="right")
    for r in reports:
        table.add_row(
            r.mode,
            f"{r.ndcg_at_10:.4f}",
            f"{r.recall_at_10:.4f}",
            f"{r.recall_at_100:.4f}",
            f"{r.mrr_at_10:.4f}",
            str(r.queries),
            f"{r.seconds:.1f}",
        )
    out.print(table)


if __name__ == "__main__":
    main()

"""The ingestion assets, one partition per book: each calls one stage of the pipeline.

source_files -> documents -> chunks -> chunk_embeddings -> qdrant_points
   assess        parse       chunk        embed            write (check, switch)

The stages are :class:`rag_pipeline.ingest.pipeline.IngestPipeline`'s (the ``pipeline``
resource): an asset here only renders a stage's output as metadata, logs and check results. A
run materializes one book or a batch of them (a range of partitions, see
:mod:`rag_pipeline.ingest.batches`): each step hands the next its stage's output per book, and
records each book's metadata and checks on the book's own partition (:mod:`.batch`).
"""

import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypedDict

from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckKey,
    AssetChecksDefinition,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetsDefinition,
    Backoff,
    Config,
    DynamicPartitionsDefinition,
    Output,
    PreviewWarning,
    ResourceParam,
    RetryPolicy,
    asset,
    asset_check,
)
from pydantic import Field

from rag_pipeline.chunking import DEFAULT_CHUNKER
from rag_pipeline.defs.batch import (
    BookCheck,
    check_books,
    record_book,
    run_books,
)
from rag_pipeline.defs.book_metadata import (
    TABLE_ROWS,
    details,
    inventory_metadata,
    parsed_metadata,
    recipe_metadata,
    source_metadata,
    when,
    write_summary,
    written_table,
)
from rag_pipeline.defs.metadata import error_table, table
from rag_pipeline.defs.parse_check import parse_errors_again
from rag_pipeline.defs.partitions import book_partitions_def
from rag_pipeline.defs.runs import one_label, tag_checks, tag_migration, tag_run
from rag_pipeline.ingest.index import WriteReport
from rag_pipeline.ingest.pipeline import IngestPipeline, WrittenBook, held_back
from rag_pipeline.ingest.progress import ProgressLog
from rag_pipeline.ingest.report import BookResult
from rag_pipeline.ingest.stages import (
    BookInventory,
    ChunkedBook,
    EmbeddedBook,
    ParsedBook,
    rebuilt_reason,
)
from rag_pipeline.models import document_id
from rag_pipeline.retrieve.lineage import written_points_messages

__all__ = [
    "BOOK_CHECK_KEYS",
    "EMBEDDING_POOL",
    "INGESTION_GROUP",
    "NO_RUN_CONFIG",
    "PARSE_ERRORS",
    "STORE_POOL",
    "IngestRunConfig",
    "chunk_embeddings",
    "chunks",
    "documents",
    "ingestion_assets",
    "ingestion_checks",
    "qdrant_points",
    "source_files",
]

# Per-book checks (AssetCheckSpec(partitions_def=...)) are a preview feature this project relies
# on deliberately: that one warning is silenced here, every other warning still shows.
warnings.filterwarnings(
    "ignore",
    message=r"Specifying a partitions_def on an AssetCheckSpec",
    category=PreviewWarning,
)

INGESTION_GROUP = "ingestion"
OWNERS = ["team:data-platform"]
#: steps that read or write the store; one slot for the embedded stores (they lock a book's shard
#: or their whole folder to one process)
STORE_POOL = "qdrant_store"
#: embedding steps; its limit caps concurrent calls to a paid embedding API
EMBEDDING_POOL = "embedding_api"


#: the run config of a step that takes none: an empty schema, so the Launchpad refuses any
#: entry (without it Dagster accepts and ignores anything, such as a chunk budget)
NO_RUN_CONFIG: dict[str, Any] = {}


class _BookAsset(TypedDict):
    partitions_def: DynamicPartitionsDefinition
    group_name: str
    owners: list[str]


#: what every per-book asset is: a partition per book, in the ingestion group, the team's
BOOK_ASSET = _BookAsset(
    partitions_def=book_partitions_def, group_name=INGESTION_GROUP, owners=OWNERS
)
#: transient failures of a step (a store busy past its wait, an API outage) retried in place
STEP_RETRY = RetryPolicy(max_retries=2, delay=5, backoff=Backoff.EXPONENTIAL)


#: what every per-book asset's page says about what Dagster OSS draws (after the first
#: paragraph: the asset graph shows that alone)
READING_THE_COLOURS = (
    "Reading this asset's colours (Dagster OSS): a green partition is a book whose run "
    "succeeded, not a book whose every file parsed: broken files show as the documents "
    "asset's parse_errors check (yellow ⚠), the run's rag/checks=warned tag and "
    "qdrant_collection's health column. While a book is being re-run its partition does not "
    'count as materialized, so "N% filled" dips during a healthy run and is back when it '
    "ends. A purged book's partition is removed, but this page may still front that book's "
    "last materialization until another book is materialized (OSS cannot wipe one partition's "
    "history); the purge is an observation in the Events tab."
)


@dataclass(frozen=True)
class BookCheckSpec:
    """A check of one book's partition of the asset it is declared on (its result is kept
    per book)."""

    name: str
    description: str
    blocking: bool = False


def book_asset(
    *,
    kinds: set[str],
    description: str,
    check: BookCheckSpec | None = None,
    pool: str | None = None,
    retry: bool = False,
    code_version: str = "2",
    run_config: bool = False,
) -> Callable[[Callable[..., Any]], AssetsDefinition]:
    """What every per-book asset is (:data:`BOOK_ASSET`), with its kinds, description, check,
    pool and :data:`STEP_RETRY` (``retry``); an empty run config unless it takes one
    (``run_config``: the Launchpad refuses any entry, see :data:`NO_RUN_CONFIG`)."""

    def decorate(fn: Callable[..., Any]) -> AssetsDefinition:
        specs = (
            [
                AssetCheckSpec(
                    check.name,
                    asset=fn.__name__,
                    partitions_def=book_partitions_def,
                    blocking=check.blocking,
                    description=check.description,
                )
            ]
            if check is not None
            else []
        )
        return asset(
            **BOOK_ASSET,
            kinds=kinds,
            code_version=code_version,
            pool=pool,
            retry_policy=STEP_RETRY if retry else None,
            description=f"{description}\n\n{READING_THE_COLOURS}",
            check_specs=specs,
            config_schema=None if run_config else NO_RUN_CONFIG,
        )(fn)

    return decorate


class IngestRunConfig(Config):
    """Per-run choices. What defines the index (chunk budget, model) is deployment
    configuration, set in the environment, never here."""

    force: bool = Field(
        default=False,
        description="rebuild every file of the book and embed every chunk again, whatever "
        "the index says",
    )


#: what one step hands the next: its stage's output for each book of the run, in partition order
Books = dict[str, Any]


@book_asset(
    kinds={"markdown", "qdrant"},
    pool=STORE_POOL,
    run_config=True,
    description="Markdown files of the book on disk (path, size, sha256, module/chapter/lesson "
    "from the path) and what each needs compared with the index: new, modified, unchanged, "
    "deleted or unreadable (kept). The index state is read from Qdrant payloads; there is no "
    "other state store.",
)
def source_files(
    context: AssetExecutionContext,
    config: IngestRunConfig,
    pipeline: ResourceParam[IngestPipeline],
) -> Output[dict[str, BookInventory]]:
    book_ids = run_books(context)
    tag_run(context, book_ids)
    assessed = pipeline.assess(book_ids, force=config.force)
    migrations: list[str] = []
    for book_id, book in assessed.items():
        if book.damage is not None:
            context.log.warning(f"{book_id}: {rebuilt_reason(book.damage)}")
        if book.build.label is not None:
            migrations.append(book.build.label)
            context.log.info(
                f"{book_id}: recipe change {book.build.label}: the book is built beside its "
                "searched index" + (" (resuming the pending build)" if book.build.resumed else "")
            )
        for error in book.inventory.crawl_errors:
            context.log.warning(str(error))
        record_book(
            context,
            book_id,
            {**inventory_metadata(book), **source_metadata(pipeline.source, book.inventory)},
        )
    if migrations:
        tag_migration(context, one_label(migrations))
    return Output({book_id: book.inventory for book_id, book in assessed.items()})


@book_asset(
    kinds={"markdown"},
    description="New and modified files parsed: frontmatter split off and normalized (title, "
    "module, chapter, lesson, hardware tier, proficiency level, tags), sha256 of the bytes "
    "parsed. A file that cannot be read or parsed is an error record naming the reason (its "
    "last good chunks stay); the rest of the book goes on.",
)
def documents(
    context: AssetExecutionContext,
    pipeline: ResourceParam[IngestPipeline],
    source_files: dict[str, BookInventory],
) -> Iterator[Output[dict[str, ParsedBook]] | Output[None] | AssetCheckEvaluation]:
    parsed_books = pipeline.parse(source_files)
    checks: dict[str, BookCheck] = {}
    for book_id, parsed in parsed_books.items():
        for error in parsed.errors:
            context.log.warning(str(error))
        for warning in parsed.warnings:
            context.log.warning(f"{parsed.book_id}/{warning}")
        metadata, checks[book_id] = parsed_metadata(parsed)
        if not checks[book_id].passed:
            tag_checks(context, "warned")
            # Dagster OSS's run log draws any check that did not pass as a red "Check ...
            # failed" row, whatever its severity: this line says what the result is
            context.log.warning(f"{book_id}: parse_errors {checks[book_id].description}")
        record_book(context, book_id, metadata)
    yield Output(parsed_books)
    yield from check_books(context, PARSE_ERRORS.name, checks)


#: broken or empty files of a book. Its results come from the documents step (which parses),
#: but it is declared apart from the asset so that runs of the ingest job do not plan it: a
#: planned check is "in progress" with no severity, which Dagster OSS's asset graph draws as a
#: red ✕ while any book has failed it, even with WARN severity and during a healthy run.
PARSE_ERRORS = AssetCheckKey(documents.key, "parse_errors")


#: what the parse_errors results mean, where the UI shows the check
PARSE_ERRORS_DESCRIPTION = (
    "Warns (yellow, never red: WARN severity) with the file names when files of the book fail "
    "to parse or are empty. Its result is written by each run's documents step, for every "
    "book of the run; the run itself still succeeds and its other files are indexed, so the "
    "partition bar stays green for such a book (Dagster OSS has no colour for a materialized "
    "partition with warnings): this check, the run's rag/checks=warned tag and "
    "qdrant_collection's problems say which books have broken files. Executing the check on "
    "its own evaluates the book's latest documents materialization again."
)


# Dagster types a check's function as returning one AssetCheckResult, which in a run of
# several books is recorded for no partition: this one yields an evaluation per book.
@asset_check(  # type: ignore[arg-type]
    asset=documents,
    name=PARSE_ERRORS.name,
    partitions_def=book_partitions_def,
    description=PARSE_ERRORS_DESCRIPTION,
)
def parse_errors(
    context: AssetCheckExecutionContext,
) -> Iterator[Output[None] | AssetCheckEvaluation]:
    """The check run on its own (the UI's Execute, a Materialize that selects it): each book's
    latest documents materialization evaluated again, from what its parse recorded."""
    books = list(context.op_execution_context.partition_keys)
    yield Output(None)
    yield from parse_errors_again(context.instance, PARSE_ERRORS, books)


@book_asset(
    kinds={"python"},
    code_version=DEFAULT_CHUNKER.version,  # what every recipe's signature records
    description="Heading-aware chunks of the parsed documents: split on headings, packed to "
    "a token budget measured with the embedder's own tokenizer (never above its input limit), "
    "with overlap, no split inside code fences or tables, content-hash ids and prev/next links. "
    "A file whose chunks break an invariant is an error of that file alone.",
    check=BookCheckSpec(
        "chunks_valid",
        "Blocks embedding and publishing when a chunk is empty, over the token limit, "
        "duplicated, or its prev/next chain is broken.",
        blocking=True,
    ),
)
def chunks(
    context: AssetExecutionContext,
    pipeline: ResourceParam[IngestPipeline],
    documents: dict[str, ParsedBook],
) -> Iterator[Output[dict[str, ChunkedBook]] | Output[None] | AssetCheckEvaluation]:
    chunked_books = pipeline.chunk(documents)
    checks: dict[str, BookCheck] = {}
    for book_id, chunked in chunked_books.items():
        stats = chunked.token_stats()
        chunk_errors = [e for e in chunked.errors if e.stage == "chunk"]
        record_book(
            context,
            book_id,
            {
                "chunks": len(chunked.chunks),
                "tokens_total": stats["total"],
                "tokens_mean": stats["mean"],
                "tokens_max": stats["max"],
                "token_limit": pipeline.recipe_of(chunked.inventory).budget.limit,
                "seconds": round(chunked.seconds, 3),
                **when(bool(chunk_errors), chunk_errors=error_table(chunk_errors)),
            },
        )
        problems = list(chunked.problems)
        checks[book_id] = BookCheck(
            passed=not problems,
            metadata={"problems": len(problems), **details(problems)},
        )
    yield Output(chunked_books)
    yield from check_books(context, "chunks_valid", checks)


@book_asset(
    kinds={"python"},
    pool=EMBEDDING_POOL,
    retry=True,
    description="Dense vectors (the configured embedder) and BM25 sparse vectors for every "
    "chunk. Text already in the index with the same model is not embedded again: its vector "
    "is reused, so only new text reaches the embedder. The books of one run are embedded in "
    "one pass (sorted by length together).",
    check=BookCheckSpec(
        "vector_dimension",
        "Blocks publishing unless every vector has the model's dimension, which must also be "
        "the collection's, and is finite and unit length.",
        blocking=True,
    ),
)
def chunk_embeddings(
    context: AssetExecutionContext,
    pipeline: ResourceParam[IngestPipeline],
    chunks: dict[str, ChunkedBook],
) -> Iterator[Output[dict[str, EmbeddedBook]] | Output[None] | AssetCheckEvaluation]:
    progress = ProgressLog("embedding", context.log.info)
    embedded_books = pipeline.embed(chunks, progress=progress, say=context.log.info)
    checks: dict[str, BookCheck] = {}
    for book_id, embedded in embedded_books.items():
        rate = embedded.embedded / embedded.embed_seconds if embedded.embed_seconds > 0 else 0.0
        record_book(
            context,
            book_id,
            {
                "model": embedded.model,
                "chunks_embedded": embedded.embedded,
                "chunks_reused": embedded.reused,
                "embedder_tokens": embedded.tokens,
                "cost_usd_estimate": round(embedded.cost_usd, 6),
                "embed_seconds": round(embedded.embed_seconds, 3),
                "chunks_per_second": round(rate, 1),
            },
        )
        held = embedded.index_dimension
        checks[book_id] = BookCheck(
            passed=not embedded.problems,
            metadata={
                "model_dimension": int(embedded.dense.shape[1]),
                "collection_dimension": held if held is not None else -1,
                **details(list(embedded.problems)),
            },
            # the reason the run's failure names (a blocking check's own error says only
            # which check failed)
            description="; ".join(embedded.problems) or None,
        )
    yield Output(embedded_books)
    yield from check_books(context, "vector_dimension", checks)


@book_asset(
    kinds={"qdrant"},
    pool=STORE_POOL,
    retry=True,
    description="The book's points in the Qdrant collection (book_id is the tenant key). New "
    "points are upserted first, points they replace are deleted after, and per-file document "
    "records are committed last, so the book stays searchable and a re-run converges.",
    check=BookCheckSpec(
        "index_consistency",
        "Points in Qdrant == chunks the document records promise; no orphan points, no "
        "duplicate chunk positions, every prev/next id resolves, vector dimension matches the "
        "model.",
    ),
)
def qdrant_points(
    context: AssetExecutionContext,
    pipeline: ResourceParam[IngestPipeline],
    chunks: dict[str, ChunkedBook],
    chunk_embeddings: dict[str, EmbeddedBook],
) -> Iterator[Output[dict[str, BookResult]] | Output[None] | AssetCheckEvaluation]:
    written = pipeline.write(chunks, chunk_embeddings, run_id=context.run.run_id)
    results: dict[str, BookResult] = {}
    checks: dict[str, BookCheck] = {}
    for book_id, book in written.items():
        results[book_id] = book.result
        source = source_metadata(pipeline.source, chunks[book_id].inventory)
        checks[book_id] = _written_book(
            context, chunks[book_id], chunk_embeddings[book_id], book, source
        )
    yield Output(results)
    yield from check_books(context, "index_consistency", checks)


def _written_book(
    context: AssetExecutionContext,
    chunked: ChunkedBook,
    embedded: EmbeddedBook,
    book: WrittenBook,
    source: dict[str, Any],
) -> BookCheck:
    """The book's metadata of the write step (logged and recorded), and its check."""
    book_id = chunked.book_id
    if book.written is None or book.consistency is None or book.switch is None:
        # removed while this run read and embedded it: its purge deletes the book; the run
        # ends cleanly instead of retrying
        message = book.result.error_messages[0]
        context.log.warning(message)
        record_book(
            context, book_id, {"summary": message, "points_upserted": 0, "points_deleted": 0}
        )
        return BookCheck(
            passed=True,
            metadata={"skipped": "the book folder was removed; its purge empties the book"},
        )
    written, consistency = book.written, book.consistency
    problems = consistency.problems()
    if problems:
        tag_checks(context, "failed")
    for reason in book.switch.held_back:
        context.log.warning(held_back(book_id, reason))
    deleted_rows = [{"point id": i, "file": f} for i, f in written.deleted_points]
    _log_written_points(context, chunked, written)
    record_book(
        context,
        book_id,
        {
            "summary": write_summary(chunked, embedded, written, consistency.points),
            "points_written": written_table(chunked, written),
            "points_upserted": written.upserted,
            "points_deleted": written.deleted,
            "document_records": written.documents,
            "points_in_book": consistency.points,
            "embedding_model": book.embedding_model,
            **when(bool(deleted_rows), points_deleted_list=table(deleted_rows, TABLE_ROWS)),
            **recipe_metadata(book.recipe_before, book.switch),
            **source,
        },
    )
    return BookCheck(
        passed=consistency.passed,
        metadata={
            "points": consistency.points,
            "expected": consistency.expected,
            "documents": consistency.documents,
            "problems": len(problems),
            **details(problems),
        },
    )


def _log_written_points(
    context: AssetExecutionContext, chunked: ChunkedBook, written: WriteReport
) -> None:
    """Log every point the run wrote (chunks and document records), each on a short line with
    its file and section: the run page's log filter, given a point id, shows a message of a
    few lines, its line among them, for runs of any size (the ``points_written`` table shows
    a few)."""
    book_id = chunked.book_id
    ids = set(written.written_ids)
    points = [(c.id, c.source_file, c.section_title or "") for c in chunked.chunks if c.id in ids]
    documents = [(o.source_file, document_id(book_id, o.source_file)) for o in chunked.outcomes]
    for message in written_points_messages(book_id, points, documents):
        context.log.info(message)


ingestion_assets = [source_files, documents, chunks, chunk_embeddings, qdrant_points]
#: the per-book checks declared apart from their asset (see :data:`PARSE_ERRORS`)
ingestion_checks: list[AssetChecksDefinition] = [parse_errors]
#: every per-book check, in the order of the assets
BOOK_CHECK_KEYS = (
    PARSE_ERRORS,
    *(key for a in ingestion_assets for key in sorted(a.check_keys, key=lambda k: k.name)),
)

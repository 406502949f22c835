"""The ingestion assets, one partition per book: thin calls into :mod:`rag_pipeline.ingest`.

source_files -> documents -> chunks -> chunk_embeddings -> qdrant_points

Each step opens the store only for its own reads or writes, so a search or another process
gets in while a step parses or embeds.
"""

import warnings
from collections.abc import Iterator
from typing import Any, TypedDict

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    Backoff,
    Config,
    DynamicPartitionsDefinition,
    MetadataValue,
    Output,
    PreviewWarning,
    ResourceParam,
    RetryPolicy,
    TableMetadataValue,
    asset,
)
from pydantic import Field

from rag_pipeline.chunk import CHUNKER_VERSION
from rag_pipeline.config import SourceConfig
from rag_pipeline.defs.metadata import error_table, shorten, table
from rag_pipeline.defs.partitions import book_partitions_def
from rag_pipeline.defs.runs import tag_checks, tag_migration, tag_run
from rag_pipeline.ingest.collection import book_summary
from rag_pipeline.ingest.consistency import check_chunks, check_index, check_vectors
from rag_pipeline.ingest.crawl import path_is_gone
from rag_pipeline.ingest.index import WriteReport
from rag_pipeline.ingest.migration import SwitchOutcome, finish_build, start_build
from rag_pipeline.ingest.progress import ProgressLog
from rag_pipeline.ingest.report import BookResult
from rag_pipeline.ingest.stages import (
    BookInventory,
    ChunkedBook,
    EmbeddedBook,
    ParsedBook,
    book_result,
    chunk_book,
    embed_book,
    parse_book,
    take_inventory,
    vectors_to_reuse,
    write_book,
)
from rag_pipeline.resources import LazyRecipe, StoreOpener

__all__ = [
    "EMBEDDING_POOL",
    "INGESTION_GROUP",
    "NO_RUN_CONFIG",
    "STORE_POOL",
    "IngestRunConfig",
    "chunk_embeddings",
    "chunks",
    "documents",
    "ingestion_assets",
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
#: steps that read or write the store; one slot for the embedded stores (they lock their folder)
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


def book_check(
    name: str, *, asset: str, description: str, blocking: bool = False
) -> AssetCheckSpec:
    """A check of one book's partition of ``asset`` (its result is kept per book)."""
    return AssetCheckSpec(
        name,
        asset=asset,
        partitions_def=book_partitions_def,
        blocking=blocking,
        description=description,
    )


class IngestRunConfig(Config):
    """Per-run choices. What defines the index (chunk budget, model) is deployment
    configuration, set in the environment, never here."""

    force: bool = Field(
        default=False,
        description="rebuild every file of the book and embed every chunk again, whatever "
        "the index says",
    )


@asset(
    **BOOK_ASSET,
    kinds={"markdown", "qdrant"},
    code_version="2",
    pool=STORE_POOL,
    description="Markdown files of the book on disk (path, size, sha256, module/chapter/lesson "
    "from the path) and what each needs compared with the index: new, modified, unchanged, "
    "deleted or unreadable (kept). The index state is read from Qdrant payloads; there is no "
    "other state store.",
)
def source_files(
    context: AssetExecutionContext,
    config: IngestRunConfig,
    books: ResourceParam[SourceConfig],
    qdrant: ResourceParam[StoreOpener],
    recipe: ResourceParam[LazyRecipe],
) -> Output[BookInventory]:
    tag_run(context, context.partition_key)
    with qdrant.open() as store:  # a reader: the recipe the book is searched with now
        book_recipe = recipe.for_book(store, context.partition_key).recipe
        build = start_build(store, context.partition_key, book_recipe)
    if build.label is not None:
        tag_migration(context, build.label)
        context.log.info(
            f"recipe change {build.label}: the book is built beside its searched index"
            + (" (resuming the pending build)" if build.resumed else "")
        )
    # the run's handles build its recipe: a recipe change reads its pending build
    with qdrant.open(recipe=book_recipe) as store:
        inventory = take_inventory(
            books, context.partition_key, store, book_recipe, force=config.force
        )
    changes = inventory.changes
    status = changes.statuses()
    rows = [
        {
            "file": f.source_file,
            "status": status[f.source_file],
            "why": changes.reasons.get(f.source_file, ""),
            "bytes": f.size,
            "module": f.path_meta.module or "",
            "chapter": "" if f.path_meta.chapter is None else f.path_meta.chapter,
            "lesson": "" if f.path_meta.lesson is None else f.path_meta.lesson,
        }
        for f in inventory.files
    ]
    rows += [
        {"file": name, "status": status[name], "why": changes.reasons.get(name, "")}
        for name in (*changes.deleted, *changes.unreadable)
    ]
    rows.sort(key=lambda row: row["status"] == "unchanged")  # what changed comes first
    for error in inventory.crawl_errors:
        context.log.warning(str(error))
    return Output(
        inventory,
        metadata={
            "files": len(inventory.files),
            **changes.counts(),
            "crawl_errors": len(inventory.crawl_errors),
            "bytes": sum(f.size for f in inventory.files),
            "indexed_chunk_points": inventory.state.chunk_points,
            "forced": inventory.reembed,
            "recipe": book_recipe.embedding_model,
            "signature": book_recipe.signature,
            "migration": build.label or "none",
            "migration_resumed": build.resumed,
            "files_table": table(rows, limit=40),
            "errors": error_table(inventory.crawl_errors),
        },
    )


@asset(
    **BOOK_ASSET,
    config_schema=NO_RUN_CONFIG,
    kinds={"markdown"},
    code_version="2",
    description="New and modified files parsed: frontmatter split off and normalized (title, "
    "module, chapter, lesson, hardware tier, proficiency level, tags), sha256 of the bytes "
    "parsed. A file that cannot be read or parsed is an error record naming the reason (its "
    "last good chunks stay); the rest of the book goes on.",
    check_specs=[
        book_check(
            "parse_errors",
            asset="documents",
            description="Warns with the file names when files fail to parse or are empty.",
        )
    ],
)
def documents(
    context: AssetExecutionContext, books: ResourceParam[SourceConfig], source_files: BookInventory
) -> Iterator[Output[ParsedBook] | AssetCheckResult]:
    parsed = parse_book(source_files, books)
    rows = [
        {
            "file": d.source_file,
            "title": shorten(d.meta.title, 60),
            "proficiency": d.meta.proficiency_level or "",
            "tier": "" if d.meta.hardware_tier is None else d.meta.hardware_tier,
            "chars": len(d.body),
            "warnings": len(d.warnings),
        }
        for d in parsed.documents
    ]
    for error in parsed.errors:
        context.log.warning(str(error))
    for warning in parsed.warnings:
        context.log.warning(f"{parsed.book_id}/{warning}")
    # the check covers the whole book: files that stay broken or empty are reported every run
    all_errors = parsed.errors + parsed.standing_errors
    all_empty = parsed.empty_documents + parsed.standing_empty_documents
    files = len(parsed.inventory.files)
    error_rate = round(len(all_errors) / files, 4) if files else 0.0
    empty_list = MetadataValue.md("\n".join(f"- {n}" for n in all_empty) or "(none)")
    if all_errors or all_empty:
        tag_checks(context, "warned")
    warnings = MetadataValue.md("\n".join(f"- {w}" for w in parsed.warnings[:50]) or "(none)")
    yield Output(
        parsed,
        metadata={
            "parsed": len(parsed.documents),
            "errors": len(parsed.errors),
            "book_errors": len(all_errors),
            "error_rate": error_rate,
            "empty_documents": len(all_empty),
            "warnings": len(parsed.warnings),
            "empty_files": empty_list,
            "warning_list": warnings,
            "error_table": error_table(all_errors),
            "documents": table(rows),
        },
    )
    yield AssetCheckResult(
        check_name="parse_errors",
        passed=not all_errors and not all_empty,
        severity=AssetCheckSeverity.WARN,
        metadata={
            "error_rate": error_rate,
            "errors": len(all_errors),
            "new_errors": len(parsed.errors),
            "empty_documents": len(all_empty),
            "files": error_table(all_errors),
            "empty_files": empty_list,
        },
    )


@asset(
    **BOOK_ASSET,
    config_schema=NO_RUN_CONFIG,
    kinds={"python"},
    code_version=CHUNKER_VERSION,
    description="Heading-aware chunks of the parsed documents: split on headings, packed to "
    "a token budget measured with the embedder's own tokenizer (never above its input limit), "
    "with overlap, no split inside code fences or tables, content-hash ids and prev/next links. "
    "A file whose chunks break an invariant is an error of that file alone.",
    check_specs=[
        book_check(
            "chunks_valid",
            asset="chunks",
            blocking=True,
            description="Blocks embedding and publishing when a chunk is empty, over the token "
            "limit, duplicated, or its prev/next chain is broken.",
        )
    ],
)
def chunks(
    context: AssetExecutionContext, recipe: ResourceParam[LazyRecipe], documents: ParsedBook
) -> Iterator[Output[ChunkedBook] | AssetCheckResult]:
    index_recipe = recipe.for_model(documents.inventory.embedding_model)  # the book's recipe
    chunked = chunk_book(documents, index_recipe)
    stats = chunked.token_stats()
    rows = [
        {
            "#": c.chunk_index,
            "file": c.source_file,
            "section": shorten(c.section_title or "", 40),
            "tokens": c.token_count,
            # its size, not its text: chunk text lives in Qdrant only, never in the
            # instance's event log (search or `rag-pipeline document` shows it)
            "chars": len(c.text),
        }
        for c in chunked.chunks[:20]
    ]
    yield Output(
        chunked,
        metadata={
            "chunks": len(chunked.chunks),
            "documents": len({c.parent_doc_id for c in chunked.chunks}),
            "tokens_total": stats["total"],
            "tokens_mean": stats["mean"],
            "tokens_p95": stats["p95"],
            "tokens_max": stats["max"],
            "token_limit": index_recipe.budget.limit,
            "target_tokens": index_recipe.budget.target,
            "chunk_errors": error_table([e for e in chunked.errors if e.stage == "chunk"]),
            "seconds": round(chunked.seconds, 3),
            "preview": table(rows),
        },
    )
    problems = check_chunks(chunked.chunks, index_recipe.budget.limit)
    yield AssetCheckResult(
        check_name="chunks_valid",
        passed=not problems,
        metadata={
            "problems": len(problems),
            "details": MetadataValue.md("\n".join(f"- {p}" for p in problems[:50]) or "(none)"),
        },
    )


@asset(
    **BOOK_ASSET,
    config_schema=NO_RUN_CONFIG,
    kinds={"python"},
    code_version="2",
    pool=EMBEDDING_POOL,
    retry_policy=STEP_RETRY,
    description="Dense vectors (the configured embedder) and BM25 sparse vectors for every "
    "chunk. Text already in the index with the same model is not embedded again: its vector "
    "is reused, so only new text reaches the embedder.",
    check_specs=[
        book_check(
            "vector_dimension",
            asset="chunk_embeddings",
            blocking=True,
            description="Blocks publishing unless every vector has the model's dimension, which "
            "must also be the collection's, and is finite and unit length.",
        )
    ],
)
def chunk_embeddings(
    context: AssetExecutionContext,
    recipe: ResourceParam[LazyRecipe],
    qdrant: ResourceParam[StoreOpener],
    chunks: ChunkedBook,
) -> Iterator[Output[EmbeddedBook] | AssetCheckResult]:
    index_recipe = recipe.for_model(chunks.inventory.embedding_model)
    with qdrant.open(recipe=index_recipe) as store:
        reuse = vectors_to_reuse(chunks, index_recipe, store)
        collection_dim = store.dimension_of(context.partition_key)
    todo = len(chunks.chunks) - sum(1 for c in chunks.chunks if c.content_hash in reuse)
    context.log.info(
        f"{len(chunks.chunks)} chunks: {len(chunks.chunks) - todo} already indexed, "
        f"{todo} to embed with {index_recipe.embedding_model}"
    )
    progress = ProgressLog("embedding", context.log.info)
    embedded = embed_book(chunks, index_recipe, reuse, progress)
    rate = embedded.embedded / embedded.embed_seconds if embedded.embed_seconds > 0 else 0.0
    yield Output(
        embedded,
        metadata={
            "model": embedded.model,
            "dimension": int(embedded.dense.shape[1]),
            "chunks_embedded": embedded.embedded,
            "chunks_reused": embedded.reused,
            "embedder_tokens": embedded.tokens,
            "cost_usd_estimate": round(embedded.cost_usd, 6),
            "seconds": round(embedded.seconds, 3),
            "embed_seconds": round(embedded.embed_seconds, 3),
            "chunks_per_second": round(rate, 1),
        },
    )
    problems = check_vectors(embedded.dense, index_recipe.dimension, collection_dim)
    yield AssetCheckResult(
        check_name="vector_dimension",
        passed=not problems,
        metadata={
            "model_dimension": index_recipe.dimension,
            "collection_dimension": collection_dim if collection_dim is not None else -1,
            "details": MetadataValue.md("\n".join(f"- {p}" for p in problems) or "(none)"),
        },
    )


@asset(
    **BOOK_ASSET,
    config_schema=NO_RUN_CONFIG,
    kinds={"qdrant"},
    code_version="2",
    pool=STORE_POOL,
    retry_policy=STEP_RETRY,
    description="The book's points in the Qdrant collection (book_id is the tenant key). New "
    "points are upserted first, points they replace are deleted after, and per-file document "
    "records are committed last, so the book stays searchable and a re-run converges.",
    check_specs=[
        book_check(
            "index_consistency",
            asset="qdrant_points",
            description="Points in Qdrant == chunks the document records promise; no orphan "
            "points, no duplicate chunk positions, every prev/next id resolves, vector dimension "
            "matches the model.",
        )
    ],
)
def qdrant_points(
    context: AssetExecutionContext,
    recipe: ResourceParam[LazyRecipe],
    qdrant: ResourceParam[StoreOpener],
    books: ResourceParam[SourceConfig],
    chunks: ChunkedBook,
    chunk_embeddings: EmbeddedBook,
) -> Iterator[Output[BookResult] | AssetCheckResult]:
    index_recipe = recipe.for_model(chunks.inventory.embedding_model)
    lineage = index_recipe.lineage(context.run.run_id, chunk_embeddings.sparse_model)
    with qdrant.open(recipe=index_recipe) as store:
        if path_is_gone(books.data_dir, context.partition_key):
            # removed while this run read and embedded it: writing now would bring back points
            # its purge deletes (or already deleted); the run ends cleanly instead of retrying
            yield from _book_removed_during_run(context)
            return
        written = write_book(store, chunks, chunk_embeddings, lineage)
        consistency = check_index(store, context.partition_key, index_recipe.dimension)
    result = book_result(chunks, chunk_embeddings, written, consistency)
    problems = consistency.problems()
    if problems:
        tag_checks(context, "failed")
    with qdrant.open() as store:  # a reader: the switch decision is finish_build's
        before = store.current_recipe(context.partition_key)
        switch = finish_build(
            store,
            context.partition_key,
            failed_files=_failed_files(chunks),
            checks_passed=consistency.passed,
            recipe=index_recipe.tag(),
            keep_old=qdrant.config.keep_old_recipe,
        )
        if switch.switched:  # the new generation's catalog entry: plans need not open it
            store.save_summary(context.partition_key, book_summary(store, context.partition_key))
    for reason in switch.held_back:
        message = f"{context.partition_key}: the new recipe's build stays pending: {reason}"
        context.log.warning(message)
        result.warnings.append(message)
    yield Output(
        result,
        metadata={
            "summary": _summary(chunks, chunk_embeddings, written, consistency.points),
            "points_written": _written_table(chunks, written),
            "points_deleted_list": table(
                [{"point id": i, "file": f} for i, f in written.deleted_points],
                limit=LINEAGE_ROWS,
            ),
            "points_upserted": written.upserted,
            "points_deleted": written.deleted,
            "document_records": written.documents,
            "points_in_book": consistency.points,
            "collection": qdrant.collection,
            "store": qdrant.description,
            "embedding_model": lineage.embedding_model,
            "signature": lineage.signature,
            **_recipe_metadata(before, switch),
        },
    )
    yield AssetCheckResult(
        check_name="index_consistency",
        passed=consistency.passed,
        metadata={
            "points": consistency.points,
            "expected": consistency.expected,
            "documents": consistency.documents,
            "problems": len(problems),
            "details": MetadataValue.md("\n".join(f"- {p}" for p in problems[:50]) or "(none)"),
        },
    )


def _failed_files(chunked: ChunkedBook) -> set[str]:
    """Files that failed in this run (read, parse, chunk, crawl): a new build lacks their
    chunks, which the old index may still serve."""
    failed = {o.source_file for o in chunked.outcomes if o.status == "error"}
    return failed | {e.source_file for e in chunked.inventory.crawl_errors}


def _recipe_metadata(before: dict[str, str] | None, switch: SwitchOutcome) -> dict[str, Any]:
    """The recipe change of the run: the recipe searched before, what became of the build."""
    return {
        "recipe_before": (before or {}).get("embedding_model", "untagged"),
        "signature_before": (before or {}).get("signature", ""),
        "recipe_build": switch.state,
        "recipe_held_back": MetadataValue.md(
            "\n".join(f"- {r}" for r in switch.held_back) or "(none)"
        ),
    }


#: how many written or deleted points a run lists in its metadata (the totals are exact)
LINEAGE_ROWS = 100


def _book_removed_during_run(
    context: AssetExecutionContext,
) -> Iterator[Output[BookResult] | AssetCheckResult]:
    book_id = context.partition_key
    message = f"book folder {book_id!r} was removed during this run: nothing written"
    context.log.warning(message)
    yield Output(
        BookResult(book_id, "missing", error_messages=[message]),
        metadata={"summary": message, "points_upserted": 0, "points_deleted": 0},
    )
    yield AssetCheckResult(
        check_name="index_consistency",
        passed=True,
        metadata={"skipped": "the book folder was removed; its purge empties the book"},
    )


def _summary(
    chunked: ChunkedBook, embedded: EmbeddedBook, written: WriteReport, points: int
) -> str:
    if not chunked.inventory.changes.has_work:
        return f"{points} chunks already indexed, 0 embedded: nothing changed"
    return (
        f"{written.upserted} chunk points written ({embedded.embedded} embedded, "
        f"{embedded.reused} vectors reused), {written.deleted} points deleted; "
        f"{points} chunk points in the book"
    )


def _written_table(chunked: ChunkedBook, written: WriteReport) -> TableMetadataValue:
    """Which points this run wrote: search a point id here to find the run that wrote it."""
    rows = [
        {
            "point id": c.id,
            "file": c.source_file,
            "section": shorten(c.section_title or "", 40),
            "content hash": c.content_hash[:12],
        }
        for c in chunked.chunks
    ]
    return table(rows, limit=LINEAGE_ROWS)


ingestion_assets = [source_files, documents, chunks, chunk_embeddings, qdrant_points]

"""The ingestion assets, one partition per book: thin calls into :mod:`rag_pipeline.ingest`.

source_files -> documents -> chunks -> chunk_embeddings -> qdrant_points

A run materializes one book or a batch of them (a range of partitions, see
:mod:`rag_pipeline.ingest.batches`): each step hands the next its stage's output per book, and
records each book's metadata and checks on the book's own partition (:mod:`.batch`). Each step
opens the store only for its own reads or writes, one book at a time, so a search or another
process gets in while a step parses or embeds.
"""

import warnings
from collections.abc import Iterator
from typing import Any, TypedDict

from dagster import (
    AssetCheckEvaluation,
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
from rag_pipeline.defs.batch import BookCheck, check_books, record_book, run_books
from rag_pipeline.defs.metadata import error_table, shorten, table
from rag_pipeline.defs.partitions import book_partitions_def
from rag_pipeline.defs.runs import one_label, tag_checks, tag_migration, tag_run
from rag_pipeline.ingest.consistency import check_chunks, check_vectors
from rag_pipeline.ingest.index import WriteReport
from rag_pipeline.ingest.migration import BuildStart, SwitchOutcome, start_build
from rag_pipeline.ingest.progress import ProgressLog
from rag_pipeline.ingest.report import BookResult
from rag_pipeline.ingest.stages import (
    BookInventory,
    ChunkedBook,
    EmbeddedBook,
    ParsedBook,
    book_result,
    chunk_book,
    discard_if_damaged,
    embed_books,
    finish_book,
    parse_book,
    rebuilt_reason,
    take_inventory,
    vectors_to_reuse,
    write_and_check,
)
from rag_pipeline.recipes.recipe import IndexRecipe
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


#: what one step hands the next: its stage's output for each book of the run, in partition order
Books = dict[str, Any]


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
) -> Output[dict[str, BookInventory]]:
    book_ids = run_books(context)
    tag_run(context, book_ids)
    inventories: dict[str, BookInventory] = {}
    migrations: list[str] = []
    for book_id in book_ids:
        with qdrant.open() as store:  # a reader: the recipe the book is searched with now
            damage = discard_if_damaged(store, book_id)
            book_recipe = recipe.for_book(store, book_id).recipe
            build = start_build(store, book_id, book_recipe)
        if damage is not None:
            context.log.warning(f"{book_id}: {rebuilt_reason(damage)}")
        if build.label is not None:
            migrations.append(build.label)
            context.log.info(
                f"{book_id}: recipe change {build.label}: the book is built beside its searched "
                "index" + (" (resuming the pending build)" if build.resumed else "")
            )
        # the run's handles build its recipe: a recipe change reads its pending build
        with qdrant.open(recipe=book_recipe) as store:
            inventory = take_inventory(
                books, book_id, store, book_recipe, force=config.force, damage=damage
            )
        for error in inventory.crawl_errors:
            context.log.warning(str(error))
        record_book(context, book_id, _inventory_metadata(inventory, book_recipe, build))
        inventories[book_id] = inventory
    if migrations:
        tag_migration(context, one_label(migrations))
    return Output(inventories)


def _inventory_metadata(
    inventory: BookInventory, book_recipe: IndexRecipe, build: BuildStart
) -> dict[str, Any]:
    changes = inventory.changes
    status = changes.statuses()
    changed = [name for name, st in status.items() if st != "unchanged"]
    rows = [
        {"file": name, "status": status[name], "why": changes.reasons.get(name, "")}
        for name in sorted(changed)
    ]
    return {
        "files": len(inventory.files),
        **{k: v for k, v in changes.counts().items() if k != "files_unchanged"},
        "indexed_chunk_points": inventory.state.chunk_points,
        "recipe": book_recipe.embedding_model,
        "files_table": table(rows, limit=TABLE_ROWS),
        **when(
            inventory.reembed,
            forced=True,
        ),
        **when(
            build.label is not None,
            migration=build.label or "",
            migration_resumed=build.resumed,
            signature=book_recipe.signature,
        ),
        **when(
            bool(inventory.crawl_errors),
            crawl_errors=len(inventory.crawl_errors),
            errors=error_table(inventory.crawl_errors),
        ),
    }


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
    context: AssetExecutionContext,
    books: ResourceParam[SourceConfig],
    source_files: dict[str, BookInventory],
) -> Iterator[Output[dict[str, ParsedBook]] | Output[None] | AssetCheckEvaluation]:
    parsed_books: dict[str, ParsedBook] = {}
    checks: dict[str, BookCheck] = {}
    for book_id, inventory in source_files.items():
        parsed = parse_book(inventory, books)
        for error in parsed.errors:
            context.log.warning(str(error))
        for warning in parsed.warnings:
            context.log.warning(f"{parsed.book_id}/{warning}")
        metadata, checks[book_id] = _parsed_metadata(parsed)
        if not checks[book_id].passed:
            tag_checks(context, "warned")
        record_book(context, book_id, metadata)
        parsed_books[book_id] = parsed
    yield Output(parsed_books)
    yield from check_books(context, "parse_errors", checks)


def _parsed_metadata(parsed: ParsedBook) -> tuple[dict[str, Any], BookCheck]:
    # the check covers the whole book: files that stay broken or empty are reported every run
    all_errors = parsed.errors + parsed.standing_errors
    all_empty = parsed.empty_documents + parsed.standing_empty_documents
    files = len(parsed.inventory.files)
    error_rate = round(len(all_errors) / files, 4) if files else 0.0
    empty_list = MetadataValue.md("\n".join(f"- {n}" for n in all_empty))
    errors = {"error_rate": error_rate, "error_table": error_table(all_errors)}
    metadata = {
        "parsed": len(parsed.documents),
        "errors": len(parsed.errors),
        "book_errors": len(all_errors),
        "empty_documents": len(all_empty),
        "warnings": len(parsed.warnings),
        **when(bool(all_errors), **errors),
        **when(bool(all_empty), empty_files=empty_list),
        **when(
            bool(parsed.warnings),
            warning_list=MetadataValue.md("\n".join(f"- {w}" for w in parsed.warnings[:50])),
        ),
    }
    check = BookCheck(
        passed=not all_errors and not all_empty,
        severity=AssetCheckSeverity.WARN,
        metadata={
            "errors": len(all_errors),
            "new_errors": len(parsed.errors),
            "empty_documents": len(all_empty),
            **when(bool(all_errors), error_rate=error_rate, files=error_table(all_errors)),
            **when(bool(all_empty), empty_files=empty_list),
        },
    )
    return metadata, check


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
    context: AssetExecutionContext,
    recipe: ResourceParam[LazyRecipe],
    documents: dict[str, ParsedBook],
) -> Iterator[Output[dict[str, ChunkedBook]] | Output[None] | AssetCheckEvaluation]:
    chunked_books: dict[str, ChunkedBook] = {}
    checks: dict[str, BookCheck] = {}
    for book_id, parsed in documents.items():
        index_recipe = recipe.for_model(parsed.inventory.embedding_model)  # the book's recipe
        chunked = chunk_book(parsed, index_recipe)
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
                "token_limit": index_recipe.budget.limit,
                "seconds": round(chunked.seconds, 3),
                **when(bool(chunk_errors), chunk_errors=error_table(chunk_errors)),
            },
        )
        problems = check_chunks(chunked.chunks, index_recipe.budget.limit)
        checks[book_id] = BookCheck(
            passed=not problems,
            metadata={"problems": len(problems), **details(problems)},
        )
        chunked_books[book_id] = chunked
    yield Output(chunked_books)
    yield from check_books(context, "chunks_valid", checks)


@asset(
    **BOOK_ASSET,
    config_schema=NO_RUN_CONFIG,
    kinds={"python"},
    code_version="2",
    pool=EMBEDDING_POOL,
    retry_policy=STEP_RETRY,
    description="Dense vectors (the configured embedder) and BM25 sparse vectors for every "
    "chunk. Text already in the index with the same model is not embedded again: its vector "
    "is reused, so only new text reaches the embedder. The books of one run are embedded in "
    "one pass (sorted by length together).",
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
    chunks: dict[str, ChunkedBook],
) -> Iterator[Output[dict[str, EmbeddedBook]] | Output[None] | AssetCheckEvaluation]:
    # books are grouped by recipe (a batch may hold an fp32 book beside int8 ones): one
    # embedding pass per model
    by_model: dict[str, list[str]] = {}
    for book_id, chunked in chunks.items():
        by_model.setdefault(chunked.inventory.embedding_model, []).append(book_id)
    embedded_books: dict[str, EmbeddedBook] = {}
    dimensions: dict[str, int | None] = {}
    for model, book_ids in by_model.items():
        index_recipe = recipe.for_model(model)
        work = []
        for book_id in book_ids:
            with qdrant.open(recipe=index_recipe) as store:
                reuse = vectors_to_reuse(chunks[book_id], index_recipe, store)
                dimensions[book_id] = store.dimension_of(book_id)
            work.append((chunks[book_id], reuse))
        total = sum(len(c.chunks) for c, _ in work)
        todo = total - sum(
            sum(1 for chunk in c.chunks if chunk.content_hash in reuse) for c, reuse in work
        )
        context.log.info(
            f"{_books_label(book_ids)}: {total} chunks: {total - todo} already indexed, "
            f"{todo} to embed with {index_recipe.embedding_model}"
        )
        progress = ProgressLog("embedding", context.log.info)
        for embedded in embed_books(work, index_recipe, progress):
            embedded_books[embedded.book_id] = embedded
    checks: dict[str, BookCheck] = {}
    for book_id in chunks:
        embedded = embedded_books[book_id]
        index_recipe = recipe.for_model(chunks[book_id].inventory.embedding_model)
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
        collection_dim = dimensions[book_id]
        problems = check_vectors(embedded.dense, index_recipe.dimension, collection_dim)
        checks[book_id] = BookCheck(
            passed=not problems,
            metadata={
                "model_dimension": index_recipe.dimension,
                "collection_dimension": collection_dim if collection_dim is not None else -1,
                **details(problems),
            },
        )
    yield Output(embedded_books)
    yield from check_books(context, "vector_dimension", checks)


def _books_label(book_ids: list[str]) -> str:
    return book_ids[0] if len(book_ids) == 1 else f"{len(book_ids)} books"


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
    chunks: dict[str, ChunkedBook],
    chunk_embeddings: dict[str, EmbeddedBook],
) -> Iterator[Output[dict[str, BookResult]] | Output[None] | AssetCheckEvaluation]:
    results: dict[str, BookResult] = {}
    checks: dict[str, BookCheck] = {}
    for book_id, chunked in chunks.items():
        results[book_id], checks[book_id] = _write_book(
            context, recipe, qdrant, books, chunked, chunk_embeddings[book_id]
        )
    yield Output(results)
    yield from check_books(context, "index_consistency", checks)


def _write_book(
    context: AssetExecutionContext,
    recipe: LazyRecipe,
    qdrant: StoreOpener,
    books: SourceConfig,
    chunked: ChunkedBook,
    embedded: EmbeddedBook,
) -> tuple[BookResult, BookCheck]:
    """Write one book's points, check its index, switch a finished recipe build."""
    book_id = chunked.book_id
    index_recipe = recipe.for_model(chunked.inventory.embedding_model)
    lineage = index_recipe.lineage(context.run.run_id, embedded.sparse_model)
    with qdrant.open(recipe=index_recipe) as store:
        checked = write_and_check(store, books, chunked, embedded, lineage, index_recipe.dimension)
    if checked is None:
        # removed while this run read and embedded it: its purge deletes the book; the run
        # ends cleanly instead of retrying
        return _book_removed_during_run(context, book_id)
    written, consistency = checked.written, checked.consistency
    result = book_result(chunked, embedded, written, consistency)
    problems = consistency.problems()
    if problems:
        tag_checks(context, "failed")
    with qdrant.open() as store:  # a reader: the switch decision is finish_book's
        before = store.current_recipe(book_id)
        switch = finish_book(
            store,
            chunked,
            consistency,
            index_recipe,
            run_id=context.run.run_id,
            keep_old=qdrant.config.keep_old_recipe,
        )
    for reason in switch.held_back:
        message = f"{book_id}: the new recipe's build stays pending: {reason}"
        context.log.warning(message)
        result.warnings.append(message)
    deleted_rows = [{"point id": i, "file": f} for i, f in written.deleted_points]
    record_book(
        context,
        book_id,
        {
            "summary": _summary(chunked, embedded, written, consistency.points),
            "points_written": _written_table(chunked, written),
            "points_upserted": written.upserted,
            "points_deleted": written.deleted,
            "document_records": written.documents,
            "points_in_book": consistency.points,
            "embedding_model": lineage.embedding_model,
            **when(bool(deleted_rows), points_deleted_list=table(deleted_rows, TABLE_ROWS)),
            **_recipe_metadata(before, switch),
        },
    )
    check = BookCheck(
        passed=consistency.passed,
        metadata={
            "points": consistency.points,
            "expected": consistency.expected,
            "documents": consistency.documents,
            "problems": len(problems),
            **details(problems),
        },
    )
    return result, check


def _recipe_metadata(before: dict[str, str] | None, switch: SwitchOutcome) -> dict[str, Any]:
    """The recipe change of the run, if it changed it: the recipe searched before, what became
    of the build (in place for a run that kept the book's recipe: nothing recorded)."""
    return when(
        switch.pending,
        recipe_before=(before or {}).get("embedding_model", "untagged"),
        signature_before=(before or {}).get("signature", ""),
        recipe_build=switch.state,
        **when(
            bool(switch.held_back),
            recipe_held_back=MetadataValue.md("\n".join(f"- {r}" for r in switch.held_back)),
        ),
    )


#: rows a table of a book's materialization shows at most (its totals are beside it): what a
#: person reads on the page, and the instance keeps for every book of every run
TABLE_ROWS = 10


def when(condition: bool, **entries: Any) -> dict[str, Any]:
    """``entries`` if ``condition``, else none: an entry that would only say "nothing" (an
    empty error table, no migration) costs the instance space in every book of every run."""
    return dict(entries) if condition else {}


def details(problems: list[str]) -> dict[str, Any]:
    """A check's problems, listed (when there are any)."""
    listed = MetadataValue.md("\n".join(f"- {p}" for p in problems[:50]))
    return when(bool(problems), details=listed)


def _book_removed_during_run(
    context: AssetExecutionContext, book_id: str
) -> tuple[BookResult, BookCheck]:
    message = f"book folder {book_id!r} was removed during this run: nothing written"
    context.log.warning(message)
    record_book(context, book_id, {"summary": message, "points_upserted": 0, "points_deleted": 0})
    return BookResult(book_id, "missing", error_messages=[message]), BookCheck(
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
    """Which points this run wrote, those of new text first: search a point id here to find
    the run that wrote it (``rag-pipeline lineage`` names it for any point)."""
    inventory = chunked.inventory
    written_ids = set(written.written_ids)
    points = [c for c in chunked.chunks if c.id in written_ids]
    points.sort(
        key=lambda c: not inventory.reembed and c.content_hash in inventory.state.by_content
    )
    rows = [
        {
            "point id": c.id,
            "file": c.source_file,
            "section": shorten(c.section_title or "", 40),
            "content hash": c.content_hash[:12],
        }
        for c in points
    ]
    return table(rows, limit=TABLE_ROWS)


ingestion_assets = [source_files, documents, chunks, chunk_embeddings, qdrant_points]

"""The ingestion assets, one partition per book: thin calls into :mod:`rag_pipeline.pipeline`.

source_files -> documents -> chunks -> chunk_embeddings -> qdrant_points
"""

from collections.abc import Iterator

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    Backoff,
    MaterializeResult,
    MetadataValue,
    Output,
    RetryPolicy,
    asset,
)

from rag_pipeline.chunk import CHUNKER_VERSION, ChunkBudget
from rag_pipeline.consistency import check_chunks, check_index, check_vectors
from rag_pipeline.defs.metadata import error_table, md_table, shorten
from rag_pipeline.defs.partitions import book_partitions_def
from rag_pipeline.embed import Embedder
from rag_pipeline.index import CHUNK
from rag_pipeline.pipeline import (
    BookInventory,
    ChunkedBook,
    EmbeddedBook,
    ParsedBook,
    chunk_book,
    embed_book,
    index_signature,
    lineage_for,
    parse_book,
    take_inventory,
    write_book,
)
from rag_pipeline.resources import BookSourceResource, EmbedderResource, QdrantStoreResource
from rag_pipeline.sparse import Bm25Encoder
from rag_pipeline.store.filters import Match, tenant_filter

__all__ = [
    "INGESTION_GROUP",
    "chunk_embeddings",
    "chunks",
    "documents",
    "ingestion_assets",
    "qdrant_points",
    "source_files",
]

INGESTION_GROUP = "ingestion"
OWNERS = ["team:data-platform"]
#: steps that read or write the store; one slot for the embedded stores (they lock their folder)
STORE_POOL = "qdrant_store"
#: embedding steps; its limit caps concurrent calls to a paid embedding API
EMBEDDING_POOL = "embedding_api"
_common = {
    "partitions_def": book_partitions_def,
    "group_name": INGESTION_GROUP,
    "owners": OWNERS,
}


def _tools(
    books: BookSourceResource, embedder: EmbedderResource
) -> tuple[Embedder, ChunkBudget, Bm25Encoder]:
    model = embedder.get()
    return model, ChunkBudget.for_tokenizer(books.chunking(), model.tokenizer), Bm25Encoder()


@asset(
    **_common,
    kinds={"markdown", "qdrant"},
    code_version="1",
    pool=STORE_POOL,
    description="Markdown files of the book on disk (path, size, sha256, module/chapter/lesson "
    "from the path) and what each needs compared with the index: new, modified, unchanged or "
    "deleted. The index state is read from Qdrant payloads; there is no other state store.",
)
def source_files(
    context: AssetExecutionContext,
    books: BookSourceResource,
    qdrant: QdrantStoreResource,
    embedder: EmbedderResource,
) -> Output[BookInventory]:
    model, budget, sparse = _tools(books, embedder)
    with qdrant.open() as store:
        inventory = take_inventory(
            books.source(),
            context.partition_key,
            store,
            index_signature(model, budget, sparse),
            model.model_name,
        )
    changes = inventory.changes
    status = changes.statuses()
    rows = [
        {
            "file": f.source_file,
            "status": status[f.source_file],
            "bytes": f.size,
            "module": f.path_meta.module,
            "chapter": f.path_meta.chapter,
            "lesson": f.path_meta.lesson,
        }
        for f in inventory.files
    ]
    rows += [{"file": name, "status": "deleted"} for name in changes.deleted]
    rows.sort(key=lambda row: row["status"] == "unchanged")  # what changed comes first
    return Output(
        inventory,
        metadata={
            "files": len(inventory.files),
            **changes.counts(),
            "crawl_errors": len(inventory.crawl_errors),
            "bytes": sum(f.size for f in inventory.files),
            "indexed_chunk_points": inventory.state.chunk_points,
            "files_table": md_table(rows, limit=40),
            "errors": error_table(inventory.crawl_errors),
        },
    )


@asset(
    **_common,
    kinds={"markdown"},
    code_version="1",
    description="New and modified files parsed: frontmatter split off and normalized (title, "
    "module, chapter, lesson, hardware tier, proficiency level, tags), sha256 of the bytes "
    "parsed. A file that cannot be parsed is an error record naming the reason; the rest of "
    "the book goes on.",
    check_specs=[
        AssetCheckSpec(
            "parse_errors",
            asset="documents",
            partitions_def=book_partitions_def,
            description="Warns with the file names when files fail to parse or are empty.",
        )
    ],
)
def documents(
    context: AssetExecutionContext, books: BookSourceResource, source_files: BookInventory
) -> Iterator[Output[ParsedBook] | AssetCheckResult]:
    parsed = parse_book(source_files, books.source())
    rows = [
        {
            "file": d.source_file,
            "title": shorten(d.meta.title, 60),
            "proficiency": d.meta.proficiency_level,
            "tier": d.meta.hardware_tier,
            "chars": len(d.body),
        }
        for d in parsed.documents
    ]
    for error in parsed.errors:
        context.log.warning(f"{error.book_id}/{error.source_file}: {error.reason}")
    # the check covers the whole book: files that stay broken or empty are reported every run
    all_errors = parsed.errors + parsed.standing_errors
    all_empty = parsed.empty_documents + parsed.standing_empty_documents
    files = len(parsed.inventory.files)
    error_rate = round(len(all_errors) / files, 4) if files else 0.0
    empty_list = MetadataValue.md("\n".join(f"- {n}" for n in all_empty) or "(none)")
    yield Output(
        parsed,
        metadata={
            "parsed": len(parsed.documents),
            "errors": len(parsed.errors),
            "book_errors": len(all_errors),
            "error_rate": error_rate,
            "empty_documents": len(all_empty),
            "empty_files": empty_list,
            "error_table": error_table(all_errors),
            "documents": md_table(rows),
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
    **_common,
    kinds={"python"},
    code_version=CHUNKER_VERSION,
    description="Heading-aware chunks of the parsed documents: split on ## headings, packed to "
    "a token budget measured with the embedder's own tokenizer (never above its input limit), "
    "with overlap, no split inside code fences or tables, content-hash ids and prev/next links.",
    check_specs=[
        AssetCheckSpec(
            "chunks_valid",
            asset="chunks",
            partitions_def=book_partitions_def,
            blocking=True,
            description="Blocks embedding and publishing when a chunk is empty, over the token "
            "limit, duplicated, or its prev/next chain is broken.",
        )
    ],
)
def chunks(
    context: AssetExecutionContext,
    books: BookSourceResource,
    embedder: EmbedderResource,
    documents: ParsedBook,
) -> Iterator[Output[ChunkedBook] | AssetCheckResult]:
    model, budget, _ = _tools(books, embedder)
    chunked = chunk_book(documents, model, budget)
    stats = chunked.token_stats()
    rows = [
        {
            "#": c.chunk_index,
            "file": c.source_file,
            "section": shorten(c.section_title or "", 40),
            "tokens": c.token_count,
            "text": shorten(c.text, 80),
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
            "token_limit": budget.limit,
            "target_tokens": budget.target,
            "chunk_errors": error_table([e for e in chunked.errors if e.stage == "chunk"]),
            "seconds": round(chunked.seconds, 3),
            "preview": md_table(rows),
        },
    )
    problems = check_chunks(chunked.chunks, budget.limit)
    yield AssetCheckResult(
        check_name="chunks_valid",
        passed=not problems,
        metadata={
            "problems": len(problems),
            "details": MetadataValue.md("\n".join(f"- {p}" for p in problems[:50]) or "(none)"),
        },
    )


@asset(
    **_common,
    kinds={"onnx", "openai"},
    code_version="1",
    pool=EMBEDDING_POOL,
    retry_policy=RetryPolicy(max_retries=2, delay=5, backoff=Backoff.EXPONENTIAL),
    description="Dense vectors (the configured embedder) and BM25 sparse vectors for every "
    "chunk. Text already in the index with the same model is not embedded again: its vector "
    "is reused, so only new text reaches the embedder.",
    check_specs=[
        AssetCheckSpec(
            "vector_dimension",
            asset="chunk_embeddings",
            partitions_def=book_partitions_def,
            blocking=True,
            description="Blocks publishing unless every vector has the model's dimension, which "
            "must also be the collection's, and is finite and unit length.",
        )
    ],
)
def chunk_embeddings(
    context: AssetExecutionContext,
    books: BookSourceResource,
    embedder: EmbedderResource,
    qdrant: QdrantStoreResource,
    chunks: ChunkedBook,
) -> Iterator[Output[EmbeddedBook] | AssetCheckResult]:
    model, _, sparse = _tools(books, embedder)
    with qdrant.open() as store:
        embedded = embed_book(chunks, model, store, sparse)
        collection_dim = store.dense_dimension()
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
    problems = check_vectors(embedded.dense, model.dimension, collection_dim)
    yield AssetCheckResult(
        check_name="vector_dimension",
        passed=not problems,
        metadata={
            "model_dimension": model.dimension,
            "collection_dimension": collection_dim if collection_dim is not None else -1,
            "details": MetadataValue.md("\n".join(f"- {p}" for p in problems) or "(none)"),
        },
    )


@asset(
    **_common,
    kinds={"qdrant"},
    code_version="1",
    pool=STORE_POOL,
    retry_policy=RetryPolicy(max_retries=2, delay=5, backoff=Backoff.EXPONENTIAL),
    description="The book's points in the Qdrant collection (book_id is the tenant key). New "
    "points are upserted first, points they replace are deleted after, and per-file document "
    "records are committed last, so the book stays searchable and a re-run converges.",
    check_specs=[
        AssetCheckSpec(
            "index_consistency",
            asset="qdrant_points",
            partitions_def=book_partitions_def,
            description="Points in Qdrant == chunks the document records promise; no orphan "
            "points, no duplicate chunk positions, every prev/next id resolves, vector dimension "
            "matches the model.",
        )
    ],
)
def qdrant_points(
    context: AssetExecutionContext,
    books: BookSourceResource,
    embedder: EmbedderResource,
    qdrant: QdrantStoreResource,
    chunks: ChunkedBook,
    chunk_embeddings: EmbeddedBook,
) -> MaterializeResult:
    model, budget, sparse = _tools(books, embedder)
    lineage = lineage_for(model, budget, sparse, context.run_id)
    with qdrant.open() as store:
        report = write_book(store, chunks, chunk_embeddings, lineage)
        points = store.count(tenant_filter(context.partition_key, Match("record_type", CHUNK)))
        target = store.description
        consistency = check_index(store, context.partition_key, model.dimension)
    problems = consistency.problems()
    check = AssetCheckResult(
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
    return MaterializeResult(
        check_results=[check],
        metadata={
            "points_upserted": report.upserted,
            "points_deleted": report.deleted,
            "document_records": report.documents,
            "points_in_book": points,
            "collection": qdrant.collection,
            "store": target,
            "embedding_model": lineage.embedding_model,
            "signature": lineage.signature,
        },
    )


ingestion_assets = [source_files, documents, chunks, chunk_embeddings, qdrant_points]

"""The ingestion stages of one book as plain functions; Dagster assets are thin calls to these.

inventory (files on disk vs the index) -> parse changed files -> chunk -> embed new text (reuse
vectors of text already indexed) -> write points, delete stale ones, commit document records.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rag_pipeline import __version__
from rag_pipeline.changes import FileChanges, classify_files
from rag_pipeline.chunk import CHUNKER_VERSION, ChunkBudget, chunk_document
from rag_pipeline.config import ChunkingConfig, SourceConfig
from rag_pipeline.crawl import discover_files
from rag_pipeline.embed.base import Embedder
from rag_pipeline.index import (
    DocumentOutcome,
    IndexState,
    LineageInfo,
    WriteReport,
    read_index_state,
    reusable_vectors,
    write_book_changes,
)
from rag_pipeline.models import Chunk, FileError, ParsedDocument, SourceFile
from rag_pipeline.parse import parse_document
from rag_pipeline.sparse import Bm25Encoder
from rag_pipeline.store.base import CollectionSpec, SparseVector, VectorStore

__all__ = [
    "BookInventory",
    "BookPlan",
    "BookRun",
    "ChunkedBook",
    "EmbeddedBook",
    "ParsedBook",
    "chunk_book",
    "default_budget",
    "embed_book",
    "index_signature",
    "ingest_book",
    "lineage_for",
    "parse_book",
    "plan_book",
    "take_inventory",
    "write_book",
]


def index_signature(embedder: Embedder, budget: ChunkBudget, sparse: Bm25Encoder) -> str:
    """Identifies how chunks were cut and embedded; a change re-processes every file."""
    key = f"{CHUNKER_VERSION}|{budget}|{embedder.model_name}|{embedder.dimension}|{sparse.name}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def lineage_for(
    embedder: Embedder, budget: ChunkBudget, sparse: Bm25Encoder, run_id: str | None
) -> LineageInfo:
    return LineageInfo(
        embedder.model_name,
        embedder.dimension,
        sparse.name,
        index_signature(embedder, budget, sparse),
        __version__,
        run_id,
    )


@dataclass(frozen=True)
class BookInventory:
    """Files of a book on disk, what the index holds for it, and what must change."""

    book_id: str
    files: tuple[SourceFile, ...]
    crawl_errors: tuple[FileError, ...]
    changes: FileChanges
    state: IndexState
    signature: str

    @property
    def changed_files(self) -> tuple[SourceFile, ...]:
        changed = set(self.changes.changed)
        return tuple(f for f in self.files if f.source_file in changed)

    @property
    def file_hashes(self) -> dict[str, str]:
        return {f.source_file: f.sha256 for f in self.files}


def take_inventory(
    source: SourceConfig,
    book_id: str,
    store: VectorStore,
    signature: str,
    embedding_model: str,
) -> BookInventory:
    files, errors = discover_files(source.data_dir, book_id, source.path_patterns)
    state = read_index_state(store, book_id, embedding_model=embedding_model)
    changes = classify_files(
        {f.source_file: f.sha256 for f in files}, state.documents, signature, state.orphan_files
    )
    return BookInventory(book_id, tuple(files), tuple(errors), changes, state, signature)


@dataclass(frozen=True)
class ParsedBook:
    """The new and modified files parsed (or the reason each could not be)."""

    inventory: BookInventory
    documents: tuple[ParsedDocument, ...]
    errors: tuple[FileError, ...]
    # bytes actually parsed may be newer than the inventory's: this is what gets recorded
    file_hashes: Mapping[str, str] = field(default_factory=dict)

    @property
    def book_id(self) -> str:
        return self.inventory.book_id

    @property
    def empty_documents(self) -> tuple[str, ...]:
        return tuple(d.source_file for d in self.documents if d.is_empty)

    @property
    def standing_errors(self) -> tuple[FileError, ...]:
        """Errors of unchanged files, as recorded by the run that last saw them: a file that
        stays broken keeps being reported, not only in the run that first found it."""
        documents = self.inventory.state.documents
        return tuple(
            FileError(self.book_id, name, "parse", documents[name].error or "unknown error")
            for name in self.inventory.changes.unchanged
            if documents[name].status == "error"
        )

    @property
    def standing_empty_documents(self) -> tuple[str, ...]:
        documents = self.inventory.state.documents
        return tuple(n for n in self.inventory.changes.unchanged if documents[n].status == "empty")


def parse_book(inventory: BookInventory, source: SourceConfig) -> ParsedBook:
    """Parse the new and modified files; each bad file becomes an error, the rest goes on."""
    documents: list[ParsedDocument] = []
    errors: list[FileError] = []
    hashes: dict[str, str] = {}
    for f in inventory.changed_files:
        hashes[f.source_file] = f.sha256
        if f.size > source.max_file_bytes:
            errors.append(
                FileError(
                    f.book_id,
                    f.source_file,
                    "parse",
                    f"file too large: {f.size / 1e6:.1f} MB exceeds the "
                    f"{source.max_file_bytes / 1e6:.1f} MB limit "
                    "(RAG_MAX_FILE_BYTES)",
                    f.sha256,
                )
            )
            continue
        try:
            data = Path(f.path).read_bytes()
        except OSError as exc:
            errors.append(
                FileError(
                    f.book_id, f.source_file, "parse", f"cannot read file: {exc.strerror}", f.sha256
                )
            )
            continue
        digest = hashlib.sha256(data).hexdigest()
        hashes[f.source_file] = digest
        result = parse_document(
            f.book_id,
            f.source_file,
            data,
            digest,
            f.path_meta,
            default_hardware_tier=source.default_hardware_tier,
        )
        (errors if isinstance(result, FileError) else documents).append(result)
    return ParsedBook(inventory, tuple(documents), tuple(errors), hashes)


@dataclass(frozen=True)
class ChunkedBook:
    """Chunks of the parsed files, and what each changed file's document record will say."""

    inventory: BookInventory
    chunks: tuple[Chunk, ...]
    outcomes: tuple[DocumentOutcome, ...]
    errors: tuple[FileError, ...] = ()  # parse and chunk errors of this run
    seconds: float = 0.0

    @property
    def book_id(self) -> str:
        return self.inventory.book_id

    def token_stats(self) -> dict[str, float]:
        if not self.chunks:
            return {"min": 0, "mean": 0, "p95": 0, "max": 0, "total": 0}
        counts = np.array([c.token_count for c in self.chunks])
        return {
            "min": int(counts.min()),
            "mean": round(float(counts.mean()), 1),
            "p95": int(np.percentile(counts, 95)),
            "max": int(counts.max()),
            "total": int(counts.sum()),
        }


def chunk_book(parsed: ParsedBook, embedder: Embedder, budget: ChunkBudget) -> ChunkedBook:
    started = time.perf_counter()
    chunks: list[Chunk] = []
    errors: list[FileError] = list(parsed.errors)
    outcomes: list[DocumentOutcome] = []
    for doc in parsed.documents:
        try:
            doc_chunks = chunk_document(doc, embedder.tokenizer, budget)
        except Exception as exc:  # a chunker bug on one file must not sink the book
            error = FileError(
                doc.book_id,
                doc.source_file,
                "chunk",
                f"chunking failed: {type(exc).__name__}: {exc}",
                doc.source_file_hash,
            )
            errors.append(error)
            outcomes.append(
                DocumentOutcome(
                    doc.source_file, doc.source_file_hash, "error", doc_meta=doc.meta, error=error
                )
            )
            continue
        chunks.extend(doc_chunks)
        outcomes.append(
            DocumentOutcome(
                doc.source_file,
                doc.source_file_hash,
                "ok" if doc_chunks else "empty",
                len(doc_chunks),
                doc.meta,
                doc.frontmatter,
            )
        )
    for error in parsed.errors:
        outcomes.append(
            DocumentOutcome(
                error.source_file,
                parsed.file_hashes.get(error.source_file, ""),
                "error",
                error=error,
            )
        )
    return ChunkedBook(
        parsed.inventory,
        tuple(chunks),
        tuple(outcomes),
        tuple(errors),
        time.perf_counter() - started,
    )


@dataclass(frozen=True)
class EmbeddedBook:
    """Dense and sparse vectors aligned with the chunks, and what producing them cost."""

    book_id: str
    model: str
    dense: np.ndarray
    sparse: tuple[SparseVector, ...]
    embedded: int
    reused: int
    tokens: int
    cost_usd: float
    seconds: float
    embed_seconds: float = 0.0  # inside the embedder only: the "pure embedding time"


def embed_book(
    chunked: ChunkedBook,
    embedder: Embedder,
    store: VectorStore,
    sparse_encoder: Bm25Encoder,
) -> EmbeddedBook:
    """Vectors for every chunk: reused from the index when its text is there, else embedded."""
    started = time.perf_counter()
    chunks = chunked.chunks
    inventory = chunked.inventory
    reuse = reusable_vectors(
        store, inventory.book_id, inventory.state, (c.content_hash for c in chunks)
    )
    dense = np.zeros((len(chunks), embedder.dimension), dtype=np.float32)
    todo: list[int] = []
    for i, c in enumerate(chunks):
        vector = reuse.get(c.content_hash)
        if vector is not None and vector.shape == (embedder.dimension,):
            dense[i] = vector
        else:
            todo.append(i)
    tokens = sum(chunks[i].token_count for i in todo)
    embed_started = time.perf_counter()
    if todo:
        dense[todo] = embedder.embed([chunks[i].embed_text for i in todo])
    embed_seconds = time.perf_counter() - embed_started
    sparse = tuple(sparse_encoder.encode_documents([c.embed_text for c in chunks]))
    return EmbeddedBook(
        inventory.book_id,
        embedder.model_name,
        dense,
        sparse,
        len(todo),
        len(chunks) - len(todo),
        tokens,
        embedder.cost_usd(tokens),
        time.perf_counter() - started,
        embed_seconds,
    )


def write_book(
    store: VectorStore,
    chunked: ChunkedBook,
    embedded: EmbeddedBook,
    lineage: LineageInfo,
) -> WriteReport:
    if len(chunked.chunks) != len(embedded.dense):
        raise ValueError(
            f"{chunked.book_id}: {len(chunked.chunks)} chunks but "
            f"{len(embedded.dense)} vectors; re-materialize chunk_embeddings"
        )
    store.ensure_collection(CollectionSpec(store.collection, embedded.dense.shape[1]))
    inventory = chunked.inventory
    return write_book_changes(
        store,
        inventory.book_id,
        changes=inventory.changes,
        chunks=chunked.chunks,
        dense=embedded.dense,
        sparse=embedded.sparse,
        outcomes=chunked.outcomes,
        lineage=lineage,
    )


@dataclass(frozen=True)
class BookPlan:
    """What the next run of a book would do, computed without embedding or writing."""

    book_id: str
    changes: FileChanges
    chunks_total: int
    chunks_to_embed: int
    chunks_reused: int
    tokens_to_embed: int
    cost_usd: float
    points_to_delete: int
    errors: tuple[FileError, ...]

    def as_dict(self) -> dict[str, object]:
        return {
            **self.changes.counts(),
            "files": {s: list(getattr(self.changes, s)) for s in ("new", "modified", "deleted")},
            "chunks": self.chunks_total,
            "chunks_to_embed": self.chunks_to_embed,
            "chunks_reused": self.chunks_reused,
            "tokens_to_embed": self.tokens_to_embed,
            "cost_usd": round(self.cost_usd, 6),
            "points_to_delete": self.points_to_delete,
            "errors": [str(e) for e in self.errors],
        }


def plan_book(
    source: SourceConfig,
    book_id: str,
    store: VectorStore,
    embedder: Embedder,
    budget: ChunkBudget,
    sparse_encoder: Bm25Encoder,
) -> BookPlan:
    signature = index_signature(embedder, budget, sparse_encoder)
    inventory = take_inventory(source, book_id, store, signature, embedder.model_name)
    parsed = parse_book(inventory, source)
    chunked = chunk_book(parsed, embedder, budget)
    state = inventory.state
    todo = [c for c in chunked.chunks if not state.by_content.get(c.content_hash)]
    new_ids = {c.id for c in chunked.chunks}
    stale = sum(
        len(state.chunk_ids.get(n, set()) - new_ids)
        for n in (*inventory.changes.changed, *inventory.changes.deleted)
    )
    tokens = sum(c.token_count for c in todo)
    return BookPlan(
        book_id,
        inventory.changes,
        len(chunked.chunks),
        len(todo),
        len(chunked.chunks) - len(todo),
        tokens,
        embedder.cost_usd(tokens),
        stale + len(inventory.changes.deleted),
        (*inventory.crawl_errors, *chunked.errors),
    )


def default_budget(embedder: Embedder, config: ChunkingConfig | None = None) -> ChunkBudget:
    return ChunkBudget.for_tokenizer(config or ChunkingConfig(), embedder.tokenizer)


@dataclass(frozen=True)
class BookRun:
    """Everything one pass over a book produced (the assets' outputs, without Dagster)."""

    inventory: BookInventory
    parsed: ParsedBook
    chunked: ChunkedBook
    embedded: EmbeddedBook
    written: WriteReport


def ingest_book(
    source: SourceConfig,
    book_id: str,
    store: VectorStore,
    embedder: Embedder,
    budget: ChunkBudget,
    sparse_encoder: Bm25Encoder,
    run_id: str | None = None,
) -> BookRun:
    """All stages of one book in order, as the asset chain runs them."""
    signature = index_signature(embedder, budget, sparse_encoder)
    inventory = take_inventory(source, book_id, store, signature, embedder.model_name)
    parsed = parse_book(inventory, source)
    chunked = chunk_book(parsed, embedder, budget)
    embedded = embed_book(chunked, embedder, store, sparse_encoder)
    written = write_book(
        store, chunked, embedded, lineage_for(embedder, budget, sparse_encoder, run_id)
    )
    return BookRun(inventory, parsed, chunked, embedded, written)

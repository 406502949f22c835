"""The ingestion stages of one book as plain functions, composed by the one pipeline
(:class:`rag_pipeline.ingest.pipeline.IngestPipeline`, which every run goes through).

inventory (files vs the index) -> parse changed files -> chunk -> embed new text (reuse vectors
of text already indexed) -> write points, delete stale ones, commit document records -> check
the index -> switch a finished recipe build.

Every stage works file by file: a file that cannot be read, parsed or chunked becomes an error
on its own document record (its last good chunks stay), and the rest of the book goes on.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from rag_pipeline.chunking import TooManyBlocks
from rag_pipeline.embed.base import ProgressCallback
from rag_pipeline.ingest.assess import BookAssessment, assess_book
from rag_pipeline.ingest.catalog import run_summary
from rag_pipeline.ingest.changes import UNREADABLE_STAGE
from rag_pipeline.ingest.consistency import (
    IndexConsistency,
    check_chunks,
    check_index,
    check_vectors,
)
from rag_pipeline.ingest.index import (
    DocumentOutcome,
    IndexState,
    WriteReport,
    documents_after_write,
    reusable_vectors,
    sparse_model_of,
    write_book_changes,
)
from rag_pipeline.ingest.migration import SwitchOutcome, finish_build
from rag_pipeline.ingest.report import BookResult
from rag_pipeline.models import Chunk, FileError, ParsedDocument, shown_name
from rag_pipeline.recipes.recipe import IndexRecipe, LineageInfo
from rag_pipeline.sources.base import BookSource, ParseOptions, SourceReadError
from rag_pipeline.sparse import EncodedWhenRead
from rag_pipeline.store import BookDamagedError, CollectionSpec, SparseVector, VectorStore
from rag_pipeline.store.capabilities import catalog_of

__all__ = [
    "BookInventory",
    "CheckedWrite",
    "ChunkedBook",
    "EmbeddedBook",
    "ParsedBook",
    "Progress",
    "WritePreview",
    "book_result",
    "chunk_book",
    "discard_if_damaged",
    "embed_books",
    "failed_files",
    "finish_book",
    "parse_book",
    "preview_writes",
    "rebuilt_reason",
    "source_lineage",
    "take_inventory",
    "vectors_to_reuse",
    "write_and_check",
    "write_book",
    "written_files",
]

#: called after each embedding batch (see :class:`~rag_pipeline.embed.base.ProgressCallback`)
Progress = ProgressCallback


#: the run's first step hands on the book's assessment: the run does what it says
BookInventory = BookAssessment


def discard_if_damaged(store: VectorStore, book_id: str) -> str | None:
    """Before a run reads its book: a book whose index is damaged
    (:class:`~rag_pipeline.store.BookDamagedError`, as far as the store can tell without
    reading a book its summary vouches for) loses what is left of it, so that the run
    rebuilds it from its files. Returns the damage found (None: none)."""
    try:
        store.verify(book_id)
    except BookDamagedError as exc:
        store.discard_damaged(book_id, exc.problem)
        return exc.problem
    return None


def _assess_for_run(
    source: BookSource,
    book_id: str,
    store: VectorStore,
    recipe: IndexRecipe,
    force: bool,
    read_options: str,
) -> BookInventory:
    """The run's assessment, read in proportion to the change (issue 40.4): the book's
    document records and chunk counts (from its saved summary while the store vouches for
    it, as the plan reads them), never every chunk's payload. What the run reuses is looked
    up by content hash (:func:`vectors_to_reuse`) and what it replaces is read per changed
    file when it writes (:func:`~rag_pipeline.ingest.index.write_book_changes`), so the
    inventory's ``state`` holds no chunk ids (``chunk_payloads_read`` is False)."""
    inventory = assess_book(
        source,
        book_id,
        store,
        recipe,
        read_options=read_options,
        force=force,
        chunk_payloads=False,
    )
    inventory.state.sparse_model = sparse_model_of(store, book_id)
    inventory.state.chunk_payloads_read = False
    return inventory


def rebuilt_reason(problem: str) -> str:
    """Why every file of a book whose index was damaged runs."""
    return f"its index was damaged ({problem}): rebuilt from its files"


def take_inventory(
    source: BookSource,
    book_id: str,
    store: VectorStore,
    recipe: IndexRecipe,
    *,
    read_options: str,
    force: bool = False,
    damage: str | None = None,
) -> BookInventory:
    """Hash the book's files and compare them with what the index holds (files parsed under
    other ``read_options`` are read again); a book whose index is found damaged (here, or
    before: ``damage``, see :func:`discard_if_damaged`) loses what is left of it and is
    rebuilt, every file with that reason."""
    try:
        inventory = _assess_for_run(source, book_id, store, recipe, force, read_options)
    except BookDamagedError as exc:
        store.discard_damaged(book_id, exc.problem)
        inventory = _assess_for_run(source, book_id, store, recipe, force, read_options)
        damage = exc.problem
    if damage is None:
        return inventory
    return replace(inventory, changes=inventory.changes.with_reason(rebuilt_reason(damage)))


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
    def warnings(self) -> tuple[str, ...]:
        return tuple(
            f"{shown_name(d.source_file)}: {w}" for d in self.documents for w in d.warnings
        )

    @property
    def standing_errors(self) -> tuple[FileError, ...]:
        """Errors of unchanged files, as recorded by the run that last saw them."""
        return self.inventory.recorded_errors

    @property
    def standing_empty_documents(self) -> tuple[str, ...]:
        documents = self.inventory.state.documents
        return tuple(n for n in self.inventory.changes.unchanged if documents[n].status == "empty")

    @property
    def book_errors(self) -> tuple[FileError, ...]:
        """Every broken file of the book: this run's and those that stay broken."""
        return self.errors + self.standing_errors

    @property
    def book_empty_documents(self) -> tuple[str, ...]:
        return self.empty_documents + self.standing_empty_documents

    @property
    def clean(self) -> bool:
        """No file of the book is broken or empty (the ``parse_errors`` check passes)."""
        return not self.book_errors and not self.book_empty_documents


def parse_book(inventory: BookInventory, source: BookSource, options: ParseOptions) -> ParsedBook:
    """Read and parse the new and modified files; each bad file becomes an error, the rest
    goes on. Indexed files that could not be read are errors too (their chunks stay)."""
    documents: list[ParsedDocument] = []
    errors: list[FileError] = []
    hashes: dict[str, str] = {}
    book_id = inventory.book_id
    for f in inventory.changed_files:
        try:
            data = source.read(book_id, f, inventory.boundary)
        except SourceReadError as exc:
            # no bytes were parsed: the record keeps the hash of the version it serves (none
            # for a new file), never the look's, so the next run reads the file again
            hashes[f.source_file] = _served_hash(inventory, f.source_file)
            errors.append(FileError(book_id, f.source_file, "read", str(exc)))
            continue
        digest = hashlib.sha256(data).hexdigest()
        hashes[f.source_file] = digest
        result = source.to_document(book_id, f.source_file, data, digest, options)
        if isinstance(result, FileError):
            errors.append(result)
        else:
            documents.append(result)
    for name in inventory.changes.unreadable:
        known = inventory.crawl_error(name)
        reason = known.reason if known else source.why_unreadable(book_id, name)
        errors.append(FileError(book_id, name, UNREADABLE_STAGE, reason))
        hashes[name] = _served_hash(inventory, name)
    return ParsedBook(inventory, tuple(documents), tuple(errors), hashes)


def _served_hash(inventory: BookInventory, source_file: str) -> str:
    """The hash of the version a file's record serves ("" for a file the index does not hold):
    what the record of a file that gave no bytes keeps (see ``changes.UNREAD_STAGES``)."""
    record = inventory.state.documents.get(source_file)
    return record.source_file_hash if record is not None else ""


@dataclass(frozen=True)
class ChunkedBook:
    """Chunks of the parsed files, and what each changed file's document record will say."""

    inventory: BookInventory
    chunks: tuple[Chunk, ...]
    outcomes: tuple[DocumentOutcome, ...]
    errors: tuple[FileError, ...] = ()  # read, parse and chunk errors of this run
    warnings: tuple[str, ...] = ()
    seconds: float = 0.0
    #: what breaks the chunk invariants across the book (the blocking ``chunks_valid`` check)
    problems: tuple[str, ...] = ()

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
            "p95": int(percentile_95(counts)),
            "max": int(counts.max()),
            "total": int(counts.sum()),
        }


def percentile_95(values: np.ndarray) -> float:
    """``np.percentile(values, 95)`` (its default, linear method, the same arithmetic):
    numpy's own imports ``numpy.ma`` on its first call, 0.1-0.2 s of a CLI's one-file edit."""
    ordered = np.sort(values)
    virtual = 0.95 * (len(ordered) - 1)
    below = int(np.floor(virtual))
    above = min(below + 1, len(ordered) - 1)
    t = virtual - below
    a, b = float(ordered[below]), float(ordered[above])
    return b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t


#: the warning of a document with text but no chunk
_NO_TEXT = (
    "empty document (no text once read as Markdown, such as only link reference "
    "definitions): nothing to index"
)


def chunk_book(parsed: ParsedBook, recipe: IndexRecipe) -> ChunkedBook:
    """Chunk every parsed document; a document whose chunks break an invariant (over the
    model's limit, a broken chain) is an error of that file alone."""
    started = time.perf_counter()
    chunks: list[Chunk] = []
    errors: list[FileError] = list(parsed.errors)
    outcomes: list[DocumentOutcome] = []
    warnings = list(parsed.warnings)
    for doc in parsed.documents:
        try:
            doc_chunks = recipe.chunker.chunk(doc, recipe.embedder.tokenizer, recipe.budget)
            problems = check_chunks(doc_chunks, recipe.budget.limit)
            if problems:
                raise ValueError("; ".join(problems[:3]))
        except Exception as exc:  # a chunker bug on one file must not sink the book
            # a file refused by a limit says so in its own words, not as a bug's
            why = str(exc) if isinstance(exc, TooManyBlocks) else None
            error = FileError(
                doc.book_id,
                doc.source_file,
                "chunk",
                why or f"chunking failed: {type(exc).__name__}: {exc}",
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
        doc_warnings = doc.warnings
        if not doc_chunks and not doc.is_empty:
            # text, but none once read as Markdown (only link reference definitions): as
            # empty as a blank file, and said as one is
            doc_warnings += (_NO_TEXT,)
            warnings.append(f"{shown_name(doc.source_file)}: {_NO_TEXT}")
        outcomes.append(
            DocumentOutcome(
                doc.source_file,
                doc.source_file_hash,
                "ok" if doc_chunks else "empty",
                len(doc_chunks),
                doc.meta,
                doc.frontmatter,
                warnings=doc_warnings,
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
        tuple(warnings),
        time.perf_counter() - started,
        tuple(check_chunks(chunks, recipe.budget.limit)),
    )


@dataclass(frozen=True)
class WritePreview:
    """What writing a chunked book will do, computed from the inventory without embedding:
    the numbers ``rag-pipeline plan`` prints are the ones the run then produces."""

    chunks: int
    to_embed: int
    reused: int
    tokens: int
    points_to_delete: int


def preview_writes(chunked: ChunkedBook) -> WritePreview:
    inventory = chunked.inventory
    state = inventory.state
    todo = [
        c for c in chunked.chunks if inventory.reembed or not state.by_content.get(c.content_hash)
    ]
    new_ids = {c.id for c in chunked.chunks}
    failed = {o.source_file for o in chunked.outcomes if o.status == "error"}
    changes = inventory.changes
    touched = (set(changes.changed) - failed) | set(changes.deleted)
    stale = sum(len(state.chunk_ids.get(name, set()) - new_ids) for name in touched)
    records = sum(1 for name in changes.deleted if name in state.documents)
    return WritePreview(
        len(chunked.chunks),
        len(todo),
        len(chunked.chunks) - len(todo),
        sum(c.token_count for c in todo),
        stale + records,
    )


@dataclass(frozen=True)
class EmbeddedBook:
    """Dense and sparse vectors aligned with the chunks, and what producing them cost."""

    book_id: str
    model: str
    dense: np.ndarray
    #: encoded when read (:class:`~rag_pipeline.sparse.EncodedWhenRead`): the write reads
    #: them a batch of points at a time
    sparse: Sequence[SparseVector]
    embedded: int
    reused: int
    tokens: int
    cost_usd: float
    seconds: float
    embed_seconds: float = 0.0  # inside the embedder only: the "pure embedding time"
    sparse_model: str = ""  # the sparse encoder (with the book's BM25 average) used
    #: the dense dimension the book's index holds (None: none yet), and what is wrong with
    #: the vectors (the blocking ``vector_dimension`` check: a model of another size, a
    #: non-finite or non-unit vector)
    index_dimension: int | None = None
    problems: tuple[str, ...] = ()


def vectors_to_reuse(
    chunked: ChunkedBook, recipe: IndexRecipe, store: VectorStore
) -> dict[str, np.ndarray]:
    """Stored vectors for the chunks whose text the book already holds, embedded with the
    recipe's model (none when the book is being re-embedded)."""
    inventory = chunked.inventory
    if inventory.reembed or not chunked.chunks:
        return {}
    return reusable_vectors(
        store,
        inventory.book_id,
        (c.content_hash for c in chunked.chunks),
        recipe.dimension,
        recipe.embedding_model,
    )


def embed_books(
    books: Sequence[tuple[ChunkedBook, Mapping[str, np.ndarray], int | None]],
    recipe: IndexRecipe,
    progress: Progress | None = None,
) -> list[EmbeddedBook]:
    """Vectors for every chunk of several books of one recipe, ``(chunked, vectors to reuse,
    the dimension the book's index holds)`` each, in one pass of the embedder: a chunk whose
    text the index holds gets its stored vector, the rest are embedded, the texts of every
    book sorted by tokens together, so batches are fuller than book by book (a small book no
    longer pads a batch of its own). Dense vectors are checked and handed back per book; each
    book's BM25 weights are its own (its own average length)."""
    started = time.perf_counter()
    embedder = recipe.embedder
    denses: list[np.ndarray] = []
    todos: list[list[int]] = []
    texts: list[str] = []
    for chunked, reuse, _ in books:
        chunks = chunked.chunks
        dense = np.zeros((len(chunks), embedder.dimension), dtype=np.float32)
        todo: list[int] = []
        for i, c in enumerate(chunks):
            vector = reuse.get(c.content_hash)
            if vector is not None:
                dense[i] = vector
            else:
                todo.append(i)
        texts += [chunks[i].embed_text for i in todo]
        denses.append(dense)
        todos.append(todo)
    embed_started = time.perf_counter()
    vectors = embedder.embed(texts, progress=progress) if texts else None
    embed_seconds = time.perf_counter() - embed_started
    out: list[EmbeddedBook] = []
    offset = 0
    for (chunked, _, held_dimension), dense, todo in zip(books, denses, todos, strict=True):
        book_started = time.perf_counter()
        chunks = chunked.chunks
        if todo:
            assert vectors is not None
            dense[todo] = vectors[offset : offset + len(todo)]
            offset += len(todo)
        inventory = chunked.inventory
        # the book's BM25 average (when it is measured) keeps each text's analysed length
        # alone; its vectors are encoded as the write reads them, a batch at a time: neither
        # the analysed terms nor the vectors of a whole book are held (issue 40.4)
        encoder = recipe.sparse_for(
            None if inventory.reembed else inventory.state.sparse_model,
            lambda: (len(recipe.sparse.terms(c.embed_text)) for c in chunks),  # noqa: B023
        )
        sparse = EncodedWhenRead(encoder, chunks, _embed_text)
        tokens = sum(chunks[i].token_count for i in todo)
        share = len(todo) / len(texts) if texts else 0.0  # the book's share of the pass
        out.append(
            EmbeddedBook(
                chunked.book_id,
                embedder.model_name,
                dense,
                sparse,
                len(todo),
                len(chunks) - len(todo),
                tokens,
                embedder.cost_usd(tokens),
                (time.perf_counter() - book_started)
                + share * (embed_started - started + embed_seconds),
                share * embed_seconds,
                encoder.name,
                held_dimension,
                tuple(check_vectors(dense, embedder.dimension, held_dimension)),
            )
        )
    return out


def _embed_text(chunk: Chunk) -> str:
    return chunk.embed_text


def source_lineage(lineage: LineageInfo, inventory: BookInventory) -> LineageInfo:
    """``lineage`` with where the book's files came from: the revision the run read and each
    file's version token (a git commit and blob ids; nothing for a folder)."""
    versions = {f.source_file: f.version for f in inventory.files if f.version is not None}
    if not inventory.revision and not versions:
        return lineage
    return replace(lineage, source_revision=inventory.revision, source_versions=versions)


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
    store.ensure_collection(CollectionSpec(store.collection, lineage.embedding_dim))
    inventory = chunked.inventory
    report = write_book_changes(
        store,
        inventory.book_id,
        changes=inventory.changes,
        chunks=chunked.chunks,
        dense=embedded.dense,
        sparse=embedded.sparse,
        outcomes=chunked.outcomes,
        lineage=lineage,
        newer_than=inventory.state.newest_indexed_at,
    )
    if catalog_of(store) is not None:
        state = documents_after_write(store, inventory.state, written_files(chunked))
        _save_summary(store, inventory, lineage.run_id, state)
    return report


def written_files(chunked: ChunkedBook) -> set[str]:
    """The files whose points and document records a run of ``chunked`` writes or deletes;
    the book's other files keep what they had (what the run's write and check read)."""
    changes = chunked.inventory.changes
    outcomes = {o.source_file for o in chunked.outcomes}
    return outcomes | set(changes.changed) | set(changes.deleted) | set(changes.unreadable)


def _save_summary(
    store: VectorStore,
    inventory: BookInventory,
    run_id: str | None,
    state: IndexState | None = None,
) -> None:
    """The book's catalog entry as the run leaves it, with the stats of the files the run read
    (a store without a catalog keeps none): the collection look and the plan read it, not the
    book, until the book changes. ``state``: the book's document records as the run left
    them (read from the book when not given)."""
    catalog = catalog_of(store)
    if catalog is not None:
        summary = run_summary(
            store,
            inventory.book_id,
            run_id=run_id,
            files=inventory.files,
            read_at_ns=inventory.read_at_ns,
            state=state,
        )
        catalog.save_summary(inventory.book_id, summary)


@dataclass(frozen=True)
class CheckedWrite:
    """The write step's outcome: what it wrote and the index check after it."""

    written: WriteReport
    consistency: IndexConsistency


def write_and_check(
    store: VectorStore,
    source: BookSource,
    chunked: ChunkedBook,
    embedded: EmbeddedBook,
    lineage: LineageInfo,
    dimension: int,
) -> CheckedWrite | None:
    """The write step of a run: the book's points written, then its index checked; None
    when the book folder was removed while the run read and embedded it (writing now would
    bring back points its purge deletes)."""
    book_id = chunked.book_id
    if source.is_gone(book_id):
        return None
    written = write_book(store, chunked, embedded, lineage)
    # the files written are read back and checked; the others' records are the assessment's
    consistency = check_index(
        store,
        book_id,
        dimension,
        written=written_files(chunked),
        others=chunked.inventory.state.documents,
    )
    return CheckedWrite(written, consistency)


def failed_files(chunked: ChunkedBook) -> set[str]:
    """Files that failed in this run (read, parse, chunk, crawl): a new build lacks their
    chunks, which the old index may still serve."""
    failed = {o.source_file for o in chunked.outcomes if o.status == "error"}
    return failed | {e.source_file for e in chunked.inventory.crawl_errors}


def finish_book(
    store: VectorStore,
    chunked: ChunkedBook,
    consistency: IndexConsistency,
    recipe: IndexRecipe,
    *,
    run_id: str | None,
    keep_old: bool = False,
) -> SwitchOutcome:
    """The end of a run of a book (``store``: a reader handle, opened after the run's
    builders closed): its pending recipe build switched in if it is complete and lost nothing
    (:func:`~rag_pipeline.ingest.migration.finish_build`), and the new generation's summary
    saved (plans need not open it); a book rebuilt for damage is given back to its readers
    once its check passed (:meth:`~rag_pipeline.store.VectorStore.end_repair`)."""
    book_id = chunked.book_id
    switch = finish_build(
        store,
        book_id,
        failed_files=failed_files(chunked),
        checks_passed=consistency.passed,
        recipe=recipe.tag(),
        keep_old=keep_old,
    )
    if switch.switched:
        _save_summary(store, chunked.inventory, run_id)
    if consistency.passed:  # a book rebuilt for damage is searched from here on, not before
        store.end_repair(book_id)
    return switch


def book_result(
    chunked: ChunkedBook,
    embedded: EmbeddedBook,
    written: WriteReport,
    index: IndexConsistency,
) -> BookResult:
    """What a run did to its book, with the book's totals as the index now holds them."""
    inventory = chunked.inventory
    changes = inventory.changes
    recorded = set(index.file_errors)
    messages = [
        f"{inventory.book_id}/{shown_name(name)}: {reason}"
        for name, reason in sorted(index.file_errors.items())
    ]
    messages += [str(e) for e in inventory.crawl_errors if e.source_file not in recorded]
    return BookResult(
        inventory.book_id,
        "ingested",
        files=len(inventory.files) + changes.counts()["files_unreadable"],
        errors=len(messages),
        chunks=index.expected,
        embedded=embedded.embedded,
        points=index.points,
        reused=embedded.reused,
        deleted=written.deleted,
        files_new=len(changes.new),
        files_modified=len(changes.modified),
        files_deleted=len(changes.deleted),
        files_unreadable=changes.counts()["files_unreadable"],
        tokens=embedded.tokens,
        cost_usd=embedded.cost_usd,
        embed_seconds=embedded.embed_seconds,
        error_messages=messages,
        warnings=list(chunked.warnings),
        reasons=sorted(set(changes.reasons.values())),
    )

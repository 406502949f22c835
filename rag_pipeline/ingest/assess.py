"""One book's assessment: its files against what the index holds, and what the next run must do.

The one place where that is decided. ``rag-pipeline plan`` (and the plan ``ingest`` makes
before it starts any run) shows a view of the assessment, the run's first step
(``stages.take_inventory``) is the assessment, and the evaluation corpus is assessed the same
way, so what ``plan`` says is what ``ingest`` does. An assessment crawls and hashes the files
once, reads the index once, probes the stored vectors once and words the reasons once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import islice

from rag_pipeline.ingest.catalog import (
    file_stats_from_summary,
    index_from_summary,
    run_summary,
)
from rag_pipeline.ingest.changes import FORCED_REBUILD, FileChanges, classify_files
from rag_pipeline.ingest.index import IndexState, damaged_vectors, read_index_state
from rag_pipeline.models import FileError, SourceFile, VersionKey, shown_name
from rag_pipeline.recipes.recipe import IndexRecipe
from rag_pipeline.schema import SOURCE_FILE, chunks_of
from rag_pipeline.sources.base import BookFilesRead, BookSource
from rag_pipeline.store import VectorStore
from rag_pipeline.store.capabilities import catalog_of, saved_summary

__all__ = [
    "DAMAGED_VECTORS",
    "DAMAGE_SAMPLE",
    "BookAssessment",
    "BookIndex",
    "assess",
    "assess_book",
    "read_book_index",
    "saved_book_index",
    "saved_file_stats",
]

#: how many of a book's stored chunk vectors are probed for damage (read, not scored)
DAMAGE_SAMPLE = 4
#: the reason a book whose probed vectors are damaged is rebuilt
DAMAGED_VECTORS = "stored vectors are damaged: the book is rebuilt"
#: how many file names a plan's reason lists before it says "and N more"
_NAMES_SHOWN = 3


@dataclass(frozen=True)
class BookIndex:
    """What the index holds for one book, as the assessment needs it."""

    state: IndexState
    chunk_points: Mapping[str, int]  # source_file -> chunk points the index holds for it
    damaged: bool  # a probed stored vector is not what this pipeline writes


def read_book_index(
    store: VectorStore,
    book_id: str,
    recipe: IndexRecipe,
    *,
    chunk_payloads: bool = True,
    found: BookFilesRead | None = None,
) -> BookIndex:
    """Read the book's index state once and probe a few of its stored vectors.

    Without ``chunk_payloads`` only the document records and the book's point count are read
    (per file only when that count is not what the records promise: a fraction of a second
    for a whole corpus): enough to decide, not to run (a run needs
    the chunk ids it replaces and the content hashes whose vectors it reuses). They are taken
    from the book's saved summary while the store vouches for it (written by the last run
    after its writes, its shard's files unchanged since: no shard is opened, and nothing can
    have damaged the vectors the last run wrote); else read from the book, and saved as its
    summary with the stats of ``found``'s files whose hash the records hold (the next plan
    reads none of those files again)."""
    if chunk_payloads:
        state = read_index_state(store, book_id, embedding_model=recipe.embedding_model)
        points = state.chunk_counts()
    elif (saved := saved_book_index(store, book_id)) is not None:
        return saved
    else:
        state = read_index_state(store, book_id, documents_only=True)
        points = _points_per_file(store, state)
        state.chunk_points = sum(points.values())  # the book's total, as the full read has it
    probe = store.scroll(chunks_of(book_id), fields=[], page_size=DAMAGE_SAMPLE)
    sample = [record.id for record in islice(probe, DAMAGE_SAMPLE)]
    # probed against the dimension of the index read (a book's generation has its own):
    # vectors of a recorded recipe of another dimension are a recipe change, not damage
    dimension = store.dimension_of(book_id) or recipe.dimension
    damaged = damaged_vectors(store, book_id, sample, dimension) > 0
    catalog = catalog_of(store)
    if not chunk_payloads and not damaged and catalog is not None:
        # read once, then kept: the next plan of the unchanged book opens no shard
        files = found.files if found is not None else ()
        read_at_ns = found.read_at_ns if found is not None else 0
        catalog.save_summary(
            book_id, run_summary(store, book_id, run_id=None, files=files, read_at_ns=read_at_ns)
        )
    return BookIndex(state, points, damaged)


def saved_file_stats(store: VectorStore, book_id: str) -> dict[str, tuple[VersionKey, str]]:
    """(stat, sha256) of each file as the book's last run read it, from its saved summary
    while the store vouches for it ({} otherwise): what a plan need not read again."""
    return file_stats_from_summary(saved_summary(store, book_id))


def saved_book_index(store: VectorStore, book_id: str) -> BookIndex | None:
    """The book's document records and chunk points from its saved summary, while the store
    vouches for it (None: read the book). Its vectors are those the last run wrote and checked,
    untouched since: not probed."""
    saved = index_from_summary(saved_summary(store, book_id), book_id)
    return None if saved is None else BookIndex(saved[0], saved[1], damaged=False)


def _points_per_file(store: VectorStore, state: IndexState) -> dict[str, int]:
    """source_file -> chunk points the index holds for it, read without a per-file facet when
    the book's chunk points are exactly what its document records promise.

    A facet by file costs a look at every file name of the whole collection, for each book:
    a plan of every book would cost the square of the collection. A book whose total matches
    is taken to hold each file's promised points; a book whose total does not is read per
    file, so the plan names the files at fault."""
    held = store.count(chunks_of(state.book_id))
    if held != state.promised_chunks:
        return store.counts_by(chunks_of(state.book_id), SOURCE_FILE)
    return {name: d.total_chunks for name, d in state.documents.items() if d.total_chunks > 0}


@dataclass(frozen=True)
class BookAssessment:
    """Files of a book, what the index holds for it, what must change and why.

    This is also what the run's first step hands on (``stages.BookInventory``): the run does
    what its assessment says."""

    book_id: str
    boundary: str  # where the source found the book: every read stays within it
    files: tuple[SourceFile, ...]
    crawl_errors: tuple[FileError, ...]
    changes: FileChanges
    state: IndexState
    signature: str
    #: every vector is embedded again (forced, or the stored vectors are damaged)
    reembed: bool = False
    damaged: bool = False  # the probed stored vectors are damaged: the book is rebuilt
    #: the model the run embeds with: every step of the run uses this book's recipe
    embedding_model: str = ""
    #: when its files were read (see :class:`BookFilesRead`)
    read_at_ns: int = 0
    #: what the book's tree is at (a git commit; "" for a folder, see :class:`BookVersions`)
    revision: str = ""

    @property
    def recipe_change(self) -> bool:
        """Files of the book are indexed with another recipe (model, precision, chunker,
        budget): the run embeds them again."""
        return any(
            d.signature and d.signature != self.signature for d in self.state.documents.values()
        )

    @property
    def recorded_signature(self) -> str | None:
        """The recipe signature most of the book's files are indexed with (None: none)."""
        return self.state.recorded_signature

    @property
    def changed_files(self) -> tuple[SourceFile, ...]:
        changed = set(self.changes.changed)
        return tuple(f for f in self.files if f.source_file in changed)

    def crawl_error(self, source_file: str) -> FileError | None:
        return next((e for e in self.crawl_errors if e.source_file == source_file), None)

    @property
    def reasons(self) -> list[str]:
        """Why the book runs, one line per reason with the files it applies to."""
        if self.damaged:
            return [DAMAGED_VECTORS]
        if self.reembed:
            return [FORCED_REBUILD]
        by_reason: dict[str, list[str]] = {}
        for name, reason in self.changes.reasons.items():
            by_reason.setdefault(reason, []).append(name)
        return [f"{reason}: {_some(names)}" for reason, names in sorted(by_reason.items())]

    @property
    def recorded_errors(self) -> tuple[FileError, ...]:
        """Errors recorded on the files the next run leaves alone (unchanged files): a file
        that stays broken keeps being reported, not only by the run that first found it."""
        documents = self.state.documents
        return tuple(
            FileError(self.book_id, name, "parse", documents[name].error or "unknown error")
            for name in self.changes.unchanged
            if documents[name].status == "error"
        )


def _some(names: list[str]) -> str:
    more = len(names) - _NAMES_SHOWN
    shown = ", ".join(shown_name(n) for n in names[:_NAMES_SHOWN])
    return shown + (f" and {more} more" if more > 0 else "")


def assess(
    found: BookFilesRead,
    index: BookIndex,
    recipe: IndexRecipe,
    source: BookSource,
    *,
    read_options: str,
    force: bool = False,
) -> BookAssessment:
    """Classify every file against the index: the book's decision, with its reasons (a file
    the index holds that ``found`` lacks is deleted only when ``source`` says it is gone;
    one parsed under other ``read_options``, ``ParseOptions.key``, is read again)."""
    reembed = force or index.damaged
    book_id = found.book_id
    # what the look itself found wrong with a file (too large, a refused link) says why it
    # gave no bytes better than a second look at it
    found_wrong = {e.source_file: e.reason for e in found.errors}
    changes = classify_files(
        {f.source_file: f.sha256 for f in found.files},
        index.state.documents,
        recipe.signature,
        is_gone=lambda name: source.is_gone(book_id, name),
        chunk_points=index.chunk_points,
        orphan_files=set(index.chunk_points) - set(index.state.documents),
        force=reembed,
        why_unreadable=lambda name: found_wrong.get(name) or source.why_unreadable(book_id, name),
        parse_version=recipe.parse_version,
        read_options=read_options,
    )
    if index.damaged:
        changes = changes.with_reason(DAMAGED_VECTORS)
    return BookAssessment(
        book_id,
        found.boundary,
        found.files,
        found.errors,
        changes,
        index.state,
        recipe.signature,
        reembed=reembed,
        damaged=index.damaged,
        embedding_model=recipe.embedding_model,
        read_at_ns=found.read_at_ns,
        revision=found.revision,
    )


def assess_book(
    source: BookSource,
    book_id: str,
    store: VectorStore,
    recipe: IndexRecipe,
    *,
    read_options: str,
    force: bool = False,
    chunk_payloads: bool = True,
) -> BookAssessment:
    """Assess a book of ``source`` (see :func:`read_book_index` for ``chunk_payloads``: an
    assessment without them can be shown, not run). A run hashes every file again, except one
    whose version names its content (a git blob id) and is the one its last run recorded:
    that version's bytes are the ones recorded, whatever happened since."""
    saved = {} if force else saved_file_stats(store, book_id)
    found = source.scan(book_id, {n: v for n, v in saved.items() if isinstance(v[0], str)})
    index = read_book_index(store, book_id, recipe, chunk_payloads=chunk_payloads, found=found)
    return assess(found, index, recipe, source, read_options=read_options, force=force)

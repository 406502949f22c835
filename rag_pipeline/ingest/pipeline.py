"""The ingest pipeline: the one path every run of a book takes, whoever starts it.

:class:`IngestPipeline` holds what a run reads from (a :class:`~rag_pipeline.sources.base.
BookSource`), writes to (a :class:`~rag_pipeline.resources.store.StoreOpener`) and builds with
(the recipes, one per embedding model). Its stages take and return one output per book, for a
run of one book or of a batch:

    assess -> parse -> chunk -> embed -> write (the index checked, a recipe build switched)

Each Dagster asset calls one stage and renders its output as metadata and checks
(``defs/assets.py``); :meth:`IngestPipeline.run` calls them in that order, for what runs
without Dagster (the evaluation corpus, the benchmarks, the tests); ``plan``'s preview is
:meth:`IngestPipeline.preview`, the parse and chunk stages on the plan's own assessment. No
other code writes a book's points. Every stage opens the store only for its own reads and
writes, one book at a time: a search or another process gets in while a stage parses or
embeds.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from rag_pipeline.ingest.consistency import IndexConsistency
from rag_pipeline.ingest.index import WriteReport
from rag_pipeline.ingest.migration import BuildStart, SwitchOutcome, start_build
from rag_pipeline.ingest.report import BookResult
from rag_pipeline.ingest.stages import (
    BookInventory,
    CheckedWrite,
    ChunkedBook,
    EmbeddedBook,
    ParsedBook,
    Progress,
    WritePreview,
    book_result,
    chunk_book,
    discard_if_damaged,
    embed_books,
    finish_book,
    parse_book,
    preview_writes,
    source_lineage,
    take_inventory,
    vectors_to_reuse,
    write_and_check,
)
from rag_pipeline.models import shown_name
from rag_pipeline.recipes.choice import RecipeSource
from rag_pipeline.recipes.recipe import IndexRecipe, LineageInfo
from rag_pipeline.resources.store import StoreOpener
from rag_pipeline.sources.base import BookSource, ParseOptions
from rag_pipeline.store.capabilities import generations_of
from rag_pipeline.store.sharing import kept_open

if TYPE_CHECKING:
    from rag_pipeline.config import Settings
    from rag_pipeline.ingest.plan import IngestPlan
    from rag_pipeline.store import VectorStore

__all__ = [
    "AssessedBook",
    "BookRun",
    "IngestPipeline",
    "PreparedRun",
    "WrittenBook",
    "held_back",
]

log = logging.getLogger(__name__)

#: how long live mode's stages of a run keep the book's shard from a waiting search (an
#: edit's stages take a fraction of that: the search then waits less than a hand-over cost)
PREPARE_HOLD_S = 1.0

#: where a stage says what it does (a run's log): called with one line of text
Say = Callable[[str], None]


def held_back(book_id: str, reason: str) -> str:
    """The warning of a recipe build the run did not switch in."""
    return f"{book_id}: the new recipe's build stays pending: {reason}"


@dataclass(frozen=True)
class AssessedBook:
    """The first stage's output for one book: its assessment (what the run will do), the
    recipe build it starts or resumes, and the damage it found and discarded."""

    inventory: BookInventory
    build: BuildStart
    damage: str | None = None


@dataclass(frozen=True)
class WrittenBook:
    """The last stage's output for one book: what the run did to it (the report), what it
    wrote, the index check after the writes and what became of a recipe build; ``written``
    is None when the book was removed while the run read it (nothing written: its purge
    empties it)."""

    result: BookResult
    written: WriteReport | None = None
    consistency: IndexConsistency | None = None
    switch: SwitchOutcome | None = None
    #: the recipe the book was searched with before the run
    recipe_before: dict[str, str] | None = None
    embedding_model: str = ""

    @property
    def removed(self) -> bool:
        return self.written is None


@dataclass(frozen=True)
class BookRun:
    """Every stage's output for one book of :meth:`IngestPipeline.run`."""

    assessed: AssessedBook
    parsed: ParsedBook
    chunked: ChunkedBook
    embedded: EmbeddedBook
    outcome: WrittenBook

    @property
    def inventory(self) -> BookInventory:
        return self.assessed.inventory

    @property
    def written(self) -> WriteReport:
        """What the run wrote (``ValueError`` for a book removed while it ran: nothing)."""
        if self.outcome.written is None:
            raise ValueError(self.outcome.result.error_messages[0])
        return self.outcome.written


@dataclass
class PreparedRun:
    """The stages of a run done ahead of its Dagster run (live mode: an edit's points are
    written, under the run's id, before the run's events), each output handed once to the
    run's step that asks for it with the same inputs (:meth:`IngestPipeline.replaying`).
    ``outputs``: stage name -> its output, for the stages done."""

    run_id: str
    book_ids: list[str]
    force: bool
    outputs: dict[str, Any] = field(default_factory=dict)
    #: what the embed stage said (its run log line), said again by the run's step
    said: list[str] = field(default_factory=list)
    #: the stages already handed to a step (a step asking again computes)
    handed: set[str] = field(default_factory=set)
    #: stage name -> seconds it took, and "close": the store's handles flushed and let go
    #: (what a search waits for), for the edit's breakdown (``bench/freshness.py``)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def written(self) -> bool:
        """Whether the points were written (every stage done)."""
        return "write" in self.outputs

    def take(self, stage: str, inputs: Sequence[Mapping[str, Any]]) -> Any | None:
        """The stage's output, once, if ``inputs`` are the very outputs it was computed
        from (a step retried, or given other inputs, computes again)."""
        before = {"parse": ["assess"], "chunk": ["parse"], "embed": ["chunk"]}
        before["write"] = ["chunk", "embed"]
        if stage not in self.outputs or stage in self.handed:
            return None
        for name, given in zip(before.get(stage, []), inputs, strict=True):
            kept = self.outputs.get(name)
            if stage == "parse" and kept is not None:
                kept = {b: a.inventory for b, a in kept.items()}
            if kept is None or not _same(kept, given):
                return None
        self.handed.add(stage)
        return self.outputs[stage]


def _building_beside(store: VectorStore, book_id: str) -> bool:
    """Whether a recipe build of the book is pending beside its searched index (what
    :func:`~rag_pipeline.ingest.stages.finish_book` may switch in, with a reader's handle)."""
    generations = generations_of(store)
    return generations is not None and generations.pending_recipe(book_id) is not None


def _same(kept: Mapping[str, Any], given: Mapping[str, Any]) -> bool:
    return kept.keys() == given.keys() and all(kept[k] is given[k] for k in kept)


class IngestPipeline:
    """The books of ``source``, indexed into ``store`` with each book's recipe."""

    def __init__(
        self,
        source: BookSource,
        store: StoreOpener,
        recipes: RecipeSource,
        *,
        parsing: ParseOptions | None = None,
    ) -> None:
        self.source = source
        self.store = store
        self.recipes = recipes
        self.parsing = parsing or ParseOptions()
        #: per thread, stages done ahead of the Dagster run it executes now (:meth:`replaying`;
        #: live mode executes runs of different books in threads of one process)
        self._replays = threading.local()

    @classmethod
    def from_settings(
        cls, settings: Settings, recipes: RecipeSource | IndexRecipe | None = None
    ) -> IngestPipeline:
        """The pipeline the settings describe; ``recipes``: the recipes already in use (their
        models loaded) of the same settings, or one recipe for every book."""
        from rag_pipeline.recipes.lazy import LazyRecipe

        if recipes is None or isinstance(recipes, IndexRecipe):
            recipes = LazyRecipe(settings.embedding(), settings.chunking(), recipes)
        return cls(
            settings.source(),
            StoreOpener(settings.store()),
            recipes,
            parsing=settings.parsing(),
        )

    @property
    def _replay(self) -> PreparedRun | None:
        replay: PreparedRun | None = getattr(self._replays, "prepared", None)
        return replay

    @property
    def description(self) -> str:
        """What the pipeline reads and writes, for the UI's resource page. Its paths shown as
        text (a byte of a folder's name that is not UTF-8 escaped): Dagster hashes a resource's
        description as UTF-8, so such a ``RAG_DATA_DIR`` failed every run's start."""
        recipes = getattr(self.recipes, "description", "fixed recipe")
        return shown_name(
            f"books of the {self.source.description} into {self.store.description}; {recipes}"
        )

    def with_source(self, source: BookSource) -> IngestPipeline:
        """The same store and recipes over another source (an evaluation corpus)."""
        return IngestPipeline(source, self.store, self.recipes, parsing=self.parsing)

    def warm_up(self) -> None:
        """Load the model a new book is embedded with (live mode: the first change embeds at
        once). A book recorded under another model still loads that one on first use."""
        self.recipes.for_model("").embedder.warm_up()  # "": what a new book gets

    def recipe_of(self, inventory: BookInventory) -> IndexRecipe:
        """The recipe a book's run builds with (the one its assessment chose)."""
        return self.recipes.for_model(inventory.embedding_model)

    # -- the stages: one output per book, in the order of ``book_ids`` -------------------------

    def assess(self, book_ids: Iterable[str], *, force: bool = False) -> dict[str, AssessedBook]:
        """Repair damage, choose each book's recipe, start (or resume) a recipe build beside
        the searched index, and assess the book's files against the index it builds."""
        replay = self._replay
        if replay is not None and (list(book_ids), force) == (replay.book_ids, replay.force):
            done = replay.take("assess", [])
            if done is not None:
                return dict(done)
        out: dict[str, AssessedBook] = {}
        for book_id in book_ids:
            with self.store.open() as store:  # a reader: the recipe the book is searched with
                damage = discard_if_damaged(store, book_id)
                recipe = self.recipes.for_book(store, book_id).recipe
                build = start_build(store, book_id, recipe)
            # the run's handles build its recipe: a recipe change reads its pending build
            with self.store.open(recipe=recipe) as store:
                inventory = take_inventory(
                    self.source,
                    book_id,
                    store,
                    recipe,
                    read_options=self.parsing.key,
                    force=force,
                    damage=damage,
                )
            out[book_id] = AssessedBook(inventory, build, damage)
        return out

    def parse(self, inventories: Mapping[str, BookInventory]) -> dict[str, ParsedBook]:
        """Read and parse each book's new and modified files (a bad file is an error of its
        own; the rest of the book goes on)."""
        if self._replay is not None and (done := self._replay.take("parse", [inventories])):
            return dict(done)
        return {b: parse_book(i, self.source, self.parsing) for b, i in inventories.items()}

    def chunk(self, parsed: Mapping[str, ParsedBook]) -> dict[str, ChunkedBook]:
        """Chunk each book's parsed documents with its recipe's chunker and budget."""
        if self._replay is not None and (done := self._replay.take("chunk", [parsed])):
            return dict(done)
        return {b: chunk_book(p, self.recipe_of(p.inventory)) for b, p in parsed.items()}

    def embed(
        self,
        chunked: Mapping[str, ChunkedBook],
        *,
        progress: Progress | None = None,
        say: Say | None = None,
    ) -> dict[str, EmbeddedBook]:
        """Vectors for every chunk: the stored one where the index holds the text, else
        embedded; the books of one model in one pass (a batch may mix models: an fp32 book
        beside int8 ones)."""
        if self._replay is not None and (done := self._replay.take("embed", [chunked])):
            for message in self._replay.said:
                if say is not None:
                    say(message)
            return dict(done)
        by_model: dict[str, list[str]] = {}
        for book_id, book in chunked.items():
            by_model.setdefault(book.inventory.embedding_model, []).append(book_id)
        embedded: dict[str, EmbeddedBook] = {}
        for model, book_ids in by_model.items():
            recipe = self.recipes.for_model(model)
            work: list[tuple[ChunkedBook, Mapping[str, np.ndarray], int | None]] = []
            for book_id in book_ids:
                with self.store.open(recipe=recipe) as store:
                    reuse = vectors_to_reuse(chunked[book_id], recipe, store)
                    work.append((chunked[book_id], reuse, store.dimension_of(book_id)))
            if say is not None:
                total = sum(len(book.chunks) for book, _, _ in work)
                todo = sum(
                    1 for c, reuse, _ in work for x in c.chunks if x.content_hash not in reuse
                )
                label = book_ids[0] if len(book_ids) == 1 else f"{len(book_ids)} books"
                say(
                    f"{label}: {total} chunks: {total - todo} already indexed, {todo} to embed "
                    f"with {recipe.embedding_model}"
                )
            for vectors in embed_books(work, recipe, progress):
                embedded[vectors.book_id] = vectors
        return {book_id: embedded[book_id] for book_id in chunked}

    def write(
        self,
        chunked: Mapping[str, ChunkedBook],
        embedded: Mapping[str, EmbeddedBook],
        *,
        run_id: str | None,
    ) -> dict[str, WrittenBook]:
        """Write each book's points (new ones first, then the deletions, then the document
        records), check its index, and switch a finished recipe build in."""
        replay = self._replay
        if replay is not None and replay.run_id == run_id:
            done = replay.take("write", [chunked, embedded])
            if done is not None:
                return dict(done)
        return {b: self._write(c, embedded[b], run_id) for b, c in chunked.items()}

    def _write(
        self, chunked: ChunkedBook, embedded: EmbeddedBook, run_id: str | None
    ) -> WrittenBook:
        book_id = chunked.book_id
        recipe = self.recipe_of(chunked.inventory)
        lineage = source_lineage(recipe.lineage(run_id, embedded.sparse_model), chunked.inventory)
        lineage = replace(lineage, read_options=self.parsing.key)
        with self.store.open(recipe=recipe) as store:
            checked = write_and_check(
                store, self.source, chunked, embedded, lineage, recipe.dimension
            )
            if checked is not None and not _building_beside(store, book_id):
                # nothing to switch: the builder's handle ends the run (a reader's handle
                # would unload the book's shard and load it again, a search let in between)
                return self._finished(store, chunked, embedded, checked, recipe, lineage)
        if checked is None:  # removed while the run read and embedded it
            message = f"book folder {book_id!r} was removed during this run: nothing written"
            return WrittenBook(BookResult(book_id, "missing", error_messages=[message]))
        with self.store.open() as store:  # a reader: the switch decision is finish_book's
            return self._finished(store, chunked, embedded, checked, recipe, lineage)

    def _finished(
        self,
        store: VectorStore,
        chunked: ChunkedBook,
        embedded: EmbeddedBook,
        checked: CheckedWrite,
        recipe: IndexRecipe,
        lineage: LineageInfo,
    ) -> WrittenBook:
        """The end of a book's write: a pending recipe build switched in (on ``store``, a
        reader opened after the builders closed, or the builder when none is pending)."""
        book_id = chunked.book_id
        result = book_result(chunked, embedded, checked.written, checked.consistency)
        generations = generations_of(store)
        before = None if generations is None else generations.current_recipe(book_id)
        switch = finish_book(
            store,
            chunked,
            checked.consistency,
            recipe,
            run_id=lineage.run_id,
            keep_old=self.store.config.keep_old_recipe,
        )
        result.warnings += [held_back(book_id, reason) for reason in switch.held_back]
        return WrittenBook(
            result,
            checked.written,
            checked.consistency,
            switch,
            before,
            lineage.embedding_model,
        )

    # -- everything at once, and the plan's preview ---------------------------------------------

    def run(
        self,
        book_ids: Sequence[str],
        *,
        run_id: str | None = None,
        force: bool = False,
        progress: Progress | None = None,
    ) -> dict[str, BookRun]:
        """Every stage for ``book_ids`` in one go (what a Dagster run of them does, without
        Dagster's run and metadata)."""
        assessed = self.assess(book_ids, force=force)
        parsed = self.parse({b: a.inventory for b, a in assessed.items()})
        chunked = self.chunk(parsed)
        embedded = self.embed(chunked, progress=progress)
        written = self.write(chunked, embedded, run_id=run_id)
        return {
            b: BookRun(assessed[b], parsed[b], chunked[b], embedded[b], written[b])
            for b in assessed
        }

    def prepare(self, book_ids: Sequence[str], *, run_id: str, force: bool = False) -> PreparedRun:
        """The stages of the Dagster run ``run_id`` done now, its points written under its id
        (what live mode does before the run's events: the points are searchable as soon as
        they are embedded). Stops before a stage that a blocking check of the run would stop
        (a chunk or vector problem) and at the first error: the run's step does that stage
        itself and reports it as ever."""
        prepared = PreparedRun(run_id, list(book_ids), force)
        started = time.time()
        # a book's shard loaded once for every stage, as within a run, and kept for an edit's
        # stages even when a search waits (PREPARE_HOLD_S: it then gets the edit at once);
        # let go when another process waits past that, and closed when the block ends
        with kept_open(PREPARE_HOLD_S):
            self._prepare(prepared)
            closing = time.perf_counter()
        prepared.seconds["close"] = time.perf_counter() - closing
        log.info(
            "run %s prepared: started at %.3f, %s",
            run_id,
            started,
            ", ".join(f"{stage} {s:.3f} s" for stage, s in prepared.seconds.items()),
        )
        return prepared

    def _prepare(self, prepared: PreparedRun) -> None:
        """The stages of :meth:`prepare`, each output kept as it comes."""
        out, book_ids, run_id = prepared.outputs, prepared.book_ids, prepared.run_id
        force = prepared.force
        lap = time.perf_counter()

        def timed(stage: str) -> None:
            nonlocal lap
            now = time.perf_counter()
            prepared.seconds[stage], lap = now - lap, now

        try:
            out["assess"] = assessed = self.assess(book_ids, force=force)
            timed("assess")
            out["parse"] = parsed = self.parse({b: a.inventory for b, a in assessed.items()})
            timed("parse")
            out["chunk"] = chunked = self.chunk(parsed)
            timed("chunk")
            if any(book.problems for book in chunked.values()):
                return  # chunks_valid blocks the embedding and the write
            out["embed"] = embedded = self.embed(chunked, say=prepared.said.append)
            timed("embed")
            if any(book.problems for book in embedded.values()):
                return  # vector_dimension blocks the write
            out["write"] = self.write(chunked, embedded, run_id=run_id)
            timed("write")
        except Exception:  # the run's step meets it again and records it
            log.debug("stages of run %s left to the run", run_id, exc_info=True)

    @contextlib.contextmanager
    def replaying(self, prepared: PreparedRun) -> Iterator[None]:
        """While the Dagster run of ``prepared`` executes (in this process), its steps are
        handed the stages already done instead of doing them again."""
        self._replays.prepared = prepared
        try:
            yield
        finally:
            self._replays.prepared = None

    def preview(
        self, assessment: BookInventory, recipe: IndexRecipe
    ) -> tuple[WritePreview, ChunkedBook]:
        """What a run of the assessed book will do, counted by the run's own parse and chunk
        stages (nothing embedded or written): ``plan``'s preview."""
        parsed = parse_book(assessment, self.source, self.parsing)
        chunked = chunk_book(parsed, recipe)
        return preview_writes(chunked), chunked

    def plan(
        self,
        store: VectorStore,
        book_ids: Sequence[str] | None = None,
        *,
        force: bool = False,
        detail: bool = False,
    ) -> IngestPlan:
        """What an ingest of ``book_ids`` (default: every book) does (see
        :func:`rag_pipeline.ingest.plan.plan_ingest`), reading through ``store``."""
        from rag_pipeline.ingest.plan import plan_ingest

        return plan_ingest(self, store, book_ids, force=force, detail=detail)

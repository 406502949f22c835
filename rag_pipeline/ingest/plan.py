"""The ingest plan: for every book, run, unchanged, purge or missing, and why.

One function decides, for ``rag-pipeline plan``, ``rag-pipeline ingest`` and (its purge policy)
the books sensor, so what ``plan`` prints is what ``ingest`` then does: a book's run or
unchanged is a view of its assessment (:mod:`rag_pipeline.ingest.assess`), the one the run's
first step makes. The decision reads the files on disk and only the index's document records
and point counts (per book; per file where a book's count is off; never chunk payloads; a
few vectors are probed for damage), so planning every book of a corpus takes a fraction of a
second. With ``detail``, the assessment also reads the chunk payloads a run reads (no text),
and books that will run are parsed and chunked from it (nothing is embedded or written) to
count the chunks to embed, the tokens and the points to delete. Either way each file is
hashed once, and only the files that run are read."""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from rag_pipeline.ingest.assess import (
    BookAssessment,
    assess,
    read_book_index,
    saved_book_index,
)
from rag_pipeline.ingest.catalog import file_stats_from_summary, index_from_summary
from rag_pipeline.ingest.changes import FileChanges, records_of_other_rules
from rag_pipeline.ingest.consistency import check_vectors
from rag_pipeline.ingest.index import read_index_state
from rag_pipeline.ingest.migration import migration_label, resumed_build
from rag_pipeline.ingest.report import BookResult, IngestReport
from rag_pipeline.ingest.stages import WritePreview, rebuilt_reason
from rag_pipeline.models import FileError, validate_book_id
from rag_pipeline.recipes.recipe import IndexRecipe
from rag_pipeline.schema import EMBEDDING_MODEL, SIGNATURE, book_filter
from rag_pipeline.sources.base import BookSource, BookUnavailableError
from rag_pipeline.store import BookDamagedError, VectorStore
from rag_pipeline.store.capabilities import generations_of, saved_summary
from rag_pipeline.store.errors import StoreBusyError

if TYPE_CHECKING:
    from rag_pipeline.ingest.pipeline import IngestPipeline
    from rag_pipeline.recipes.choice import RecipeSource

__all__ = [
    "Action",
    "BookPlan",
    "IngestPlan",
    "PurgeDecision",
    "RulesCheck",
    "books_of_other_parse_rules",
    "books_of_other_recipes",
    "decide_purges",
    "plan_book",
    "plan_ingest",
    "refusing_to_purge_all",
]

Action = Literal["run", "unchanged", "purge", "missing"]


def cost_usd(tokens: int, usd_per_million_tokens: float) -> float:
    """What embedding ``tokens`` costs at the embedder's price, to the micro-dollar."""
    return round(tokens * usd_per_million_tokens / 1_000_000, 6)


@dataclass
class BookPlan:
    """What the next ingest does with one book, and why."""

    book_id: str
    action: Action
    reasons: list[str] = field(default_factory=list)
    changes: FileChanges = field(default_factory=FileChanges)
    files: int = 0
    errors: list[str] = field(default_factory=list)  # crawl errors and standing file errors
    chunks: int = 0  # what the document records promise
    points: int = 0  # chunk points the index holds (for a purge: every point of the book)
    preview: WritePreview | None = None
    seconds: float = 0.0
    #: the model the book is built with, and the one its index records (None: nothing yet)
    embedding_model: str = ""
    recorded_model: str | None = None
    #: files of the book are indexed with another recipe: the run embeds them again
    recipe_change: bool = False
    #: the recipe signature the book is built with, and the one its files record
    signature: str = ""
    recorded_signature: str | None = None
    #: where the book comes from (kind, location; see BookSource.describe) and, for a source
    #: with revisions (git), the one indexed, the one the run reads, and that range in words
    source: dict[str, str] = field(default_factory=dict)
    indexed_revision: str | None = None
    revision: str | None = None
    revisions: str | None = None

    @property
    def migration(self) -> str | None:
        """What the book's recipe change is (the ``rag/migration`` run tag), or None."""
        if not self.recipe_change:
            return None
        return migration_label(
            {
                EMBEDDING_MODEL: self.recorded_model or "",
                SIGNATURE: self.recorded_signature or "?",
            },
            {EMBEDDING_MODEL: self.embedding_model, SIGNATURE: self.signature},
        )

    def result(self) -> BookResult:
        """The report of a book that starts no run (unchanged or missing)."""
        return BookResult(
            self.book_id,
            "unchanged" if self.action == "unchanged" else "missing",
            files=self.files,
            errors=len(self.errors),
            chunks=self.chunks,
            points=self.points,
            seconds=self.seconds,
            error_messages=list(self.errors),
            reasons=list(self.reasons),
            files_unreadable=self.changes.counts()["files_unreadable"],
        )

    def as_dict(self, usd_per_million_tokens: float) -> dict[str, Any]:
        c = self.changes
        p = self.preview
        purge = self.action == "purge"
        to_embed = p.to_embed if p else 0
        tokens = p.tokens if p else 0
        return {
            "action": self.action,
            "reasons": self.reasons,
            **c.counts(),
            "files": {s: list(getattr(c, s)) for s in ("new", "modified", "deleted", "unreadable")},
            "chunks": p.chunks if p else (0 if purge else self.chunks),
            "chunks_to_embed": to_embed,
            "chunks_reused": p.reused if p else (0 if purge else self.chunks),
            "tokens_to_embed": tokens,
            "cost_usd": cost_usd(tokens, usd_per_million_tokens),
            "points_to_delete": p.points_to_delete if p else (self.points if purge else 0),
            "errors": self.errors,
            "embedding_model": self.embedding_model or None,
            "recorded_embedding_model": self.recorded_model,
            "recipe_change": self.recipe_change_cost(usd_per_million_tokens),
            "source": self.source or None,
            "indexed_revision": self.indexed_revision,
            "revision": self.revision,
            "revisions": self.revisions,
        }

    def recipe_change_cost(self, usd_per_million_tokens: float) -> dict[str, Any] | None:
        """What the book's recipe change costs (its whole run: every file is embedded
        again), or None when its recipe does not change."""
        if not self.recipe_change:
            return None
        chunks = self.preview.to_embed if self.preview else self.chunks
        tokens = self.preview.tokens if self.preview else 0
        return {
            "from": self.recorded_model,
            "to": self.embedding_model,
            "chunks_to_embed": chunks,
            "tokens_to_embed": tokens,
            "cost_usd": cost_usd(tokens, usd_per_million_tokens),
        }


@dataclass
class IngestPlan:
    """The plan of one ingest request."""

    books: dict[str, BookPlan]
    rejected: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    force: bool = False
    seconds: float = 0.0
    #: the books the store holds points of, as the plan read them
    indexed: frozenset[str] = frozenset()
    #: the plan refused to purge or ingest (:attr:`PurgeDecision.halt`)
    halted: bool = False

    def with_action(self, action: Action) -> list[str]:
        return [b for b, p in self.books.items() if p.action == action]

    @property
    def needs_runs(self) -> bool:
        return any(p.action in ("run", "purge") for p in self.books.values())

    def partitions_to_drop(self, source: BookSource, partitions: Collection[str]) -> list[str]:
        """The book partitions that go with no purge run: a book with no folder (or entry)
        and no points, whether or not a run of it ever succeeded (one whose runs all failed,
        then removed). A book still indexed keeps its partition until its purge; a halted plan
        (a wrong or empty data folder) drops none. The rule every path that removes books
        follows (the books sensor purges such a book, its purge deleting nothing)."""
        if self.halted:
            return []
        return [
            b
            for b in partitions
            if b not in self.indexed
            and (b not in self.books or self.books[b].action == "missing")
            and source.is_gone(b)
        ]

    def recipe_change(self, usd_per_million_tokens: float) -> dict[str, Any]:
        """What the recipe changes of the plan cost in total: the books whose index was
        built with another recipe, their chunks and tokens to embed, and US dollars."""
        costs = {b: p.recipe_change_cost(usd_per_million_tokens) for b, p in self.books.items()}
        changed = {b: c for b, c in costs.items() if c is not None}
        tokens = sum(c["tokens_to_embed"] for c in changed.values())
        return {
            "books": list(changed),
            "books_affected": len(changed),
            "chunks_to_embed": sum(c["chunks_to_embed"] for c in changed.values()),
            "tokens_to_embed": tokens,
            "cost_usd": cost_usd(tokens, usd_per_million_tokens),
        }

    def report(self) -> IngestReport:
        """The report of an ingest that starts no run."""
        return IngestReport(
            books={b: p.result() for b, p in self.books.items()},
            rejected=list(self.rejected),
            warnings=list(self.warnings),
            seconds=self.seconds,
        )


def refusing_to_purge_all(source: BookSource, count: int, on_disk: int = 0) -> str:
    where = source.description
    if not on_disk:
        return (
            f"no {source.book_noun} in the {where}: refusing to purge all {count} indexed books "
            "at once; purge books one by one with `rag-pipeline ingest --book ID`"
        )
    return (
        f"none of the {count} indexed books is in the {where} (it holds {on_disk} other "
        f"book folder{'s' if on_disk != 1 else ''}): is RAG_DATA_DIR right? Refusing to purge "
        f"all {count} indexed books at once, and ingesting nothing until this is settled: "
        "name the books to ingest or purge with `rag-pipeline ingest --book ID`"
    )


@dataclass(frozen=True)
class PurgeDecision:
    """Which books lose their points, which asked-for books do not exist, and warnings."""

    purge: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()  # no usable folder, but the folder still exists: points stay
    warnings: tuple[str, ...] = ()
    #: the data folder holds none of the indexed books (empty, unmounted, the wrong folder):
    #: nothing is purged or ingested, until an operator names books (``--book``)
    halt: bool = False


def decide_purges(
    source: BookSource,
    on_disk: Collection[str],
    indexed: Collection[str],
    targets: Sequence[str] | None = None,
) -> PurgeDecision:
    """The purge policy. A book is purged only when its folder no longer exists; a folder that
    exists but cannot be used (refused, unreadable) keeps its points. Without named books, a
    purge never empties the index: when no indexed book is left in the data folder, nothing is
    purged, and nothing is ingested either (``halt``): that is far more often an unmounted
    volume or a wrong ``RAG_DATA_DIR`` (other folders, none of the indexed books) than a
    decision to replace every book, and ingesting the other folders would make the next
    decision purge the indexed books after all. Named books (``--book``) still run or purge."""
    candidates = (
        [b for b in targets if b not in on_disk]
        if targets is not None
        else sorted(set(indexed) - set(on_disk))
    )
    if targets is None and candidates and not set(indexed) & set(on_disk):
        return PurgeDecision(
            kept=tuple(candidates),
            warnings=(refusing_to_purge_all(source, len(candidates), len(on_disk)),),
            halt=True,
        )
    purge, missing, kept, warnings = [], [], [], []
    for book_id in candidates:
        if not source.is_gone(book_id):
            kept.append(book_id)
            warnings.append(
                f"{source.book_noun} {book_id!r} {source.why_not_a_book(book_id)}; "
                "its indexed points are kept"
            )
        elif book_id in indexed:
            purge.append(book_id)
        else:
            missing.append(book_id)
    return PurgeDecision(tuple(purge), tuple(missing), tuple(kept), tuple(warnings))


@dataclass(frozen=True)
class RulesCheck:
    """Which books hold a record written under other rules (parse rules, read settings,
    a recipe), and which could not be looked at now (busy: looked at again later)."""

    stale: tuple[str, ...] = ()
    busy: tuple[str, ...] = ()


def books_of_other_parse_rules(
    store: VectorStore, book_ids: Sequence[str], parse_version: str, read_options: str
) -> RulesCheck:
    """The books a run under ``parse_version`` and ``read_options`` has work for because
    of their records alone (the rule of :func:`~rag_pipeline.ingest.changes.classify_files`,
    applied to what the records say, no file read): what the books sensor and a plan agree on
    after an upgrade of the parse rules or a change of the read settings. Each book's
    saved summary is read where the store vouches for it, else its document records (no
    chunk payloads)."""
    stale: list[str] = []
    busy: list[str] = []
    for book_id in book_ids:
        try:
            saved = index_from_summary(saved_summary(store, book_id), book_id)
            state = saved[0] if saved is not None else None
            if state is None:
                state = read_index_state(store, book_id, documents_only=True)
        except StoreBusyError:
            busy.append(book_id)
            continue
        except BookDamagedError:  # not a parse-rules matter: its plan says what it needs
            continue
        if records_of_other_rules(state.documents, parse_version, read_options):
            stale.append(book_id)
    return RulesCheck(tuple(stale), tuple(busy))


def books_of_other_recipes(
    store: VectorStore,
    book_ids: Sequence[str],
    recipes: RecipeSource,
    building: Collection[str] = (),
) -> RulesCheck:
    """The books a run has work for because of their recipe alone (no file read): the
    searched index was built with another recipe than the one the book is built with now
    (``recipes.for_book``: the configured one, save ``auto``'s recorded precision), or a
    build of another recipe is pending beside it (the run drops it, as a plan says). A book
    in ``building`` (a run of it in flight) whose pending build is of its recipe is left to
    that run. The searched recipe is the generation's tag where the store keeps one, else
    the signature of most of the book's document records (saved summary, else the records);
    a book with nothing indexed is no matter of recipe (its files say when it runs)."""
    stale: list[str] = []
    busy: list[str] = []
    generations = generations_of(store)
    for book_id in book_ids:
        try:
            wanted = recipes.for_book(store, book_id).recipe.signature
            current, pending = (
                generations.recipes(book_id) if generations is not None else (None, None)
            )
            searched = (current or {}).get(SIGNATURE)
            if searched is None:
                saved = index_from_summary(saved_summary(store, book_id), book_id)
                state = saved[0] if saved is not None else None
                if state is None:
                    state = read_index_state(store, book_id, documents_only=True)
                searched = state.recorded_signature
        except StoreBusyError:
            busy.append(book_id)
            continue
        except BookDamagedError:  # not a recipe matter: its plan says what it needs
            continue
        pending_signature = (pending or {}).get(SIGNATURE)
        if pending_signature is not None and pending_signature != wanted:
            stale.append(book_id)  # an unfinished build of a recipe no longer wanted
        elif searched is not None and searched != wanted:
            if pending_signature == wanted and book_id in building:
                continue  # its build is under way
            stale.append(book_id)
    return RulesCheck(tuple(stale), tuple(busy))


def plan_ingest(
    pipeline: IngestPipeline,
    store: VectorStore,
    book_ids: Sequence[str] | None = None,
    *,
    force: bool = False,
    detail: bool = False,
) -> IngestPlan:
    """Decide what an ingest of ``book_ids`` (default: every book of the pipeline's source)
    does, reading the index through ``store`` (a reader handle); each book is assessed with
    its own recipe (``pipeline.recipes.for_book``).

    Raises :class:`~rag_pipeline.sources.base.SourceUnavailableError` when the source itself
    is missing (a data folder that is not there)."""
    started = time.perf_counter()
    source = pipeline.source
    targets = [validate_book_id(b) for b in book_ids] if book_ids else None
    scan = source.list_books()
    on_disk = set(scan.book_ids)
    indexed = set(store.tenants())
    decision = decide_purges(source, on_disk, indexed, targets)
    plan = IngestPlan({}, [str(e) for e in scan.rejected], list(decision.warnings), force)
    plan.indexed, plan.halted = frozenset(indexed), decision.halt
    if decision.halt:
        plan.seconds = time.perf_counter() - started
        return plan
    for book_id in targets if targets is not None else scan.book_ids:
        t0 = time.perf_counter()
        if book_id in decision.purge:
            plan.books[book_id] = _purge_plan(store, book_id)
        elif book_id in decision.missing or book_id in decision.kept:
            plan.books[book_id] = BookPlan(
                book_id,
                "missing",
                [f"no usable {source.book_noun} {book_id!r} in the {source.description}"],
                errors=_refusals(book_id, scan.rejected)
                or [f"no {source.book_noun} {book_id!r} in the {source.description}"],
            )
        else:
            try:
                chosen = pipeline.recipes.for_book(store, book_id)
                plan.books[book_id] = book = plan_book(
                    pipeline, store, chosen.recipe, book_id, force=force, detail=detail
                )
                book.recorded_model = chosen.choice.recorded_model
            except BookDamagedError as exc:  # the run discards it and rebuilds the book
                plan.books[book_id] = BookPlan(
                    book_id, "run", [rebuilt_reason(exc.problem)], errors=[str(exc)]
                )
            except BookUnavailableError as exc:  # its run looks again, and fails with this
                plan.books[book_id] = BookPlan(
                    book_id,
                    "run",
                    ["its source could not be looked at: its points are kept; the run retries"],
                    errors=[str(exc)],
                    source=source.describe(book_id),
                )
        plan.books[book_id].seconds = time.perf_counter() - t0
    if targets is None:
        for book_id in decision.purge:
            plan.books[book_id] = _purge_plan(store, book_id)
    plan.seconds = time.perf_counter() - started
    return plan


def _refusals(book_id: str, rejected: Sequence[FileError]) -> list[str]:
    return [f"{e.book_id}: {e.reason}" for e in rejected if e.book_id == book_id]


def _purge_plan(store: VectorStore, book_id: str) -> BookPlan:
    # every point of the book (chunks and document records), as the purge deletes them
    try:
        points = store.count(book_filter(book_id))
    except BookDamagedError:
        points = 0  # what is left of a damaged book is removed all the same
    return BookPlan(book_id, "purge", ["book folder removed"], points=points)


def plan_book(
    pipeline: IngestPipeline,
    store: VectorStore,
    recipe: IndexRecipe,
    book_id: str,
    *,
    force: bool = False,
    detail: bool = False,
) -> BookPlan:
    """Run or unchanged, as the book's assessment says (see :mod:`rag_pipeline.ingest.assess`);
    with ``detail``, a book that runs gets the preview of its run, from the same assessment
    and by the pipeline's own stages. A book its saved summary shows unchanged needs no
    preview: decided without its shard.

    The book is assessed against the index its run reads: a build of ``recipe`` pending
    beside the searched index (a run held back or killed, :func:`resumed_build`) is read
    through a builder of the recipe, as the run's steps read it, so the plan counts and
    prices what the run embeds, not the vectors already built."""
    pending = resumed_build(store, book_id, recipe)
    if pending is None:
        return _plan_book(pipeline, store, recipe, book_id, force=force, detail=detail)
    generations = generations_of(store)
    searched = None if generations is None else generations.current_recipe(book_id)
    with pipeline.store.open(recipe=recipe) as builder:
        book = _plan_book(pipeline, builder, recipe, book_id, force=force, detail=detail)
    searched_signature = (searched or {}).get(SIGNATURE)
    if searched_signature is not None and searched_signature != recipe.signature:
        # a migration still: the book is searched with the other recipe until its run switches
        book.recipe_change, book.recorded_signature = True, searched_signature
    book.action = "run"  # the run switches the build, or says why it is held back again
    model = pending.get(EMBEDDING_MODEL) or f"recipe {recipe.signature}"
    book.reasons.append(
        f"a build of its recipe ({model}) is pending beside the searched index: "
        "the run resumes it, reusing the vectors already built"
    )
    return book


def _plan_book(
    pipeline: IngestPipeline,
    store: VectorStore,
    recipe: IndexRecipe,
    book_id: str,
    *,
    force: bool,
    detail: bool,
) -> BookPlan:
    """:func:`plan_book`, reading the book's index through ``store``."""
    source = pipeline.source
    summary = saved_summary(store, book_id)
    found = source.scan(book_id, None if force else file_stats_from_summary(summary))
    saved = None if force or not detail else saved_book_index(store, book_id)
    options = pipeline.parsing.key
    assessment = (
        None if saved is None else assess(found, saved, recipe, source, read_options=options)
    )
    if assessment is None or assessment.changes.has_work:
        index = read_book_index(store, book_id, recipe, chunk_payloads=detail, found=found)
        assessment = assess(found, index, recipe, source, read_options=options, force=force)
    book = plan_of(assessment)
    book.source = source.describe(book_id)
    abandoned = abandoned_build(store, book_id, recipe)
    if book.action == "unchanged" and abandoned is not None:
        book.action = "run"  # its run drops the build (finish_build): nothing else will
        book.reasons.append(abandoned)
    if found.revision:
        # the book's records decide it, read from the book or its summary alike (IndexState)
        book.indexed_revision = assessment.state.revision
        book.revision = found.revision
        book.revisions = source.revision_range(book_id, book.indexed_revision or "", found.revision)
        if book.action == "run" and book.revisions:
            book.reasons.append(book.revisions)
    if detail and book.action == "run":
        preview, chunked = pipeline.preview(assessment, recipe)
        book.preview = preview
        # a file the crawl refused is also an unreadable file of the run, with the crawl's
        # reason (parse_book): one fact, listed once
        crawl = {(e.source_file, e.reason) for e in assessment.crawl_errors}
        run = [e for e in chunked.errors if (e.source_file, e.reason) not in crawl]
        book.errors = [str(e) for e in (*assessment.crawl_errors, *run)]
        book.errors += [str(e) for e in chunked.inventory.recorded_errors]
    if book.action == "run" and generations_of(store) is None:
        # one dimension per collection: the run's blocking check will refuse this model's
        book.errors += [f"{book_id}: {p}" for p in dimension_refusals(store, recipe)]
    return book


def abandoned_build(store: VectorStore, book_id: str, recipe: IndexRecipe) -> str | None:
    """Why a book whose index matches ``recipe`` still runs: a build beside of another recipe
    (a setting changed, then changed back before that build switched) is pending in its
    folder, or a switch killed half way left its old generation: kept on disk (the first
    shown as pending) until a run of the book drops it (``finish_build``); None when there
    is neither."""
    generations = generations_of(store)
    if generations is None:
        return None
    pending = generations.pending_recipe(book_id)
    if pending is None:
        left = generations.leftovers(book_id)
        if not left:
            return None
        return f"a switch of its recipe was cut short: {', '.join(left)} left; the run removes it"
    if pending.get(SIGNATURE) == recipe.signature:
        return None
    model = pending.get(EMBEDDING_MODEL) or f"recipe {pending.get(SIGNATURE, '?')}"
    return f"an unfinished build of another recipe ({model}) is pending: the run drops it"


def dimension_refusals(store: VectorStore, recipe: IndexRecipe) -> list[str]:
    """Why a run of ``recipe`` will be refused by a store whose collection has one dimension
    (the ``vector_dimension`` check's words; [] when it will not)."""
    held = store.dense_dimension()
    empty = np.empty((0, recipe.dimension), dtype=np.float32)
    return check_vectors(empty, recipe.dimension, held) if held is not None else []


def plan_of(assessment: BookAssessment) -> BookPlan:
    """The plan's view of a book's assessment."""
    failing_now = {e.source_file for e in assessment.crawl_errors}  # today's error is listed
    standing = [e for e in assessment.recorded_errors if e.source_file not in failing_now]
    changes = assessment.changes
    return BookPlan(
        assessment.book_id,
        "run" if changes.has_work else "unchanged",
        assessment.reasons,
        changes,
        files=len(assessment.files) + changes.counts()["files_unreadable"],
        errors=[str(e) for e in (*assessment.crawl_errors, *standing)],
        chunks=assessment.state.promised_chunks,
        points=assessment.state.chunk_points,
        embedding_model=assessment.embedding_model,
        recipe_change=assessment.recipe_change and changes.has_work,
        signature=assessment.signature,
        recorded_signature=assessment.recorded_signature,
    )

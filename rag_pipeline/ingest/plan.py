"""The ingest plan: for every book, run, unchanged, purge or missing, and why.

One function decides, for ``rag-pipeline plan``, ``rag-pipeline ingest`` and (its purge policy)
the books sensor, so what ``plan`` prints is what ``ingest`` then does. The decision reads the
files on disk and only the index's document records and per-file point counts (never chunk
payloads or vectors), so planning every book of a corpus takes a fraction of a second. With
``detail``, books that will run are also read, parsed and chunked (nothing is embedded or
written) to count the chunks to embed, the tokens and the points to delete.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, Literal

from rag_pipeline.config import SourceConfig
from rag_pipeline.ingest.changes import FileChanges, classify_files
from rag_pipeline.ingest.crawl import (
    book_folder_problem,
    discover_books,
    path_is_gone,
    unreadable_reason,
)
from rag_pipeline.ingest.index import damaged_vectors, read_index_state
from rag_pipeline.ingest.recipe import IndexRecipe
from rag_pipeline.ingest.report import BookResult, IngestReport
from rag_pipeline.ingest.stages import (
    WritePreview,
    chunk_book,
    parse_book,
    preview_writes,
    read_book_files,
    take_inventory,
)
from rag_pipeline.models import FileError, validate_book_id
from rag_pipeline.schema import book_filter, chunks_of
from rag_pipeline.store import VectorStore

__all__ = [
    "Action",
    "BookPlan",
    "IngestPlan",
    "PurgeDecision",
    "decide_purges",
    "plan_ingest",
    "refusing_to_purge_all",
]

Action = Literal["run", "unchanged", "purge", "missing"]


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
            "cost_usd": round(tokens * usd_per_million_tokens / 1_000_000, 6),
            "points_to_delete": p.points_to_delete if p else (self.points if purge else 0),
            "errors": self.errors,
        }


@dataclass
class IngestPlan:
    """The plan of one ingest request."""

    books: dict[str, BookPlan]
    rejected: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    force: bool = False
    seconds: float = 0.0

    def with_action(self, action: Action) -> list[str]:
        return [b for b, p in self.books.items() if p.action == action]

    @property
    def needs_runs(self) -> bool:
        return any(p.action in ("run", "purge") for p in self.books.values())

    def report(self) -> IngestReport:
        """The report of an ingest that starts no run."""
        return IngestReport(
            books={b: p.result() for b, p in self.books.items()},
            rejected=list(self.rejected),
            warnings=list(self.warnings),
            seconds=self.seconds,
        )


def refusing_to_purge_all(data_dir: Path, count: int, on_disk: int = 0) -> str:
    if not on_disk:
        return (
            f"no book folder under {data_dir}: refusing to purge all {count} indexed books "
            "at once; purge books one by one with `rag-pipeline ingest --book ID`"
        )
    return (
        f"none of the {count} indexed books is under {data_dir} (it holds {on_disk} other "
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
    data_dir: Path,
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
            warnings=(refusing_to_purge_all(data_dir, len(candidates), len(on_disk)),),
            halt=True,
        )
    purge, missing, kept, warnings = [], [], [], []
    for book_id in candidates:
        if not path_is_gone(data_dir, book_id):
            kept.append(book_id)
            warnings.append(
                f"book folder {book_id!r} {book_folder_problem(data_dir, book_id)}; "
                "its indexed points are kept"
            )
        elif book_id in indexed:
            purge.append(book_id)
        else:
            missing.append(book_id)
    return PurgeDecision(tuple(purge), tuple(missing), tuple(kept), tuple(warnings))


def plan_ingest(
    source: SourceConfig,
    store: VectorStore,
    recipe: IndexRecipe,
    book_ids: Sequence[str] | None = None,
    *,
    force: bool = False,
    detail: bool = False,
) -> IngestPlan:
    """Decide what an ingest of ``book_ids`` (default: every book folder) does.

    Raises :class:`~rag_pipeline.ingest.crawl.DataDirError` when the data folder is missing."""
    started = time.perf_counter()
    targets = [validate_book_id(b) for b in book_ids] if book_ids else None
    scan = discover_books(source.data_dir)
    on_disk = set(scan.book_ids)
    indexed = set(store.tenants())
    decision = decide_purges(source.data_dir, on_disk, indexed, targets)
    plan = IngestPlan({}, [str(e) for e in scan.rejected], list(decision.warnings), force)
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
                [f"no usable book folder {book_id!r} under {source.data_dir}"],
                errors=_refusals(book_id, scan.rejected)
                or [f"no book folder {book_id!r} under {source.data_dir}"],
            )
        else:
            plan.books[book_id] = assess_book(source, store, recipe, book_id, force=force)
            if detail and plan.books[book_id].action == "run":
                _add_preview(plan.books[book_id], source, store, recipe, force)
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
    points = store.count(book_filter(book_id))
    return BookPlan(book_id, "purge", ["book folder removed"], points=points)


def assess_book(
    source: SourceConfig,
    store: VectorStore,
    recipe: IndexRecipe,
    book_id: str,
    *,
    force: bool = False,
) -> BookPlan:
    """Run or unchanged: every file, the chunker and the model must match the book's document
    records, and the index must hold exactly the chunk points each record promises."""
    found = read_book_files(source, book_id)
    errors = [str(e) for e in found.errors]
    current = {f.source_file: f.sha256 for f in found.files}
    state = read_index_state(store, book_id, documents_only=True)
    counts = store.counts_by(chunks_of(book_id), "source_file")
    book_dir = Path(source.data_dir) / book_id
    damaged = bool(state.documents) and _damaged(store, book_id, recipe)
    changes = classify_files(
        current,
        state.documents,
        recipe.signature,
        is_gone=lambda name: path_is_gone(book_dir, name),
        chunk_points=counts,
        orphan_files=set(counts) - set(state.documents),
        force=force or damaged,
        why_unreadable=lambda name: unreadable_reason(book_dir, name),
    )
    failing_now = {e.source_file for e in found.errors}  # their error of today is listed
    errors += [
        f"{book_id}/{d.source_file}: {d.error}"
        for d in state.documents.values()
        if d.status == "error"
        and d.source_file not in changes.changed
        and d.source_file not in failing_now
    ]
    reasons = _reasons(changes, force, damaged)
    return BookPlan(
        book_id,
        "run" if changes.has_work else "unchanged",
        reasons,
        changes,
        files=len(found.files),
        errors=errors,
        chunks=state.promised_chunks,
        points=sum(counts.values()),
    )


def _damaged(store: VectorStore, book_id: str, recipe: IndexRecipe) -> bool:
    sample = [r.id for r in islice(store.scroll(chunks_of(book_id), fields=[], page_size=4), 4)]
    return damaged_vectors(store, book_id, sample, recipe.dimension) > 0


def _reasons(changes: FileChanges, force: bool, damaged: bool) -> list[str]:
    if damaged:
        return ["stored vectors are damaged: the book is rebuilt"]
    if force:
        return ["forced rebuild"]
    out: list[str] = []
    by_reason: dict[str, list[str]] = {}
    for name, reason in changes.reasons.items():
        by_reason.setdefault(reason, []).append(name)
    for reason, names in sorted(by_reason.items()):
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        out.append(f"{reason}: {shown}")
    return out


def _add_preview(
    book: BookPlan, source: SourceConfig, store: VectorStore, recipe: IndexRecipe, force: bool
) -> None:
    """Parse and chunk what will run (nothing embedded or written) to count the work."""
    inventory = take_inventory(source, book.book_id, store, recipe, force=force)
    parsed = parse_book(inventory, source)
    chunked = chunk_book(parsed, recipe)
    book.preview = preview_writes(chunked)
    book.changes = inventory.changes
    book.errors = [str(e) for e in (*inventory.crawl_errors, *chunked.errors)]
    book.errors += [str(e) for e in parsed.standing_errors]

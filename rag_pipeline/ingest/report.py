"""What an ingest did, per book: the ``rag-pipeline ingest --json`` contract."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["BookResult", "BookStatus", "IngestReport"]

#: ``deferred``: not run, the process was asked to stop first (live mode stops after the run
#: in hand; the next live process or the books sensor runs the book)
BookStatus = Literal["ingested", "unchanged", "removed", "failed", "missing", "deferred"]


@dataclass
class BookResult:
    book_id: str
    status: BookStatus
    files: int = 0
    errors: int = 0
    chunks: int = 0  # what the document records promise
    embedded: int = 0
    points: int = 0  # chunk points the index holds (== chunks when consistent)
    reused: int = 0
    deleted: int = 0
    files_new: int = 0
    files_modified: int = 0
    files_deleted: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    embed_seconds: float = 0.0
    seconds: float = 0.0
    run_id: str | None = None
    error_messages: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)  # why the book ran (or was purged)
    files_unreadable: int = 0

    def __post_init__(self) -> None:
        # README's rule: ``errors`` counts the entries of ``error_messages`` (each bad file,
        # and a failed book's failed step or run), whoever made the result: the CLI, live
        # mode, a run's failure (a failed run said 0 errors beside its message)
        self.errors = max(self.errors, len(self.error_messages))

    def as_dict(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "errors": self.errors,
            "chunks": self.chunks,
            "embedded": self.embedded,
            "points": self.points,
            "reused": self.reused,
            "deleted": self.deleted,
            "files_new": self.files_new,
            "files_modified": self.files_modified,
            "files_deleted": self.files_deleted,
            "files_unreadable": self.files_unreadable,
            "status": self.status,
            "tokens": self.tokens,
            "cost_usd": round(self.cost_usd, 6),
            "embed_seconds": round(self.embed_seconds, 3),
            "seconds": round(self.seconds, 3),
            "run_id": self.run_id,
            "error_messages": self.error_messages,
            "warnings": self.warnings,
            "reasons": self.reasons,
        }


@dataclass
class IngestReport:
    books: dict[str, BookResult] = field(default_factory=dict)
    rejected: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not any(b.status in ("failed", "missing") for b in self.books.values())

    def followed_by(self, later: IngestReport) -> IngestReport:
        """This report with what a later ingest changed (a rebuild, then the catch-up of the
        books changed while it built): a later book's result wins unless it is unchanged."""
        books = dict(self.books)
        for book_id, result in later.books.items():
            if result.status != "unchanged" or book_id not in books:
                books[book_id] = result
        return IngestReport(
            books,
            sorted({*self.rejected, *later.rejected}),
            [*self.warnings, *(w for w in later.warnings if w not in self.warnings)],
            self.seconds + later.seconds,
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "books": {k: v.as_dict() for k, v in self.books.items()},
            "rejected_folders": self.rejected,
            "warnings": self.warnings,
            "seconds": round(self.seconds, 3),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> IngestReport:
        """The report whose :meth:`as_dict` is ``data`` (what another process printed or sent:
        a field this version does not know is left out)."""
        known = set(BookResult.__dataclass_fields__) - {"book_id"}
        books = {
            book_id: BookResult(book_id, **{k: v for k, v in fields.items() if k in known})
            for book_id, fields in data["books"].items()
        }
        return cls(
            books,
            list(data.get("rejected_folders", [])),
            list(data.get("warnings", [])),
            float(data.get("seconds", 0.0)),
        )

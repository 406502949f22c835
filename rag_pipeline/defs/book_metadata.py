"""What each per-book asset records for a book, rendered from its stage's output: the
metadata a person reads on the asset's and the run's page, and the parse check's verdict.

The assets (:mod:`.assets`) call these after their stage; nothing here runs a stage.
"""

from typing import Any

from dagster import AssetCheckSeverity, TableMetadataValue

from rag_pipeline.defs.batch import BookCheck
from rag_pipeline.defs.metadata import error_table, markdown_list, shorten, table
from rag_pipeline.defs.parse_check import parse_errors_verdict
from rag_pipeline.ingest.index import WriteReport
from rag_pipeline.ingest.migration import SwitchOutcome
from rag_pipeline.ingest.pipeline import AssessedBook
from rag_pipeline.ingest.stages import BookInventory, ChunkedBook, EmbeddedBook, ParsedBook
from rag_pipeline.schema import SOURCE_REVISION
from rag_pipeline.sources.base import BookSource

__all__ = [
    "TABLE_ROWS",
    "details",
    "inventory_metadata",
    "parse_errors_verdict",
    "parsed_metadata",
    "recipe_metadata",
    "source_metadata",
    "when",
    "write_summary",
    "written_table",
]

#: rows a table of a book's materialization shows at most (its totals are beside it): what a
#: person reads on the page, and the instance keeps for every book of every run
TABLE_ROWS = 10


def when(condition: bool, **entries: Any) -> dict[str, Any]:
    """``entries`` if ``condition``, else none: an entry that would only say "nothing" (an
    empty error table, no migration) costs the instance space in every book of every run."""
    return dict(entries) if condition else {}


def details(problems: list[str]) -> dict[str, Any]:
    """A check's problems, listed (when there are any)."""
    listed = markdown_list(problems[:50])
    return when(bool(problems), details=listed)


def source_metadata(source: BookSource, inventory: BookInventory) -> dict[str, Any]:
    """Where the book's files came from: the source's kind and location (``source_kind``,
    ``source``), and for a source with revisions the commit read (``source_commit``: sha and
    subject; the full sha in ``source_revision``)."""
    described = source.describe(inventory.book_id)
    kind = described.get("kind", "")
    where = ", ".join(f"{k} {v}" for k, v in described.items() if k != "kind" and v)
    entries: dict[str, Any] = {"source_kind": kind, "source": where}
    if inventory.revision:
        info = source.revision_info(inventory.book_id, inventory.revision) or {}
        commit = f"{inventory.revision[:12]} {info.get('subject', '')}".strip()
        if info.get("date"):
            commit += f" ({info['date']})"
        entries[SOURCE_REVISION] = inventory.revision  # the key its points have
        entries["source_commit"] = shorten(commit, 200)
    return entries


def inventory_metadata(book: AssessedBook) -> dict[str, Any]:
    """source_files' entries for a book: its files, what changed and why, its recipe and any
    migration or crawl errors."""
    inventory, build = book.inventory, book.build
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
        "recipe": inventory.embedding_model,
        "files_table": table(rows, limit=TABLE_ROWS),
        **when(
            inventory.reembed,
            forced=True,
        ),
        **when(
            build.label is not None,
            migration=build.label or "",
            migration_resumed=build.resumed,
            signature=inventory.signature,
        ),
        **when(
            bool(inventory.crawl_errors),
            crawl_errors=len(inventory.crawl_errors),
            errors=error_table(inventory.crawl_errors),
        ),
    }


def parsed_metadata(parsed: ParsedBook) -> tuple[dict[str, Any], BookCheck]:
    """documents' entries for a book and its parse_errors result (warned, never failed)."""
    # the check covers the whole book: files that stay broken or empty are reported every run
    all_errors, all_empty = parsed.book_errors, parsed.book_empty_documents
    files = len(parsed.inventory.files)
    error_rate = round(len(all_errors) / files, 4) if files else 0.0
    empty_list = markdown_list(all_empty)
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
            warning_list=markdown_list(parsed.warnings[:50]),
        ),
    }
    check = BookCheck(
        passed=parsed.clean,
        severity=AssetCheckSeverity.WARN,
        description=parse_errors_verdict([e.source_file for e in all_errors], list(all_empty)),
        metadata={
            "errors": len(all_errors),
            "new_errors": len(parsed.errors),
            "empty_documents": len(all_empty),
            **when(bool(all_errors), error_rate=error_rate, files=error_table(all_errors)),
            **when(bool(all_empty), empty_files=empty_list),
        },
    )
    return metadata, check


def recipe_metadata(before: dict[str, str] | None, switch: SwitchOutcome) -> dict[str, Any]:
    """The recipe change of the run, if it changed it: the recipe searched before, what became
    of the build (in place for a run that kept the book's recipe: nothing recorded)."""
    return when(
        switch.pending,
        recipe_before=(before or {}).get("embedding_model", "untagged"),
        signature_before=(before or {}).get("signature", ""),
        recipe_build=switch.state,
        **when(
            bool(switch.held_back),
            recipe_held_back=markdown_list(switch.held_back),
        ),
    )


def write_summary(
    chunked: ChunkedBook, embedded: EmbeddedBook, written: WriteReport, points: int
) -> str:
    """The write step's result in one line, as the book's ``summary`` entry reads."""
    if not chunked.inventory.changes.has_work:
        return f"{points} chunks already indexed, 0 embedded: nothing changed"
    return (
        f"{written.upserted} chunk points written ({embedded.embedded} embedded, "
        f"{embedded.reused} vectors reused), {written.deleted} points deleted; "
        f"{points} chunk points in the book"
    )


def written_table(chunked: ChunkedBook, written: WriteReport) -> TableMetadataValue:
    """A sample of the points this run wrote, those of new text first (every id is in the
    run's log: ``rag-pipeline lineage`` links a point to its line)."""
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

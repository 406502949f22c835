"""The parse_errors check evaluated again from what a book's documents materialization
recorded: the check's own step, and the run coordinator when a run that plans it is submitted
(:mod:`rag_pipeline.defs.coordinator`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetCheckSeverity,
    DagsterInstance,
)

from rag_pipeline.defs.batch import latest_materializations

__all__ = ["parse_errors_again", "parse_errors_verdict"]


def parse_errors_verdict(broken: list[str], empty: list[str]) -> str:
    """parse_errors' result in words: WARN severity, whatever the UI's label says."""
    if not broken and not empty:
        return "passed: every file of the book parsed and has text"
    named = [n for n in [*broken, *empty] if n != "?"]
    files = f": {', '.join(named[:5])}{' ...' if len(named) > 5 else ''}" if named else ""
    return (
        f"warned, not failed (WARN): {len(broken)} broken and {len(empty)} empty file(s)"
        f"{files}; the run succeeded and the book's other files are indexed"
    )


def parse_errors_again(
    instance: DagsterInstance, check: AssetCheckKey, books: Sequence[str]
) -> Iterator[AssetCheckEvaluation]:
    """The parse_errors ``check`` of each book evaluated again from the book's latest
    materialization of its asset (documents), one query for all."""
    latest = latest_materializations(instance, check.asset_key, books)
    for book_id in books:
        found = latest.get(book_id)
        recorded = found.metadata if found else {}
        broken = int(getattr(recorded.get("book_errors"), "value", 0) or 0)
        empty = int(getattr(recorded.get("empty_documents"), "value", 0) or 0)
        metadata: dict[str, Any] = {"errors": broken, "empty_documents": empty}
        if found is None:
            metadata["reason"] = "the book has no documents materialization"
        for key, name in (("error_table", "files"), ("empty_files", "empty_files")):
            if key in recorded:
                metadata[name] = recorded[key]
        yield AssetCheckEvaluation(
            asset_key=check.asset_key,
            check_name=check.name,
            passed=found is not None and not broken and not empty,
            severity=AssetCheckSeverity.WARN,
            description=parse_errors_verdict(["?"] * broken, ["?"] * empty)
            if found
            else "warned: the book has no documents materialization",
            partition=book_id,
            metadata=metadata,
            target_materialization_data=found.target if found else None,
        )

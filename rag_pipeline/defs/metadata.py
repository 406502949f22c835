"""Small helpers that render asset metadata for the Dagster UI."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd
from dagster import MarkdownMetadataValue, MetadataValue

from rag_pipeline.models import FileError

__all__ = ["error_table", "md_table", "shorten"]


def shorten(text: str, width: int = 90) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def md_table(
    rows: Sequence[Mapping[str, Any]], limit: int = 25, empty: str = "(none)"
) -> MarkdownMetadataValue:
    """A Markdown table of the first ``limit`` rows, saying how many were left out."""
    if not rows:
        return MetadataValue.md(empty)
    frame = pd.DataFrame(list(rows[:limit])).astype(object)
    # a missing value reads as an empty cell, never "nan"
    frame = frame.where(frame.notna(), "")
    text = frame.to_markdown(index=False)
    if len(rows) > limit:
        text += f"\n\n… and {len(rows) - limit} more ({len(rows)} in all)"
    return MetadataValue.md(text)


def error_table(errors: Iterable[FileError], limit: int = 50) -> MarkdownMetadataValue:
    rows = [
        {"file": e.source_file or "(book folder)", "stage": e.stage, "reason": e.reason}
        for e in errors
    ]
    return md_table(rows, limit, empty="No errors.")

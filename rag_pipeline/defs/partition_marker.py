"""The book partitions the Dagster instance holds, remembered beside it without Dagster.

A no-change ingest needs no partition added, so it can answer without importing Dagster (whose
import and instance set-up cost seconds) when every book already has its partition, as of the
last ingest through Dagster. This module must not import dagster.

The marker is only a hint: a missing or unreadable one sends the next no-change ingest through
Dagster (seconds slower, same result), so failing to write it never fails an ingest.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Collection
from pathlib import Path

__all__ = [
    "PARTITIONS_MARKER",
    "forget_partitions_marker",
    "read_partitions_marker",
    "write_partitions_marker",
]

PARTITIONS_MARKER = "rag_book_partitions.json"


def read_partitions_marker(dagster_home: Path) -> frozenset[str] | None:
    try:
        data = json.loads((dagster_home / PARTITIONS_MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, list) or not all(isinstance(b, str) for b in data):
        return None
    return frozenset(data)


def forget_partitions_marker(dagster_home: Path) -> None:
    """Remove the marker before an ingest changes the partitions: one killed before it writes
    the marker again must not leave a marker that misses a partition it added (a book whose
    run it was, removed since, would keep its partition past no-change ingests)."""
    with contextlib.suppress(OSError):
        (dagster_home / PARTITIONS_MARKER).unlink()


def write_partitions_marker(dagster_home: Path, partitions: Collection[str]) -> str | None:
    """Record the partitions; returns None, or why the marker could not be written (then
    the old marker is removed if it can be, so that it cannot answer for a newer state)."""
    marker = dagster_home / PARTITIONS_MARKER
    part: str | None = None
    try:
        with tempfile.NamedTemporaryFile(
            "w", dir=dagster_home, delete=False, suffix=".tmp", encoding="utf-8"
        ) as fh:
            part = fh.name
            json.dump(sorted(partitions), fh)
        os.replace(part, marker)
    except OSError as exc:
        for leftover in (part, marker):
            if leftover is not None:
                with contextlib.suppress(OSError):
                    os.unlink(leftover)
        return (
            f"could not record the book partitions in {marker} ({exc.strerror or exc}); "
            "the books are ingested, the next ingest without changes only takes longer"
        )
    return None

"""The book partitions the Dagster instance holds, remembered beside it without Dagster.

A no-change ingest needs no partition added, so it can answer without importing Dagster (whose
import and instance set-up cost seconds) when every book already has its partition, as of the
last ingest through Dagster. This module must not import dagster.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Collection
from pathlib import Path

__all__ = ["PARTITIONS_MARKER", "read_partitions_marker", "write_partitions_marker"]

PARTITIONS_MARKER = "rag_book_partitions.json"


def read_partitions_marker(dagster_home: Path) -> frozenset[str] | None:
    try:
        data = json.loads((dagster_home / PARTITIONS_MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, list) or not all(isinstance(b, str) for b in data):
        return None
    return frozenset(data)


def write_partitions_marker(dagster_home: Path, partitions: Collection[str]) -> None:
    with tempfile.NamedTemporaryFile(
        "w", dir=dagster_home, delete=False, suffix=".tmp", encoding="utf-8"
    ) as fh:
        json.dump(sorted(partitions), fh)
    os.replace(fh.name, dagster_home / PARTITIONS_MARKER)

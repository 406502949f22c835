"""Small helpers that render asset metadata for the Dagster UI.

Tables are Dagster table metadata (a schema with typed columns), which the UI draws as a
table on the asset's page and the run's page, searchable without opening a dialog; what a
table leaves out is counted in the entry's own ``<name>_rows`` total by the caller.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dagster import MetadataValue, TableColumn, TableMetadataValue, TableRecord, TableSchema

from rag_pipeline.models import FileError

__all__ = ["error_table", "shorten", "table", "table_rows"]

#: a cell's type in the UI, from the Python type of the column's values
_COLUMN_TYPES = ((bool, "bool"), (int, "int"), (float, "float"))


def shorten(text: str, width: int = 90) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _cell(value: Any) -> str | int | float | bool | None:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def _column_type(values: Iterable[Any]) -> str:
    present = [v for v in values if v is not None and v != ""]
    for python_type, name in _COLUMN_TYPES:
        # bool is an int: a column of ints is "int" only when no value is a bool
        if present and all(
            isinstance(v, python_type) and (python_type is bool or not isinstance(v, bool))
            for v in present
        ):
            return name
    return "string"


def table(
    rows: Sequence[Mapping[str, Any]],
    limit: int = 25,
    columns: Sequence[str] | None = None,
) -> TableMetadataValue:
    """The first ``limit`` rows as table metadata; the columns are ``columns`` (else those of
    the rows, in order of appearance), typed by their values. A missing value is an empty
    cell."""
    kept = [dict(row) for row in rows[:limit]]
    names = (
        list(columns) if columns is not None else list(dict.fromkeys(k for r in kept for k in r))
    )
    schema = TableSchema(
        columns=[
            TableColumn(name=name, type=_column_type(r.get(name) for r in kept)) for name in names
        ]
    )
    records = [TableRecord(data={n: _cell(r.get(n)) for n in names}) for r in kept]
    return MetadataValue.table(records=records, schema=schema)


def table_rows(value: Any) -> list[dict[str, Any]]:
    """The rows of a table metadata value recorded earlier (``[]`` for anything else)."""
    if not isinstance(value, TableMetadataValue):
        return []
    return [dict(record.data) for record in value.records]


def error_table(errors: Iterable[FileError], limit: int = 50) -> TableMetadataValue:
    rows = [
        {"file": e.source_file or "(book folder)", "stage": e.stage, "reason": e.reason}
        for e in errors
    ]
    return table(rows, limit, columns=("file", "stage", "reason"))

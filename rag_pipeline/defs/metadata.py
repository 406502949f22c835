"""Small helpers that render asset metadata for the Dagster UI.

Tables are Dagster table metadata (a schema with typed columns), which the UI draws as a
table on the asset's page and the run's page, searchable without opening a dialog; what a
table leaves out is counted in the entry's own ``<name>_rows`` total by the caller. A table
whose cells link somewhere, or too wide for the asset page's value column, is a markdown
table instead (:func:`markdown_table`), which the UI opens in a dialog.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dagster import (
    MarkdownMetadataValue,
    MetadataValue,
    TableColumn,
    TableMetadataValue,
    TableRecord,
    TableSchema,
)

from rag_pipeline.models import FileError

__all__ = [
    "DIALOG_MARKDOWN_CHARS",
    "breakable",
    "error_table",
    "link",
    "markdown_rows",
    "markdown_table",
    "shorten",
    "table",
    "table_rows",
]

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


#: the UI shows a markdown value shorter than this inline (on an asset's Overview, in a value
#: column about 275 px wide in a 1,280 px window, where a table of several columns is cut),
#: and a longer one behind a button that opens it in a dialog up to 80 % of the window wide
DIALOG_MARKDOWN_CHARS = 1000


#: a token longer than this (a path) is given places to wrap on the asset page
_LONG_TOKEN = 30


def breakable(text: str) -> str:
    """``text`` with a zero-width space after each ``/`` of its long tokens: the UI's value
    column wraps only at spaces, and one long path widens every row of the page past a
    1,280 px window (a path copied from there holds the invisible spaces)."""
    return " ".join(
        word.replace("/", "/\u200b") if len(word) > _LONG_TOKEN else word
        for word in text.split(" ")
    )


def link(text: str, url: str) -> str:
    """A markdown link (what a table metadata cell cannot hold)."""
    return f"[{text}]({url})"


def markdown_table(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[str], legend: str = ""
) -> MarkdownMetadataValue:
    """``rows`` as a markdown table (cells may hold links, see :func:`link`) with ``legend``
    under it, long enough to open in the UI's dialog (:data:`DIALOG_MARKDOWN_CHARS`): a
    table needs the width."""
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    for row in rows:
        cells = [str(_cell(row.get(c)) if row.get(c) is not None else "") for c in columns]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    text = "\n".join(lines) + (f"\n\n{legend}" if legend else "")
    # trailing blank lines render as nothing: they only make a short table long enough
    return MetadataValue.md(text.ljust(DIALOG_MARKDOWN_CHARS, "\n"))


_LINK = re.compile(r"^\[(?P<label>.*)\]\((?P<url>[^)]*)\)$")


def markdown_rows(value: Any) -> list[dict[str, str | int]]:
    """The rows of a :func:`markdown_table` recorded earlier (a link cell as its text, a
    number as an int)."""
    text = value.value if isinstance(value, MarkdownMetadataValue) else value
    if not isinstance(text, str):
        return []
    lines = [line for line in text.splitlines() if line.startswith("|")]
    if len(lines) < 2:
        return []

    def cells(line: str) -> list[str | int]:
        parts = re.split(r"(?<!\\)\|", line.strip()[1:-1])
        out: list[str | int] = []
        for part in parts:
            cell = part.strip().replace("\\|", "|")
            found = _LINK.match(cell)
            text = found["label"] if found else cell
            out.append(int(text) if text.isdigit() else text)
        return out

    names = [str(name) for name in cells(lines[0])]
    return [dict(zip(names, cells(line), strict=True)) for line in lines[2:]]


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

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

from rag_pipeline.models import FileError, printable

__all__ = [
    "DIALOG_MARKDOWN_CHARS",
    "breakable",
    "error_table",
    "escape_markdown",
    "link",
    "markdown_list",
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


#: characters that mean something to the UI's markdown (GFM with inline HTML) anywhere in a
#: line: emphasis, links and images, code, HTML tags and entities, table cells, strikethrough
_MARKDOWN_INLINE = re.compile(r"([\\`*_\[\]<>&|~!])")
#: what makes the start of a line a block (a heading, a quote, a list, a rule, a numbered
#: item): the punctuation is escaped (a backslash before a digit is no escape: it would show)
_MARKDOWN_LINE_START = re.compile(r"^(\s*)([#>+=-])|^(\s*\d{1,9})([.)])")


class Markdown(str):
    """Text that is markdown already (a :func:`link`): :func:`escape_markdown` keeps it."""


def escape_markdown(text: object) -> str:
    """``text`` (a file name, a section title, an error message: book data) as markdown that
    shows it literally on one line: controls escaped as ``printable`` does, every markdown
    and HTML character backslash-escaped, so a name like ``x](http://evil)[y.md`` or
    ``<img src=x onerror=...>.md`` is text, never a link, an image, a tag or a table cell.
    Every place in defs/ that puts book data into markdown goes through here."""
    if isinstance(text, Markdown):
        return text
    escaped = _MARKDOWN_INLINE.sub(r"\\\1", printable(str(text), limit=10_000))
    return _MARKDOWN_LINE_START.sub(_escape_line_start, escaped)


def _escape_line_start(match: re.Match[str]) -> str:
    """The block marker of :data:`_MARKDOWN_LINE_START` backslash-escaped."""
    lead, mark = (match[1], match[2]) if match[2] else (match[3], match[4])
    return f"{lead}\\{mark}"


def _unescape_markdown(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def markdown_list(items: Iterable[object], empty: str = "") -> MarkdownMetadataValue:
    """``items`` (book data) as a markdown bullet list, each escaped
    (:func:`escape_markdown`); ``empty`` when there are none."""
    return MetadataValue.md("\n".join(f"- {escape_markdown(i)}" for i in items) or empty)


def link(text: str, url: str) -> Markdown:
    """A markdown link (what a table metadata cell cannot hold): ``text`` escaped, and the
    characters that would end the link or break the table percent-encoded in ``url``."""
    safe_url = "".join(
        f"%{ord(ch):02X}" if ch in " ()<>|\\`\"'" or ord(ch) < 32 else ch for ch in url
    )
    return Markdown(f"[{escape_markdown(text)}]({safe_url})")


def markdown_table(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[str], legend: str = ""
) -> MarkdownMetadataValue:
    """``rows`` as a markdown table (cells may hold links, see :func:`link`) with ``legend``
    under it, long enough to open in the UI's dialog (:data:`DIALOG_MARKDOWN_CHARS`): a
    table needs the width."""
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    for row in rows:
        cells = [escape_markdown(row[c]) if row.get(c) is not None else "" for c in columns]
        lines.append("| " + " | ".join(cells) + " |")
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
            cell = part.strip()
            found = _LINK.match(cell)
            text = _unescape_markdown(found["label"] if found else cell)
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

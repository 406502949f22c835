"""The one JSON writer of what the product prints: every command's ``--json`` output and every
answer of the query service (which are the same bodies)."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["json_text"]


def json_text(data: Any, *, indent: int | None = None) -> str:
    """``data`` as the ``--json`` output and the query service write it: non-ASCII as it is,
    ``str()`` of anything JSON has no type for, compact without ``indent``. Always valid
    UTF-8: a lone surrogate (a byte that is not UTF-8 in a path, as Python reads it, e.g.
    under ``RAG_DATA_DIR``) is written as its ``\\u`` escape; it failed the CLI's output
    with UnicodeEncodeError (exit 1) and the service's answer with a 500."""
    text = json.dumps(
        data,
        indent=indent,
        ensure_ascii=False,
        default=str,
        separators=None if indent is not None else (",", ":"),
    )
    return text.encode("utf-8", "backslashreplace").decode("utf-8")

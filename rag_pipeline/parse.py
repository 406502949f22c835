"""Decode a Markdown file, split off its frontmatter and normalize the payload fields.

Bad input never raises: a file that cannot be ingested becomes a :class:`FileError` naming the
reason, so the rest of its book goes on.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

import frontmatter
import yaml
from markdown_it import MarkdownIt

from rag_pipeline.models import (
    DocumentMeta,
    FileError,
    ParsedDocument,
    PathMeta,
    document_id,
    normalize_proficiency,
)

__all__ = [
    "HARDWARE_TIER_KEYWORDS",
    "parse_document",
]

_PROFICIENCY_KEYS = (
    "proficiency_level",
    "proficiency",
    "cefr_level",
    "cefr_entry_level",
    "difficulty",
    "level",
)
_HARDWARE_TIER_KEYS = ("hardware_tier", "hardware_level", "tier")
# Checked from the highest tier down; a document needs the highest tier any of its
# prerequisites names. Tier 1 is "a computer, simulation only".
HARDWARE_TIER_KEYWORDS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (4, ("unitree", "physical robot", "humanoid robot", "robot hardware")),
    (3, ("jetson", "orin", "realsense", "edge device", "lidar")),
    (2, ("gpu", "rtx", "cuda", "nvidia", "workstation")),
)

_md = MarkdownIt("commonmark").disable(["inline", "text_join"])


def parse_document(
    book_id: str,
    source_file: str,
    data: bytes,
    source_file_hash: str,
    path_meta: PathMeta | None = None,
    *,
    default_hardware_tier: int | None = 1,
) -> ParsedDocument | FileError:
    """Turn a file's bytes into a :class:`ParsedDocument`, or a :class:`FileError` saying why."""
    path_meta = path_meta or PathMeta()

    def error(reason: str) -> FileError:
        return FileError(book_id, source_file, "parse", reason, source_file_hash)

    if b"\x00" in data[:8192]:
        return error("binary content (NUL bytes); not a Markdown text file")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return error(f"not valid UTF-8: byte 0x{data[exc.start]:02x} at offset {exc.start}")
    if _looks_binary(text):
        return error("binary content (mostly control characters); not a Markdown text file")
    text = text.replace("\r\n", "\n").replace("\r", "\n")

    try:
        fm, body = _split_frontmatter(text)
    except yaml.YAMLError as exc:
        return error(f"invalid YAML frontmatter: {_yaml_reason(exc)}")
    except Exception as exc:  # TOML / JSON handlers raise their own errors
        return error(f"invalid frontmatter: {exc}")
    if not isinstance(fm, Mapping):
        return error("frontmatter is not a key/value mapping")
    fm = {str(k): _json_safe(v) for k, v in fm.items()}

    meta = DocumentMeta(
        title=_title(fm, body, source_file),
        module=_text(fm.get("module")) or path_meta.module,
        chapter=_int(fm.get("chapter"))
        if _int(fm.get("chapter")) is not None
        else path_meta.chapter,
        lesson=_int(fm.get("lesson")) if _int(fm.get("lesson")) is not None else path_meta.lesson,
        hardware_tier=_hardware_tier(fm, default_hardware_tier),
        proficiency_level=_proficiency(fm),
        tags=_tags(fm.get("tags")),
        description=_text(fm.get("description")),
    )
    return ParsedDocument(
        book_id=book_id,
        source_file=source_file,
        source_file_hash=source_file_hash,
        parent_doc_id=document_id(book_id, source_file),
        meta=meta,
        body=body,
        frontmatter=fm,
    )


def _split_frontmatter(text: str) -> tuple[Any, str]:
    """(frontmatter data, body) with python-frontmatter's handlers; data may be any YAML type."""
    handler = frontmatter.detect_format(text, frontmatter.handlers)
    if handler is None:
        return {}, text
    try:
        raw, body = handler.split(text)
    except ValueError:  # an opening delimiter with no closing one: no frontmatter
        return {}, text
    data = handler.load(raw)
    return ({} if data is None else data), body


def _looks_binary(text: str) -> bool:
    sample = text[:4096]
    if not sample:
        return False
    controls = sum(1 for ch in sample if ord(ch) < 32 and ch not in "\n\r\t\f\v")
    return controls / len(sample) > 0.1


def _yaml_reason(exc: yaml.YAMLError) -> str:
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None)
    # +2: one for 1-based lines, one for the opening '---' line python-frontmatter strips
    return f"{problem} (line {mark.line + 2})" if mark is not None else str(problem)


def _json_safe(value: Any) -> Any:
    """Frontmatter values as JSON types, so they can travel in payloads and metadata."""
    if isinstance(value, dt.date | dt.datetime | dt.time):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, dict | list):
        return None
    text = str(value).strip()
    return text or None


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    match = re.search(r"\d+", str(value))
    return int(match.group()) if match else None


def _title(fm: Mapping[str, Any], body: str, source_file: str) -> str:
    title = _text(fm.get("title"))
    if title:
        return title
    heading = _first_heading(body)
    if heading:
        return heading
    stem = PurePosixPath(source_file).stem
    stem = re.sub(r"^\d+[-_.\s]*", "", stem) or stem
    return re.sub(r"[-_]+", " ", stem).strip().capitalize() or source_file


def _first_heading(body: str) -> str | None:
    # Only the head of the document: a title lives near the top, and large files stay cheap.
    tokens = _md.parse(body[:20000])
    for i, token in enumerate(tokens):
        if token.type == "heading_open" and i + 1 < len(tokens):
            text = tokens[i + 1].content.strip()
            if text:
                return text
    return None


def _proficiency(fm: Mapping[str, Any]) -> str | None:
    for key in _PROFICIENCY_KEYS:
        value = _text(fm.get(key))
        if value:
            return normalize_proficiency(value)
    return None


def _hardware_tier(fm: Mapping[str, Any], default: int | None) -> int | None:
    for key in _HARDWARE_TIER_KEYS:
        tier = _int(fm.get(key))
        if tier is not None:
            return tier
    prereqs = fm.get("hardware_prerequisites")
    if isinstance(prereqs, list | str):
        words = " ".join(map(str, prereqs if isinstance(prereqs, list) else [prereqs])).lower()
        for tier, keywords in HARDWARE_TIER_KEYWORDS:
            if any(k in words for k in keywords):
                return tier
    return default


def _tags(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list):
        items = [items]
    tags = []
    for item in items:
        text = _text(item)
        if text and text not in tags:
            tags.append(text)
    return tuple(tags)

"""Decode a Markdown file, split off its frontmatter and normalize the payload fields.

Bad input never raises: a file that cannot be ingested becomes a :class:`FileError` naming the
reason, so the rest of its book goes on. What is odd but usable (a frontmatter field of the
wrong type, NUL bytes in the text) is ingested with a warning naming the field.

YAML frontmatter is parsed with bounds: its size, its number of aliases, and the size and depth
of the value once aliases are expanded, so an alias bomb or a self-referencing anchor is a
per-file error in microseconds, not minutes of CPU and gigabytes of memory.
"""

from __future__ import annotations

import codecs
import datetime as dt
import json
import math
import re
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

import frontmatter
import yaml
from frontmatter.default_handlers import JSONHandler, YAMLHandler
from markdown_it import MarkdownIt

from rag_pipeline.models import (
    DocumentMeta,
    FileError,
    ParsedDocument,
    PathMeta,
    document_id,
    normalize_proficiency,
)
from rag_pipeline.store.filters import INT64_MAX, INT64_MIN

__all__ = [
    "FRONTMATTER_LIMITS",
    "HARDWARE_TIER_KEYWORDS",
    "PARSE_RULES_VERSION",
    "parse_document",
]

#: the version of the parse rules: bump it whenever what a file parses to can change (a file
#: refused before is accepted, a field read otherwise). The recipe writes it on every document
#: record (``parse_version``), and a file whose record is an error written under another one
#: (or none: records from before versions) is read again by the next run, so an upgrade
#: converges on a clean build (:func:`rag_pipeline.ingest.changes.classify_files`). "2": the
#: hostile-input rules (frontmatter typos kept as text, huge integers, a leading rule of prose)
PARSE_RULES_VERSION = "2"

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
#: bounds on a frontmatter block: raw bytes, YAML aliases, values after expansion, nesting
FRONTMATTER_LIMITS = {"bytes": 64 * 1024, "aliases": 64, "values": 10_000, "depth": 32}

_md = MarkdownIt("commonmark").disable(["inline", "text_join"])
#: a Git LFS pointer file (its spec: under 1024 bytes, a version line first, then ``oid``
#: and ``size``; CRLF where a Windows checkout converted it): what a clone or an upload without
#: the LFS objects holds in a file's place
_LFS_POINTER = re.compile(
    rb"\Aversion https://(?:git-lfs\.github\.com|hawser\.github\.com)/spec/v1\r?\n"
    rb"(?:[a-z0-9.-]+ [^\r\n]*\r?\n)*?oid sha256:[0-9a-f]{64}\r?\n"
    rb"(?:[a-z0-9.-]+ [^\r\n]*\r?\n)*\Z"
)


class _FrontmatterError(ValueError):
    pass


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
    try:
        return _parse(
            book_id,
            source_file,
            data,
            source_file_hash,
            path_meta or PathMeta(),
            default_hardware_tier,
        )
    except Exception as exc:  # a parser bug on one file must never sink the book
        return FileError(
            book_id,
            source_file,
            "parse",
            f"cannot parse: {type(exc).__name__}: {exc}",
            source_file_hash,
        )


def _parse(
    book_id: str,
    source_file: str,
    data: bytes,
    source_file_hash: str,
    path_meta: PathMeta,
    default_hardware_tier: int | None,
) -> ParsedDocument | FileError:
    def error(reason: str) -> FileError:
        return FileError(book_id, source_file, "parse", reason, source_file_hash)

    warnings: list[str] = []
    if len(data) < 1024 and _LFS_POINTER.match(data):
        return error(
            "a Git LFS pointer, not the file's content (the object was not fetched: run "
            "`git lfs pull` where the book is checked out, or store the file without LFS)"
        )
    decoded = _decode(data)
    if isinstance(decoded, _Refusal):
        return error(str(decoded))
    text, encoding = decoded
    if encoding is not None:
        warnings.append(f"{encoding} encoded with a byte-order mark: decoded (UTF-8 is preferred)")
    refusal = _binary_reason(text, data)
    if refusal is not None:
        return error(refusal)
    if "\x00" in text:  # a few stray NULs in real text: drop them, they would reach every payload
        warnings.append(f"{text.count(chr(0))} NUL characters removed from the text")
        text = text.replace("\x00", "")
    text = text.replace("\r\n", "\n").replace("\r", "\n")

    try:
        fm, body = _split_frontmatter(text, warnings)
    except _FrontmatterError as exc:
        return error(str(exc))
    except RecursionError:  # a JSON frontmatter nested past the interpreter's stack
        return error(f"frontmatter is nested deeper than {FRONTMATTER_LIMITS['depth']} levels")
    except Exception as exc:  # TOML / JSON handlers raise their own errors
        return error(f"invalid frontmatter: {exc}")
    if isinstance(fm, str | int | float):
        # prose between a thematic break (---) that opens the file and a second one: no
        # metadata, the file's own text (it was refused whole, for a rule drawn in Markdown)
        warnings.append(
            "the text between the first two '---' lines is not frontmatter (no key: value "
            "line): read as Markdown"
        )
        fm, body = {}, text
    if not isinstance(fm, Mapping):
        return error("frontmatter is not a key/value mapping")
    if not body.strip():
        what = "0 bytes" if not data else "only whitespace" if body == text else "only frontmatter"
        warnings.append(f"empty document ({what}): nothing to index")
    reader = _Fields({str(k): v for k, v in fm.items()}, warnings)
    meta = DocumentMeta(
        title=reader.title(body, source_file),
        module=reader.text("module") or path_meta.module,
        chapter=_first(reader.integer("chapter"), path_meta.chapter),
        lesson=_first(reader.integer("lesson"), path_meta.lesson),
        hardware_tier=reader.hardware_tier(default_hardware_tier),
        proficiency_level=reader.proficiency(),
        tags=reader.tags(),
        description=reader.text("description"),
    )
    return ParsedDocument(
        book_id=book_id,
        source_file=source_file,
        source_file_hash=source_file_hash,
        parent_doc_id=document_id(book_id, source_file),
        meta=meta,
        body=body,
        frontmatter=reader.fields,
        warnings=tuple(warnings),
    )


def _first(*values: int | None) -> int | None:
    return next((v for v in values if v is not None), None)


def _split_frontmatter(text: str, warnings: list[str]) -> tuple[Any, str]:
    """(frontmatter data, body) with python-frontmatter's handlers; YAML is loaded bounded."""
    handler = frontmatter.detect_format(text, frontmatter.handlers)
    if handler is None:
        return {}, text
    try:
        raw, body = handler.split(text)
    except ValueError:  # an opening delimiter with no closing one: no frontmatter
        opening = text.split("\n", 1)[0].strip()
        warnings.append(
            f"frontmatter is not closed (no second {opening!r} line): the whole file is "
            "indexed as text"
        )
        return {}, text
    if len(raw.encode("utf-8")) > FRONTMATTER_LIMITS["bytes"]:
        raise _FrontmatterError(
            f"frontmatter is larger than {FRONTMATTER_LIMITS['bytes'] // 1024} KiB"
        )
    if isinstance(handler, JSONHandler):  # an integer past Python's limit is its text
        repeated: set[str] = set()

        def mapping(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
            keys = [k for k, _ in pairs]
            repeated.update(k for k in keys if keys.count(k) > 1)
            return dict(pairs)

        data = json.loads(raw, parse_int=_json_int, object_pairs_hook=mapping)
        _say_repeated(repeated, warnings)
        return _or_empty(_bounded(data, warnings)), body
    if not isinstance(handler, YAMLHandler):
        return _or_empty(_bounded(handler.load(raw), warnings)), body
    try:
        return _or_empty(_load_yaml(raw, warnings)), body
    except yaml.YAMLError as exc:
        raise _FrontmatterError(
            f"invalid YAML frontmatter: {_yaml_reason(exc, raw, _raw_first_line(handler, text))}"
        ) from None


def _json_int(digits: str) -> int | str:
    """A JSON integer; one of more digits than Python converts (4,300) is kept as its text."""
    try:
        return int(digits)
    except ValueError:
        return digits


def _or_empty(data: Any) -> Any:
    return {} if data is None else data


def _raw_first_line(handler: YAMLHandler, text: str) -> int:
    """The file's 1-based line on which the frontmatter ``handler.split`` returns begins: the
    opening delimiter's line, as the text after '---' is the frontmatter's first (empty) line;
    the delimiter's pattern may also swallow blank lines after it."""
    assert handler.FM_BOUNDARY is not None
    opening = handler.FM_BOUNDARY.search(text)
    return 1 + (text[: opening.end()].count("\n") if opening is not None else 0)


def _load_yaml(raw: str, warnings: list[str]) -> Any:
    """Check the event stream first (aliases, nesting), stopping at the first excess: PyYAML's
    scanner slows quadratically with flow nesting and its loader recurses once per level, so a
    10 KB block of 5,000 brackets would take seconds and end in a RecursionError."""
    aliases = depth = 0
    for event in yaml.parse(raw, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > FRONTMATTER_LIMITS["aliases"]:
                raise _FrontmatterError(
                    f"frontmatter uses more than {FRONTMATTER_LIMITS['aliases']} YAML aliases"
                )
        elif isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > FRONTMATTER_LIMITS["depth"] + 1:  # +1: the top-level mapping
                raise _FrontmatterError(
                    f"frontmatter is nested deeper than {FRONTMATTER_LIMITS['depth']} levels"
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
    loader = _Loader(raw)
    try:
        data = loader.get_single_data()
    except yaml.YAMLError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
        # a collection of the wrong shape for its tag (``!!map [1]``): PyYAML's own error
        # would be Python's ("cannot unpack non-iterable ScalarNode object")
        raise _FrontmatterError(
            f"invalid YAML frontmatter: a value does not have the shape its tag says ({exc})"
        ) from None
    finally:
        loader.dispose()
    _say_repeated(loader.repeated, warnings)
    for value, kind in loader.not_what_they_say:
        shown = repr(value) if len(value) <= 60 else repr(value[:59] + "…")
        warnings.append(f"frontmatter value {shown} is not a valid {kind}: kept as text")
    return _bounded(data, warnings)


def _say_repeated(keys: set[str], warnings: list[str]) -> None:
    for key in sorted(keys):
        warnings.append(f"frontmatter key {key!r} is given more than once: its last value is used")


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, noting the keys a mapping gives twice (YAML forbids it; PyYAML
    keeps the last value without a word, so a second ``title:`` silently won)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.repeated: set[str] = set()
        #: (text, type) of the values that look like a type but are not one of it
        self.not_what_they_say: list[tuple[str, str]] = []

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        """A scalar PyYAML cannot make into the type its form or tag says (``2020-13-45``, a
        date with no month 13; ``0x_``; ``!!bool maybe``) is its text, with a warning: PyYAML
        raised Python's own error (``month must be in 1..12``) and the whole file was lost
        for one typo."""
        try:
            return super().construct_object(node, deep=deep)
        except yaml.YAMLError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError):
            if not isinstance(node, yaml.ScalarNode):
                raise
            self.recursive_objects.pop(node, None)
            self.not_what_they_say.append((str(node.value), node.tag.rpartition(":")[2]))
            self.constructed_objects[node] = str(node.value)
            return str(node.value)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[str] = set()
        for key, _ in node.value:
            # keys a merge (``<<: *base``) brings in may be overridden: that is its purpose
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                if key.value in seen:
                    self.repeated.add(key.value)
                seen.add(key.value)
        return super().construct_mapping(node, deep=deep)


def _bounded(value: Any, warnings: list[str]) -> Any:
    """The value as JSON types, refusing self-reference and huge or deep expansions."""
    # values left, texts with lone surrogates, binary values that are not text
    budget = [FRONTMATTER_LIMITS["values"], 0, 0]
    safe = _json_safe(value, budget, 0, set())
    if budget[1]:
        warnings.append(
            f"frontmatter: {budget[1]} text value(s) hold a \\u escape of half a UTF-16 "
            "surrogate pair (\\ud800-\\udfff), which is no character: replaced by U+FFFD"
        )
    if budget[2]:
        warnings.append(f"frontmatter: {budget[2]} !!binary value(s) are not UTF-8 text: left out")
    return safe


def _json_safe(value: Any, budget: list[int], depth: int, path: set[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        raise _FrontmatterError(
            f"frontmatter expands to more than {FRONTMATTER_LIMITS['values']} values "
            "(YAML aliases repeat whole structures); refused"
        )
    if depth > FRONTMATTER_LIMITS["depth"]:
        raise _FrontmatterError(
            f"frontmatter is nested deeper than {FRONTMATTER_LIMITS['depth']} levels"
        )
    if isinstance(value, dt.date | dt.datetime | dt.time):
        return value.isoformat()
    if isinstance(value, Mapping | list | tuple | set):
        if id(value) in path:
            raise _FrontmatterError("frontmatter refers to itself (a recursive YAML anchor)")
        inner = path | {id(value)}
        if isinstance(value, Mapping):
            return {
                _text(str(k), budget): _json_safe(v, budget, depth + 1, inner)
                for k, v in value.items()
            }
        if isinstance(value, set):  # a !!set: in an order of its own, not the hash's
            value = sorted(value, key=lambda v: (type(v).__name__, str(v)))
        return [_json_safe(v, budget, depth + 1, inner) for v in value]
    if isinstance(value, bytes):  # a !!binary value: the text it holds, if it is text
        try:
            return _text(value.decode("utf-8"), budget)
        except UnicodeDecodeError:
            budget[2] += 1
            return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, int) and not isinstance(value, bool) and not _fits(value):
        # payload integers are 64-bit; one of thousands of digits (``0b1111...``) has no
        # decimal text Python will write: its hexadecimal one
        return str(value) if value.bit_length() < 10_000 else hex(value)
    if isinstance(value, str):
        return _text(value, budget)
    if value is None or isinstance(value, int | float | bool):
        return value
    return str(value)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _text(value: str, budget: list[int]) -> str:
    """A frontmatter text as a payload can hold it: without NULs, and without surrogates (a
    YAML or JSON ``\\ud83d\\ude00`` escape gives two of them): a pair becomes its character,
    a lone one U+FFFD (counted in ``budget[1]``). Such a text could not be encoded as UTF-8,
    and the store refused the whole book's write for it."""
    value = value.replace("\x00", "")
    if _SURROGATE.search(value) is None:
        return value
    fixed = value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    if fixed.count("\ufffd") > value.count("\ufffd"):
        budget[1] += 1
    return fixed


def _fits(value: int) -> bool:
    return INT64_MIN <= value <= INT64_MAX


class _Fields:
    """Typed reads of frontmatter fields; a value of the wrong type is a warning, not an error."""

    def __init__(self, fields: dict[str, Any], warnings: list[str]) -> None:
        self.fields = fields
        self.warnings = warnings

    def _warn(self, key: str, value: Any, expected: str, used: object) -> None:
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:59] + "…"
        self.warnings.append(f"frontmatter field {key!r} is {shown}, expected {expected}; {used}")

    def text(self, key: str) -> str | None:
        value = self.fields.get(key)
        if value is None:
            return None
        if isinstance(value, dict | list):
            self._warn(key, value, "text", "ignored")
            return None
        text = str(value).strip()
        return text or None

    def integer(self, key: str, *, quiet: bool = False) -> int | None:
        value = self.fields.get(key)
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        if isinstance(value, int) and not isinstance(value, bool) and _fits(value):
            return value
        if isinstance(value, float) and value.is_integer() and _fits(int(value)):
            return int(value)
        if isinstance(value, str):
            match = re.fullmatch(r"\s*\D{0,20}?(\d{1,18})\D{0,20}\s*", value)
            if match:  # "Chapter 3", "03", "lesson-2"
                return int(match.group(1))
        if not quiet:
            self._warn(key, value, "a whole number", "ignored")
        return None

    def title(self, body: str, source_file: str) -> str:
        title = self.text("title")
        if title:
            return title
        heading = _first_heading(body)
        if heading:
            return heading
        stem = PurePosixPath(source_file).stem
        stem = re.sub(r"^\d+[-_.\s]*", "", stem) or stem
        return re.sub(r"[-_]+", " ", stem).strip().capitalize() or source_file

    def proficiency(self) -> str | None:
        for key in _PROFICIENCY_KEYS:
            value = self.text(key)
            if value:
                return normalize_proficiency(value)
        return None

    def hardware_tier(self, default: int | None) -> int | None:
        for key in _HARDWARE_TIER_KEYS:
            if self.fields.get(key) is None:
                continue
            tier = self.integer(key, quiet=True)
            if tier is not None:
                return tier
            self._warn(key, self.fields[key], "a whole number", f"used the default {default}")
            return default
        prereqs = self.fields.get("hardware_prerequisites")
        if isinstance(prereqs, list | str):
            words = " ".join(map(str, prereqs if isinstance(prereqs, list) else [prereqs]))
            for tier, keywords in HARDWARE_TIER_KEYWORDS:
                if any(k in words.lower() for k in keywords):
                    return tier
        return default

    def tags(self) -> tuple[str, ...]:
        value = self.fields.get("tags")
        if value is None:
            return ()
        if isinstance(value, dict):
            self._warn("tags", value, "a list or a comma-separated text", "ignored")
            return ()
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list):
            items = [items]
        tags: list[str] = []
        for item in items:
            if isinstance(item, dict | list):
                self._warn("tags", item, "a list of words", "that item ignored")
                continue
            text = str(item).strip()
            if text and text not in tags:
                tags.append(text)
        return tuple(tags)


class _Refusal(str):
    """Why a file's bytes are not text."""


#: byte-order marks of the encodings decoded besides UTF-8 (UTF-32 first: FF FE 00 00 also
#: starts like UTF-16 LE's mark)
_BOMS = (
    (codecs.BOM_UTF32_BE, "utf-32-be", "UTF-32 (big-endian)"),
    (codecs.BOM_UTF32_LE, "utf-32-le", "UTF-32 (little-endian)"),
    (codecs.BOM_UTF16_BE, "utf-16-be", "UTF-16 (big-endian)"),
    (codecs.BOM_UTF16_LE, "utf-16-le", "UTF-16 (little-endian)"),
)


def _decode(data: bytes) -> tuple[str, str | None] | _Refusal:
    """(text, the encoding's name when not UTF-8), or why the bytes are not text. UTF-8 with or
    without a BOM; UTF-16 and UTF-32 only with their BOM (without one, no guess is safe)."""
    try:
        return data.decode("utf-8-sig"), None
    except UnicodeDecodeError as exc:
        utf8_error = exc
    for bom, codec, name in _BOMS:
        if data.startswith(bom):
            try:
                return data[len(bom) :].decode(codec), name
            except UnicodeDecodeError as exc:
                if codec == "utf-32-le":  # FF FE 00 00 may be UTF-16 LE and a NUL
                    continue
                offset = len(bom) + exc.start
                return _Refusal(f"not valid {name}: {exc.reason} at offset {offset}")
    if b"\x00" in data[:8192]:
        return _Refusal(_nul_binary(data))
    offset = utf8_error.start
    return _Refusal(f"not valid UTF-8: byte 0x{data[offset]:02x} at offset {offset}")


def _binary_reason(text: str, data: bytes) -> str | None:
    """Why decoded text is binary content, or None. Binary: more than 10 % control characters
    (NULs included) in its first 4,096 characters, or NULs more than 10 % of all of it; but
    one or two NULs and no other control character never make a file binary (a tiny text file
    with a stray NUL is text). A few NULs in real text are not binary: the caller removes them
    with a warning."""
    sample = text[:4096]
    if not sample:
        return None
    nuls = text.count("\x00")
    controls = sum(1 for ch in sample if ord(ch) < 32 and ch not in "\n\r\t\f\v")
    if controls - sample.count("\x00") == 0 and nuls <= 2:
        return None
    if controls <= len(sample) * 0.1 and nuls <= len(text) * 0.1:
        return None
    if "\x00" in sample:
        return _nul_binary(data)
    return "binary content (mostly control characters); not a Markdown text file"


def _nul_binary(data: bytes) -> str:
    head = data[:8192]
    pairs = len(head) // 2
    if pairs >= 4:  # ASCII text as UTF-16: every other byte is NUL
        even, odd = head[0 : 2 * pairs : 2].count(0), head[1 : 2 * pairs : 2].count(0)
        if max(even, odd) >= 0.8 * pairs and min(even, odd) <= 0.05 * pairs:
            return (
                "binary content (NUL bytes): looks like UTF-16 without a byte-order mark; "
                "convert it to UTF-8"
            )
    return "binary content (NUL bytes); not a Markdown text file"


def _yaml_reason(exc: yaml.YAMLError, raw: str, first_line: int) -> str:
    """PyYAML's problem with the file's line of it (``first_line`` is the file's line of raw's
    line 0). A problem found at the frontmatter's end (an unclosed bracket or quote) names the
    line where the unclosed thing opens: that is where a person has to look."""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None)
    if mark is None:
        return str(problem)
    end = len(raw.rstrip())
    if mark.index < end:
        return f"{problem} (line {first_line + mark.line})"
    context = getattr(exc, "context", None)
    opened = getattr(exc, "context_mark", None)
    if opened is not None and context and opened.index < end:
        thing = context.removeprefix("while parsing ").removeprefix("while scanning ")
        return f"{problem} (line {first_line + opened.line}: {thing} that is never closed)"
    # Nothing opened earlier: the last line with text is where the frontmatter stops short.
    last = first_line + raw[:end].count("\n")
    return f"{problem} (line {last})"


def _first_heading(body: str) -> str | None:
    # Only the head of the document: a title lives near the top, and large files stay cheap.
    tokens = _md.parse(body[:20000])
    for i, token in enumerate(tokens):
        if token.type == "heading_open" and i + 1 < len(tokens):
            text = tokens[i + 1].content.strip()
            if text:
                return text
    return None

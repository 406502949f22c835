"""Typed records that flow between the pipeline stages (frozen, picklable, dagster-free)."""

from __future__ import annotations

import re
import unicodedata
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

__all__ = [
    "BOOK_ID_PATTERN",
    "POINT_NAMESPACE",
    "Chunk",
    "DocumentMeta",
    "FileError",
    "FileKey",
    "InvalidBookIdError",
    "ParsedDocument",
    "PathMeta",
    "SourceFile",
    "VersionKey",
    "book_id_problem",
    "document_id",
    "is_book_id",
    "normalize_proficiency",
    "printable",
    "shown_name",
    "validate_book_id",
]

# Fixed namespace so point and document ids are the same on every machine and every run.
POINT_NAMESPACE = uuid.UUID("6f6c7c1e-3b1f-5d0a-9a43-5d2b8e0d7a11")


_CEFR = re.compile(r"^[ABC][12]$", re.IGNORECASE)
#: a book id is a partition key, a payload value and a path segment at once
BOOK_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class InvalidBookIdError(ValueError):
    """A book id that is not safe to use as a partition key, filter value or path segment."""


def validate_book_id(book_id: str) -> str:
    """Return ``book_id`` if it is a safe id, else raise :class:`InvalidBookIdError`."""
    if not isinstance(book_id, str) or not is_book_id(book_id):
        shown = printable(book_id) if isinstance(book_id, str) else repr(book_id)
        problem = _book_id_problem(book_id) if isinstance(book_id, str) else "not text"
        raise InvalidBookIdError(
            f"invalid book id {shown!r}: {problem}; use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit, without '..'"
        )
    return book_id


def is_book_id(book_id: str) -> bool:
    """Whether :func:`validate_book_id` accepts ``book_id``."""
    return bool(BOOK_ID_PATTERN.fullmatch(book_id)) and ".." not in book_id


def book_id_problem(book_id: str) -> str:
    """Why :func:`validate_book_id` refuses ``book_id`` (its whole message)."""
    try:
        validate_book_id(book_id)
    except InvalidBookIdError as exc:
        return str(exc)
    return ""


def _book_id_problem(book_id: str) -> str:
    """What exactly is wrong with a book id the pattern refuses."""
    if not book_id:
        return "it is empty"
    if len(book_id) > 128:
        return f"it is {len(book_id)} characters long"
    bad = next((ch for ch in book_id if not (ch.isascii() and (ch.isalnum() or ch in "._-"))), None)
    if bad is not None and not bad.isascii():
        # named: a combining mark shown alone is invisible, and twins look alike
        name = unicodedata.name(bad, "unnamed")
        return f"it contains '{printable(bad)}' (U+{ord(bad):04X} {name})"
    if bad is not None:
        return f"it contains '{printable(bad)}'"
    if not book_id[0].isalnum():
        return f"it starts with {book_id[0]!r}"
    return "it contains '..'"


def printable(name: str, limit: int = 200) -> str:
    """A file or folder name as safe text: undecodable bytes and controls escaped."""
    out = []
    for ch in name:
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte, as os.fsdecode keeps it
            out.append(f"\\x{code - 0xDC00:02x}")
        elif code < 32 or code == 127:
            out.append(f"\\x{code:02x}")
        else:
            out.append(ch)
    text = "".join(out)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def shown_name(name: str) -> str:
    """A file's name as a message shows it: whole (a path the file system takes), with control
    characters escaped, so that one message is one line naming one file (``a\\x0ab.md``) and
    a name cannot write to the terminal. Only messages use it: the name itself (records,
    payloads, the crawl's errors) is never altered."""
    return printable(name, limit=4096)


def normalize_proficiency(value: str) -> str:
    """One spelling per level, in payloads and in filters: CEFR codes upper case (``B1``),
    words lower case (``beginner``)."""
    value = value.strip()
    return value.upper() if _CEFR.match(value) else value.lower()


def document_id(book_id: str, source_file: str) -> str:
    """Stable id of one document (a file of a book), used as ``parent_doc_id``."""
    return str(uuid.uuid5(POINT_NAMESPACE, f"doc\x1f{book_id}\x1f{source_file}"))


@dataclass(frozen=True, slots=True)
class PathMeta:
    """Structure read from a file's path: module folder, chapter and lesson numbers."""

    module: str | None = None
    chapter: int | None = None
    lesson: int | None = None


class FileKey(NamedTuple):
    """What a file's stat says of it for change detection, as git's index records it: every
    field a change of its bytes, its name or its permissions moves (see
    :mod:`rag_pipeline.sources.filekeys`)."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int
    mode: int


#: a file's version as change detection compares it: its full stat (a folder), or a token
#: naming its content, which a change of the bytes always changes (a git blob id, ``git:<sha1>``)
VersionKey = FileKey | str


@dataclass(frozen=True, slots=True)
class SourceFile:
    """A file of a book with the SHA-256 of its bytes, as a look at its source found it."""

    book_id: str
    source_file: str  # posix path relative to the book
    location: str  # where its source reads it (an absolute path for a folder)
    sha256: str
    #: its version as change detection compares it (None: a source without one, e.g. an
    #: evaluation corpus)
    key: VersionKey | None = None
    #: what its source calls the version of these bytes (a git blob id, an object's ETag),
    #: recorded on every point of the file; None: a folder's file
    version: str | None = None


Stage = Literal["crawl", "read", "parse", "chunk", "embed", "index"]


@dataclass(frozen=True, slots=True)
class FileError:
    """Why one file (or book folder) was not ingested; the rest of the book goes on."""

    book_id: str
    source_file: str
    stage: Stage
    reason: str
    source_file_hash: str | None = None

    def __str__(self) -> str:
        return f"{self.book_id}/{shown_name(self.source_file)}: {self.reason}"


@dataclass(frozen=True, slots=True)
class DocumentMeta:
    """Normalized payload fields of a document, shared by all of its chunks."""

    title: str
    module: str | None = None
    chapter: int | None = None
    lesson: int | None = None
    hardware_tier: int | None = None
    proficiency_level: str | None = None
    tags: tuple[str, ...] = ()
    description: str | None = None


@dataclass(frozen=True, slots=True)
class ParsedDocument:
    """A decoded file: frontmatter split off, normalized metadata, and the Markdown body."""

    book_id: str
    source_file: str
    source_file_hash: str
    parent_doc_id: str
    meta: DocumentMeta
    body: str
    frontmatter: dict[str, Any] = field(default_factory=dict)
    #: what was odd but not fatal (a frontmatter field of the wrong type, NUL bytes removed)
    warnings: tuple[str, ...] = ()

    @property
    def is_empty(self) -> bool:
        return not self.body.strip()


@dataclass(frozen=True, slots=True)
class Chunk:
    """One retrievable piece of a document, with its place in the document's chain."""

    id: str
    book_id: str
    source_file: str
    source_file_hash: str
    parent_doc_id: str
    content_hash: str
    text: str
    section_title: str | None
    chunk_index: int
    total_chunks: int
    prev_chunk_id: str | None
    next_chunk_id: str | None
    token_count: int
    meta: DocumentMeta

    @property
    def embed_text(self) -> str:
        """What the embedder sees: the document title and section path, then the text."""
        return compose_embed_text(self.meta.title, self.section_title, self.text)


def compose_embed_text(title: str, section_title: str | None, text: str) -> str:
    header = title if not section_title else f"{title} > {section_title}"
    return f"{header}\n\n{text}" if header else text

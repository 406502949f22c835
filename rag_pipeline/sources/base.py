"""The book source contract: what change detection and the pipeline need of where books live.

A *book* is a set of files, each named by its path relative to the book (``source_file``). A
source lists its books, says each file's *version* without reading it (what a change moves:
a folder's full stat, a corpus row's content hash), reads a file's bytes, says whether a book
or a file is *gone* (one that exists but cannot be read is not: its chunks stay), and turns a
file's bytes into a document. Everything else (hashing with git's rules, the assessment, the
sensor's fingerprints) is built on those few calls, the same for every source: a new kind of
source (a git repository, an object store) is one new class.

A file's version is a stat (a folder: git's index rules) or a token naming its content (a git
blob id); a book may also have a *revision*, what its whole tree is at (a git commit): a run
records it in each point and in the book's summary, and :meth:`BookSource.describe` /
:meth:`BookSource.revision_info` say it in words (lineage, plan, the Dagster UI).

Implementations: :class:`~rag_pipeline.sources.folder.FolderSource` (a folder per book under
``RAG_DATA_DIR``), :class:`~rag_pipeline.sources.git.GitSource` (a ref of a git repository per
book), :class:`~rag_pipeline.sources.s3.S3Source` (a prefix of an S3 bucket per book),
:class:`~rag_pipeline.sources.declared.DeclaredSources` (the books ``RAG_SOURCES`` declares
beside the folder books) and :class:`~rag_pipeline.evaluation.beir.BeirSource` (a BEIR corpus
as one book).
"""

from __future__ import annotations

import errno
import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rag_pipeline.models import FileError, ParsedDocument, PathMeta, SourceFile, VersionKey
from rag_pipeline.sources.filekeys import now_ns, settled, trusted_hash

if TYPE_CHECKING:
    from rag_pipeline.sources.watch import BookWatcher

__all__ = [
    "DEFAULT_HARDWARE_TIER",
    "DEFAULT_MAX_FILE_BLOCKS",
    "DEFAULT_MAX_FILE_BYTES",
    "DEFAULT_PATH_PATTERNS",
    "BookFilesRead",
    "BookFingerprint",
    "BookListing",
    "BookSource",
    "BookUnavailableError",
    "BookVersions",
    "FileNow",
    "FileVersion",
    "ParseOptions",
    "RefusedPathError",
    "SourceReadError",
    "SourceUnavailableError",
    "too_large",
]


class SourceUnavailableError(ValueError):
    """The source itself cannot be listed (a data folder missing or unreadable): nothing can
    be told apart from "every book was removed", so nothing is ingested or purged."""


class BookUnavailableError(Exception):
    """One book's source cannot be looked at or read now (a git remote that cannot be reached,
    a ref that does not exist, an object store's endpoint unreachable, its credentials refused,
    its reads denied): nothing can be told of its files, so nothing of it is purged or taken
    for deleted, the book's run fails with this message, its indexed points stay, and the next
    look tries again. Other books go on. ``str()`` names the book, the source and the reason.
    Not a :class:`SourceReadError`: a read that raises it fails the book, not one file."""


class SourceReadError(Exception):
    """A file could not be read safely; ``str()`` is the reason a user reads."""

    def __init__(self, code: int | None, reason: str) -> None:
        super().__init__(reason)
        self.errno = code


class RefusedPathError(SourceReadError):
    """A path the book boundary refuses (:func:`~rag_pipeline.sources.crawl.open_in_book`):
    it leads outside its book folder (a symlink out or into another book, a ``..``) or to
    something that is not a regular file (a device, a FIFO, a folder). Nothing was opened."""

    def __init__(self, reason: str, code: int = errno.EPERM) -> None:
        super().__init__(code, reason)


def too_large(size: int, max_bytes: int, noun: str = "file") -> str:
    """Why a file over ``RAG_MAX_FILE_BYTES`` is refused, in words (every source's). Sizes
    under a megabyte are given in bytes: "0.0 MB exceeds the 0.0 MB limit" says nothing."""
    return (
        f"{noun} too large: {_size(size)} exceeds the {_size(max_bytes)} limit (RAG_MAX_FILE_BYTES)"
    )


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1_000_000 else f"{n:,} bytes"


def _read_failure(exc: OSError | SourceReadError) -> str:
    """Why a file gave no bytes, in words (a SourceReadError says it all: "cannot read file:
    ...", or the boundary's refusal)."""
    return f"cannot read file: {exc.strerror}" if isinstance(exc, OSError) else str(exc)


@dataclass(frozen=True, slots=True)
class BookListing:
    """The books a source holds (sorted), and the entries it refused as books."""

    book_ids: tuple[str, ...]
    rejected: tuple[FileError, ...] = ()


@dataclass(frozen=True, slots=True)
class FileVersion:
    """One file of a book as a look at the source sees it, before any byte is read."""

    source_file: str
    #: what change detection compares (see :mod:`.filekeys`); None: the source has no such
    #: key, and ``sha256`` says the version
    key: VersionKey | None
    #: where the source reads it (a path, for a folder)
    location: str = ""
    #: the content hash, where the source knows it without reading the file (a corpus row)
    sha256: str | None = None
    #: what the source calls this version, recorded on every point of the file (a git blob
    #: id, an object's ETag; None: a folder's file)
    version: str | None = None


@dataclass(frozen=True, slots=True)
class BookVersions:
    """Every file of one book with its version, and what could not be looked at."""

    book_id: str
    #: the boundary every read of the book stays within (a folder's real path; "" for none)
    boundary: str
    files: tuple[FileVersion, ...]
    errors: tuple[FileError, ...] = ()
    #: what the whole book is at (a git commit); "" for a source without one (a folder)
    revision: str = ""


@dataclass(frozen=True, slots=True)
class FileNow:
    """One file of a book as it is now, for lineage."""

    #: a file of the book is there (False: gone, or what is there is refused by the boundary)
    exists: bool
    sha256: str | None  # None: no bytes were read
    #: why there are no bytes: the boundary's refusal or the read error (None: read, or gone)
    problem: str | None = None


@dataclass(frozen=True)
class BookFilesRead:
    """A book's files as read for change detection: each file with its SHA-256, and the
    files that could not be read."""

    book_id: str
    boundary: str  # see :class:`BookVersions`
    files: tuple[SourceFile, ...]
    errors: tuple[FileError, ...]
    #: when the look began (time.time_ns()): a file modified before it was read as it was
    read_at_ns: int = 0
    #: files whose bytes were read to hash them (the others' hash was known)
    hashed: int = 0
    revision: str = ""  # see :class:`BookVersions`


@dataclass(frozen=True, slots=True)
class BookFingerprint:
    """A book's content digest plus the per-file cache that makes the next one cheap."""

    book_id: str
    digest: str
    files: int
    #: source_file -> (stat, sha256) of the files whose stat was settled when hashed (see
    #: :mod:`.filekeys`); kept in memory by the sensor, not in its cursor
    stats: Mapping[str, tuple[VersionKey, str]] = field(default_factory=dict)
    hashed: int = 0  # files whose bytes were read for this fingerprint


# Regexes with named groups ``module``, ``chapter``, ``lesson`` matched against a file's path
# relative to its book folder. Every pattern is tried; the first match wins per field.
DEFAULT_PATH_PATTERNS: tuple[str, ...] = (
    r"(?:^|/)(?P<module>module-\d+[^/]*)/",
    r"(?:^|/)chapter-(?P<chapter>\d+)[^/]*/",
    r"(?:^|/)\d+-chapter-(?P<chapter>\d+)[^/]*/",
    r"(?:^|/)ch(?:apter-)?(?P<chapter>\d+)-[^/]*\.mdx?$",
    r"(?:^|/)(?:page|lesson)-(?P<lesson>\d+)[^/]*\.mdx?$",
    r"(?:^|/)week-\d+-lesson-(?P<lesson>\d+)[^/]*\.mdx?$",
    r"(?:^|/)\d+-lesson-(?P<lesson>\d+)[^/]*\.mdx?$",
    r"chapter-\d+[^/]*/(?P<lesson>\d+)-[^/]*\.mdx?$",
)
#: the hardware tier of a document whose frontmatter states none, unless set
DEFAULT_HARDWARE_TIER = 1
#: larger files are refused with a per-file error (``RAG_MAX_FILE_BYTES``)
DEFAULT_MAX_FILE_BYTES = 10 * 1024 * 1024
#: Markdown blocks a file may hold unless RAG_MAX_FILE_BLOCKS says otherwise
DEFAULT_MAX_FILE_BLOCKS = 100_000


@dataclass(frozen=True, slots=True)
class ParseOptions:
    """How a file's bytes become a document: the path patterns that give ``module``,
    ``chapter`` and ``lesson`` (``RAG_PATH_PATTERNS``), the hardware tier of a document whose
    frontmatter states none (``RAG_DEFAULT_HARDWARE_TIER``), and the limits past which a file
    is refused (``RAG_MAX_FILE_BYTES``, ``RAG_MAX_FILE_BLOCKS``: enforced by the source and the
    chunker; here for :attr:`key`; None: not known, left out of it)."""

    path_patterns: tuple[str, ...] = ()
    default_hardware_tier: int | None = DEFAULT_HARDWARE_TIER
    max_file_bytes: int | None = None
    max_file_blocks: int | None = None

    @property
    def key(self) -> str:
        """What a clean build of a file depends on besides its bytes and the recipe, recorded
        on every document record (``read_options``): a file indexed under other settings is
        read again (its chunks' metadata, or whether it is refused, would differ from a clean
        build's). The settings that are not their defaults, in words; "" for none, which is
        also what a record written before records held a key stands for."""
        parts = []
        if self.path_patterns != DEFAULT_PATH_PATTERNS:
            text = json.dumps(list(self.path_patterns))
            parts.append(f"path patterns {hashlib.sha256(text.encode()).hexdigest()[:8]}")
        if self.default_hardware_tier != DEFAULT_HARDWARE_TIER:
            parts.append(f"default tier {self.default_hardware_tier}")
        if self.max_file_bytes not in (None, DEFAULT_MAX_FILE_BYTES):
            parts.append(f"at most {self.max_file_bytes} bytes")
        if self.max_file_blocks not in (None, DEFAULT_MAX_FILE_BLOCKS):
            parts.append(f"at most {self.max_file_blocks} blocks")
        return ", ".join(parts)


class BookSource(ABC):
    """Where books come from (see the module docstring for the contract)."""

    #: what the source is, for messages ("data folder /srv/books (RAG_DATA_DIR)")
    description: str = "book source"
    #: what one of its books is, for messages ("book folder")
    book_noun: str = "book"

    @abstractmethod
    def list_books(self) -> BookListing:
        """Every book id and the entries refused as books; :class:`SourceUnavailableError`
        when the source itself cannot be listed."""

    @abstractmethod
    def versions(self, book_id: str) -> BookVersions:
        """Every file of the book with its version; no file's bytes are read.
        :class:`BookUnavailableError` when the book cannot be looked at now."""

    @abstractmethod
    def read(self, book_id: str, file: FileVersion | SourceFile, boundary: str) -> bytes:
        """The file's bytes, from within ``boundary`` (what :meth:`versions` said);
        :class:`SourceReadError` naming why it cannot be read."""

    @abstractmethod
    def is_gone(self, book_id: str, source_file: str | None = None) -> bool:
        """The book (or one file of it) no longer exists. A book or file that exists but
        cannot be read is not gone: its indexed chunks must stay."""

    def exists(self) -> bool:
        """The source itself is there (a purge decided earlier must not run when it is not:
        an unmounted folder is not a decision to delete)."""
        try:
            self.list_books()
        except SourceUnavailableError:
            return False
        return True

    def watcher(self) -> BookWatcher | None:
        """Notifications of which books something happened in (None: the source sends none,
        and every look looks at every book)."""
        return None

    def folder_keys(self, versions: BookVersions) -> list[tuple[str, VersionKey | None]]:
        """The stat of the book's folder and of each folder holding its files (None: it
        cannot be stat'ed now), for a source of folders: a folder moved away and back moves
        no file's stat, only its own. Empty for a source without folders."""
        return []

    def notifies(self, book_id: str) -> bool:
        """The watcher's notifications cover the book (a folder behind a link is not
        watched: a look must look at it)."""
        return True

    def why_unreadable(self, book_id: str, source_file: str) -> str:
        """Why a file that is not gone gave no bytes."""
        return "the file exists but could not be read"

    def why_not_a_book(self, book_id: str) -> str:
        """Why an entry that is not gone is not a usable book."""
        return "is not a book this source can read"

    def locate(self, book_id: str, source_file: str) -> str:
        """Where a person finds the file (a path, for a folder); never a URL's credentials
        (:func:`~rag_pipeline.urls.without_credentials`): plans, lineage and the Dagster UI
        show it as it is."""
        return f"{book_id}/{source_file}"

    def describe(self, book_id: str) -> dict[str, str]:
        """Where the book comes from, in words: ``kind`` (folder, git, s3) and ``location``
        (a path, a repository and ref); the Dagster UI, ``plan`` and ``lineage`` show it as
        it is (no credentials, as :meth:`locate`)."""
        return {"kind": "book", "location": self.locate(book_id, "").rstrip("/")}

    def revision_info(self, book_id: str, revision: str) -> dict[str, str] | None:
        """What a revision of :class:`BookVersions` is (a commit: sha, author, date,
        subject), for lineage; None: the source has no revisions or cannot say now."""
        return None

    def revision_range(self, book_id: str, old: str, new: str) -> str | None:
        """What moving the book from revision ``old`` (indexed) to ``new`` applies, in words
        (a commit range and its count); None when there is nothing to say."""
        return None

    def file_now(self, book_id: str, source_file: str) -> FileNow:
        """The file as it is now (what lineage compares with the index); a source reads it
        within the book's boundary, as a run does."""
        try:
            versions = self.versions(book_id)
        except BookUnavailableError as exc:
            return FileNow(True, None, str(exc))  # not known to be gone
        for v in versions.files:
            if v.source_file == source_file:
                try:
                    return FileNow(True, v.sha256 or self.hash(book_id, v, versions.boundary))
                except RefusedPathError as exc:
                    return FileNow(False, None, str(exc))
                except (OSError, SourceReadError) as exc:
                    gone = self.is_gone(book_id, source_file)
                    return FileNow(not gone, None, None if gone else _read_failure(exc))
        for error in versions.errors:  # there, but refused (a link in a git tree): said why
            if error.source_file == source_file:
                return FileNow(False, None, error.reason)
        return FileNow(False, None)

    def hash(self, book_id: str, file: FileVersion, boundary: str) -> str:
        """The SHA-256 of the file's bytes (``OSError`` or :class:`SourceReadError` when it
        cannot be read); a source that can stream a large file overrides it."""
        return hashlib.sha256(self.read(book_id, file, boundary)).hexdigest()

    def to_document(
        self,
        book_id: str,
        source_file: str,
        data: bytes,
        sha256: str,
        options: ParseOptions,
    ) -> ParsedDocument | FileError:
        """The file's bytes as a document (default: Markdown with YAML frontmatter, see
        :mod:`rag_pipeline.ingest.parse`), or the error naming why it is not one."""
        from rag_pipeline.ingest.parse import parse_document
        from rag_pipeline.sources.crawl import path_meta

        return parse_document(
            book_id,
            source_file,
            data,
            sha256,
            path_meta(source_file, options.path_patterns) if options.path_patterns else PathMeta(),
            default_hardware_tier=options.default_hardware_tier,
        )

    # -- built on the calls above: the same for every source ---------------------------------

    def scan(
        self, book_id: str, known: Mapping[str, tuple[VersionKey, str]] | None = None
    ) -> BookFilesRead:
        """Every file of the book with its SHA-256: the one the source knows, else the one
        ``known`` records while the file's version is exactly the recorded one (git's rules,
        :mod:`.filekeys`), else the file is read and hashed."""
        read_at_ns = now_ns()
        versions = self.versions(book_id)
        known = known or {}
        files: list[SourceFile] = []
        errors = list(versions.errors)
        hashed = 0
        for v in versions.files:
            digest = v.sha256 or (trusted_hash(v.key, known, v.source_file) if v.key else None)
            if digest is None:
                hashed += 1
                try:
                    digest = self.hash(book_id, v, versions.boundary)
                except (OSError, SourceReadError) as exc:
                    if self.is_gone(book_id, v.source_file):
                        continue  # vanished since it was listed: it is gone
                    errors.append(FileError(book_id, v.source_file, "read", _read_failure(exc)))
                    continue
            files.append(SourceFile(book_id, v.source_file, v.location, digest, v.key, v.version))
        return BookFilesRead(
            book_id,
            versions.boundary,
            tuple(files),
            tuple(errors),
            read_at_ns,
            hashed,
            versions.revision,
        )

    def fingerprint(
        self, book_id: str, previous: Mapping[str, tuple[VersionKey, str]] | None = None
    ) -> BookFingerprint:
        """Digest of (name, sha256) of every file of the book, and of every file that cannot
        be looked at (one turning unreadable is a change too), hashing only the files whose
        version is not the one ``previous`` recorded (what a sensor tick compares)."""
        found = self.scan(book_id, previous)
        kept = {
            f.source_file: (f.key, f.sha256)
            for f in found.files
            if f.key is not None and settled(f.key, found.read_at_ns)
        }
        h = hashlib.sha256()
        for f in sorted(found.files, key=lambda f: f.source_file):
            h.update(f.source_file.encode("utf-8", "surrogateescape"))
            h.update(b"\0")
            h.update(f.sha256.encode())
            h.update(b"\n")
        for error in found.errors:
            h.update(f"!{error.source_file}\0{error.reason}\n".encode("utf-8", "surrogateescape"))
        return BookFingerprint(book_id, h.hexdigest(), len(found.files), kept, found.hashed)

"""The sources file (``RAG_SOURCES``): books declared once, beside the folder books.

A YAML file maps book ids to sources::

    books:
      handbook: {git: /srv/git/handbook.git, ref: main, path: docs}
      runbooks: {s3: s3://team-docs/runbooks/, endpoint_url: http://127.0.0.1:9000}

Each entry is validated (pydantic; a bad entry is a :class:`~rag_pipeline.config.SettingsError`
naming the entry and the field, exit 2), and :class:`DeclaredSources` serves those books and
the folder books of ``RAG_DATA_DIR`` as one :class:`~rag_pipeline.sources.base.BookSource`:
each book is handled by the source that holds it, one class per kind of source, each built as
``XSource(books: Mapping[str, XBookSpec])``. The file is read again whenever it changes, so
that declared books come and go as their entries do (a removed entry's book is purged under the
rules of a removed folder); a file that turns bad stops every look (nothing is ingested or
purged) until it is fixed.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Union

import yaml
from pydantic import BaseModel, ConfigDict, Discriminator, Tag, ValidationError

from rag_pipeline.models import FileKey, SourceFile, VersionKey, validate_book_id
from rag_pipeline.sources.base import (
    BookListing,
    BookSource,
    BookVersions,
    FileNow,
    FileVersion,
    SourceUnavailableError,
)
from rag_pipeline.sources.filekeys import file_key, now_ns, settle_wait_s, settled
from rag_pipeline.sources.folder import FolderSource
from rag_pipeline.sources.git import GitBookSpec, GitSource
from rag_pipeline.sources.s3 import S3BookSpec, S3Source
from rag_pipeline.urls import without_credentials

if TYPE_CHECKING:
    from rag_pipeline.sources.watch import BookWatcher

__all__ = ["DeclaredSources", "SourcesFileError", "load_sources"]


class SourcesFileError(ValueError):
    """The sources file cannot be used; ``str()`` names the file, the entry and the field,
    ``problem`` the entry and the field only."""

    def __init__(self, path: Path, problem: str) -> None:
        # (a problem may quote the file, a URL's credentials with it: never shown)
        problem = without_credentials(problem)
        super().__init__(f"sources file {path} (RAG_SOURCES): {problem}")
        self.problem = problem


def _kind(value: Any) -> str | None:
    """Which source an entry is: the key it has (``git``, ``s3``)."""
    if isinstance(value, dict):
        kinds = [k for k in ("git", "s3") if k in value]
        return kinds[0] if len(kinds) == 1 else None
    if isinstance(value, GitBookSpec):
        return "git"
    return "s3" if value is not None else None


if TYPE_CHECKING:
    BookSpec = BaseModel
else:  # an entry is the model of the one key it has (git, s3)
    BookSpec = Annotated[
        Union[Annotated[GitBookSpec, Tag("git")], Annotated[S3BookSpec, Tag("s3")]],  # noqa: UP007
        Discriminator(
            _kind,
            custom_error_type="source_kind",
            custom_error_message="an entry has exactly one of the keys git or s3",
        ),
    ]


class _SourcesFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    books: dict[str, BookSpec] = {}


def _where(loc: tuple[Any, ...]) -> str:
    """``entry 'handbook', field 'ref'`` for a problem at ``loc``."""
    parts = [str(p) for p in loc]
    if len(parts) >= 3 and parts[2] in ("git", "s3"):
        del parts[2]  # the union's tag
    if len(parts) >= 2 and parts[0] == "books":
        entry = f"entry {parts[1]!r}"
        return f"{entry}, field {'.'.join(parts[2:])!r}" if len(parts) > 2 else entry
    return ".".join(parts) or "the file"


def load_sources(path: Path | str) -> dict[str, Any]:
    """Book id -> spec, as the sources file declares them; :class:`SourcesFileError` naming the
    file, the entry and the field of the first problems. Relative repository paths are
    resolved against the file's folder."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SourcesFileError(path, f"cannot read it: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise SourcesFileError(path, "is not UTF-8 text") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SourcesFileError(path, f"not valid YAML: {exc}".replace("\n", " ")) from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise SourcesFileError(path, "must be a mapping with a 'books' key")
    if not isinstance(raw.get("books", {}), dict):
        raise SourcesFileError(path, "'books' must map book ids to sources")
    try:
        parsed = _SourcesFile.model_validate(raw)
    except ValidationError as exc:
        problems = [
            f"{_where(tuple(e['loc']))}: {str(e['msg']).removeprefix('Value error, ')}"
            for e in exc.errors(include_url=False)
        ]
        raise SourcesFileError(path, "; ".join(problems)) from None
    books: dict[str, Any] = {}
    for book_id, spec in parsed.books.items():
        try:
            validate_book_id(book_id)
        except ValueError as exc:
            raise SourcesFileError(path, f"entry {book_id!r}: {exc}") from None
        if isinstance(spec, GitBookSpec) and _is_local_path(spec.git):
            local = Path(spec.git).expanduser()
            spec = spec.model_copy(update={"git": str(path.parent.resolve() / local)})
        books[book_id] = spec
    return books


def _is_local_path(url: str) -> bool:
    """A repository given as a path (not ``scheme://`` nor scp-like ``host:path``)."""
    if "://" in url:
        return False
    head = url.split("/", 1)[0]
    return ":" not in head


def _by_kind(books: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for book_id, spec in books.items():
        out.setdefault("git" if isinstance(spec, GitBookSpec) else "s3", {})[book_id] = spec
    return out


class DeclaredSources(BookSource):
    """The folder books of ``folder`` and the books the sources file at ``path`` declares,
    as one source: each call goes to the source that holds the book."""

    def __init__(
        self,
        folder: FolderSource,
        path: Path | str,
        *,
        cache_dir: Path | str,
        max_file_bytes: int = 10 * 1024 * 1024,
    ) -> None:
        self.folder = folder
        self.path = Path(path)
        self.cache_dir = Path(cache_dir)
        self.max_file_bytes = max_file_bytes
        self.description = f"{folder.description} and sources file {self.path} (RAG_SOURCES)"
        self.book_noun = "book"
        self._lock = threading.Lock()
        self._stamp: FileKey | None = None
        self._settled = False
        self._sources: dict[str, BookSource] = {}
        self._owner: dict[str, BookSource] = {}
        self._reload()

    def __repr__(self) -> str:
        return f"DeclaredSources({self.folder!r}, {str(self.path)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DeclaredSources) and (other.folder, other.path) == (
            self.folder,
            self.path,
        )

    def __hash__(self) -> int:
        return hash((self.folder, self.path))

    def __getstate__(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # -- the sources file ----------------------------------------------------------------------

    def _reload(self) -> None:
        """Read the sources file again if it changed since it was read; a bad one raises
        :class:`SourcesFileError`."""
        read_at = now_ns()
        try:
            stamp = file_key(os.stat(self.path))
        except OSError as exc:
            raise SourcesFileError(self.path, f"cannot read it: {exc.strerror}") from None
        with self._lock:
            # read again once a stamp read in its racy window has settled: a write in the
            # clock tick of that read left it as it was (the racy rule of a book's files)
            if stamp == self._stamp and (self._settled or not settled(stamp, read_at)):
                return
            by_kind = _by_kind(load_sources(self.path))
            sources: dict[str, BookSource] = {}
            for kind, specs in by_kind.items():
                before = self._sources.get(kind)
                if before is not None and getattr(before, "books", None) == specs:
                    sources[kind] = before  # the same books: its caches stay
                else:
                    sources[kind] = self._build(kind, specs)
            self._sources = sources
            self._owner = {b: sources[k] for k, specs in by_kind.items() for b in specs}
            # the file's full stat: its ctime too (a rewrite with its old times put back, as
            # `cp -p` leaves it, moves only that)
            self._stamp = stamp
            self._settled = settled(stamp, read_at)

    def _build(self, kind: str, specs: Mapping[str, Any]) -> BookSource:
        if kind == "git":
            return GitSource(specs, cache_dir=self.cache_dir, max_file_bytes=self.max_file_bytes)
        return S3Source(specs, max_file_bytes=self.max_file_bytes)

    def _declared(self) -> dict[str, BookSource]:
        """Book id -> its declared source, from the sources file as it is now; a bad file is
        :class:`SourceUnavailableError` (nothing can be told apart from "removed")."""
        try:
            self._reload()
        except SourcesFileError as exc:
            raise SourceUnavailableError(str(exc)) from None
        return self._owner

    def _of(self, book_id: str) -> BookSource:
        try:
            owner = self._declared()
        except SourceUnavailableError:
            owner = self._owner  # as last read: a look at one book goes on
        return owner.get(book_id, self.folder)

    def declared_books(self) -> dict[str, BookSource]:
        """Book id -> the source of each book the sources file declares."""
        return dict(self._declared())

    # -- the contract --------------------------------------------------------------------------

    def list_books(self) -> BookListing:
        declared = self._declared()
        folders = self.folder.list_books()
        both = sorted(set(declared) & set(folders.book_ids))
        if both:
            clash = ", ".join(
                f"{b!r} is both {self.folder.locate(b, '').rstrip('/')} and an entry of {self.path}"
                for b in both
            )
            raise SourceUnavailableError(
                f"book id declared twice: {clash}; rename the folder or the entry (RAG_SOURCES)"
            )
        rejected = [e for e in folders.rejected if e.book_id not in declared]
        return BookListing(tuple(sorted({*folders.book_ids, *declared})), tuple(rejected))

    def versions(self, book_id: str) -> BookVersions:
        return self._of(book_id).versions(book_id)

    def read(self, book_id: str, file: FileVersion | SourceFile, boundary: str) -> bytes:
        return self._of(book_id).read(book_id, file, boundary)

    def hash(self, book_id: str, file: FileVersion, boundary: str) -> str:
        return self._of(book_id).hash(book_id, file, boundary)

    def is_gone(self, book_id: str, source_file: str | None = None) -> bool:
        try:
            declared = self._declared()
        except SourceUnavailableError:
            return False  # the file cannot be read: nothing is gone
        source = declared.get(book_id, self.folder)
        if source_file is None and source is self.folder and self._being_written():
            # missing from a sources file read in the clock tick of a write: read it again
            # once that write settled, and decide by what it says then
            self._settle()
            if self._being_written():
                return False  # written again meanwhile: not now (the next look decides)
            source = self._owner.get(book_id, self.folder)
        return source.is_gone(book_id, source_file)

    def _being_written(self) -> bool:
        """The sources file was last read in the clock tick of a write (its stat racy): what it
        lacks may be a write in progress (an editor's truncate, then write), not a removed
        entry: no book is taken for removed from that read."""
        with self._lock:
            return self._stamp is not None and not self._settled

    def _settle(self) -> None:
        """Wait until the sources file's last read stat is settled (at most the racy window:
        50 ms on a file system with fine times), then read the file again."""
        with self._lock:
            stamp = self._stamp
        if stamp is not None:
            time.sleep(settle_wait_s(stamp, now_ns()))
        with contextlib.suppress(SourcesFileError):  # a bad file: the next look says so
            self._reload()

    def exists(self) -> bool:
        if not self.folder.exists():
            return False
        try:
            self._declared()
        except SourceUnavailableError:
            return False
        return True

    def watcher(self) -> BookWatcher | None:
        return self.folder.watcher()

    def folder_keys(self, versions: BookVersions) -> list[tuple[str, VersionKey | None]]:
        return self._of(versions.book_id).folder_keys(versions)

    def notifies(self, book_id: str) -> bool:
        source = self._of(book_id)
        return source is self.folder and self.folder.notifies(book_id)

    def why_unreadable(self, book_id: str, source_file: str) -> str:
        return self._of(book_id).why_unreadable(book_id, source_file)

    def why_not_a_book(self, book_id: str) -> str:
        source = self._of(book_id)
        if source is self.folder and self._being_written():
            return (
                f"is not in the sources file {self.path} (RAG_SOURCES) as read while it was "
                "being written again and again; it is looked at again at the next look"
            )
        return source.why_not_a_book(book_id)

    def locate(self, book_id: str, source_file: str) -> str:
        return self._of(book_id).locate(book_id, source_file)

    def describe(self, book_id: str) -> dict[str, str]:
        return self._of(book_id).describe(book_id)

    def revision_info(self, book_id: str, revision: str) -> dict[str, str] | None:
        return self._of(book_id).revision_info(book_id, revision)

    def revision_range(self, book_id: str, old: str, new: str) -> str | None:
        return self._of(book_id).revision_range(book_id, old, new)

    def file_now(self, book_id: str, source_file: str) -> FileNow:
        return self._of(book_id).file_now(book_id, source_file)

"""The first book source: a folder per book under the data folder (``RAG_DATA_DIR``).

A book is a folder directly under the data folder, its id the folder's name; its files are the
``*.md`` / ``*.mdx`` files anywhere below it, each named by its path inside the book folder.
The crawl's safety rules (links that leave their book, unsafe names, files re-pointed between
the look and the read) are :mod:`.crawl`'s; a file's version is its full stat (git's rules,
:mod:`.filekeys`); the data folder's notifications come from :mod:`.watch`.
"""

from __future__ import annotations

import os
from pathlib import Path

from rag_pipeline.models import SourceFile, VersionKey
from rag_pipeline.sources.base import (
    DEFAULT_MAX_FILE_BYTES,
    BookListing,
    BookSource,
    BookVersions,
    FileNow,
    FileVersion,
    RefusedPathError,
    SourceReadError,
    SourceUnavailableError,
)
from rag_pipeline.sources.crawl import (
    book_file_path,
    book_folder_problem,
    discover_books,
    hash_file,
    path_is_gone,
    read_source,
    scan_book,
    unreadable_reason,
)
from rag_pipeline.sources.filekeys import file_key
from rag_pipeline.sources.watch import BookWatcher, watcher_for

__all__ = ["DEFAULT_MAX_FILE_BYTES", "FolderSource"]


class FolderSource(BookSource):
    """Books as folders under ``data_dir``."""

    def __init__(self, data_dir: Path | str, *, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES):
        self.data_dir = Path(data_dir)
        self.max_file_bytes = max_file_bytes
        self.description = f"data folder {self.data_dir} (RAG_DATA_DIR)"
        self.book_noun = "book folder"

    def __repr__(self) -> str:
        return f"FolderSource({str(self.data_dir)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FolderSource) and (other.data_dir, other.max_file_bytes) == (
            self.data_dir,
            self.max_file_bytes,
        )

    def __hash__(self) -> int:
        return hash((self.data_dir, self.max_file_bytes))

    def list_books(self) -> BookListing:
        return discover_books(self.data_dir)

    def versions(self, book_id: str) -> BookVersions:
        return scan_book(self.data_dir, book_id)

    def read(self, book_id: str, file: FileVersion | SourceFile, boundary: str) -> bytes:
        return read_source(file.location, boundary, self.max_file_bytes)

    def hash(self, book_id: str, file: FileVersion, boundary: str) -> str:
        # streamed: a large file never sits in memory (only a run reads whole files); one
        # over the limit is refused by its size, unread, as the run's read refuses it
        return hash_file(file.location, boundary, self.max_file_bytes)

    def locate(self, book_id: str, source_file: str) -> str:
        return str(self.data_dir / book_id / source_file)

    def describe(self, book_id: str) -> dict[str, str]:
        return {"kind": "folder", "location": str(self.data_dir / book_id)}

    def file_now(self, book_id: str, source_file: str) -> FileNow:
        # the crawl's rules, for one file: the book folder as discover_books accepts it,
        # the file opened within it (open_in_book); nothing outside the book is looked at
        try:
            listing = discover_books(self.data_dir)
        except SourceUnavailableError as exc:
            return FileNow(False, None, str(exc))
        if book_id not in listing.book_ids:
            refusals = [e.reason for e in listing.rejected if e.book_id == book_id]
            return FileNow(False, None, refusals[0] if refusals else None)
        book_dir = self.data_dir / book_id
        try:
            path = book_file_path(book_dir, source_file)
            return FileNow(True, hash_file(path, os.path.realpath(book_dir), self.max_file_bytes))
        except RefusedPathError as exc:
            return FileNow(False, None, str(exc))
        except SourceReadError as exc:
            if path_is_gone(book_dir, source_file):
                return FileNow(False, None)
            return FileNow(True, None, str(exc))

    def is_gone(self, book_id: str, source_file: str | None = None) -> bool:
        if source_file is None:
            return path_is_gone(self.data_dir, book_id)
        return path_is_gone(self.data_dir / book_id, source_file)

    def exists(self) -> bool:
        return os.path.isdir(self.data_dir)

    def why_unreadable(self, book_id: str, source_file: str) -> str:
        return unreadable_reason(self.data_dir / book_id, source_file)

    def why_not_a_book(self, book_id: str) -> str:
        return book_folder_problem(self.data_dir, book_id)

    def notifies(self, book_id: str) -> bool:
        # a book folder that is a symlink: its target is not watched
        return not os.path.islink(self.data_dir / book_id)

    def folder_keys(self, versions: BookVersions) -> list[tuple[str, VersionKey | None]]:
        book_dir = os.path.join(self.data_dir, versions.book_id)
        parents = {file.source_file.rpartition("/")[0] for file in versions.files}
        folders = {""}
        for parent in parents:  # each folder on the way to one holding a file
            while parent and parent not in folders:
                folders.add(parent)
                parent = parent.rpartition("/")[0]
        keys: list[tuple[str, VersionKey | None]] = []
        for rel in sorted(folders):
            try:
                keys.append((rel, file_key(os.stat(os.path.join(book_dir, rel)))))
            except OSError:
                keys.append((rel, None))
        return keys

    def watcher(self) -> BookWatcher:
        """The data folder's notifications (one watcher per folder and process)."""
        return watcher_for(self.data_dir)

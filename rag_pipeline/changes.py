"""Change detection: cheap book fingerprints for sensors, file status against the index.

Two levels, both without a state database:

* :func:`fingerprint_book` digests a book's files by (path, size, mtime_ns) and hashes a file's
  bytes only when its stat changed since the previous fingerprint, so a sensor tick over
  thousands of unchanged files reads no file. A book's digest is over content hashes, so a
  ``touch`` that leaves the bytes alone changes nothing.
* :func:`classify_files` compares the files on disk with the document records stored in Qdrant
  payloads and says which are new, modified, unchanged or deleted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from rag_pipeline.crawl import FileStat, hash_file, scan_book

__all__ = [
    "BookFingerprint",
    "FileChanges",
    "FileStatus",
    "IndexedDocument",
    "classify_files",
    "fingerprint_book",
]

FileStatus = Literal["new", "modified", "unchanged", "deleted"]


@dataclass(frozen=True, slots=True)
class BookFingerprint:
    """A book's content digest plus the per-file cache that makes the next one cheap."""

    book_id: str
    digest: str
    files: int
    # source_file -> (size, mtime_ns, sha256); kept in memory by the sensor, not in its cursor
    stats: Mapping[str, tuple[int, int, str]] = field(default_factory=dict)
    hashed: int = 0  # files whose bytes were read for this fingerprint


def fingerprint_book(
    data_dir: Path | str,
    book_id: str,
    previous: Mapping[str, tuple[int, int, str]] | None = None,
) -> BookFingerprint:
    """Digest of (path, sha256) of every Markdown file of the book, hashing only what changed."""
    stats, _ = scan_book(data_dir, book_id)
    previous = previous or {}
    entries: dict[str, tuple[int, int, str]] = {}
    hashed = 0
    for st in stats:
        cached = previous.get(st.source_file)
        if cached is not None and cached[0] == st.size and cached[1] == st.mtime_ns:
            entries[st.source_file] = cached
            continue
        digest = _hash_or_none(st)
        if digest is None:  # vanished or unreadable mid-scan: the next tick sees it settled
            continue
        hashed += 1
        entries[st.source_file] = (st.size, st.mtime_ns, digest)
    h = hashlib.sha256()
    for name in sorted(entries):
        h.update(name.encode("utf-8", "surrogateescape"))
        h.update(b"\0")
        h.update(entries[name][2].encode())
        h.update(b"\n")
    return BookFingerprint(book_id, h.hexdigest(), len(entries), entries, hashed)


def _hash_or_none(st: FileStat) -> str | None:
    try:
        return hash_file(st.path)
    except OSError:
        return None


@dataclass(frozen=True, slots=True)
class IndexedDocument:
    """What the index says about one file (its document record's payload)."""

    source_file: str
    source_file_hash: str
    status: str = "ok"
    signature: str = ""  # chunker + embedding model the file was indexed with
    total_chunks: int = 0
    error: str | None = None


@dataclass(frozen=True, slots=True)
class FileChanges:
    """Files of one book sorted by what the next run has to do with them."""

    new: tuple[str, ...] = ()
    modified: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()

    @property
    def changed(self) -> tuple[str, ...]:
        return self.new + self.modified

    @property
    def has_work(self) -> bool:
        return bool(self.new or self.modified or self.deleted)

    def statuses(self) -> dict[str, FileStatus]:
        """Every file's status, by path."""
        out: dict[str, FileStatus] = {}
        for status in ("new", "modified", "unchanged", "deleted"):
            out.update(dict.fromkeys(getattr(self, status), status))
        return out

    def counts(self) -> dict[str, int]:
        return {
            "files_new": len(self.new),
            "files_modified": len(self.modified),
            "files_unchanged": len(self.unchanged),
            "files_deleted": len(self.deleted),
        }


def classify_files(
    current: Mapping[str, str],
    indexed: Mapping[str, IndexedDocument],
    signature: str,
    orphan_files: Iterable[str] = (),
) -> FileChanges:
    """Compare ``{source_file: sha256}`` on disk with the index.

    A file is unchanged only if its bytes, the chunker and the embedding model all match what it
    was indexed with. ``orphan_files`` are files that still have chunk points but no document
    record (a run that crashed mid-write); they count as deleted when gone from disk.
    """
    new, modified, unchanged = [], [], []
    for name in sorted(current):
        record = indexed.get(name)
        if record is None:
            new.append(name)
        elif record.source_file_hash != current[name] or record.signature != signature:
            modified.append(name)
        else:
            unchanged.append(name)
    gone = (set(indexed) | set(orphan_files)) - set(current)
    return FileChanges(tuple(new), tuple(modified), tuple(unchanged), tuple(sorted(gone)))

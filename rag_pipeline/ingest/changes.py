"""Change detection: cheap book fingerprints for sensors, file status against the index.

Two levels, both without a state database:

* :func:`fingerprint_book` digests a book's files by content and hashes a file's bytes only
  when its stat is no longer the one recorded with its hash (:mod:`.filekeys`: git's rules),
  so a sensor tick over thousands of unchanged files reads no file. A ``touch`` that leaves
  the bytes alone changes nothing.
* :func:`classify_files` compares the files on disk with the document records stored in Qdrant
  payloads and says, with a reason, what the next run must do with each file.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from rag_pipeline.models import FileKey
from rag_pipeline.sources.crawl import FileStat, hash_file, scan_book
from rag_pipeline.sources.filekeys import now_ns, settled, trusted_hash

__all__ = [
    "FORCED_REBUILD",
    "UNREADABLE_STAGE",
    "BookFingerprint",
    "FileChanges",
    "FileStatus",
    "IndexedDocument",
    "classify_files",
    "fingerprint_book",
]

#: error stage of a record whose file could not be read (crawl-time: not even hashed)
UNREADABLE_STAGE: Literal["crawl"] = "crawl"

#: the reason of every indexed file of a book rebuilt on request (``--force``)
FORCED_REBUILD = "forced rebuild"

FileStatus = Literal["new", "modified", "unchanged", "deleted", "unreadable"]


@dataclass(frozen=True, slots=True)
class BookFingerprint:
    """A book's content digest plus the per-file cache that makes the next one cheap."""

    book_id: str
    digest: str
    files: int
    #: source_file -> (stat, sha256) of the files whose stat was settled when hashed (see
    #: :mod:`.filekeys`); kept in memory by the sensor, not in its cursor
    stats: Mapping[str, tuple[FileKey, str]] = field(default_factory=dict)
    hashed: int = 0  # files whose bytes were read for this fingerprint


def fingerprint_book(
    data_dir: Path | str,
    book_id: str,
    previous: Mapping[str, tuple[FileKey, str]] | None = None,
) -> BookFingerprint:
    """Digest of (path, sha256) of every Markdown file of the book, hashing only the files
    whose stat is not the one ``previous`` recorded."""
    read_at_ns = now_ns()
    scan = scan_book(data_dir, book_id)
    previous = previous or {}
    digests: dict[str, str] = {}
    kept: dict[str, tuple[FileKey, str]] = {}
    hashed = 0
    for st in scan.files:
        digest = trusted_hash(st.key, previous, st.source_file)
        if digest is None:
            digest = _hash_or_none(st)
            if digest is None:  # vanished or unreadable mid-scan: the next tick sees it settled
                continue
            hashed += 1
        digests[st.source_file] = digest
        if settled(st.key, read_at_ns):
            kept[st.source_file] = (st.key, digest)
    h = hashlib.sha256()
    for name in sorted(digests):
        h.update(name.encode("utf-8", "surrogateescape"))
        h.update(b"\0")
        h.update(digests[name].encode())
        h.update(b"\n")
    for error in scan.errors:  # a file turning unreadable is a change too
        h.update(f"!{error.source_file}\0{error.reason}\n".encode("utf-8", "surrogateescape"))
    return BookFingerprint(book_id, h.hexdigest(), len(digests), kept, hashed)


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
    #: the stage the recorded error came from; ``UNREADABLE_STAGE`` means the file could not
    #: be read at all, and the record keeps the hash of the last good version it serves
    error_stage: str | None = None


@dataclass(frozen=True, slots=True)
class FileChanges:
    """Files of one book sorted by what the next run has to do with them.

    ``unreadable`` files exist but could not be read this time: their last good chunks stay
    and the run records the error on their document record. ``reasons`` says why each file
    that is not unchanged needs work."""

    new: tuple[str, ...] = ()
    modified: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    unreadable: tuple[str, ...] = ()
    reasons: Mapping[str, str] = field(default_factory=dict)
    #: unchanged files that still cannot be read (their records already say so): no work,
    #: but reported as unreadable by every run and plan until they can be read
    still_unreadable: tuple[str, ...] = ()

    @property
    def changed(self) -> tuple[str, ...]:
        return self.new + self.modified

    @property
    def has_work(self) -> bool:
        return bool(self.new or self.modified or self.deleted or self.unreadable)

    def with_reason(self, reason: str) -> FileChanges:
        """The same changes, with ``reason`` as the reason of every new and modified file."""
        return replace(self, reasons={**self.reasons, **dict.fromkeys(self.changed, reason)})

    def statuses(self) -> dict[str, FileStatus]:
        """Every file's status, by path."""
        out: dict[str, FileStatus] = {}
        for status in ("new", "modified", "unchanged", "deleted", "unreadable"):
            out.update(dict.fromkeys(getattr(self, status), status))
        return out

    def counts(self) -> dict[str, int]:
        return {
            "files_new": len(self.new),
            "files_modified": len(self.modified),
            "files_unchanged": len(self.unchanged),
            "files_deleted": len(self.deleted),
            "files_unreadable": len(self.unreadable) + len(self.still_unreadable),
        }


def classify_files(
    current: Mapping[str, str],
    indexed: Mapping[str, IndexedDocument],
    signature: str,
    *,
    is_gone: Callable[[str], bool],
    chunk_points: Mapping[str, int] | None = None,
    orphan_files: Iterable[str] = (),
    force: bool = False,
    why_unreadable: Callable[[str], str] | None = None,
) -> FileChanges:
    """Compare ``{source_file: sha256}`` of the files read on disk with the index.

    A file is unchanged only if its bytes, the chunker and the embedding model all match what
    it was indexed with and (when ``chunk_points`` is given) the index holds as many chunk
    points for it as its record promises. A file the index knows but that was not read is
    deleted only if ``is_gone`` says the path no longer exists; otherwise it is unreadable and
    keeps its chunks. ``orphan_files`` have chunk points but no record (a run that died
    mid-write). ``force`` rebuilds every file whatever the records say. ``why_unreadable``
    says why a file that exists gave no bytes (a directory, a FIFO, a permission).
    """
    new: list[str] = []
    modified: list[str] = []
    unchanged: list[str] = []
    reasons: dict[str, str] = {}
    for name in sorted(current):
        record = indexed.get(name)
        reason = _reason(current[name], record, signature, chunk_points, name, force)
        if record is None:
            new.append(name)
        elif reason:
            modified.append(name)
        else:
            unchanged.append(name)
        if reason:
            reasons[name] = reason
    deleted: list[str] = []
    unreadable: list[str] = []
    still_unreadable: list[str] = []
    for name in sorted((set(indexed) | set(orphan_files)) - set(current)):
        if is_gone(name):
            deleted.append(name)
            reasons[name] = "file removed"
        elif name in indexed and indexed[name].status != "error":
            unreadable.append(name)
            why = why_unreadable(name) if why_unreadable else "file exists but could not be read"
            reasons[name] = f"{why}; its last good chunks stay"
        elif name in indexed:
            unchanged.append(name)  # still unreadable, and its record already says so
            still_unreadable.append(name)
    return FileChanges(
        tuple(new),
        tuple(modified),
        tuple(sorted(unchanged)),
        tuple(deleted),
        tuple(unreadable),
        reasons,
        tuple(still_unreadable),
    )


def _reason(
    digest: str,
    record: IndexedDocument | None,
    signature: str,
    chunk_points: Mapping[str, int] | None,
    name: str,
    force: bool,
) -> str:
    if record is None:
        return "new file"
    if force:
        return FORCED_REBUILD
    if record.source_file_hash != digest:
        return "content changed"
    if record.status == "error" and record.error_stage == UNREADABLE_STAGE:
        # readable again with the bytes of the version it serves: the run clears the error
        # (and re-embeds nothing: every chunk's vector is reused)
        return "readable again: its recorded read error is cleared"
    if record.signature != signature:
        return "chunker or embedding model changed"
    if chunk_points is not None:
        held = chunk_points.get(name, 0)
        if held != record.total_chunks:
            return f"index holds {held} chunk points, its record promises {record.total_chunks}"
    return ""

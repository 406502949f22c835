"""Change detection against the index: what the next run must do with each file, and why.

:func:`classify_files` compares a book's files (each with its SHA-256, read with git's rules:
:meth:`rag_pipeline.sources.base.BookSource.scan`) with the document records stored in Qdrant
payloads, without a state database. (The sensor's cheaper look, a book's content fingerprint,
is :meth:`~rag_pipeline.sources.base.BookSource.fingerprint`.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

__all__ = [
    "FORCED_REBUILD",
    "UNREADABLE_STAGE",
    "UNREAD_STAGES",
    "FileChanges",
    "FileStatus",
    "IndexedDocument",
    "classify_files",
    "records_of_other_rules",
]

#: error stage of a record whose file could not be read (crawl-time: not even hashed)
UNREADABLE_STAGE: Literal["crawl"] = "crawl"
#: error stages at which no bytes of the file were parsed (not hashed, or not read by the run
#: after its look hashed them): such a record keeps the hash of the version it serves, so the
#: file is read again once it can be, whatever its bytes are then
UNREAD_STAGES = frozenset({UNREADABLE_STAGE, "read"})

#: the reason of every indexed file of a book rebuilt on request (``--force``)
FORCED_REBUILD = "forced rebuild"

FileStatus = Literal["new", "modified", "unchanged", "deleted", "unreadable"]


@dataclass(frozen=True, slots=True)
class IndexedDocument:
    """What the index says about one file (its document record's payload)."""

    source_file: str
    source_file_hash: str
    status: str = "ok"
    signature: str = ""  # chunker + embedding model the file was indexed with
    total_chunks: int = 0
    error: str | None = None
    #: the stage the recorded error came from; one of ``UNREAD_STAGES`` means the file gave
    #: no bytes, and the record keeps the hash of the last good version it serves
    error_stage: str | None = None
    #: the parse rules an error record was written under (None: an ok record, or one written
    #: before records named them): an error of other rules is read again
    parse_version: str | None = None
    #: the read settings the file was read under (``ParseOptions.key``; "": the defaults)
    read_options: str = ""


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
    parse_version: str | None = None,
    read_options: str | None = None,
) -> FileChanges:
    """Compare ``{source_file: sha256}`` of the files read on disk with the index.

    A file is unchanged only if its bytes, the chunker and the embedding model all match what
    it was indexed with and (when ``chunk_points`` is given) the index holds as many chunk
    points for it as its record promises. A file the index knows but that was not read is
    deleted only if ``is_gone`` says the path no longer exists; otherwise it is unreadable and
    keeps its chunks. ``orphan_files`` have chunk points but no record (a run that died
    mid-write). ``force`` rebuilds every file whatever the records say. ``why_unreadable``
    says why a file that exists gave no bytes (a directory, a FIFO, a permission).
    ``parse_version`` (the parse rules of this run): a file whose record is an error written
    under other rules is read again (rules that refused it may now accept it).
    ``read_options`` (``ParseOptions.key`` of this run): a file indexed under other read
    settings is read again (its chunks' metadata, or its refusal, would not be a clean
    build's; the vectors of unchanged texts are reused)."""
    new: list[str] = []
    modified: list[str] = []
    unchanged: list[str] = []
    reasons: dict[str, str] = {}
    for name in sorted(current):
        record = indexed.get(name)
        reason = _reason(current[name], record, signature, chunk_points, name, force)
        if not reason and record is not None:
            reason = _rules_changed(record, parse_version, read_options)
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
    if record.status == "error" and record.error_stage in UNREAD_STAGES:
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


def records_of_other_rules(
    indexed: Mapping[str, IndexedDocument],
    parse_version: str | None,
    read_options: str | None = None,
) -> list[str]:
    """The files :func:`classify_files` reads again for their records alone: errors written
    under parse rules other than ``parse_version`` (or none), files parsed under other
    ``read_options``. What the books sensor asks of a book's summary once after an
    upgrade or a settings change, without looking at its files."""
    return sorted(
        name
        for name, record in indexed.items()
        if _rules_changed(record, parse_version, read_options)
    )


def _rules_changed(
    record: IndexedDocument, parse_version: str | None, read_options: str | None
) -> str:
    """Why a file is read again by rules its record was not written under: an error by other
    parse rules (they may now accept it), any other file by other read settings."""
    if record.status == "error":
        if parse_version is None or record.parse_version == parse_version:
            return ""
        written = f"version {record.parse_version}" if record.parse_version else "no version"
        return (
            f"parse rules changed ({written}, now {parse_version}): "
            "its recorded error is read again"
        )
    if read_options is None or record.read_options == read_options:
        return ""
    return (
        f"read settings changed ({_settings(record.read_options)} -> "
        f"{_settings(read_options)}): read again"
    )


def _settings(key: str) -> str:
    return key or "the defaults"

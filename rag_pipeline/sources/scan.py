"""A look at every book of a source: per book a stat digest and a content digest.

What the books sensor and live mode compare with what they saw before to find the books that
changed: the stat digest covers every file's full stat (no reads; git's rules,
:mod:`~rag_pipeline.sources.filekeys`), and a book whose stat digest moved gets its content
digest again, hashing only the files whose stat changed (a per-process cache of each file's
stat and SHA-256). A ``touch`` moves the stat digest, never the content digest: only content
starts a run. With a :class:`~rag_pipeline.sources.watch.BookWatcher`, only the books its
notifications name (and each book in turn, at least every minute) are stat'ed.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping

from rag_pipeline.models import VersionKey
from rag_pipeline.sources.base import BookSource, BookUnavailableError
from rag_pipeline.sources.filekeys import now_ns, settled
from rag_pipeline.sources.watch import BookWatcher

__all__ = ["PURGING", "BookScanState", "clear_scan_cache", "scan_books", "written_since"]

#: a look's entry of a removed book whose purge is requested but not done yet (the sensor's
#: cursor): it matches no scan, and a later look does not take it as the book's state
PURGING = ["purging", ""]

# source_file -> (stat, sha256) per (source, book): lives as long as the code server process,
# so steady-state ticks hash nothing; after a restart the first tick re-hashes.
_stat_cache: dict[tuple[BookSource, str], dict[str, tuple[VersionKey, str]]] = {}
_cache_lock = threading.Lock()


class BookScanState:
    """What one tick found for one book."""

    __slots__ = ("book_id", "content_digest", "files", "hashed", "stat_digest")

    def __init__(
        self, book_id: str, stat_digest: str, content_digest: str, files: int, hashed: int
    ) -> None:
        self.book_id = book_id
        self.stat_digest = stat_digest
        self.content_digest = content_digest
        self.files = files
        self.hashed = hashed


def _stat_digest(source: BookSource, book_id: str) -> tuple[str, int]:
    """A digest of every file's full stat (:mod:`~rag_pipeline.sources.filekeys`); "" for a
    book with a racy file (modified in the clock tick of this scan): it matches no cursor, so
    its contents are fingerprinted at every tick until its files settle."""
    scanned_at = now_ns()
    scan = source.versions(book_id)
    if not all(st.key is not None and settled(st.key, scanned_at) for st in scan.files):
        return "", len(scan.files)
    # the folders too: one moved away and back (during a run's read) moves no file's stat
    folders = source.folder_keys(scan)
    if not all(key is not None and settled(key, scanned_at) for _, key in folders):
        return "", len(scan.files)
    lines = [f"{st.source_file}\0{_key_text(st.key)}\n" for st in scan.files]
    lines += [f"/{folder}\0{_key_text(key)}\n" for folder, key in folders]
    # an entry turning unreadable is a change too
    lines += [f"!{error.source_file}\0{error.reason}\n" for error in scan.errors]
    digest = hashlib.sha256("".join(lines).encode("utf-8", "surrogateescape"))
    return digest.hexdigest()[:32], len(scan.files)


def _key_text(key: VersionKey | None) -> str:
    return key if isinstance(key, str) else str(tuple(key or ()))


def written_since(source: BookSource, book_id: str, stat_digest: str) -> bool:
    """Whether a file of the book may have been written since a look that found
    ``stat_digest``: its stat digest moved (a write moves a file's ctime, git's rule), or a
    look was racy (""), which proves nothing. What a run read is the version that look saw
    only when this is False after the run: then nothing was written in between."""
    if not stat_digest:
        return True
    try:
        now, _ = _stat_digest(source, book_id)
    except Exception:  # the book cannot be looked at now: nothing is proved
        return True
    return now != stat_digest


def clear_scan_cache() -> None:
    """Forget every file's cached hash (the next look hashes what it fingerprints again)."""
    with _cache_lock:
        _stat_cache.clear()


def scan_books(
    source: BookSource, previous: Mapping[str, list[str]], watcher: BookWatcher | None = None
) -> tuple[dict[str, BookScanState], list[str]]:
    """Scan every book (with ``watcher``: those its notifications name, those new to the
    cursor, and those due for a look; the others keep their cursor entry): (state per book on
    disk, refused folder names)."""
    scan = source.list_books()
    to_scan = watcher.to_scan(scan.book_ids) if watcher is not None else None
    states: dict[str, BookScanState] = {}
    for book_id in scan.book_ids:
        before = previous.get(book_id)
        key = (source, book_id)
        if watcher is not None and to_scan is not None:
            # kept as the cursor has it (a link's target is not watched)
            if (
                book_id not in to_scan
                and before is not None
                and before != PURGING
                and source.notifies(book_id)
            ):
                with _cache_lock:
                    files = len(_stat_cache.get(key, ()))
                states[book_id] = BookScanState(book_id, before[0], before[1], files, 0)
                continue
            watcher.scanned(book_id)
        try:
            stat_digest, files = _stat_digest(source, book_id)
            if before and stat_digest and before[0] == stat_digest:
                states[book_id] = BookScanState(book_id, stat_digest, before[1], files, 0)
                continue
            with _cache_lock:
                cache = _stat_cache.get(key)
            fingerprint = source.fingerprint(book_id, cache)
        except BookUnavailableError as exc:
            # its own content digest: the book's run is requested (and fails, naming why)
            # once per distinct reason, then retried as a failed book is
            reason = hashlib.sha256(str(exc).encode("utf-8", "surrogateescape")).hexdigest()
            states[book_id] = BookScanState(book_id, "", f"unavailable:{reason[:20]}", 0, 0)
            continue
        with _cache_lock:
            _stat_cache[key] = dict(fingerprint.stats)
        states[book_id] = BookScanState(
            book_id, stat_digest, fingerprint.digest[:32], fingerprint.files, fingerprint.hashed
        )
    if watcher is not None and to_scan is None:
        watcher.scanned_all(scan.book_ids)
    return states, [str(e) for e in scan.rejected]

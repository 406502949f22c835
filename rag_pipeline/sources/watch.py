"""Which books' folders changed, as the file system says: what a sensor tick has to stat again.

A tick that stats every file of every book costs about 0.6 CPU s at 100,000 files (Python's own
floor for listing and stat'ing them is 0.5 s), every few seconds. :class:`BookWatcher` follows
the data folder's notifications (inotify, through watchdog) and says which books something
happened in since it last said; the books sensor stats only those, the books new to its
cursor, and a share of the others in turn so that every book is stat'ed again at least every
:data:`RESCAN_EVERY_S` seconds, whatever the notifications missed (a network file system, a
queue overflow, a link to a folder outside the data folder). A watcher that cannot start, or
whose observer stopped, says "all": the tick stats every book, as without one. A data folder
moved away and replaced (a deploy's swap, a restore) leaves inotify watching the old folder:
a watcher whose folder is no longer the one it started on stops watching, and
:func:`watcher_for` starts a new one at once.

Notifications arrive shortly after the change (watchdog holds them up to half a second to pair
renames): a change just before a tick is seen by the next one.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Collection
from pathlib import Path

__all__ = ["RESCAN_EVERY_S", "BookWatcher", "watcher_for"]

log = logging.getLogger(__name__)

#: every book is stat'ed again at least this often, whatever the notifications said
RESCAN_EVERY_S = 60.0


class BookWatcher:
    """The books of ``data_dir`` something happened in, from the file system's notifications."""

    def __init__(self, data_dir: Path) -> None:
        self.root = os.path.abspath(data_dir)
        self.started = time.monotonic()
        #: the folder this watcher's inotify watches are on (None: it was missing)
        self.folder = _identity(self.root)
        self._lock = threading.Lock()
        self._changed: set[str] = set()
        #: set by every notification; live mode waits on it (:meth:`wait_for_news`)
        self._news = threading.Event()
        #: time.monotonic() of the latest notification (0.0: none yet)
        self.last_news = 0.0
        self._everything = True  # nothing is known before the first full look
        self._scanned: dict[str, float] = {}  # book -> when the sensor last stat'ed it
        self._observer = None
        try:
            from watchdog import events as ev
            from watchdog.events import FileSystemEvent, FileSystemEventHandler
            from watchdog.observers import Observer

            # changes only: a file opened or read (by the sensor's own hashing, by a run) is
            # no news; a change of permissions comes as "modified"
            changes: list[type[FileSystemEvent]] = [
                ev.FileCreatedEvent,
                ev.FileDeletedEvent,
                ev.FileModifiedEvent,
                ev.FileMovedEvent,
                ev.FileClosedEvent,
                ev.DirCreatedEvent,
                ev.DirDeletedEvent,
                ev.DirModifiedEvent,
                ev.DirMovedEvent,
            ]

            watcher = self

            class Handler(FileSystemEventHandler):
                def on_any_event(self, event: FileSystemEvent) -> None:
                    watcher._saw(event.src_path)
                    dest = getattr(event, "dest_path", "")
                    if dest:
                        watcher._saw(dest)

            observer = Observer()
            observer.daemon = True
            observer.schedule(Handler(), self.root, recursive=True, event_filter=changes)
            observer.start()
            self._observer = observer
        except Exception as exc:  # no inotify, no watches left, a folder gone: stat them all
            log.info("not watching %s (%s): every tick stats every book", self.root, exc)

    @property
    def watching(self) -> bool:
        return self._observer is not None and self._observer.is_alive() and not self.replaced

    @property
    def replaced(self) -> bool:
        """The data folder's path now names another folder than the one watched (moved away
        and replaced, or created since a start that found none): its notifications are not
        this watcher's. A stat, as often as live mode waits for news (4 a second)."""
        return _identity(self.root) != self.folder

    def _saw(self, path: str | bytes) -> None:
        text = os.fsdecode(path)
        if not text.startswith(self.root):
            return
        book = text[len(self.root) :].lstrip(os.sep).split(os.sep, 1)[0]
        if book:
            with self._lock:
                self._changed.add(book)
                self.last_news = time.monotonic()
            self._news.set()

    def look_again(self, book: str) -> None:
        """The next :meth:`to_scan` includes ``book``, as if a notification named it."""
        with self._lock:
            self._changed.add(book)

    def wait_for_news(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a notification since the previous call; True if
        one came (at once when one is already waiting). False at once when not watching."""
        if not self.watching:
            return False
        got = self._news.wait(timeout)
        self._news.clear()
        return got

    def to_scan(self, books: Collection[str], now: float | None = None) -> set[str] | None:
        """The books a tick must stat (their notifications since the last call, and those not
        stat'ed for :data:`RESCAN_EVERY_S`); None: every book (not watching, or the first
        look). Call :meth:`scanned` for each book stat'ed."""
        now = time.monotonic() if now is None else now
        with self._lock:
            changed, self._changed = self._changed, set()
            everything, self._everything = self._everything, False
        if everything or not self.watching:
            return None
        stale = {b for b in books if now - self._scanned.get(b, float("-inf")) >= RESCAN_EVERY_S}
        return changed | stale

    def scanned(self, book: str, now: float | None = None) -> None:
        self._scanned[book] = time.monotonic() if now is None else now

    def scanned_all(self, books: Collection[str], now: float | None = None) -> None:
        """Every book was stat'ed (a tick that looked at all): their next looks are spread
        over :data:`RESCAN_EVERY_S`, a share each tick, not all again at once."""
        now = time.monotonic() if now is None else now
        ordered = sorted(books)
        for i, book in enumerate(ordered):
            self._scanned[book] = now - RESCAN_EVERY_S * i / len(ordered)

    def stop(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
            self._observer = None


def _identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of the folder at ``path``; None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


_watchers: dict[str, BookWatcher] = {}
_watchers_lock = threading.Lock()


def watcher_for(data_dir: Path) -> BookWatcher:
    """The process's watcher of ``data_dir`` (started on first use; one per folder)."""
    key = os.path.abspath(data_dir)
    with _watchers_lock:
        watcher = _watchers.get(key)
        # a stopped observer, or one that could not start a while ago, or one watching a
        # folder that is no longer the data folder (at once: its edits are news): a new one
        if (
            watcher is None
            or (watcher.replaced and _identity(key) is not None)
            or (not watcher.watching and time.monotonic() - watcher.started >= RESCAN_EVERY_S)
        ):
            if watcher is not None:
                watcher.stop()
            watcher = _watchers[key] = BookWatcher(Path(key))
        return watcher

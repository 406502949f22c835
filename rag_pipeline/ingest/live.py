"""Live mode: one long-lived process applies each change of the books as soon as its writer is
done, and hands over to the books sensor when it stops or dies.

:class:`LiveLoop` waits for the book source's notifications (a folder's inotify events), lets
a burst of writes settle (``debounce_s`` of quiet, at most ``max_delay_s`` after the first),
looks at the books the notifications name with the sensor's own look
(:func:`~rag_pipeline.sources.scan.scan_books`: a stat digest, then a content digest of the
files whose stat moved) and hands the books whose content changed, appeared or went to
``apply`` (the Dagster layer: plan, then runs of the ingest or purge job in this process).
Every book is looked at again at least every minute, whatever the notifications missed, and
the first look after a start is of every book: a change made while no live process ran is
caught up.

Who applies changes is said by :class:`LiveMark`, two files in the Dagster home:

* ``.rag-live.lock``, held (``flock``) by the live process for its whole life: while it is
  held, the books sensor skips its ticks (one writer starts runs for a book's changes; the
  CLI may still run any book: the store's book locks let one writer in at a time, and each
  run assesses against the index, so whoever writes last converges on the files);
* ``.rag-live.json``, what the live process has applied: per book the ``[stat digest,
  content digest]`` of its last applied look (the sensor's cursor format), and
  :data:`APPLYING` for a book whose run is under way or failed. The lock is released by the
  kernel when the process dies, ``kill -9`` included; a sensor that then finds the lock free
  takes this map as its cursor (once per live process: ``generation``), so it runs exactly the
  books changed since the live process applied them, and those it was applying.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag_pipeline.sources.base import BookSource, SourceUnavailableError
from rag_pipeline.sources.scan import scan_books, written_since
from rag_pipeline.sources.watch import RESCAN_EVERY_S, BookWatcher
from rag_pipeline.store.errors import StoreBusyError
from rag_pipeline.store.lock import FolderLock, describe_holder, holding_for

__all__ = [
    "APPLYING",
    "LIVE_LOCK",
    "LIVE_STATE",
    "LiveBusyError",
    "LiveLeft",
    "LiveLoop",
    "LiveMark",
    "LiveTiming",
]

log = logging.getLogger(__name__)

LIVE_LOCK = ".rag-live.lock"
LIVE_STATE = ".rag-live.json"
#: how soon an idle live process notices that it is asked to stop
_STOP_CHECK_S = 0.25
#: the state of a book whose run is under way or failed: it matches no look, so a sensor that
#: takes over runs the book
APPLYING = ["applying", ""]


class LiveBusyError(StoreBusyError):
    """Another live process already applies this Dagster home's changes."""


@dataclass(frozen=True)
class LiveTiming:
    """How soon a change is applied, and how often an idle live process looks."""

    #: quiet after the latest notification before a look: a writer's burst is one change
    debounce_s: float = 0.1
    #: a look starts at most this long after the first notification, while writes go on
    max_delay_s: float = 1.0
    #: without notifications, how often the books due for a look (each at least every
    #: minute) are stat'ed, and failed books retried when due
    idle_look_s: float = 5.0
    #: a book whose run failed is tried again after this long, doubling per failure
    retry_after_s: float = 5.0
    retry_max_s: float = 300.0


@dataclass(frozen=True)
class LiveLeft:
    """What a live process that stopped left: its generation and the books it applied."""

    generation: str
    books: dict[str, list[str]]


class LiveMark:
    """The live process's lock and applied-state map in one Dagster home (see the module
    docstring), for the source it watches: a live process of another data folder on the same
    home is not this source's."""

    def __init__(self, home: Path, source: BookSource) -> None:
        self.home = Path(home)
        self.what = f"live mode of the {source.description}"
        self.lock = FolderLock(self.home / LIVE_LOCK, "live mode", busy=LiveBusyError)
        self.state_path = self.home / LIVE_STATE
        self.generation = uuid.uuid4().hex

    @contextlib.contextmanager
    def hold(self, wait_s: float = 5.0) -> Iterator[None]:
        """Hold the lock while the live process runs (a sensor tick that holds it for a moment
        is waited for; another live process is :class:`LiveBusyError`)."""
        with holding_for(self.what):
            try:
                self.lock.acquire(wait_s, notify=log.info)
            except LiveBusyError:
                raise LiveBusyError(
                    f"another live process applies the changes of this Dagster home "
                    f"({self.home}): {self.describe(self.lock.holder() or {})}; stop it first "
                    "(one live process per Dagster home)"
                ) from None
        try:
            yield
        finally:
            self.lock.release()

    def holder(self) -> dict[str, Any] | None:
        """The note of the live process that holds the lock for this source; None when no
        live process runs (or one runs for another source)."""
        probe = self.lock.probe()
        try:
            if probe.try_acquire():
                return None
        finally:
            probe.release()
        note = probe.holder()
        # a holder that wrote no note yet (it is starting) is taken to be ours
        if note is None or note.get("for") in (None, self.what):
            return note or {}
        return None

    @staticmethod
    def describe(note: Mapping[str, Any]) -> str:
        return describe_holder(dict(note)) if note else "a live process that is starting"

    def save(self, books: Mapping[str, list[str]]) -> None:
        """Replace the applied-state map (atomically: a reader never sees half of it)."""
        data = {"generation": self.generation, "source": self.what, "books": dict(books)}
        partial = self.state_path.with_name(f".{self.state_path.name}.{os.getpid()}.tmp")
        try:
            partial.write_text(json.dumps(data, sort_keys=True, separators=(",", ":")))
            os.replace(partial, self.state_path)
        except OSError as exc:  # a full disk: the sensor then runs every book it doubts
            log.warning("cannot save live mode's state in %s: %s", self.state_path, exc)
            with contextlib.suppress(OSError):
                partial.unlink()

    def left(self) -> LiveLeft | None:
        """The map a stopped live process of this source left (None: none, or unreadable)."""
        try:
            data = json.loads(self.state_path.read_text())
            books = {str(b): [str(v[0]), str(v[1])] for b, v in data["books"].items()}
            if data.get("source") != self.what:
                return None
            return LiveLeft(str(data["generation"]), books)
        except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
            return None


@dataclass
class _Failed:
    content_digest: str
    failures: int
    next_try: float


@dataclass
class LiveLoop:
    """Applies the source's changes as they come (see the module docstring).

    ``apply(books)`` brings each book's index in step with the source and says, per book,
    whether it did; a book it did not is tried again after a back-off (at once when its
    content changes again). ``save`` receives the applied-state map after each look."""

    source: BookSource
    apply: Callable[[list[str]], Mapping[str, bool]]
    timing: LiveTiming = field(default_factory=LiveTiming)
    save: Callable[[Mapping[str, list[str]]], None] | None = None
    notify: Callable[[str], None] = log.warning
    #: per book, the look its index was last brought in step with
    known: dict[str, list[str]] = field(default_factory=dict)
    looks: int = 0
    _failed: dict[str, _Failed] = field(default_factory=dict)
    _unavailable: str = ""
    _rejected: set[str] = field(default_factory=set)
    #: books applied while something wrote them: what their run read may not be what their
    #: look saw, so the next look applies them again whatever its digests say
    _doubtful: set[str] = field(default_factory=set)

    def look(self, now: float | None = None) -> list[str]:
        """Look at the books due (all of them the first time), apply those that changed;
        returns them."""
        now = time.monotonic() if now is None else now
        self.looks += 1
        watcher = self.source.watcher()
        if watcher is not None:  # a book in doubt is stat'ed afresh: a kept digest proves nothing
            for book_id in self._doubtful:
                watcher.look_again(book_id)
        try:
            states, rejected = scan_books(self.source, self.known, watcher)
        except SourceUnavailableError as exc:
            if str(exc) != self._unavailable:  # said once, not at every look
                self.notify(f"{exc}; nothing is applied until it is back")
            self._unavailable = str(exc)
            return []
        self._unavailable = ""
        for refused in sorted(set(rejected) - self._rejected):  # each said once
            self.notify(f"refused book folder: {refused}")
        self._rejected = set(rejected)
        books = set()
        for book_id, state in states.items():
            before = self.known.get(book_id)
            if before is not None and before[1] == state.content_digest:
                continue
            failed = self._failed.get(book_id)
            if failed and failed.content_digest == state.content_digest and now < failed.next_try:
                continue  # failed with this content: tried again when its back-off is over
            books.add(book_id)
        books.update(b for b in self.known if b not in states)  # gone: purged
        books.update(b for b, f in self._failed.items() if now >= f.next_try)
        books.update(b for b in self._doubtful if b not in self._failed)
        if not books:
            return []
        applying = sorted(books)
        self._save(applying)
        done = self.apply(applying)
        for book_id in applying:
            seen = states.get(book_id)
            if done.get(book_id, False):
                self._failed.pop(book_id, None)
                self._doubtful.discard(book_id)
                if seen is None:
                    self.known.pop(book_id, None)
                    continue
                self.known[book_id] = [seen.stat_digest, seen.content_digest]
                # What is recorded as applied must be what the run read. The run read the
                # files after this look; if nothing was written since, that is the look's
                # version. If something was (an edit saved as the run started and reverted
                # after it read the files leaves the look's digests as they were), the run
                # may have indexed a version in between: the book is applied again.
                if written_since(self.source, book_id, seen.stat_digest):
                    self._doubtful.add(book_id)
                continue
            self._doubtful.discard(book_id)  # failed: retried as a failure is
            before_failed = self._failed.get(book_id)
            failures = (before_failed.failures if before_failed else 0) + 1
            wait = min(self.timing.retry_after_s * 2 ** (failures - 1), self.timing.retry_max_s)
            digest = seen.content_digest if seen is not None else ""
            self._failed[book_id] = _Failed(digest, failures, now + wait)
        self._save(())
        return applying

    def _save(self, applying: Sequence[str]) -> None:
        if self.save is None:
            return
        doubtful = {*applying, *self._failed, *self._doubtful}
        books = {b: list(v) for b, v in self.known.items()}
        books.update({b: list(APPLYING) for b in doubtful})
        self.save(books)

    def run(self, stop: threading.Event, on_ready: Callable[[], None] | None = None) -> None:
        """Look at every book, then apply changes as they come until ``stop`` is set."""
        self.look()
        if on_ready is not None:
            on_ready()
        while not stop.is_set():
            watcher = self.source.watcher()
            if watcher is not None and watcher.watching:
                if self._news(watcher, stop):
                    self._settle(watcher, stop)
            else:  # no notifications: every look stats every book
                stop.wait(self._idle_wait())
            if not stop.is_set():
                self.look()

    def _news(self, watcher: BookWatcher, stop: threading.Event) -> bool:
        """Wait for a notification until the next idle look is due; False at that time or
        when ``stop`` is set (looked at every quarter second)."""
        until = time.monotonic() + self._idle_wait()
        while not stop.is_set():
            left = until - time.monotonic()
            if left <= 0:
                return False
            if watcher.wait_for_news(min(left, _STOP_CHECK_S)):
                return True
            if not watcher.watching:  # stopped, or its folder replaced: look (a new one) now
                return True
        return False

    def _idle_wait(self) -> float:
        if self._doubtful:  # applied again once its writer has paused
            return self.timing.debounce_s
        wait = min(self.timing.idle_look_s, RESCAN_EVERY_S)
        if self._failed:
            soonest = min(f.next_try for f in self._failed.values()) - time.monotonic()
            wait = min(wait, max(soonest, 0.0))
        return wait

    def _settle(self, watcher: BookWatcher, stop: threading.Event) -> None:
        """Wait until the notifications pause for ``debounce_s`` (at most ``max_delay_s``
        from now: a writer that never pauses is applied as it goes)."""
        first = time.monotonic()
        while not stop.is_set():
            now = time.monotonic()
            quiet = now - watcher.last_news
            if quiet >= self.timing.debounce_s or now - first >= self.timing.max_delay_s:
                return
            stop.wait(min(self.timing.debounce_s - quiet, first + self.timing.max_delay_s - now))

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
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from rag_pipeline.ingest.plan import decide_purges
from rag_pipeline.sources.base import BookSource, SourceUnavailableError
from rag_pipeline.sources.scan import BookScanState, scan_books, written_since
from rag_pipeline.sources.watch import RESCAN_EVERY_S, BookWatcher
from rag_pipeline.store.errors import StoreBusyError, StorePathError
from rag_pipeline.store.lock import FolderLock, describe_holder, holding_for

__all__ = [
    "APPLYING",
    "LIVE_LOCK",
    "LIVE_STATE",
    "LiveBusyError",
    "LiveLeft",
    "LiveLoop",
    "LiveMark",
    "LiveTicket",
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
#: what a loop knows of a book its ``indexed`` names before its first look: no digest,
#: so the look finds it changed (or gone)
_INDEXED = ["", ""]


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
class LiveTicket:
    """A request to apply books now (``rag-pipeline ingest`` handing its change over): done
    once each book it names (None: every book) has been through a call of ``apply`` that
    applies what the files held when it came: a call in flight with that content (nothing
    written during it), else one that starts after it."""

    books: list[str] | None
    done: threading.Event = field(default_factory=threading.Event)
    #: what each call of ``apply`` that took its books returned
    outcomes: list[Mapping[str, bool]] = field(default_factory=list)
    #: the books it names, resolved by the look that took it (every book for None)
    resolved: list[str] = field(default_factory=list)
    #: why it was not applied (the process stopped, the source was unavailable)
    refused: str = ""
    #: the folders the look that took it refused as books (what an ingest of no book reports)
    rejected: list[str] = field(default_factory=list)
    _waiting: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def waiting(self) -> list[str]:
        """The books still to apply."""
        with self._lock:
            return sorted(self._waiting)

    def _wait_for(self, book_id: str) -> None:
        with self._lock:
            self._waiting.add(book_id)

    def _applied(self, book_id: str, outcome: Mapping[str, bool]) -> None:
        with self._lock:
            if not any(o is outcome for o in self.outcomes):
                self.outcomes.append(outcome)
            self._waiting.discard(book_id)
            if not self._waiting:
                self.done.set()

    def _refuse(self, why: str) -> None:
        with self._lock:
            if not self.done.is_set():
                self.refused = why
                self.done.set()


@dataclass
class _Failed:
    content_digest: str
    failures: int
    next_try: float


class _Job(NamedTuple):
    """The books of one call of ``apply`` (with the look each is applied with) and the
    requests waiting for them."""

    books: dict[str, BookScanState | None]
    tickets: dict[str, list[LiveTicket]]


@dataclass
class LiveLoop:
    """Applies the source's changes as they come (see the module docstring).

    ``apply(books)`` brings each book's index in step with the source and says, per book,
    whether it did; a book it did not is tried again after a back-off (at once when its
    content changes again). ``save`` receives the applied-state map whenever it changes.

    Within :meth:`run`, up to ``workers`` calls of ``apply`` run at once, each in a thread of
    its own, on different books: a long first ingest of a big book does not hold another
    book's edit behind it. A book is in at most one call at a time; one changed again while
    its call is in flight is applied again after it (its latest content: the changes of one
    book are applied in order, never side by side). Outside :meth:`run` (a bare
    :meth:`look`), ``apply`` runs in the caller's thread before the look returns."""

    source: BookSource
    apply: Callable[[list[str]], Mapping[str, bool]]
    timing: LiveTiming = field(default_factory=LiveTiming)
    save: Callable[[Mapping[str, list[str]]], None] | None = None
    notify: Callable[[str], None] = log.warning
    #: how many calls of ``apply`` run at once within :meth:`run`
    workers: int = 2
    #: the books the index holds now (None: only those this loop applied count): the first
    #: look purges an indexed book whose folder went while no live process ran, and a look
    #: that finds none of the books it applied asks the index before it halts (the books
    #: may have been purged meanwhile by an operator's ``ingest --book``)
    indexed: Callable[[], Collection[str]] | None = None
    #: per book, the look its index was last brought in step with
    known: dict[str, list[str]] = field(default_factory=dict)
    looks: int = 0
    _failed: dict[str, _Failed] = field(default_factory=dict)
    _unavailable: str = ""
    #: the warning of a look that found none of the applied books (said once)
    _said_halt: str = ""
    #: the index's books were read into ``known`` (at the first look that could read them)
    _seeded: bool = False
    _said_index: str = ""
    #: while a look halts: the folder's books it found, when, and the index's books it read
    #: then (what the next halting look reuses: see :meth:`_halted_index`)
    _halt_index: tuple[frozenset[str], float, frozenset[str]] | None = None
    _rejected: set[str] = field(default_factory=set)
    #: books applied while something wrote them: what their run read may not be what their
    #: look saw, so the next look applies them again whatever its digests say
    _doubtful: set[str] = field(default_factory=set)
    #: books to apply, with what the latest look found (None: gone, to purge)
    _pending: dict[str, BookScanState | None] = field(default_factory=dict)
    #: books in a call of ``apply`` now, with the look it applies
    _in_flight: dict[str, BookScanState | None] = field(default_factory=dict)
    #: calls of ``apply`` under way
    _busy: int = 0
    #: the thread of :meth:`run` that looks (its CPU time is not work: see work_cpu_s)
    _looker: int | None = None
    #: the worker threads of :meth:`run` (none: a look applies in its caller's thread)
    _pool: list[threading.Thread] = field(default_factory=list)
    #: guards everything above that the workers share with the looking thread
    _lock: threading.Condition = field(default_factory=threading.Condition)
    #: set by a worker when its call ends: the looking thread looks again (a book in doubt,
    #: a book changed during its run, the first catch-up done)
    _ended: threading.Event = field(default_factory=threading.Event)
    _closing: bool = False
    #: requests to apply books now, for the next look
    _requests: list[LiveTicket] = field(default_factory=list)
    #: per queued book, the requests its next call answers
    _tickets: dict[str, list[LiveTicket]] = field(default_factory=dict)
    #: per book, when its latest call of ``apply`` ended (see :meth:`_due_in`)
    _ended_at: dict[str, float] = field(default_factory=dict)
    #: per book in flight, the requests its call in flight answers (it applies the content
    #: the files held when they came)
    _riding: dict[str, list[LiveTicket]] = field(default_factory=dict)

    def request(self, books: list[str] | None) -> LiveTicket:
        """Apply ``books`` (None: every book) now, whatever the looks say: the next look
        queues them (after a call of theirs in flight). Wait on the ticket's ``done``."""
        ticket = LiveTicket(None if books is None else list(books))
        with self._lock:
            if self._closing:
                ticket._refuse("the live process is stopping")
                return ticket
            self._requests.append(ticket)
        self._ended.set()  # the looking thread looks now
        return ticket

    def look(self, now: float | None = None) -> list[str]:
        """Look at the books due (all of them the first time) and hand those that changed to
        ``apply`` (queued for the workers within :meth:`run`); returns them."""
        now = time.monotonic() if now is None else now
        self.looks += 1
        watcher = self.source.watcher()
        read: Collection[str] | None = None  # the index's books, where this look read them
        held: Collection[str] | None = None
        if not self._seeded and self.indexed is not None:
            read = self._index_books()
            if read is None:
                # nothing is applied before the index is known: the halt below compares the
                # folder with it (a wrong data folder applied first, then seeded, would make
                # the indexed books look removed and purge them)
                with self._lock:
                    asked, self._requests = self._requests, []
                for ticket in asked:
                    ticket._refuse(self._said_index or "the indexed books could not be read")
                return []
            self._seeded = True  # each one's folder is looked at: gone, it is purged
            with self._lock:
                for book_id in read:
                    self.known.setdefault(book_id, list(_INDEXED))
        with self._lock:
            doubtful = set(self._doubtful)
            cursor = self._cursor()
            asked, self._requests = self._requests, []
        # a request for every book stats every book; one for named books stats those afresh
        every = any(ticket.books is None for ticket in asked)
        named = {b for ticket in asked for b in ticket.books or ()}
        if watcher is not None:  # a book in doubt is stat'ed afresh: a kept digest proves nothing
            for book_id in doubtful | named:
                watcher.look_again(book_id)
        try:
            states, rejected = scan_books(self.source, cursor, None if every else watcher)
        except SourceUnavailableError as exc:
            if str(exc) != self._unavailable:  # said once, not at every look
                self.notify(f"{exc}; nothing is applied until it is back")
            self._unavailable = str(exc)
            for ticket in asked:
                ticket._refuse(str(exc))
            return []
        # the purge policy of ingest and the books sensor: a data folder holding none of the
        # books applied (emptied, unmounted, the wrong folder) purges nothing, starts nothing
        halt = decide_purges(self.source, set(states), set(cursor))
        if not halt.halt:
            self._halt_index = None
        elif self.indexed is not None:
            if read is not None:  # read by this look already
                self._halt_index = (frozenset(states), now, frozenset(read))
            held = self._halted_index(states, now)
        if halt.halt and held is not None:
            with self._lock:  # the books gone and purged by another writer: not ours to purge
                for book_id in set(cursor) - set(held) - set(states):
                    if book_id not in self._pending and book_id not in self._in_flight:
                        self.known.pop(book_id, None)
            halt = decide_purges(self.source, set(states), set(cursor) & set(held))
        if halt.halt:
            if halt.warnings[0] != self._said_halt:  # said once, not at every look
                self.notify(halt.warnings[0])
            self._said_halt = halt.warnings[0]
            for ticket in asked:  # the CLI runs them itself: named books still run or purge
                ticket._refuse(halt.warnings[0])
            return []
        self._said_halt = ""
        self._unavailable = ""
        for refused in sorted(set(rejected) - self._rejected):  # each said once
            self.notify(f"refused book folder: {refused}")
        self._rejected = set(rejected)
        with self._lock:
            books = self._changed(states, now)
            for ticket in asked:
                gone = [b for b, state in books.items() if state is None]  # purged
                names = ticket.books if ticket.books is not None else sorted({*states, *gone})
                ticket.resolved = list(dict.fromkeys(names))
                ticket.rejected = list(rejected)
                for book_id in ticket.resolved:
                    ticket._wait_for(book_id)
                    if book_id in self._in_flight and book_id not in {*books, *self._pending}:
                        # the call in flight applies what the files hold now: its answer
                        self._riding.setdefault(book_id, []).append(ticket)
                        continue
                    books.setdefault(book_id, states.get(book_id))
                    self._tickets.setdefault(book_id, []).append(ticket)
                if not ticket.resolved:
                    ticket.done.set()
            if books:
                self._pending.update(books)
                self._save()
                self._lock.notify_all()
        if not self._pool:
            self._apply_here(now)
        return sorted(books)

    def _halted_index(self, found: Collection[str], now: float) -> Collection[str] | None:
        """The index's books for a look that halts: read by the first such look, and again
        only when the books the folder holds changed or :data:`RESCAN_EVERY_S` passed (an
        operator's ``ingest --book`` purge of the books gone is met within a minute): a
        halted process does not open the store at every idle look."""
        books = frozenset(found)
        if self._halt_index is not None:
            seen, at, held = self._halt_index
            if seen == books and now - at < RESCAN_EVERY_S:
                return held
        read = self._index_books()
        self._halt_index = None if read is None else (books, now, frozenset(read))
        return read

    def _index_books(self) -> Collection[str] | None:
        """The books the index holds now (None: it cannot be read now, said once)."""
        assert self.indexed is not None
        try:
            return self.indexed()
        except StorePathError:
            raise  # a setting to fix (a file where the store's folder goes): watch exits 2
        except Exception as exc:  # a store busy or unreachable: the next look asks again
            said = f"the indexed books could not be read: {type(exc).__name__}: {exc}"
            if said != self._said_index:
                self.notify(said)
            self._said_index = said
            return None

    def _cursor(self) -> dict[str, list[str]]:
        """What a look compares the disk with: the applied looks, and for a book queued or in
        flight, the look it is (to be) applied with (unchanged since: nothing new)."""
        cursor = {b: list(v) for b, v in self.known.items()}
        for queued in (self._in_flight, self._pending):
            for book_id, state in queued.items():
                if state is None:
                    cursor.pop(book_id, None)
                else:
                    cursor[book_id] = [state.stat_digest, state.content_digest]
        return cursor

    def _changed(
        self, states: Mapping[str, BookScanState], now: float
    ) -> dict[str, BookScanState | None]:
        """The books a look found to apply (the caller holds the lock)."""
        books: dict[str, BookScanState | None] = {}
        for book_id, state in states.items():
            if book_id in self._pending or book_id in self._in_flight:
                target = self._pending.get(book_id, self._in_flight.get(book_id))
                if book_id in self._pending or target is None:
                    books[book_id] = state  # the latest look of a queued book is applied
                elif target.content_digest != state.content_digest:
                    books[book_id] = state  # changed during its run: applied after it
                continue
            before = self.known.get(book_id)
            if before is not None and before[1] == state.content_digest:
                continue
            failed = self._failed.get(book_id)
            if failed and failed.content_digest == state.content_digest and now < failed.next_try:
                continue  # failed with this content: tried again when its back-off is over
            books[book_id] = state
        for book_id in {*self.known, *self._in_flight, *self._pending} - set(states):
            queued = self._pending if book_id in self._pending else self._in_flight
            if book_id in queued and queued[book_id] is None:
                continue  # its purge is queued, or under way
            books[book_id] = None  # gone: purged
        busy = {*self._pending, *self._in_flight}
        for book_id, failed in self._failed.items():
            if now >= failed.next_try and book_id not in busy:
                books.setdefault(book_id, states.get(book_id))
        for book_id in self._doubtful - set(self._failed) - busy:
            books.setdefault(book_id, states.get(book_id))
        return books

    def _due_in(self, book_id: str) -> float:
        """Seconds until a queued book may start again (the caller holds the lock): a book
        changed during its run is applied again once its writer pauses (``debounce_s`` of
        quiet) or ``max_delay_s`` after that run ended, as one live look followed another:
        a writer that never pauses gets a run a ``max_delay_s``, not one per run's end."""
        ended = self._ended_at.get(book_id)
        if ended is None:
            return 0.0
        now = time.monotonic()
        watcher = self.source.watcher()
        quiet = now - watcher.last_news if watcher is not None else float("inf")
        if quiet >= self.timing.debounce_s:
            return 0.0
        return min(ended + self.timing.max_delay_s - now, self.timing.debounce_s - quiet)

    def _take(self) -> _Job:
        """The books of the next call of ``apply`` (the caller holds the lock): those queued
        and not in flight, shared among the idle workers by their files (a big book's first
        ingest goes alone; the next book does not wait behind it)."""
        ready = sorted(
            b for b in self._pending if b not in self._in_flight and self._due_in(b) <= 0
        )
        if not ready:
            return _Job({}, {})
        idle = max(len(self._pool) - self._busy, 1)
        if idle > 1 and len(ready) > 1:
            files = {
                b: max(s.files if (s := self._pending[b]) is not None else 1, 1) for b in ready
            }
            share = sum(files.values()) / idle
            taken: list[str] = []
            count = 0
            for book_id in ready:  # adjacent books: a call's runs batch them
                if taken and count + files[book_id] > share:
                    break
                taken.append(book_id)
                count += files[book_id]
            ready = taken
        job = _Job(
            {b: self._pending.pop(b) for b in ready},
            {b: self._tickets.pop(b) for b in ready if b in self._tickets},
        )
        self._in_flight.update(job.books)
        self._busy += 1
        return job

    def _apply_job(self, taken: _Job, now: float | None = None) -> None:
        """One call of ``apply`` and its bookkeeping: what each book's call read is recorded
        as applied, a failed book is backed off (from ``now``, default: when it ended)."""
        job = taken.books
        books = sorted(job)
        try:
            done: Mapping[str, bool] = self.apply(books)
        except Exception as exc:  # apply reports failures; a bug in it must not lose books
            log.exception("live mode's apply of %s failed", books)
            self.notify(f"applying {', '.join(books)} failed: {type(exc).__name__}: {exc}")
            done = {}
        now = time.monotonic() if now is None else now
        # What is recorded as applied must be what the run read. The run read the files
        # after its look; if nothing was written since, that is the look's version. If
        # something was (an edit saved as the run started and reverted after it read the
        # files leaves the look's digests as they were), the run may have indexed a version
        # in between: the book is applied again.
        written = {
            b: written_since(self.source, b, seen.stat_digest)
            for b, seen in job.items()
            if seen is not None and done.get(b, False)
        }
        answered = dict(taken.tickets)
        with self._lock:
            ended = time.monotonic()
            for book_id in books:
                self._in_flight.pop(book_id, None)
                self._ended_at[book_id] = ended
                self._record(book_id, job[book_id], done.get(book_id, False), written, now)
                riders = self._riding.pop(book_id, [])
                if written.get(book_id, False):  # in doubt: the next call answers them
                    self._tickets.setdefault(book_id, []).extend(riders)
                else:
                    answered[book_id] = [*answered.get(book_id, []), *riders]
            self._busy -= 1
            self._save()
            self._lock.notify_all()
        for book_id, tickets in answered.items():
            for ticket in tickets:
                ticket._applied(book_id, done)
        self._ended.set()

    def _record(
        self,
        book_id: str,
        seen: BookScanState | None,
        done: bool,
        written: Mapping[str, bool],
        now: float,
    ) -> None:
        """What one book's call did (the caller holds the lock)."""
        if done:
            self._failed.pop(book_id, None)
            self._doubtful.discard(book_id)
            if seen is None:
                self.known.pop(book_id, None)
                return
            self.known[book_id] = [seen.stat_digest, seen.content_digest]
            if written.get(book_id, False):
                self._doubtful.add(book_id)
            return
        self._doubtful.discard(book_id)  # failed: retried as a failure is
        before_failed = self._failed.get(book_id)
        failures = (before_failed.failures if before_failed else 0) + 1
        wait = min(self.timing.retry_after_s * 2 ** (failures - 1), self.timing.retry_max_s)
        digest = seen.content_digest if seen is not None else ""
        self._failed[book_id] = _Failed(digest, failures, now + wait)

    def _apply_here(self, now: float) -> None:
        """Without workers: apply what is queued in this thread (``now``: the look's time)."""
        while True:
            with self._lock:
                job = self._take()
            if not job.books:
                return
            self._apply_job(job, now)

    def _save(self) -> None:
        """Hand the applied-state map to ``save`` (the caller holds the lock: one writer at a
        time, each map newer than the one before)."""
        if self.save is None:
            return
        doubtful = {*self._pending, *self._in_flight, *self._failed, *self._doubtful}
        books = {b: list(v) for b, v in self.known.items()}
        books.update({b: list(APPLYING) for b in doubtful})
        self.save(books)

    def work_cpu_s(self) -> float:
        """CPU seconds the process used outside the looking thread of :meth:`run`: what the
        calls of ``apply`` do (a run parses, embeds and writes in its worker's thread and
        the threads it starts, an embedder's pool included; a hung one uses none), without
        the idle looks, which grow with the books. The process's CPU seconds where a
        thread's clock cannot be read (a platform without ``pthread_getcpuclockid``)."""
        try:
            looking = time.clock_gettime(time.pthread_getcpuclockid(self._looker or 0))
        except (AttributeError, OSError):  # no per-thread clock, or no looking thread
            looking = 0.0
        return time.process_time() - looking

    @property
    def in_step(self) -> list[str]:
        """The books of the source whose index a call of ``apply`` brought in step with a
        look of their files: not a book whose call failed, nor one the index holds that no
        look found (its folder gone while a halt keeps it: see :meth:`look`)."""
        with self._lock:
            return sorted(
                b for b, v in self.known.items() if v != _INDEXED and b not in self._failed
            )

    @property
    def in_hand(self) -> list[str]:
        """The books queued or in a call of ``apply`` now."""
        with self._lock:
            return sorted({*self._pending, *self._in_flight})

    def run(self, stop: threading.Event, on_ready: Callable[[], None] | None = None) -> None:
        """Look at every book, then apply changes as they come until ``stop`` is set; the
        calls of ``apply`` in hand then end (none starts after ``stop``) before it returns.
        ``on_ready`` is called once the first look's books are applied."""
        self._closing = False
        self._looker = threading.get_ident()
        self._pool = [
            threading.Thread(target=self._work, args=(stop,), name=f"live-{n}", daemon=True)
            for n in range(max(self.workers, 1))
        ]
        for worker in self._pool:
            worker.start()
        try:
            # the first catch-up: on_ready once it is applied
            first: set[str] | None = set(self.look())
            while not stop.is_set():
                if on_ready is not None and first is not None:
                    with self._lock:
                        first &= {*self._pending, *self._in_flight}
                    if not first:
                        first = None
                        on_ready()
                watcher = self.source.watcher()
                if watcher is not None and watcher.watching:
                    news = self._news(watcher, stop)
                    if news:
                        self._settle(watcher, stop)
                else:  # no notifications: every look stats every book
                    news = self._pause(stop, self._idle_wait())
                if self._ended.is_set():  # a call ended: wait again (a book in doubt is due
                    self._ended.clear()  # a debounce from now), or say ready; or a request
                    with self._lock:
                        asked = bool(self._requests)
                    if news is None and not asked:
                        continue
                if not stop.is_set():
                    self.look()
        finally:
            with self._lock:
                self._closing = True
                self._lock.notify_all()
            for worker in self._pool:
                worker.join()
            self._pool = []
            with self._lock:
                queued = [*self._tickets.values(), *self._riding.values()]
                left_asked = [*self._requests, *(t for ts in queued for t in ts)]
                self._requests, self._tickets, self._riding = [], {}, {}
            for ticket in left_asked:
                ticket._refuse("the live process stopped first")
            left = self.in_hand
            if left:
                self.notify(
                    f"{len(left)} books not applied (stopping): the next start, or the books "
                    "sensor, applies them"
                )

    def _work(self, stop: threading.Event) -> None:
        """A worker: take the books queued and not in flight, apply them, until stopped."""
        while True:
            with self._lock:
                job = _Job({}, {})
                while not (self._closing or stop.is_set()):
                    job = self._take()
                    if job.books:
                        break
                    later = [self._due_in(b) for b in self._pending if b not in self._in_flight]
                    self._lock.wait(max(min(later), 0.01) if later else None)
                if not job.books:
                    return
            self._apply_job(job)

    def _pause(self, stop: threading.Event, seconds: float) -> bool | None:
        """Wait ``seconds`` (False), or until ``stop`` is set (False) or a call of ``apply``
        ended (None)."""
        until = time.monotonic() + seconds
        while not stop.is_set():
            if self._ended.is_set():
                return None
            left = until - time.monotonic()
            if left <= 0:
                return False
            self._ended.wait(min(left, _STOP_CHECK_S))
        return False

    def _news(self, watcher: BookWatcher, stop: threading.Event) -> bool | None:
        """Wait for a notification (True) until the next idle look is due (False), or a call
        of ``apply`` ended (None); False when ``stop`` is set (looked at every quarter
        second)."""
        until = time.monotonic() + self._idle_wait()
        while not stop.is_set():
            if self._ended.is_set():
                return None
            left = until - time.monotonic()
            if left <= 0:
                return False
            if watcher.wait_for_news(min(left, _STOP_CHECK_S)):
                return True
            if not watcher.watching:  # stopped, or its folder replaced: look (a new one) now
                return True
        return False

    def _idle_wait(self) -> float:
        with self._lock:
            if self._doubtful - {*self._pending, *self._in_flight}:
                return self.timing.debounce_s  # applied again once its writer has paused
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

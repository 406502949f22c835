"""An inter-process lock for an embedded store folder, that says who holds it.

Embedded engines must never be opened by two processes at once: Qdrant Edge's own WAL lock does
not cover its segments, and a second opener "recovers" files the first is writing (seen as
``Tracker journal ... is shorter than expected`` in the writer). Every opener, reader or writer,
takes this lock first. It is an ``flock`` on ``<name>.lock``, so the kernel releases it when the
holder dies, ``kill -9`` included. The holder writes its pid, command and start time into the
file, so a waiter can name it. Waiters also hold a shared lock on ``<name>.wait``, which lets a
long-lived holder (the query service) notice them and step aside.

An ``flock`` belongs to an open file, not to a process: two handles of one store in one
process (live mode's workers: a run's builder handle, the next plan's reader handle) lock each
other out like two processes. So a lock a :class:`LockGroup` of this process holds is asked for
first (:meth:`LockGroup.hand_over`): a thread never waits out the busy timeout for a book its
own process holds only because another handle touched it, and a waiter never names its own
process as the holder.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import logging
import os
import resource
import socket
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

from rag_pipeline.store.errors import (
    StoreBusyError,
    StorePathError,
    StoreResourceError,
    resource_limit,
)

__all__ = [
    "FolderLock",
    "LockGroup",
    "WatchedLock",
    "allow_open_files",
    "describe_holder",
    "holding_for",
    "prepare_folder",
]

log = logging.getLogger(__name__)
_POLL_S = 0.05
#: a waiter tries this often for its first _QUICK_FOR_S: a holder that steps aside for it
#: (a search service, live mode between edits) is usually done within that, and a try is one
#: system call (issue 41.1: each hand-over cost up to a whole _POLL_S)
_QUICK_POLL_S = 0.005
_QUICK_FOR_S = 2.0
_NOTICE_EVERY_S = 10.0
#: a wait for a handle of this process is first noticed after this long: it hands the book
#: over as soon as its call (or its close by the store keeper) ends, a short critical section
_NOTICE_HERE_AFTER_S = 1.0


def describe_holder(info: dict[str, Any] | None) -> str:
    """'pid 123 on host (rag-pipeline ingest), since 12:00:01', with what the process was
    doing when it took the lock ('for Dagster run 1a2b3c4d ...'), or 'an unknown process'."""
    if not info:
        return "an unknown process"
    since = info.get("since")
    when = time.strftime("%H:%M:%S", time.localtime(since)) if isinstance(since, float) else "?"
    doing = f" for {info['for']}" if info.get("for") else ""
    return (
        f"pid {info.get('pid')} on {info.get('host')} ({info.get('command')}){doing}, since {when}"
    )


#: what this process is doing, innermost last, by thread (see :func:`holding_for`)
_doing: list[tuple[int, str]] = []


@contextlib.contextmanager
def holding_for(what: str) -> Iterator[None]:
    """Name ``what`` this process does (a Dagster run: its id and job) in every lock it takes
    meanwhile, so that a waiter (the query service, a CLI) says which run holds a book rather
    than a worker's command line. Per thread: live mode's workers run side by side, and a
    lock names the run of the thread that took it (else the process's innermost)."""
    entry = (threading.get_ident(), what)
    _doing.append(entry)
    try:
        yield
    finally:
        _doing.remove(entry)


def _doing_now() -> str | None:
    doing = list(_doing)
    mine = [what for thread, what in doing if thread == threading.get_ident()]
    return mine[-1] if mine else doing[-1][1] if doing else None


class WatchedLock(Protocol):
    """What a long-lived holder watches: a :class:`FolderLock` or a :class:`LockGroup`."""

    def others_waiting(self) -> bool: ...

    def probe(self) -> WatchedLock: ...


#: far above what a store needs; the most asked of the kernel when the hard limit is unlimited
_MAX_OPEN_FILES = 1 << 20


@functools.cache
def allow_open_files() -> int:
    """Raise this process's soft limit of open files to its hard limit, once, and return it.

    A Qdrant Edge handle holds one lock file per book it has touched (the query service, a
    plan of every book): the usual soft limit of 1,024 would end a walk over a thousand books
    with EMFILE, while the hard limit is usually far higher."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = _MAX_OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, _MAX_OPEN_FILES)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            log.debug("cannot raise the open-file limit above %s", soft)
    return soft


class FolderLock:
    """Exclusive lock of one store folder across processes (not re-entrant within one)."""

    def __init__(
        self, lock_path: Path, what: str, busy: type[StoreBusyError] = StoreBusyError
    ) -> None:
        self.path = lock_path
        self.wait_path = lock_path.with_suffix(".wait")
        self.what = what
        self.busy = busy  # what a wait past its limit raises (one book's, or the store's)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def holder(self) -> dict[str, Any] | None:
        """Who holds (or last held) the lock, as it wrote itself down."""
        try:
            data = json.loads(self.path.read_text() or "null")
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def prepare(self) -> None:
        """Create the lock file (and its folder) without taking the lock: a store that cannot
        hold it is said so when opened, not at its first use."""
        prepare_folder(self.path.parent)
        try:
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644))
        except OSError as exc:
            limit = resource_limit(exc)
            if limit is not None:  # no descriptor left: a limit, not a setting to fix
                raise StoreResourceError(f"cannot open {self.path}: {limit}") from None
            raise StorePathError(f"cannot create {self.path}: {_reason(exc, self.path)}") from None

    def acquire(self, wait_s: float, notify: Callable[[str], None] | None = None) -> None:
        """Take the lock, waiting up to ``wait_s`` seconds for its holder; then
        :class:`StoreBusyError` naming the holder. ``notify`` hears about the wait."""
        if self._fd is None:
            self._lock(lambda fd: self._wait(fd, wait_s, notify or log.warning))

    def try_acquire(self) -> bool:
        """Take the lock if nobody holds it; never waits."""
        if self._fd is None:
            self._lock(None)
        return self._fd is not None

    def _lock(self, wait: Callable[[int], None] | None) -> None:
        """Open the lock file and lock it, calling ``wait`` when it is busy (None: give up)."""
        prepare_folder(self.path.parent)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            limit = resource_limit(exc)
            if limit is not None:  # no descriptor left: a limit, not a setting to fix
                raise StoreResourceError(f"cannot open {self.path}: {limit}") from None
            raise StorePathError(f"cannot create {self.path}: {_reason(exc, self.path)}") from None
        try:
            if not _try_lock(fd) and not (_ask_here(self.path) and _try_lock(fd)):
                if wait is None:
                    os.close(fd)
                    return
                wait(fd)
            self._take(fd)
        except BaseException:
            os.close(fd)
            raise

    def _take(self, fd: int) -> None:
        """The lock on ``fd`` is ours: say who holds it, for waiters (a hint: a full disk
        leaves it unsaid, and a reader still reads)."""
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(_me()).encode(), 0)
        self._fd = fd

    def _wait(self, fd: int, wait_s: float, notify: Callable[[str], None]) -> None:
        started = time.monotonic()
        deadline = started + wait_s
        with _here_guard:
            noticed = _NOTICE_HERE_AFTER_S if self.path in _held_here else 0.0
        with self._waiting():
            while True:
                now = time.monotonic()
                if now - started >= noticed and wait_s > 0:
                    notify(f"waiting up to {wait_s:g}s for {self.what}: held by {self._holder()}")
                    noticed += _NOTICE_EVERY_S
                if now >= deadline:
                    raise self.busy(
                        f"{self.what} is in use by {self._holder()}; waited "
                        f"{wait_s:g}s (RAG_BUSY_WAIT_S). Wait for it to finish, or use a "
                        "Qdrant server (RAG_QDRANT_URL) for concurrent access."
                    )
                time.sleep(_QUICK_POLL_S if now - started < _QUICK_FOR_S else _POLL_S)
                if _try_lock(fd) or (_ask_here(self.path) and _try_lock(fd)):
                    return

    def _holder(self) -> str:
        """Who holds the lock, for a waiter: a thread of this process waits for another run
        of it (a handle in a call, or not shared), never for its own pid."""
        info = self.holder()
        if info and info.get("pid") == os.getpid() and info.get("host") == socket.gethostname():
            return "another run in this process" + (f" ({info['for']})" if info.get("for") else "")
        return describe_holder(info)

    @contextlib.contextmanager
    def _waiting(self) -> Iterator[None]:
        """Hold a shared lock on the wait file while waiting, so the holder can see us."""
        try:
            fd = os.open(self.wait_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)

    def others_waiting(self) -> bool:
        """True when another process waits for this lock (for long-lived holders)."""
        try:
            fd = os.open(self.wait_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return False
        try:
            return not _try_lock(fd)
        finally:
            os.close(fd)  # closing drops the probe's lock, if it got it

    def still_named(self) -> bool:
        """Whether the held lock file is still the one at its path (a folder renamed away
        while we waited for it, by a set aside, leaves us holding a lock nobody else takes)."""
        if self._fd is None:
            return False
        try:
            return os.fstat(self._fd).st_ino == os.stat(self.path).st_ino
        except OSError:
            return False

    def probe(self) -> FolderLock:
        """The same lock file, not held: to see waiters after the holder let go."""
        return FolderLock(self.path, self.what, self.busy)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)  # closing the descriptor releases the flock


def prepare_folder(folder: Path) -> None:
    """Create ``folder`` (and its parents) for a store, or :class:`StorePathError` saying why
    it cannot be (a file in the way, a read-only or unwritable place)."""
    if folder.exists() and not folder.is_dir():
        raise StorePathError(f"{folder} is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorePathError(f"cannot create the folder {folder}: {_reason(exc, folder)}") from None


def _reason(exc: OSError, path: Path) -> str:
    """The OS's reason, and the path it is about when not ``path`` itself (a parent)."""
    where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(path) else ""
    return f"{exc.strerror or exc}{where}"


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _me() -> dict[str, Any]:
    command = " ".join(Path(a).name if i == 0 else a for i, a in enumerate(sys.argv[:3]))
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": command or "python",
        "since": time.time(),
        "for": _doing_now(),
    }


class LockGroup:
    """The book locks one store handle holds, under the lock discipline every process follows
    (README, "Locks"; this class is where it is enforced):

    - **Bounded.** A handle holds at most ``cap`` books it did not write; taking another lets go
      of the least recently used one, so a walk over every book (a plan, the query service)
      holds a few descriptors whatever the collection's size.
    - **Try, back off, wait.** A handle never waits for a book while holding one it may let
      go: when a lock is busy it first lets go of every such book, then waits. Two handles
      can therefore only wait for each other when both wrote what they hold (two writers of
      the same books), which ``RAG_BUSY_WAIT_S`` ends with a busy error for one book.
    - **Writers keep what they wrote** until the handle closes (a run's handle is short), so
      no other process writes a book between a run's writes and their check.

    - **One process hands over** (a shared handle: :meth:`share_in_process`). Another shared
      handle of this process that wants a member gets it as soon as this handle is between
      calls (``hand_over``, even a book it wrote: the runs of one book in one process never
      overlap, the live loop and the runner see to that), never after the busy timeout (see
      the module's docstring).

    ``may_let_go(lock)`` is the handle's say: it drops what it keeps of the lock's book and
    returns True, or returns False for a book it wrote. ``hand_over(lock)`` is its say for a
    handle of this process: it drops what it keeps of the book and returns True, or False
    while a call of the handle is under way (it is asked again). Long-lived holders watch the
    group as one (:meth:`others_waiting`): the query service steps aside when any member is
    waited for.
    """

    def __init__(
        self,
        locks: Iterable[FolderLock] = (),
        *,
        cap: int | None = None,
        may_let_go: Callable[[FolderLock], bool] | None = None,
    ) -> None:
        self._locks: OrderedDict[Path, FolderLock] = OrderedDict((lk.path, lk) for lk in locks)
        self._cap = cap
        self._may_let_go = may_let_go
        self._hand_over: Callable[[FolderLock], bool] | None = None
        self._guard = threading.Lock()
        #: books let go of, by the bound and by backing off (for tests and benchmarks)
        self.let_go = 0
        #: books handed over to another handle of this process (for tests)
        self.handed_over = 0

    def add(self, lock: FolderLock) -> None:
        """Count a lock taken by its owner as the group's (a whole-store lock-up)."""
        with self._guard:
            self._locks[lock.path] = lock

    def take(self, lock: FolderLock, wait_s: float) -> FolderLock:
        """Hold ``lock`` (or the group's own lock of the same file, now the most recently
        used), under the rules above; :class:`StoreBusyError` past ``wait_s``."""
        with self._guard:
            held = self._locks.get(lock.path)
            if held is not None:
                self._locks.move_to_end(lock.path)
                return held
        if self._cap is not None:
            self._shrink(self._cap - 1)
        if not lock.try_acquire():
            self._shrink(0)  # back off: nothing we may let go is held while we wait
            lock.acquire(wait_s)
        with self._guard:
            self._locks[lock.path] = lock
        if self._hand_over is not None:
            with _here_guard:
                _held_here[lock.path] = self
        return lock

    def share_in_process(self, hand_over: Callable[[FolderLock], bool]) -> None:
        """Hand members over to other handles of this process with ``hand_over`` (see the
        class docstring): for the process's shared handles (:mod:`~rag_pipeline.store.sharing`).
        A group without it locks other handles out as another process would."""
        with self._guard:
            self._hand_over = hand_over
            held = list(self._locks)
        with _here_guard:
            _held_here.update(dict.fromkeys(held, self))

    def hand_over(self, path: Path) -> bool:
        """Let go of the member at ``path`` for another handle of this process, if the
        handle says it may now (see the class docstring)."""
        with self._guard:
            lock = self._locks.get(path)
        if lock is None or self._hand_over is None or not self._hand_over(lock):
            return False
        self.drop(lock)
        self.handed_over += 1
        return True

    def drop(self, lock: FolderLock) -> None:
        """Release one member (a lock that no longer names its file)."""
        with self._guard:
            self._locks.pop(lock.path, None)
        _forget_here(self, [lock])
        lock.release()

    def _shrink(self, keep: int) -> None:
        """Let go of the least recently used books the handle may let go, until at most
        ``keep`` of the held ones are not kept by their writer."""
        if self._may_let_go is None:
            return
        kept = 0
        for lock in self.members():
            with self._guard:
                if len(self._locks) - kept <= keep:
                    return
            if self._may_let_go(lock):
                self.drop(lock)
                self.let_go += 1
            else:
                kept += 1

    def members(self) -> tuple[FolderLock, ...]:
        """The held locks, least recently used first."""
        with self._guard:
            return tuple(self._locks.values())

    @property
    def held(self) -> bool:
        return any(lock.held for lock in self.members())

    def others_waiting(self) -> bool:
        """True when another process waits for any lock of the group."""
        return any(lock.others_waiting() for lock in self.members())

    def probe(self) -> LockGroup:
        """The same lock files, not held: to see waiters after the handle is closed."""
        return LockGroup(lock.probe() for lock in self.members())

    def release(self) -> None:
        with self._guard:
            locks, self._locks = list(self._locks.values()), OrderedDict()
        _forget_here(self, locks)
        for lock in locks:
            lock.release()


#: the group of this process that holds each book lock it may hand over (see LockGroup)
_held_here: dict[Path, LockGroup] = {}
_here_guard = threading.Lock()


def _forget_here(group: LockGroup, locks: Iterable[FolderLock]) -> None:
    with _here_guard:
        for lock in locks:
            if _held_here.get(lock.path) is group:
                del _held_here[lock.path]


def _ask_here(path: Path) -> bool:
    """Ask the group of this process that holds ``path`` to hand it over; True if it did."""
    with _here_guard:
        group = _held_here.get(path)
    return group is not None and group.hand_over(path)

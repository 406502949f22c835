"""``rag-pipeline ingest`` hands its change to a running live process (issue 41.2).

Where live mode runs, it holds Dagster, the model and the instance loaded, and it applies
each book's changes one after another: an ingest that started its own runs would load all of
that again and race it for the same books' locks. So the live process listens on a Unix
socket beside its lock, ``<DAGSTER_HOME>/.rag-live.sock``, and the CLI asks it to apply the
named books (or every book) now and waits for its report, which it prints as its own.

One request a connection, JSON lines:

* the CLI sends ``{"books": [...] | null, "key": <settings key>}``: the key says which books
  and index the CLI means (:func:`settings_key`); a live process with other settings
  refuses, and the CLI runs the change itself;
* the live process answers ``{"accepted": true}`` at once (or ``{"refused": why}``), then
  ``{"waiting": [...], "cpu_s": <its CPU seconds>}`` every few seconds while the books are
  applied, then
  ``{"report": <ingest --json>, "applied_by": ...}``, or ``{"refused": why}`` when it stops
  first.

Whenever the live process is absent, refuses, dies, falls silent or stalls (its heartbeats go
on, but neither the books it waits for nor its CPU time move: a hung run), :func:`ask_live`
returns None and the CLI runs the change itself, as without live mode (a stall is said, naming
the live process). This module imports neither
Dagster nor the store: the CLI's hand-off costs a connect and the wait.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag_pipeline.ingest.report import BookResult, IngestReport

__all__ = [
    "HANDOFF_SOCKET",
    "HandOffServer",
    "Handed",
    "LiveStalled",
    "ask_live",
    "settings_key",
]

log = logging.getLogger(__name__)

HANDOFF_SOCKET = ".rag-live.sock"
#: how long the CLI waits for the live process to accept its request
ACCEPT_S = 2.0
#: the live process says it is still at work this often while a request waits
HEARTBEAT_S = 2.0
#: a live process silent this long (no heartbeat) is taken to be stuck: the CLI runs itself
SILENT_S = 30.0
#: a live process whose heartbeats show no progress this long (the books it waits for the
#: same, less than :data:`IDLE_CPU_S` of CPU used) is taken to be hung: the CLI runs itself.
#: A run that embeds or writes uses CPU; one waiting on a store another process holds gives
#: up after ``RAG_BUSY_WAIT_S`` (30 s)
STALLED_S = 90.0
#: CPU seconds of a live process's work over :data:`STALLED_S` that are not yet progress
#: (idle, it uses about 0.01 s a minute besides its looks, which are not counted)
IDLE_CPU_S = 0.2
#: settings that do not change what an ingest writes (a live process with other values of
#: them applies the CLI's change as the CLI would)
_NOT_IN_KEY = (
    "serve_read_timeout_s",
    "serve_max_connections",
    "sensor_interval_s",
    "live_debounce_ms",
    "live_workers",
    "dagster_url",
    "busy_wait_s",
)
_PATHS = ("data_dir", "sources", "qdrant_path", "cache_dir", "local_model_dir")


def settings_key(settings: Any) -> str:
    """A digest of the settings that decide what an ingest reads and writes (paths
    resolved: the CLI and the live process may start in different folders)."""
    values = settings.model_dump(mode="json")
    for name in _NOT_IN_KEY:
        values.pop(name, None)
    for name in _PATHS:
        if values.get(name):
            values[name] = str(Path(values[name]).expanduser().resolve())
    # the report's fields: a live process started by another version, whose report this one
    # may not read, refuses (the CLI runs the change itself)
    values["report_fields"] = sorted(BookResult.__dataclass_fields__)
    text = json.dumps(values, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


@contextlib.contextmanager
def _address(path: Path) -> Iterator[str]:
    """A name for the socket at ``path`` that fits ``sun_path`` (108 bytes): a long Dagster
    home is reached through this process's descriptor of its folder."""
    if len(os.fsencode(path)) < 100:
        yield str(path)
        return
    # O_PATH: a folder its owner may enter but not list (mode 0711, 0300) is reached too
    # (Linux only, as /proc/self/fd is; elsewhere O_RDONLY, and a folder that cannot be
    # listed raises OSError: no hand-off, the CLI runs its change itself)
    folder = os.open(path.parent, getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{folder}/{path.name}"
    finally:
        os.close(folder)


def _send(conn: socket.socket, message: Mapping[str, Any]) -> None:
    conn.sendall(json.dumps(message, default=str).encode() + b"\n")


def _lines(conn: socket.socket) -> Iterator[dict[str, Any]]:
    """The JSON messages that arrive on ``conn`` (ends when it closes)."""
    buffer = b""
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            return
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            message = json.loads(line)
            if isinstance(message, dict):
                yield message


@dataclass
class Handed:
    """What the live process answered: its report of the books, and who it is."""

    report: IngestReport
    applied_by: str


class LiveStalled(Exception):
    """The live process went on sending heartbeats without progress: hung (its message names
    the process and the books it was applying)."""


@dataclass
class _Progress:
    """What the heartbeats of one request showed: when it last moved."""

    stalled_s: float
    waiting: list[str] | None = None
    cpu_s: float | None = None
    since: float = field(default_factory=time.monotonic)

    def beat(self, message: Mapping[str, Any]) -> None:
        """One heartbeat: progress when the books waited for changed or the process used
        CPU; :class:`LiveStalled` when neither happened for ``stalled_s``."""
        waiting = [str(b) for b in message["waiting"]]
        cpu = message.get("cpu_s")
        cpu_s = float(cpu) if isinstance(cpu, int | float) else None
        now = time.monotonic()
        moved = waiting != self.waiting or (
            cpu_s is not None and (self.cpu_s is None or cpu_s - self.cpu_s >= IDLE_CPU_S)
        )
        if moved:
            self.waiting, self.cpu_s, self.since = waiting, cpu_s, now
        elif now - self.since >= self.stalled_s:
            raise LiveStalled(
                f"no progress for {now - self.since:.0f}s on {', '.join(waiting) or 'its books'}"
            )


def ask_live(
    home: Path,
    books: list[str] | None,
    key: str,
    *,
    accept_s: float = ACCEPT_S,
    silent_s: float = SILENT_S,
    stalled_s: float | None = None,
    on_wait: Callable[[list[str]], None] | None = None,
    notify: Callable[[str], None] | None = None,
) -> Handed | None:
    """Ask the live process of ``home`` to apply ``books`` (None: every book) now and wait
    for its report; None when no live process answers, it refuses (other settings, it is
    stopping), dies, falls silent or stalls (heartbeats without progress for ``stalled_s``,
    default :data:`STALLED_S`: a hung run); the caller then runs the change itself. A live
    process that accepted and then stalled or fell silent is said to ``notify``, named.
    ``on_wait`` hears the books it still applies, every heartbeat."""
    path = Path(home) / HANDOFF_SOCKET
    if not path.exists():
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    who = "the live process"
    progress: _Progress | None = None
    try:
        conn.settimeout(accept_s)
        with _address(path) as address:
            conn.connect(address)
        _send(conn, {"books": books, "key": key, "pid": os.getpid()})
        messages = _lines(conn)
        first = next(messages, None)
        if first is None or not first.get("accepted"):
            if first is not None:
                log.info("live mode refused the ingest: %s", first.get("refused"))
            return None
        if isinstance(first.get("by"), str):
            who = first["by"]
        conn.settimeout(silent_s)
        progress = _Progress(STALLED_S if stalled_s is None else stalled_s)
        for message in messages:
            if "waiting" in message:
                progress.beat(message)
                if on_wait is not None:
                    on_wait([str(b) for b in message["waiting"]])
                continue
            if "report" in message:
                return Handed(IngestReport.from_dict(message["report"]), str(message["applied_by"]))
            log.info("live mode did not apply the ingest: %s", message.get("refused"))
            return None
        return None  # it closed the connection: it died, or stopped
    except LiveStalled as exc:
        (notify or log.warning)(
            f"{who} did not apply this ingest's books ({exc}): it may be hung; running the "
            "change here (see that process's output, or stop it)"
        )
        return None
    except TimeoutError:
        if progress is None:  # not accepted in time: no live process answers
            log.info("no answer from live mode at %s within %ss", path, accept_s)
        else:
            (notify or log.warning)(
                f"{who} accepted this ingest's books, then said nothing for {silent_s:g}s: "
                "running the change here"
            )
        return None
    # absent, refused, a broken answer or one this version cannot read
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.info("no answer from live mode at %s: %r", path, exc)
        return None
    finally:
        conn.close()


#: the live side: apply these books (None: every book) and return their report, or None when
#: they were not all applied (the process is stopping); meanwhile call the second argument
#: with the books still to apply every :data:`HEARTBEAT_S`
Apply = Callable[[list[str] | None, Callable[[list[str]], None]], IngestReport | None]


@dataclass
class HandOffServer:
    """The live process's end: accepts requests on ``<home>/.rag-live.sock`` while it
    runs, each in a thread of its own (its books applied by ``apply``)."""

    home: Path
    key: str
    apply: Apply
    applied_by: str = field(default_factory=lambda: f"live mode (pid {os.getpid()})")
    #: the CPU seconds that say its work moves (sent with each heartbeat: see _Progress)
    work_cpu_s: Callable[[], float] = time.process_time
    _sock: socket.socket | None = None
    _thread: threading.Thread | None = None
    _closed: threading.Event = field(default_factory=threading.Event)

    @property
    def path(self) -> Path:
        return Path(self.home) / HANDOFF_SOCKET

    def start(self) -> None:
        """Listen (a socket left by a live process that died is replaced: this process holds
        the live lock)."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with _address(self.path) as address:
            sock.bind(address)
        os.chmod(self.path, 0o600)  # the owner's processes only
        sock.listen(16)
        self._sock = sock
        self._thread = threading.Thread(target=self._accept, name="live-handoff", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closed.set()
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept
            self._sock.close()
        if self._thread is not None:
            self._thread.join(5)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def _accept(self) -> None:
        assert self._sock is not None
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        """One request: check its key, accept, apply, answer."""
        try:
            conn.settimeout(ACCEPT_S)
            request = next(_lines(conn), None)
            if request is None:
                return
            if request.get("key") != self.key:
                _send(conn, {"refused": "the live process runs with other settings"})
                return
            books = request.get("books")
            if books is not None and not isinstance(books, list):
                _send(conn, {"refused": "a request names its books in a list"})
                return
            asked = None if books is None else [str(b) for b in books]
            _send(conn, {"accepted": True, "by": self.applied_by})
            conn.settimeout(None)

            def beat(waiting: list[str]) -> None:
                # its CPU time: the CLI tells a run at work from a hung one (see _Progress)
                _send(conn, {"waiting": waiting, "cpu_s": round(self.work_cpu_s(), 3)})

            report = self.apply(asked, beat)
            if report is None:
                _send(conn, {"refused": "the live process is stopping"})
                return
            _send(conn, {"report": report.as_dict(), "applied_by": self.applied_by})
        except Exception:  # a client gone, a broken request: the client runs itself
            log.debug("hand-off request failed", exc_info=True)
        finally:
            conn.close()

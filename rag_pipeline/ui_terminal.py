"""What `make ui` shows in its terminal: warnings, errors, and one line per run start and end.

``dg dev --log-level warning`` quiets the webserver and the daemon, but each run worker logs
to the same terminal through its own console logger, at DEBUG unless the run's config says
otherwise (a run launched from the UI says nothing): a line per event, and every line of a
multi-line message. This filter, between ``dg dev`` and the terminal, keeps a log record only
at WARNING or above (with its continuation lines: a traceback, a list), every line this
project writes for a run (:data:`RUN_LINE_PREFIX`), and any other output that is not a log
record. Run as ``dg dev ... 2>&1 | python -m rag_pipeline.ui_terminal``, or as ``make ui``
does: ``python -m rag_pipeline.ui_terminal dg dev ...``, which also runs the command and stops
it (:func:`run`).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from types import FrameType
from typing import TextIO

__all__ = ["RUN_LINE_PREFIX", "STOP_GRACE_S", "keep_lines", "main", "run"]

#: the start of every line the project's runs write to the terminal (see defs.location)
RUN_LINE_PREFIX = "[rag_pipeline]"
#: the head of a record of Dagster's console format: ``2026-12-05 07:00:00 +0000 - dagster -
#: DEBUG - ...`` (colours, if any, around the level)
_RECORD = re.compile(
    r"^(?:\x1b\[[0-9;]*m)?\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4}(?:\x1b\[[0-9;]*m)?"
    r" - [\w.]+ - (?:\x1b\[[0-9;]*m)?(?P<level>[A-Z]+)"
)
_SHOWN_LEVELS = {"WARNING", "ERROR", "CRITICAL", "FATAL"}


def keep_lines(lines: Iterable[str]) -> Iterator[str]:
    """The lines worth a person's terminal, in order."""
    keeping = True  # output before any record (a startup error) is shown
    for line in lines:
        if line.startswith(RUN_LINE_PREFIX):
            keeping = True
            yield line
            continue
        record = _RECORD.match(line)
        if record is not None:
            keeping = record["level"] in _SHOWN_LEVELS
        if keeping:
            yield line


def main(stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout) -> None:
    try:
        for line in keep_lines(stdin):
            stdout.write(line)
            stdout.flush()
    except KeyboardInterrupt:  # Ctrl-C reaches the whole pipeline: dg dev shuts down itself
        pass
    except BrokenPipeError:  # the terminal is gone; the command stops on its own signal
        pass


#: how long the command's processes have to stop after they were asked before they are killed
STOP_GRACE_S = 20.0
#: a Ctrl-C this long after the first is a second one (the person insists); one sooner is the
#: same keystroke reaching this process twice (directly, and passed on by ``make ui``'s shell)
_SECOND_CTRL_C_S = 1.0
#: how long the output may stay open once the command exited (a child of it still writing)
_DRAIN_S = 5.0


class _Stopper:
    """Signal handler for SIGINT and SIGTERM: the first asks the command's process group to
    stop; a second Ctrl-C, or :data:`STOP_GRACE_S` without it stopping, kills the group. A
    second SIGTERM changes nothing (a service manager's own deadline ends in SIGKILL; a signal
    to the whole process group reaches this process twice)."""

    def __init__(self) -> None:
        self.group: int | None = None
        self.asked_at: float | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if self.asked_at is None:
            self.asked_at = now
            # to dg dev alone, which Dagster takes as a Ctrl-C: it stops the webserver and the
            # daemon, then the code servers (signalled together, the daemon's last sensor tick
            # could find its code server gone and print tracebacks)
            self.signal(signal.SIGTERM, leader_only=True)
        elif signum == signal.SIGINT and now - self.asked_at >= _SECOND_CTRL_C_S:
            self.signal(signal.SIGKILL)

    def signal(self, signum: int, *, leader_only: bool = False) -> None:
        if self.group is None:
            return  # not started yet: :func:`run` asks once it is
        try:
            if leader_only:
                os.kill(self.group, signum)
            else:
                os.killpg(self.group, signum)
        except ProcessLookupError:  # it (every process of the group) has exited
            pass

    def overdue(self) -> bool:
        return self.asked_at is not None and time.monotonic() - self.asked_at > STOP_GRACE_S


def _show(output: TextIO, stdout: TextIO) -> None:
    main(output, stdout)
    for _ in output:  # the terminal is gone: read on, or the command blocks on a full pipe
        pass


def run(command: list[str], stdout: TextIO = sys.stdout) -> int:
    """Run ``command`` (``dg dev``) with its output through :func:`keep_lines`; its exit code
    (128 + the signal that killed it).

    The command starts in a process group of its own, with SIGINT and SIGTERM at their default
    dispositions whatever this process inherited: started in the background of a script, by
    ``nohup`` or a service manager, it would inherit SIGINT ignored, and Dagster gives SIGTERM
    the disposition SIGINT has, so neither would stop it. This process takes both instead and
    passes the first on as SIGTERM to the command (``dg dev`` then shuts down as on Ctrl-C),
    as it does SIGHUP unless that was ignored (``nohup``); a second Ctrl-C, or the group still
    there after :data:`STOP_GRACE_S`, kills the group."""
    stopper = _Stopper()
    # handled here, so at their defaults in the command (exec keeps an ignored signal ignored)
    signal.signal(signal.SIGINT, stopper)
    signal.signal(signal.SIGTERM, stopper)
    if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:  # not under nohup: a closed terminal
        signal.signal(signal.SIGHUP, stopper)  # reaches its foreground group, not the command's
    proc = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,  # a process group in the background must not read a terminal
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        process_group=0,
        text=True,
        errors="replace",
    )
    stopper.group = proc.pid
    if stopper.asked_at is not None:  # a signal came while it started
        stopper.signal(signal.SIGTERM, leader_only=True)
    assert proc.stdout is not None
    shown = threading.Thread(target=_show, args=(proc.stdout, stdout), daemon=True)
    shown.start()
    while proc.poll() is None:
        if stopper.overdue():
            stopper.signal(signal.SIGKILL)
        time.sleep(0.1)
    shown.join(_DRAIN_S)
    stopper.signal(signal.SIGKILL)  # what is left of the group (a child holding the output)
    shown.join(_DRAIN_S)
    return proc.returncode if proc.returncode >= 0 else 128 - proc.returncode


if __name__ == "__main__":
    if len(sys.argv) > 1:
        sys.exit(run(sys.argv[1:]))
    main()

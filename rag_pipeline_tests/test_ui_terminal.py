"""What `make ui`'s terminal shows (rag_pipeline.ui_terminal) and the lines runs write to it."""

import os
import subprocess
import sys

import pytest

from rag_pipeline.defs.runs import run_ended_line, run_started_line
from rag_pipeline.ui_terminal import RUN_LINE_PREFIX, keep_lines

STAMP = "2026-12-05 07:00:00 +0000"
COLOURED = f"\x1b[32m{STAMP}\x1b[0m - dagster.daemon.SensorDaemon - \x1b[34mINFO\x1b[0m - tick"


@pytest.mark.parametrize(
    ("lines", "shown"),
    [
        # Dagster's records: WARNING and above shown, DEBUG and INFO not
        ([f"{STAMP} - dagster - DEBUG - ingest_books - abc - STEP_START - x"], []),
        ([f"{STAMP} - dagster - INFO - ingest_books - abc - documents - parsed"], []),
        ([COLOURED], []),
        ([f"{STAMP} - dagster - WARNING - ingest_books - abc - b/broken.md: bad"], [0]),
        (
            [f"{STAMP} - dagster.daemon - ERROR - boom", "Traceback (most recent call last):"],
            [0, 1],
        ),
        # a multi-line INFO message (a run's list of written points) is dropped whole
        ([f"{STAMP} - dagster - INFO - run - [b] points written", "a.md § A: p1, p2"], []),
        # the runs' own lines, and anything before the first record, are shown
        ([f"{RUN_LINE_PREFIX} run 1a2b3c4d started: ingest_books, b (by books_sensor)"], [0]),
        (["Traceback (most recent call last):", "ImportError: x"], [0, 1]),
        (
            [
                f"{STAMP} - dagster - DEBUG - x",
                f"{RUN_LINE_PREFIX} run 1a2b3c4d ended after 2.0 s: done",
                "its continuation",
                f"{STAMP} - dagster - INFO - y",
                "dropped with it",
            ],
            [1, 2],
        ),
    ],
)
def test_the_terminal_keeps_warnings_errors_and_the_runs_lines(lines, shown):
    assert list(keep_lines(line + "\n" for line in lines)) == [lines[i] + "\n" for i in shown]


@pytest.mark.integration
def test_the_filter_runs_as_make_ui_runs_it():
    text = "\n".join(
        [f"{STAMP} - dagster - INFO - chatter", f"{STAMP} - dagster - WARNING - kept", ""]
    )
    out = subprocess.run(
        [sys.executable, "-m", "rag_pipeline.ui_terminal"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert out == f"{STAMP} - dagster - WARNING - kept\n"


#: the command the test runs under ui_terminal: says whether it started with SIGINT and
#: SIGTERM ignored (Python keeps an ignored signal ignored) and its process group, then waits
REPORTER = """
import os, signal, time
shown = ["ignored" if signal.getsignal(s) == signal.SIG_IGN else "not-ignored"
         for s in (signal.SIGINT, signal.SIGTERM)]
print(*shown, os.getpgrp(), flush=True)
time.sleep(120)
"""


@pytest.mark.integration
def test_the_command_gets_default_signals_and_stops_on_sigterm_when_sigint_was_ignored():
    """What `make ui` started by a script or a service manager hands dg dev: SIGINT ignored,
    which Dagster also gives SIGTERM. ui_terminal runs the command in a process group of its
    own with both at their defaults, and passes SIGTERM on: it stops within a second."""
    import signal
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "rag_pipeline.ui_terminal", sys.executable, "-c", REPORTER],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        assert proc.stdout is not None
        sigint, sigterm, group = proc.stdout.readline().split()
        assert (sigint, sigterm) == ("not-ignored", "not-ignored")
        assert int(group) not in (os.getpgrp(), proc.pid)  # its own group: only told once
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 128 + signal.SIGTERM
        assert time.monotonic() - started < 5
        with pytest.raises(ProcessLookupError):
            os.killpg(int(group), 0)  # nothing of its group is left
    finally:
        proc.kill()
        proc.wait(10)
        proc.stdout.close()  # type: ignore[union-attr]


def test_a_runs_lines_name_it_its_books_and_who_started_it():
    run_id = "1a2b3c4d-0000-0000-0000-000000000000"
    batch = {f"rag-book/b{i}": "yes" for i in range(5)} | {"dagster/sensor_name": "books_sensor"}
    assert run_started_line(run_id, "ingest_books", batch) == (
        f"{RUN_LINE_PREFIX} run 1a2b3c4d started: ingest_books, b0, b1, b2 and 2 more "
        "(by books_sensor)"
    )
    ranged = {
        "dagster/asset_partition_range_start": "a",
        "dagster/asset_partition_range_end": "k",
        "dagster/backfill": "x",
    }
    assert run_started_line(run_id, "__ASSET_JOB", ranged).endswith(
        "__ASSET_JOB, books a to k (by backfill)"
    )
    one = {"rag/book": "b", "dagster/partition": "b"}
    assert run_started_line(run_id, "__ASSET_JOB", one).endswith("__ASSET_JOB, b (by ui)")
    assert run_ended_line(run_id, 3.04, failed=False) == (
        f"{RUN_LINE_PREFIX} run 1a2b3c4d ended after 3.0 s: done"
    )
    assert run_ended_line(run_id, 1, failed=True).endswith(f"failed, see /runs/{run_id}")

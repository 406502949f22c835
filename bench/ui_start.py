"""`make ui` started on new Dagster homes in a row, as a service manager starts it: how often it
comes up, how long until the UI answers, and whether SIGTERM stops all of it (issue 44).

    python bench/ui_start.py [--starts 20] [--timeout-s 240]

Each start: a new ``DAGSTER_HOME`` (the project's ``dagster.yaml`` put there by ``make``) and
an empty data folder (no ingest: the start alone), ``make ui`` in a session of its own with
SIGINT ignored (what ``make ui &`` in a script, ``nohup`` or a unit with SIGINT ignored start
with), until the webserver answers ``/server_info`` and live mode says it is ready; then
SIGTERM to the process group, until no process of the session is left. A start fails when
``make`` exits first, is not up within ``--timeout-s``, or its terminal shows a traceback or
one of the errors of two processes creating the instance together.

Prints one JSON object (also written to bench/results/ui_start.json) and a summary: starts,
failures, seconds to the UI answering and to live mode ready, seconds to every process gone
after SIGTERM, and the CPU seconds of all its processes (start to stop, reaped children).
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from common import REPO, save_results, scenario_env

#: what a failed start of a new instance showed (issue 44)
START_FAILURES = ("Traceback", "already exists", "UNIQUE constraint", "more than one head")
POLL_S = 0.1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def session_pids(session: int) -> list[int]:
    """The live processes of ``session`` (Linux's /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[3]) == session:
            found.append(int(stat.parent.name))
    return found


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_start(work: Path, timeout_s: float) -> dict[str, Any]:
    books = work / "books"
    books.mkdir(parents=True)
    port = free_port()
    env = scenario_env(books, work)
    for name in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "RAG_LIVE", "UI_ARGS"):
        env.pop(name, None)
    log_path = work / "make-ui.log"
    cpu_before = children_cpu_s()
    started = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            ["make", "-s", "-C", str(REPO), "ui", f"UI_ARGS=-h 127.0.0.1 -p {port}"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )
    result: dict[str, Any] = {"ok": False}
    ui_s = ready_s = None
    while time.monotonic() - started < timeout_s and proc.poll() is None:
        now = time.monotonic() - started
        if ui_s is None and answers(f"http://127.0.0.1:{port}/server_info"):
            ui_s = now
        if ready_s is None and "live ready:" in log_path.read_text(errors="replace"):
            ready_s = now
        if ui_s is not None and ready_s is not None:
            break
        time.sleep(POLL_S)
    result.update(ui_s=ui_s, live_ready_s=ready_s, exited_early=proc.poll() is not None)
    stopping = time.monotonic()
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    while session_pids(proc.pid) and time.monotonic() - stopping < 120:
        proc.poll()
        time.sleep(POLL_S)
    left = session_pids(proc.pid)
    result["stop_s"] = None if left else time.monotonic() - stopping
    result["left_after_120_s"] = len(left)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    proc.wait(30)
    result["cpu_s"] = children_cpu_s() - cpu_before
    text = log_path.read_text(errors="replace")
    result["errors"] = [f for f in START_FAILURES if f in text]
    result["ok"] = bool(ui_s is not None and ready_s is not None and not result["errors"])
    if not result["ok"]:
        result["log_tail"] = text[-2000:]
    return result


def summary(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)
    return {
        "p50": round(statistics.median(ordered), 2),
        "p95": round(ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))], 2),
        "max": round(ordered[-1], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=20)
    parser.add_argument("--timeout-s", type=float, default=240)
    args = parser.parse_args()
    if not Path("/proc/self/stat").exists():
        raise SystemExit("needs Linux's /proc to find every process of a start")
    starts = []
    with tempfile.TemporaryDirectory(prefix="ui-start-") as tmp:
        for n in range(args.starts):
            result = one_start(Path(tmp) / f"start{n}", args.timeout_s)
            starts.append(result)
            shown = {k: (round(v, 2) if isinstance(v, float) else v) for k, v in result.items()}
            shown.pop("log_tail", None)
            print(f"start {n + 1}/{args.starts}: {shown}", file=sys.stderr, flush=True)
    ok = [s for s in starts if s["ok"]]
    results = {
        "starts": len(starts),
        "failures": len(starts) - len(ok),
        "ui_answering_s": summary([s["ui_s"] for s in ok]),
        "live_ready_s": summary([s["live_ready_s"] for s in ok]),
        "stop_after_sigterm_s": summary([s["stop_s"] for s in starts if s["stop_s"] is not None]),
        "not_stopped_after_120_s": sum(1 for s in starts if s["stop_s"] is None),
        "cpu_s_per_start": summary([s["cpu_s"] for s in starts]),
        "cpu_count": os.cpu_count(),
        "load_average_1m_at_end": round(os.getloadavg()[0], 1),
        "each": starts,
    }
    save_results("ui_start", results)


if __name__ == "__main__":
    main()

"""Concurrent runs under the daemon: a small book's edit saved during a big book's first
ingest, for each ``max_concurrent_runs`` (issue 40); with ``--live``, through live mode for
each count of its workers (issue 40.2).

    python bench/concurrent_runs.py [--runs 1,2,3] [--files 12] [--sections 20]
                                    [--embedder local] [--live 1,2]

For each count, on a fresh temp folder: the project's ``dagster.yaml`` with
``max_concurrent_runs`` and the pools' ``default_limit`` set to it, ``dg dev`` as ``make ui``
runs it with ``RAG_LIVE=0`` (the books sensor and the daemon's run queue). Once the small book
(``data/books/ros2-fundamentals``) is indexed, a generated big book (``--files`` files of
``--sections`` sections) is added: its first ingest; 5 s after its run started, one file of
the small book is edited. Measured: seconds from the edit to the end of the small book's run
(and how long it was queued), and the big book's first ingest (its run's start to its end).
The local model's cache is ``$RAG_CACHE_DIR`` if set, else this checkout's ``.rag/cache``.

Prints one JSON object (also written to bench/results/concurrent_runs.json) and a table.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import save_results, scenario_env

REPO = Path(__file__).resolve().parents[1]
SMALL = "ros2-fundamentals"
BIG = "big-book"
EDITED = "01-chapter-1-ros2-fundamentals/02-setup.md"
POLL_S = 0.2


def wait_for(
    proc: subprocess.Popen[Any], name: str, predicate: Any, timeout: float, what: str
) -> Any:
    """``predicate()``'s first true value, polled until ``timeout``; exits if ``proc`` (the
    process ``name`` measured) ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        if proc.poll() is not None:
            raise SystemExit(f"{name} exited while waiting for {what}")
        time.sleep(POLL_S)
    raise SystemExit(f"timed out after {timeout}s waiting for {what}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_big_book(root: Path, files: int, sections: int) -> None:
    """``files * sections`` sections of varied prose (one chunk each, about 200 words)."""
    words = [
        "robot",
        "joint",
        "sensor",
        "planner",
        "torque",
        "frame",
        "topic",
        "node",
        "actuator",
        "gait",
        "balance",
    ]
    for f in range(files):
        path = root / f"part-{f % 4}" / f"ch{f:02d}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        body = [f"# Chapter {f}\n"]
        for s in range(sections):
            text = " ".join(words[(f * 7 + s * 3 + i) % len(words)] for i in range(200))
            body.append(f"## Topic {f}.{s}\n\n{text} {f}-{s}.\n")
        path.write_text("\n".join(body))


def configured(runs: int) -> str:
    text = (REPO / "dagster.yaml").read_text()
    text = re.sub(r"max_concurrent_runs: \d+", f"max_concurrent_runs: {runs}", text)
    return re.sub(r"default_limit: \d+", f"default_limit: {runs}", text)


def measure(runs: int, work: Path, files: int, sections: int, embedder: str) -> dict[str, Any]:
    from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

    data = work / "books"
    shutil.copytree(REPO / "data" / "books" / SMALL, data / SMALL)
    write_big_book(work / "big", files, sections)
    home = work / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(configured(runs))
    env = scenario_env(data, work, DAGSTER_HOME=str(home), RAG_EMBEDDER=embedder)
    env["RAG_CACHE_DIR"] = os.environ.get("RAG_CACHE_DIR", str(REPO / ".rag" / "cache"))
    env.pop("RAG_SENSOR_INTERVAL_S", None)
    subprocess.run(
        [sys.executable, "-c", "from dagster import DagsterInstance; DagsterInstance.get()"],
        env=env,
        check=True,
        timeout=180,
    )
    dg = Path(sys.executable).with_name("dg")
    port = free_port()
    with open(work / "dg-dev.log", "wb") as log:
        proc = subprocess.Popen(
            [str(dg), "dev", "--log-level", "warning", "-w", str(REPO / "workspace.yaml"),
             "-h", "127.0.0.1", "-p", str(port)],
            cwd=home, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    os.environ["DAGSTER_HOME"] = str(home)
    try:
        with DagsterInstance.get() as instance:

            def of(book: str) -> list[Any]:
                return sorted(
                    instance.get_run_records(RunsFilter(tags={"dagster/partition": book})),
                    key=lambda r: r.storage_id,
                )

            def wait(predicate: Any, timeout: float, what: str) -> Any:
                return wait_for(proc, "dg dev", predicate, timeout, what)

            success = DagsterRunStatus.SUCCESS
            wait(lambda: [r for r in of(SMALL) if r.dagster_run.status == success], 600, SMALL)
            shutil.move(work / "big", data / BIG)
            big = wait(lambda: [r for r in of(BIG) if r.start_time], 600, "the big run")[0]
            time.sleep(max(0.0, big.start_time + 5 - time.time()))
            edited = data / SMALL / EDITED
            edited.write_text(edited.read_text() + "\n\nZebra quartz umbrella.\n")
            saved = time.time()
            second = wait(lambda: of(SMALL)[1:], 120, "the edit's run")[0].dagster_run.run_id

            def ended(run_id: str) -> Any:
                record = instance.get_run_record_by_id(run_id)
                return record if record and record.dagster_run.is_finished else None

            small = wait(lambda: ended(second), 1200, "the edit's run to end")
            big_end = wait(lambda: ended(big.dagster_run.run_id), 1200, "the big run to end")
            created = small.create_timestamp.timestamp()
            return {
                "max_concurrent_runs": runs,
                "edit_to_run_end_s": round(small.end_time - saved, 1),
                "edit_queued_s": round(small.start_time - created, 1),
                "edit_run_s": round(small.end_time - small.start_time, 1),
                "big_ingest_s": round(big_end.end_time - big.start_time, 1),
                "big_ended_before_edit": big_end.end_time < small.end_time,
                "statuses": [small.dagster_run.status.value, big_end.dagster_run.status.value],
            }
    finally:
        stop_group(proc)


def stop_group(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM to the process group ``proc`` leads, SIGKILL if it is still there 60 s later."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a running process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_live(
    workers: int, work: Path, files: int, sections: int, embedder: str
) -> dict[str, Any]:
    """The same scenario through live mode (``rag-pipeline watch`` with ``workers``): the big
    book's first ingest from its run's creation (live runs do their work before they start),
    the small book's edit from its save to its run's end."""
    import json
    import threading

    from dagster import DagsterInstance, RunsFilter

    data = work / "books"
    shutil.copytree(REPO / "data" / "books" / SMALL, data / SMALL)
    write_big_book(work / "big", files, sections)
    home = work / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    env = scenario_env(data, work, DAGSTER_HOME=str(home), RAG_EMBEDDER=embedder)
    env["RAG_CACHE_DIR"] = os.environ.get("RAG_CACHE_DIR", str(REPO / ".rag" / "cache"))
    env["RAG_LIVE_WORKERS"] = str(workers)
    with open(work / "watch.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rag_pipeline.cli", "watch", "--json"],
            cwd=work, env=env, stdout=subprocess.PIPE, stderr=log, text=True,
            start_new_session=True,
        )  # fmt: skip
    events: list[dict[str, Any]] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            event = json.loads(line)
            event["at"] = time.time()
            events.append(event)

    threading.Thread(target=read, daemon=True).start()

    def wait(predicate: Any, timeout: float, what: str) -> Any:
        return wait_for(proc, "rag-pipeline watch", predicate, timeout, what)

    def applied(book: str, after: float) -> Any:
        for event in events:
            report = event.get("report", {}).get("books", {})
            if event["at"] > after and report.get(book, {}).get("status") == "ingested":
                return event
        return None

    os.environ["DAGSTER_HOME"] = str(home)
    try:
        wait(lambda: any(e["event"] == "ready" for e in events), 600, "ready")
        with DagsterInstance.get() as instance:

            def of(book: str) -> list[Any]:
                return sorted(
                    instance.get_run_records(RunsFilter(tags={"dagster/partition": book})),
                    key=lambda r: r.storage_id,
                )

            cpu_before = process_cpu_s(proc.pid)
            moved = time.time()
            shutil.move(work / "big", data / BIG)
            big = wait(lambda: of(BIG), 600, "the big run")[0]
            time.sleep(max(0.0, big.create_timestamp.timestamp() + 5 - time.time()))
            edited = data / SMALL / EDITED
            edited.write_text(edited.read_text() + "\n\nZebra quartz umbrella.\n")
            saved = time.time()
            small_event = wait(lambda: applied(SMALL, saved), 1200, "the edit's run")
            big_event = wait(lambda: applied(BIG, moved), 1200, "the big run to end")
            cpu = process_cpu_s(proc.pid) - cpu_before
            small = instance.get_run_record_by_id(small_event["report"]["books"][SMALL]["run_id"])
            big_end = instance.get_run_record_by_id(big_event["report"]["books"][BIG]["run_id"])
            created = small.create_timestamp.timestamp()
            return {
                "live_workers": workers,
                "edit_to_run_end_s": round(small.end_time - saved, 1),
                "edit_queued_s": round(created - saved, 1),
                "edit_run_s": round(small.end_time - created, 1),
                "big_ingest_s": round(big_end.end_time - big.create_timestamp.timestamp(), 1),
                "big_ended_before_edit": big_end.end_time < small.end_time,
                "live_cpu_s": round(cpu, 1),
                "statuses": [small.dagster_run.status.value, big_end.dagster_run.status.value],
            }
    finally:
        stop_group(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default="1,2,3", help="max_concurrent_runs values to measure")
    parser.add_argument("--files", type=int, default=12)
    parser.add_argument("--sections", type=int, default=20)
    parser.add_argument("--embedder", default="local")
    parser.add_argument(
        "--live",
        default="",
        help="live mode's worker counts to measure instead of the daemon (e.g. 1,2)",
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # dg dev is stopped on the way out
    if args.live:
        main_live([int(n) for n in args.live.split(",")], args)
        return
    results = []
    for runs in [int(n) for n in args.runs.split(",")]:
        with tempfile.TemporaryDirectory(prefix=f"concurrent-{runs}-") as work:
            results.append(measure(runs, Path(work), args.files, args.sections, args.embedder))
        print(results[-1], flush=True)
    out = {"cores": os.cpu_count(), "files": args.files, "sections": args.sections}
    out["results"] = results
    save_results("concurrent_runs", out)
    print("| max_concurrent_runs | edit -> its run's end | queued | its run | big first ingest |")
    print("|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['max_concurrent_runs']} | {r['edit_to_run_end_s']} s | {r['edit_queued_s']} s"
            f" | {r['edit_run_s']} s | {r['big_ingest_s']} s |"
        )


def main_live(counts: list[int], args: argparse.Namespace) -> None:
    results = []
    for workers in counts:
        with tempfile.TemporaryDirectory(prefix=f"concurrent-live-{workers}-") as work:
            results.append(
                measure_live(workers, Path(work), args.files, args.sections, args.embedder)
            )
        print(results[-1], flush=True)
    out = {"cores": os.cpu_count(), "files": args.files, "sections": args.sections}
    out["load_average"] = os.getloadavg()
    out["results"] = results
    save_results("concurrent_runs_live", out)
    print("| live workers | edit -> its run's end | its run | big first ingest | live CPU |")
    print("|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['live_workers']} | {r['edit_to_run_end_s']} s | {r['edit_run_s']} s"
            f" | {r['big_ingest_s']} s | {r['live_cpu_s']} s |"
        )


if __name__ == "__main__":
    main()

"""Freshness under `make ui`: seconds from a saved edit to its chunk in `serve`'s answers.

    python bench/freshness.py [--edits 5] [--configs old,current] [--idle-s 60] [--seed 7]

For each configuration, on a fresh temp folder: the project's ``dagster.yaml`` in a new
``DAGSTER_HOME``, a copy of ``data/books/ros2-fundamentals``, ``RAG_EMBEDDER=hash`` (the
pipeline's own delay, not the model's); ``dagster dev -w workspace.yaml`` started from
``DAGSTER_HOME`` as ``make ui`` starts it, and ``rag-pipeline serve``. Once the first ingest
is searchable and no run is in flight:

1. the CPU seconds of the ``dagster dev`` process tree (webserver, daemon, code server;
   ``/proc``, reaped children included) over ``--idle-s`` seconds with nothing to do: what
   the sensor and queue intervals cost while idle;
2. ``--edits`` times: a random pause (uniform over one sensor interval, so that an edit lands
   anywhere in the sensor's cycle), a unique word appended to one file, then ``/search`` for
   that word (sparse, every 0.2 s) until a hit's text holds it. Each edit's seconds are split
   by the ingest run's own events: to the run's creation (sensor interval and tick), queued
   (to ``RunStartingEvent``: the daemon's dequeue pass), launch (to ``RunStartEvent``: run
   worker start and code load), the run, and what is left (serve; negative when the point was
   found before the run's last events).

Configurations: ``current`` is the code's defaults (``RAG_SENSOR_INTERVAL_S`` unset, the
repository's ``dagster.yaml``); ``old`` the defaults before issue 17 (a 30 s sensor interval,
Dagster's default 5 s dequeue interval). Prints one JSON object (also written to
bench/results/freshness.json) and a table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from common import scenario_env

REPO = Path(__file__).resolve().parents[1]
BOOK = "ros2-fundamentals"
EDITED_FILE = "01-chapter-1-ros2-fundamentals/03-nodes-communication.md"
#: a word every indexed copy of the book holds: its first ingest is searchable
FIRST_INGEST_QUERY = "nodes"
POLL_S = 0.2
#: the defaults before issue 17: (RAG_SENSOR_INTERVAL_S, dequeue_interval_seconds)
OLD_DEFAULTS = (30, 5)
IN_FLIGHT = {"QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING"}
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_json(url: str, timeout: float = 30) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def old_dagster_yaml(text: str) -> str:
    """The project's dagster.yaml with the dequeue interval set back to Dagster's default."""
    return re.sub(
        r"dequeue_interval_seconds: *\d+", f"dequeue_interval_seconds: {OLD_DEFAULTS[1]}", text
    )


def current_sensor_interval() -> int:
    from rag_pipeline.config import Settings

    return int(Settings.model_fields["sensor_interval_s"].default)


# -- process CPU ------------------------------------------------------------------------------


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds of the process and its reaped children)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
    return int(fields[1]), (utime + stime + cutime + cstime) / CLOCK_TICKS


def _label(pid: int) -> str:
    """What a process of the tree is: the dagster subcommand it runs (webserver, daemon ...)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "gone"
    words = [Path(a).name for a in argv if a and not a.startswith("-")]
    for known in ("dagster-webserver", "dagster-daemon", "grpc", "execute_run", "dev"):
        if known in words:
            return known
    return " ".join(words[:3])


def tree_cpu_s(root: int) -> dict[str, float]:
    """CPU seconds of ``root`` and every live descendant (with their reaped children), by
    :func:`_label`."""
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            stats[int(entry.name)] = stat
    out: dict[str, float] = {}
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        if pid in stats:
            label = _label(pid)
            out[label] = out.get(label, 0.0) + stats[pid][1]
        frontier.extend(p for p, (ppid, _) in stats.items() if ppid == pid)
    return out


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: round(after.get(k, 0.0) - before.get(k, 0.0), 2) for k in sorted(after)}


# -- one configuration ------------------------------------------------------------------------


class Setup:
    """`dagster dev` and `rag-pipeline serve` on a temp folder, as `make ui` runs them."""

    def __init__(self, name: str, work: Path) -> None:
        self.name = name
        self.work = work
        self.data = work / "books"
        shutil.copytree(REPO / "data" / "books" / BOOK, self.data / BOOK)
        self.home = work / "dagster_home"
        self.home.mkdir()
        config = (REPO / "dagster.yaml").read_text()
        self.sensor_interval_s = OLD_DEFAULTS[0] if name == "old" else current_sensor_interval()
        (self.home / "dagster.yaml").write_text(
            old_dagster_yaml(config) if name == "old" else config
        )
        self.env = scenario_env(self.data, work, DAGSTER_HOME=str(self.home))
        self.env.pop("RAG_SENSOR_INTERVAL_S", None)
        if name == "old":
            self.env["RAG_SENSOR_INTERVAL_S"] = str(OLD_DEFAULTS[0])
        self.dequeue_interval_s = dequeue_interval((self.home / "dagster.yaml").read_text())
        self.dagster_port, self.serve_port = free_port(), free_port()
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        # migrate the fresh instance first: doing it while the webserver starts races
        subprocess.run(
            [sys.executable, "-c", "from dagster import DagsterInstance; DagsterInstance.get()"],
            env=self.env,
            check=True,
            timeout=180,
        )
        bin_dir = Path(sys.executable).parent
        self.dagster = self._spawn(
            [
                *(str(bin_dir / "dagster"), "dev", "-w", str(REPO / "workspace.yaml")),
                *("-h", "127.0.0.1", "-p", str(self.dagster_port)),
            ],
            "dagster-dev.log",
            cwd=self.home,
        )
        self.serve = self._spawn(
            [
                *(sys.executable, "-m", "rag_pipeline.cli", "serve"),
                *("--port", str(self.serve_port)),
            ],
            "serve.log",
            cwd=self.work,
        )
        self.wait_for(lambda: get_json(f"{self.serve_url}/health", 2), 180, "serve")
        self.wait_for(lambda: self.runs() is not None, 180, "the Dagster webserver")

    def _spawn(self, cmd: list[str], log: str, cwd: Path) -> subprocess.Popen[bytes]:
        with open(self.work / log, "wb") as out:
            # its own process group, so that SIGTERM reaches every child
            proc = subprocess.Popen(
                cmd, cwd=cwd, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)

    @property
    def serve_url(self) -> str:
        return f"http://127.0.0.1:{self.serve_port}"

    def wait_for(self, predicate: Any, timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                if value := predicate():
                    return value
            except Exception as exc:  # not up yet
                last = exc
            if any(p.poll() is not None for p in self.procs):
                raise SystemExit(f"{self.name}: a process exited while waiting for {what}")
            time.sleep(POLL_S)
        raise SystemExit(f"{self.name}: timed out after {timeout}s waiting for {what} ({last})")

    def search_holds(self, word: str) -> bool:
        query = urllib.parse.urlencode({"q": word, "book": BOOK, "mode": "sparse", "limit": 3})
        hits = get_json(f"{self.serve_url}/search?{query}")
        return any(word in (hit.get("text") or "") for hit in hits)

    def graphql(self, query: str, **variables: Any) -> Any:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.dagster_port}/graphql",
            data=json.dumps({"query": query, "variables": variables}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            body = json.loads(response.read())
        if "errors" in body:
            raise RuntimeError(body["errors"])
        return body["data"]

    def runs(self) -> list[dict[str, Any]]:
        data = self.graphql("""query { runsOrError(limit: 20) { ... on Runs { results {
            runId status jobName creationTime tags { key value } } } } }""")
        return list(data["runsOrError"]["results"])

    def run_events(self, run_id: str) -> dict[str, float]:
        """The first timestamp (epoch s) of each event type of a run."""
        data = self.graphql(
            """query($id: ID!) { runOrError(runId: $id) { ... on Run { eventConnection {
            events { __typename ... on MessageEvent { timestamp } } } } } }""",
            id=run_id,
        )
        out: dict[str, float] = {}
        for event in data["runOrError"]["eventConnection"]["events"]:
            if event.get("timestamp"):
                out.setdefault(event["__typename"], int(event["timestamp"]) / 1000)
        return out

    def tick_spacing_s(self) -> float | None:
        """The median seconds between the books sensor's latest ticks."""
        data = self.graphql(
            """query($s: SensorSelector!) { sensorOrError(sensorSelector: $s) { ... on Sensor {
            sensorState { ticks(limit: 40) { timestamp } } } } }""",
            s={
                "repositoryLocationName": "rag_pipeline",
                "repositoryName": "__repository__",
                "sensorName": "books_sensor",
            },
        )
        stamps = sorted(t["timestamp"] for t in data["sensorOrError"]["sensorState"]["ticks"])
        gaps = [b - a for a, b in itertools.pairwise(stamps)]
        return round(statistics.median(gaps), 2) if gaps else None

    def idle(self) -> bool:
        return not any(r["status"] in IN_FLIGHT for r in self.runs())


def phases(setup: Setup, edited_at: float, found_at: float) -> dict[str, Any]:
    """An edit's seconds, split by the first ingest run of the book created after it."""
    runs = [
        r
        for r in setup.runs()
        if r["jobName"] == "ingest_books"
        and r["creationTime"] >= edited_at
        and {"key": "dagster/partition", "value": BOOK} in r["tags"]
    ]
    if not runs:
        return {}
    run = min(runs, key=lambda r: r["creationTime"])
    events = setup.run_events(run["runId"])
    points = [
        ("to_run_created", run["creationTime"]),
        ("queued", events.get("RunDequeuedEvent") or events.get("RunStartingEvent")),
        ("launch", events.get("RunStartEvent")),
        ("run", events.get("RunSuccessEvent")),
        ("serve", found_at),
    ]
    # a phase whose event is missing is counted in the next one
    out: dict[str, float] = {}
    before = edited_at
    for name, at in points:
        if at is not None:
            out[name] = round(at - before, 2)
            before = at
    out["events"] = {
        k: round(v - edited_at, 2) for k, v in sorted(events.items(), key=lambda e: e[1])
    }
    return out


def measure(name: str, edits: int, idle_s: float, rng: random.Random) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"freshness-{name}-") as tmp:
        setup = Setup(name, Path(tmp))
        try:
            started = time.monotonic()
            setup.start()
            setup.wait_for(lambda: setup.search_holds(FIRST_INGEST_QUERY), 300, "the first ingest")
            first_s = time.monotonic() - started
            setup.wait_for(setup.idle, 120, "no run in flight")
            cpu_before = tree_cpu_s(setup.dagster.pid)
            time.sleep(idle_s)
            idle_cpu = cpu_delta(cpu_before, tree_cpu_s(setup.dagster.pid))
            results = []
            edited = setup.data / BOOK / EDITED_FILE
            edits_cpu_before = tree_cpu_s(setup.dagster.pid)
            for i in range(edits):
                time.sleep(rng.uniform(0, setup.sensor_interval_s))
                word = f"freshness{uuid.uuid4().hex[:12]}"
                with open(edited, "a", encoding="utf-8") as f:
                    f.write(f"\n\nEdit {i}: the freshness marker {word}.\n")
                edited_at = time.time()
                setup.wait_for(lambda w=word: setup.search_holds(w), 600, f"edit {i}")  # type: ignore[misc]
                found_at = time.time()
                results.append(
                    {
                        "seconds": round(found_at - edited_at, 2),
                        **phases(setup, edited_at, found_at),
                    }
                )
                print(f"{name} edit {i}: {results[-1]}", file=sys.stderr, flush=True)
            edits_cpu = sum(cpu_delta(edits_cpu_before, tree_cpu_s(setup.dagster.pid)).values())
            tick_spacing = setup.tick_spacing_s()
        finally:
            setup.stop()
    seconds = [r["seconds"] for r in results]
    return {
        "config": name,
        "sensor_interval_s": setup.sensor_interval_s,
        "dequeue_interval_s": setup.dequeue_interval_s,
        "sensor_tick_spacing_s": tick_spacing,
        "first_ingest_searchable_s": round(first_s, 1),
        "idle_cpu_s_per_min": round(sum(idle_cpu.values()) * 60 / idle_s, 2),
        "idle_cpu_s_per_min_by_process": {
            k: round(v * 60 / idle_s, 2) for k, v in idle_cpu.items()
        },
        "edit_phase_cpu_s_per_edit": round(edits_cpu / max(edits, 1), 2),
        "edits": results,
        "p50_s": round(statistics.median(seconds), 2),
        "max_s": max(seconds),
    }


def dequeue_interval(config: str) -> int:
    """The dequeue interval a dagster.yaml sets."""
    found = re.search(r"dequeue_interval_seconds: *(\d+)", config)
    return int(found.group(1)) if found else OLD_DEFAULTS[1]  # Dagster's own default


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edits", type=int, default=5)
    parser.add_argument("--configs", default="old,current", help="comma-separated: old, current")
    parser.add_argument("--idle-s", type=float, default=60, help="idle CPU window per config")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    if not configs or set(configs) - {"old", "current"}:
        parser.error("--configs takes old and/or current")
    report = {
        "edits": args.edits,
        "results": [measure(c, args.edits, args.idle_s, rng) for c in configs],
    }
    out = REPO / "bench" / "results" / "freshness.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    for r in report["results"]:
        per_edit = [e["seconds"] for e in r["edits"]]
        print(
            f"{r['config']:<8} sensor {r['sensor_interval_s']} s (ticks every"
            f" {r['sensor_tick_spacing_s']} s), dequeue {r['dequeue_interval_s']} s:"
            f" p50 {r['p50_s']} s, max {r['max_s']} s, per edit {per_edit};"
            f" idle CPU {r['idle_cpu_s_per_min']} s/min"
        )


if __name__ == "__main__":
    main()

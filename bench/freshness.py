"""Freshness: seconds from a saved edit to its chunk in `serve`'s answers, with the default
local model, for each way changes reach the index.

    python bench/freshness.py [--edits 10] [--configs live,ui,sensor] [--idle-s 60]
                              [--embedder local] [--seed 7]

Configurations, each on a fresh temp folder (a copy of ``data/books/ros2-fundamentals``, the
project's ``dagster.yaml`` in a new ``DAGSTER_HOME``), with ``rag-pipeline serve`` beside:

* ``live``: ``rag-pipeline watch`` alone (live mode, no Dagster webserver or daemon);
* ``ui``: ``make ui`` as a user runs it (``dg dev`` and live mode; the books sensor defers);
* ``sensor``: ``make ui`` with ``RAG_LIVE=0``: the books sensor, the daemon's run queue and a
  run worker that loads the model (``current`` is its old name).

Once the first ingest is searchable and no run is in flight:

1. the CPU seconds of the process tree (``/proc``, reaped children included) over
   ``--idle-s`` seconds with nothing to do, by process (the live process, the webserver, the
   daemon, the code server);
2. ``--edits`` times: a random pause (uniform over one sensor interval, so that an edit lands
   anywhere in the sensor's cycle), a unique word appended to one file, then ``/search`` for
   that word (sparse, every 0.05 s) until a hit's text holds it. Each edit's seconds are split
   by the ingest run's own events: to the run's creation (the sensor's tick, or live mode's
   debounce and look), queued (to ``RunStartingEvent``: the daemon's dequeue pass), launch
   (to ``RunStartEvent``: run worker start, code and model load; in live mode the run's
   stages and its points' write, done before its events), the run, and what is left
   (serve; negative when the point was found before the run's last events); beside them,
   seconds from the run's creation to the hit, and by how much the hit came before the
   run's start event (live mode writes the points first).

Prints one JSON object (also written to bench/results/freshness.json) and a table.
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
POLL_S = 0.05
#: Dagster's own dequeue interval (where a dagster.yaml sets none)
DAGSTER_DEQUEUE_S = 5
CONFIGS = ("live", "ui", "sensor")
ALIASES = {"current": "sensor"}
IN_FLIGHT = {"QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING"}
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_json(url: str, timeout: float = 30) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


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
    for known in (
        "watch",
        "serve",
        "dagster-webserver",
        "dagster-daemon",
        "grpc",
        "execute_run",
        "dev",
    ):
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
    """The processes of one configuration and `rag-pipeline serve` on a temp folder."""

    def __init__(self, name: str, work: Path, embedder: str) -> None:
        self.name = name
        self.work = work
        self.data = work / "books"
        shutil.copytree(REPO / "data" / "books" / BOOK, self.data / BOOK)
        self.home = work / "dagster_home"
        self.home.mkdir()
        shutil.copy(REPO / "dagster.yaml", self.home / "dagster.yaml")
        self.sensor_interval_s = current_sensor_interval()
        self.env = scenario_env(self.data, work, DAGSTER_HOME=str(self.home), RAG_EMBEDDER=embedder)
        self.env.pop("RAG_SENSOR_INTERVAL_S", None)
        self.env.pop("RAG_LIVE", None)
        if embedder == "local":  # the model cache every run worker shares, as make ui has it
            self.env["RAG_CACHE_DIR"] = str(REPO / ".rag" / "cache")
        self.dequeue_interval_s = dequeue_interval((self.home / "dagster.yaml").read_text())
        self.dagster_port, self.serve_port = free_port(), free_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.root: subprocess.Popen[bytes] | None = None  # the tree whose CPU is measured

    @property
    def dagster(self) -> bool:
        return self.name != "live"

    def start(self) -> None:
        # migrate the fresh instance first: doing it while the webserver starts races
        subprocess.run(
            [sys.executable, "-c", "from dagster import DagsterInstance; DagsterInstance.get()"],
            env=self.env,
            check=True,
            timeout=180,
        )
        if self.name == "live":
            # -v: the log line of each run's stages (its per-edit breakdown)
            self.root = self._spawn(
                [sys.executable, "-m", "rag_pipeline.cli", "-v", "watch"],
                "watch.log",
                cwd=self.work,
            )
        else:  # make ui, as a user runs it (its paths under this folder, its own port)
            env = {**self.env, "UI_ARGS": f"-h 127.0.0.1 -p {self.dagster_port}"}
            if self.name == "sensor":
                env["RAG_LIVE"] = "0"
            self.root = self._spawn(["make", "-s", "-C", str(REPO), "ui"], "make-ui.log", REPO, env)
        self.serve = self._spawn(
            [
                *(sys.executable, "-m", "rag_pipeline.cli", "serve"),
                *("--port", str(self.serve_port)),
            ],
            "serve.log",
            cwd=self.work,
        )
        self.wait_for(lambda: get_json(f"{self.serve_url}/health", 2), 180, "serve")
        if self.dagster:
            self.wait_for(lambda: self.runs() is not None, 180, "the Dagster webserver")

    def _spawn(
        self, cmd: list[str], log: str, cwd: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        with open(self.work / log, "wb") as out:
            # its own process group, so that SIGTERM reaches every child
            proc = subprocess.Popen(
                cmd, cwd=cwd, env=env or self.env, stdout=out, stderr=subprocess.STDOUT,
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

    def instance(self) -> Any:
        """The configuration's Dagster instance (its DAGSTER_HOME), read from this process."""
        from dagster import DagsterInstance

        os.environ["DAGSTER_HOME"] = str(self.home)
        return DagsterInstance.get()

    def runs(self) -> list[Any]:
        """The latest ingest and purge run records."""
        from dagster import RunsFilter

        with self.instance() as instance:
            return list(instance.get_run_records(RunsFilter(), limit=20))

    def run_events(self, run_id: str) -> dict[str, float]:
        """The first timestamp (epoch s) of each event type of a run, and of the write of its
        points (``points_written``: the qdrant_points step's success)."""
        with self.instance() as instance:
            logs = instance.all_logs(run_id)
        out: dict[str, float] = {}
        for entry in logs:
            event = entry.dagster_event
            if event is None:
                continue
            out.setdefault(event.event_type_value, entry.timestamp)
            if event.event_type_value == "STEP_SUCCESS" and event.step_key == "qdrant_points":
                out.setdefault("points_written", entry.timestamp)
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
        return not any(r.dagster_run.status.value in IN_FLIGHT for r in self.runs())


def phases(setup: Setup, edited_at: float, found_at: float) -> dict[str, Any]:
    """An edit's seconds, split by the first ingest run of the book created after it."""
    runs = [
        r
        for r in setup.runs()
        if r.dagster_run.job_name == "ingest_books"
        and r.create_timestamp.timestamp() >= edited_at
        and r.dagster_run.tags.get("dagster/partition") == BOOK
    ]
    if not runs:
        return {}
    record = min(runs, key=lambda r: r.create_timestamp)
    events = setup.run_events(record.dagster_run.run_id)
    points = [
        ("to_run_created", record.create_timestamp.timestamp()),
        ("queued", events.get("PIPELINE_DEQUEUED") or events.get("PIPELINE_STARTING")),
        ("launch", events.get("PIPELINE_START")),
        ("to_points_written", events.get("points_written")),
        ("run_end", events.get("PIPELINE_SUCCESS")),
    ]
    # a phase whose event is missing is counted in the next one
    out: dict[str, Any] = {}
    before = edited_at
    for name, at in points:
        if at is not None:
            out[name] = round(at - before, 2)
            before = at
    written = events.get("points_written")
    out["found_after_points_written"] = round(found_at - written, 2) if written else None
    # live mode does a run's stages and writes its points between the run's creation and
    # its start event ("launch"): an edit is found before its run's own events
    created = record.create_timestamp.timestamp()
    out["found_after_run_created"] = round(found_at - created, 2)
    start = events.get("PIPELINE_START")
    out["found_before_run_start"] = round(start - found_at, 2) if start else None
    if (stages := prepared_stages(setup, record.dagster_run.run_id)) is not None:
        out.update(breakdown(stages, edited_at, created, found_at))
    return out


#: live mode's log line of a run's stages done before its events (IngestPipeline.prepare)
_PREPARED = re.compile(r"run (?P<run>[0-9a-f-]+) prepared: started at (?P<at>[0-9.]+), (?P<s>.*)")


def prepared_stages(setup: Setup, run_id: str) -> dict[str, float] | None:
    """When live mode began the run's stages (``"at"``, epoch s) and each stage's seconds
    (``close``: its store handles flushed and let go), from its log (None: not found)."""
    log = setup.work / "watch.log"
    if not log.exists():
        return None
    for line in log.read_text(errors="replace").splitlines():
        found = _PREPARED.search(line)
        if found and found["run"] == run_id:
            stages = {"at": float(found["at"])}
            for part in found["s"].split(", "):
                name, _, seconds = part.partition(" ")
                stages[name] = float(seconds.removesuffix(" s"))
            return stages
    return None


def breakdown(
    stages: dict[str, float], edited_at: float, created: float, found_at: float
) -> dict[str, Any]:
    """An edit's seconds in live mode, end to end: to its stages' start (debounce, look,
    plan; the run's record begins then too), each stage, ``recorded`` (the wait for the
    run's record before the write, where the stages were done first), the store let go
    (``close``: flush, unlock), then until ``serve`` answered with the edit (its notice,
    reopen and the bench's poll); beside them, when the run's record was created."""
    at = stages.pop("at")
    done = at + sum(stages.values())
    return {
        "breakdown": {
            "to_stages_start": round(at - edited_at, 3),
            **{name: round(s, 3) for name, s in stages.items()},
            "serve_found": round(found_at - done, 3),
        },
        "run_created_after_stages_start": round(created - at, 3),
    }


def percentile(values: list[float], q: int) -> float:
    """The ``q``-th percentile (inclusive method: within the values measured)."""
    if len(values) < 2:
        return values[0]
    return round(statistics.quantiles(values, n=100, method="inclusive")[q - 1], 2)


def measure(
    name: str, edits: int, idle_s: float, rng: random.Random, embedder: str
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"freshness-{name}-") as tmp:
        setup = Setup(name, Path(tmp), embedder)
        try:
            started = time.monotonic()
            setup.start()
            setup.wait_for(lambda: setup.search_holds(FIRST_INGEST_QUERY), 600, "the first ingest")
            first_s = time.monotonic() - started
            setup.wait_for(setup.idle, 120, "no run in flight")
            time.sleep(2)  # the collection's refresh after the first ingest
            assert setup.root is not None
            cpu_before = tree_cpu_s(setup.root.pid)
            time.sleep(idle_s)
            idle_cpu = cpu_delta(cpu_before, tree_cpu_s(setup.root.pid))
            results = []
            edited = setup.data / BOOK / EDITED_FILE
            edits_cpu_before = tree_cpu_s(setup.root.pid)
            for i in range(edits):
                time.sleep(rng.uniform(0, setup.sensor_interval_s))
                word = f"freshness{uuid.uuid4().hex[:12]}"
                with open(edited, "a", encoding="utf-8") as f:
                    f.write(f"\n\nEdit {i}: the freshness marker {word}.\n")
                edited_at = time.time()
                setup.wait_for(lambda w=word: setup.search_holds(w), 600, f"edit {i}")  # type: ignore[misc]
                found_at = time.time()
                setup.wait_for(setup.idle, 120, "the edit's run to end")
                results.append(
                    {
                        "seconds": round(found_at - edited_at, 2),
                        **phases(setup, edited_at, found_at),
                    }
                )
                print(f"{name} edit {i}: {results[-1]}", file=sys.stderr, flush=True)
            edits_cpu = sum(cpu_delta(edits_cpu_before, tree_cpu_s(setup.root.pid)).values())
            tick_spacing = setup.tick_spacing_s() if name == "sensor" else None
        finally:
            setup.stop()
            logs = REPO / "bench" / "results" / f"freshness-{name}-logs"
            logs.mkdir(parents=True, exist_ok=True)
            for log in Path(tmp).glob("*.log"):  # what each process said, kept for a look
                shutil.copy(log, logs / log.name)
    seconds = [r["seconds"] for r in results]
    parts = [r["breakdown"] for r in results if "breakdown" in r]
    median_breakdown = (
        {k: round(statistics.median(p.get(k, 0.0) for p in parts), 3) for k in parts[-1]}
        if parts
        else None
    )
    return {
        "config": name,
        "embedder": embedder,
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
        "median_breakdown_s": median_breakdown,
        "p50_s": round(statistics.median(seconds), 2),
        "p95_s": percentile(seconds, 95),
        "max_s": max(seconds),
    }


def dequeue_interval(config: str) -> int:
    """The dequeue interval a dagster.yaml sets."""
    found = re.search(r"dequeue_interval_seconds: *(\d+)", config)
    return int(found.group(1)) if found else DAGSTER_DEQUEUE_S


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edits", type=int, default=10)
    parser.add_argument(
        "--configs", default=",".join(CONFIGS), help=f"comma-separated: {', '.join(CONFIGS)}"
    )
    parser.add_argument("--idle-s", type=float, default=60, help="idle CPU window per config")
    parser.add_argument("--embedder", default="local", choices=["local", "hash"])
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    configs = [ALIASES.get(c.strip(), c.strip()) for c in args.configs.split(",") if c.strip()]
    if not configs or set(configs) - set(CONFIGS):
        parser.error(f"--configs takes {', '.join(CONFIGS)}")
    report = {
        "edits": args.edits,
        "results": [measure(c, args.edits, args.idle_s, rng, args.embedder) for c in configs],
    }
    out = REPO / "bench" / "results" / "freshness.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    for r in report["results"]:
        per_edit = [e["seconds"] for e in r["edits"]]
        print(
            f"{r['config']:<7} {r['embedder']}: p50 {r['p50_s']} s, p95 {r['p95_s']} s,"
            f" max {r['max_s']} s, per edit {per_edit}; idle CPU {r['idle_cpu_s_per_min']}"
            f" s/min {r['idle_cpu_s_per_min_by_process']}"
        )
        if r.get("median_breakdown_s"):
            print(f"        median per edit (s): {r['median_breakdown_s']}")


if __name__ == "__main__":
    main()

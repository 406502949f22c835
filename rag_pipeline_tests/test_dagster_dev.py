"""The real `dg dev` (what `make ui` runs: webserver + daemon) on a temp workspace, driven as a
user would: the sensor ingests new books and follows an edit, a partition is materialized
through the webserver's GraphQL API (what the UI's Materialize button sends), and Chromium loads
the asset graph page."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import requests

from rag_pipeline.defs.metadata import markdown_rows
from rag_pipeline.ui_terminal import STOP_GRACE_S
from rag_pipeline_tests.conftest import REPO
from rag_pipeline_tests.helpers import cli_env
from rag_pipeline_tests.ui_badge import CHECKS as BADGE
from rag_pipeline_tests.ui_badge import node_badge

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ARTIFACTS = REPO / "test-artifacts"
LOCATION = "rag_pipeline"
REPOSITORY = "__repository__"
ASSETS = ["source_files", "documents", "chunks", "chunk_embeddings", "qdrant_points"]
CHECKS = [
    ("documents", "parse_errors"),
    ("chunks", "chunks_valid"),
    ("chunk_embeddings", "vector_dimension"),
    ("qdrant_points", "index_consistency"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DagsterDev:
    """``dg dev`` as ``make ui`` runs it; ``webserver_only``: the webserver alone (no daemon:
    no sensor starts a run), to read what runs recorded."""

    def __init__(self, tmp_path: Path, data_dir: Path, *, webserver_only: bool = False):
        self.webserver_only = webserver_only
        self.port = free_port()
        self.home = tmp_path / "dagster_home"
        self.home.mkdir()
        config = (REPO / "dagster.yaml").read_text()
        (self.home / "dagster.yaml").write_text(config)
        self.env = {
            **cli_env(tmp_path, data_dir),
            "DAGSTER_HOME": str(self.home),
            "RAG_SENSOR_INTERVAL_S": "3",
            "PYTHONWARNINGS": "ignore",
        }
        self.log_path = tmp_path / "dagster-dev.log"
        self.log = open(self.log_path, "w")  # noqa: SIM115
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.terminal: subprocess.Popen | None = None

    def start(self) -> None:
        # migrate the fresh instance first: doing it while the webserver starts races (here,
        # where Dagster is imported already, not in a process of its own that imports it)
        from dagster import DagsterInstance

        with DagsterInstance.from_config(str(self.home)):
            pass
        dg = Path(sys.executable).with_name("dg")  # what `make ui` runs, as it runs it
        command = [str(dg), "dev", "--log-level", "warning"]
        if self.webserver_only:
            command = [str(Path(sys.executable).with_name("dagster-webserver"))]
        self.proc = subprocess.Popen(
            [
                *command,
                *("-w", str(REPO / "workspace.yaml")),
                *("-h", "127.0.0.1", "-p", str(self.port)),
            ],
            cwd=REPO,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # its own process group, so SIGTERM reaches every child
        # the terminal as `make ui` shows it
        self.terminal = subprocess.Popen(
            [sys.executable, "-m", "rag_pipeline.ui_terminal"],
            stdin=self.proc.stdout,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=self.env,
        )
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        self.wait_for(
            lambda: requests.get(f"{self.url}/server_info", timeout=2).ok,
            120,
            "the webserver to answer",
        )

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                # what `make ui` allows (rag_pipeline.ui_terminal kills what is left of the
                # group then); some stops after a Launchpad run, a backfill and CLI runs took
                # longer and were waited for 60 s
                self.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                print(f"dg dev still running {STOP_GRACE_S:g} s after SIGTERM: killed")
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if self.terminal is not None:
            try:
                self.terminal.wait(30)  # at the end of dg dev's output
            except subprocess.TimeoutExpired:
                # a process outside dg dev's group (a compute log's `tail` whose orphan watcher
                # had not started when the group was signalled) still holds the pipe: `make ui`
                # runs dg dev under ui_terminal, which kills what is left after 5 s; this filter
                # is only the tests' view of the terminal
                self.terminal.kill()
                self.terminal.wait(10)
        self.log.close()

    def terminal_lines(self) -> list[str]:
        """What the terminal of `make ui` showed so far."""
        return self.log_path.read_text().splitlines()

    def wait_for(self, predicate, timeout: float, what: str):  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                value = predicate()
                if value:
                    return value
            except Exception as exc:
                last = exc
            if self.proc and self.proc.poll() is not None:
                raise AssertionError(f"dagster dev exited while waiting for {what}")
            time.sleep(0.5)
        raise AssertionError(f"timed out after {timeout}s waiting for {what} ({last})")

    def graphql(self, query: str, **variables):  # type: ignore[no-untyped-def]
        response = requests.post(
            f"{self.url}/graphql", timeout=30, json={"query": query, "variables": variables}
        )
        response.raise_for_status()
        body = response.json()
        assert "errors" not in body, body
        return body["data"]

    def runs(self) -> list[dict]:
        data = self.graphql("""query { runsOrError(limit: 50) { ... on Runs { results {
            runId status jobName tags { key value } } } } }""")
        return data["runsOrError"]["results"]

    def book_runs(self, book: str, status: str = "SUCCESS") -> list[dict]:
        """Runs of the book: alone (its partition), or in a batch (a range of partitions;
        the tests' books are the range's two ends)."""
        return [r for r in self.runs() if r["status"] == status and covers(r, book)]

    def failed_runs(self) -> list[dict]:
        return [r for r in self.runs() if r["status"] == "FAILURE"]


def covers(run: dict, book: str) -> bool:
    tags = {t["key"]: t["value"] for t in run["tags"]}
    ends = (
        tags.get("dagster/asset_partition_range_start"),
        tags.get("dagster/asset_partition_range_end"),
    )
    return tags.get("dagster/partition") == book or book in ends


def trigger(run: dict) -> str | None:
    return next((t["value"] for t in run["tags"] if t["key"] == "rag/trigger"), None)


LAUNCH = """
mutation Launch($executionParams: ExecutionParams!) {
  launchPipelineExecution(executionParams: $executionParams) {
    __typename
    ... on LaunchRunSuccess { run { runId status } }
    ... on PythonError { message stack }
    ... on InvalidSubsetError { message }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}"""
RUN_STATUS = """query Status($runId: ID!) { runOrError(runId: $runId) {
  __typename ... on Run { status } } }"""


@pytest.fixture
def dev(tmp_path, sample_books):
    server = DagsterDev(tmp_path, sample_books)
    try:
        server.start()
        yield server
    finally:
        server.stop()


BACKFILL = """
mutation Backfill($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message stack }
  }
}"""
RUNS_OF_BOOK = """query Runs($filter: RunsFilter!) { runsOrError(filter: $filter) {
  ... on Runs { results { runId status jobName tags { key value } } } } }"""
METADATA_ENTRIES = """metadataEntries { label
        ... on MarkdownMetadataEntry { mdStr }
        ... on TextMetadataEntry { text }
        ... on TableMetadataEntry { table { records } }
        ... on BoolMetadataEntry { boolValue }
        ... on IntMetadataEntry { intValue } }"""
ASSET_EVENTS = (
    """query Events($path: [String!]!, $partitions: [String!]) {
  assetNodeOrError(assetKey: {path: $path}) { ... on AssetNode {
    assetMaterializations(limit: 5, partitions: $partitions) { runId partition """
    + METADATA_ENTRIES
    + """ }
    assetObservations(limit: 5, partitions: $partitions) { runId partition """
    + METADATA_ENTRIES
    + """ } } } }"""
)
#: a check's latest result and its per-partition results (what the check's page shows)
CHECK_STATUS = """query Check($path: [String!]!) {
  assetNodeOrError(assetKey: {path: $path}) { ... on AssetNode {
    assetChecksOrError { ... on AssetChecks { checks { name
      executionForLatestMaterialization { status evaluation { severity description } }
      partitionStatuses { ... on AssetCheckDefaultPartitionStatuses {
        succeededPartitions failedPartitions } } } } } } } }"""


def chromium_shot(page: str, name: str, tmp_path: Path) -> str:
    """Load ``page`` in headless Chromium: its DOM, and a screenshot in test-artifacts/."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (.ci/run installs Debian's package)")
    ARTIFACTS.mkdir(exist_ok=True)
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'chromium'}",
        "--window-size=1280,900",  # the window the collection page is laid out for
        "--virtual-time-budget=20000",
    ]
    shot = ARTIFACTS / name
    shot.unlink(missing_ok=True)  # a shot of an earlier session passes no check
    # one browser start for both, the DOM and the screenshot of the same load (two starts
    # cost 3-4 s more a page on a loaded 2-core machine)
    dom = subprocess.run(
        [chromium, *flags, "--dump-dom", f"--screenshot={shot}", page],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert shot.is_file() and shot.stat().st_size > 10_000
    for marker in ("PythonError", "Unexpected GraphQL error", "An unexpected error"):
        assert marker not in dom, marker
    return dom


def metadata(event: dict) -> dict:
    """label -> value; a table is its list of rows."""
    out = {}
    for entry in event["metadataEntries"]:
        if "table" in entry:
            out[entry["label"]] = [json.loads(r) for r in entry["table"]["records"]]
        for key in ("mdStr", "text", "boolValue", "intValue"):
            if key in entry:
                out[entry["label"]] = entry[key]
    return out


#: the sample books, new together: the sensor's first run is a batch of both
BOOKS = ["humanoid-robotics-ros2", "ros2-fundamentals"]
#: one collection_sensor interval (15 s), its tick, and a store a run may still hold
REFRESH_S = 60


def sensor_batch(dev: DagsterDev) -> dict:
    """The sensor (on by default) adds both partitions and ingests both books: new together,
    they share one run (a batch: a range of partitions)."""
    for book in BOOKS:
        dev.wait_for(lambda b=book: dev.book_runs(b), 300, f"the sensor's run for {book}")
    assert not dev.failed_runs()
    (first,) = dev.book_runs(BOOKS[0])
    assert dev.book_runs(BOOKS[1]) == [first] and trigger(first) == "books_sensor"
    assert {"key": "rag/batch", "value": "2 books"} in first["tags"]
    return first


def collection_rows(dev: DagsterDev, expect=lambda rows: True) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    """The collection page's per-book table, once it lists both books and ``expect`` holds."""
    events = dev.graphql(ASSET_EVENTS, path=["qdrant_collection"], partitions=None)
    found = events["assetNodeOrError"]["assetMaterializations"]
    table = metadata(found[0])["book_table"] if found else ""
    rows = {r["book"]: r for r in markdown_rows(table)}
    return rows if set(BOOKS) <= set(rows) and expect(rows) else {}


def runs_with_book_tag(dev: DagsterDev, book: str) -> list[dict]:
    """The one filter of a book's runs: rag-book/<book>=yes."""
    return dev.graphql(
        RUNS_OF_BOOK, filter={"tags": [{"key": f"rag-book/{book}", "value": "yes"}]}
    )["runsOrError"]["results"]


def dev_cli(dev: DagsterDev, tmp_path: Path, sample_books: Path):  # type: ignore[no-untyped-def]
    """The CLI against the same instance and store as ``dev``."""
    from rag_pipeline_tests.helpers import Cli

    cli = Cli(tmp_path, sample_books)
    cli.env.update(dev.env)
    cli.env["RAG_DAGSTER_URL"] = dev.url
    return cli


def assert_terminal_after_stop(dev: DagsterDev, daemon_runs: dict[str, str]) -> None:
    """After ``dev`` stopped: its terminal (as `make ui` shows it) had a line per start and end
    of each of ``daemon_runs`` (run id: who started it), and neither Dagster's INFO and DEBUG
    lines nor anything repeated every second."""
    terminal = dev.terminal_lines()
    for launched, by in daemon_runs.items():
        started = f"[rag_pipeline] run {launched[:8]} started: "
        assert [t for t in terminal if t.startswith(started) and t.endswith(f"(by {by})")], (
            launched,
            terminal,
        )
        ended = f"[rag_pipeline] run {launched[:8]} ended after "
        assert [t for t in terminal if t.startswith(ended) and t.endswith(": done")], terminal
    assert not [t for t in terminal if " - DEBUG - " in t or " - INFO - " in t], terminal
    assert "won't launch more" not in "\n".join(terminal)
    # log records repeated (the daemon's every-second lines), not the frames of a traceback:
    # on a loaded machine Dagster printed 10 tracebacks of failed gRPC queries to the code
    # server (dagster/_grpc/client.py, in one suite run of three), whose blank lines and
    # frames repeat from one traceback to the next
    records = [
        t
        for t in terminal
        if t.strip() and not t.startswith(("[rag_pipeline]", " ", "Traceback", "The above"))
    ]
    repeats = Counter(t.split(" - ", 1)[-1] for t in records)
    assert not [t for t, n in repeats.items() if n > 10], (repeats.most_common(5), terminal[-60:])


# The two tests below were one (160 s, the suite's long pole): each starts its own `dg dev`,
# so that two workers run them side by side.


def test_every_way_a_run_starts_is_found_by_one_filter_and_says_who_started_it(
    dev, sample_books, tmp_path
):
    """Every way a run starts (sensor, asset graph, backfill, Launchpad, CLI) is found by one
    filter per book (tag rag/book) and says who started it; an edit runs only its book; index
    settings in run config are refused at launch; the collection asset reflects every run
    within a sensor interval, without runs of its own; the terminal names each run."""
    books = BOOKS
    # 1. the sensor's first run: both books in one batch
    first = sensor_batch(dev)

    # 2. an edit is picked up by the next tick, and only that book runs again
    edited = sample_books / "ros2-fundamentals" / "00-intro.md"
    edited.write_text(edited.read_text() + "\n\n## Sensor check\n\nZebra quartz umbrella.\n")
    dev.wait_for(
        lambda: len(dev.book_runs("ros2-fundamentals")) >= 2, 240, "the run that follows the edit"
    )
    assert len(dev.book_runs("humanoid-robotics-ros2")) == 1

    # 3. what the UI's Materialize button sends: the implicit asset job, one partition
    data = dev.graphql(
        LAUNCH,
        executionParams={
            "mode": "default",
            "runConfigData": "{}",
            "selector": {
                "repositoryLocationName": LOCATION,
                "repositoryName": REPOSITORY,
                "pipelineName": "__ASSET_JOB",
                "assetSelection": [{"path": [a]} for a in ASSETS],
                "assetCheckSelection": [{"assetKey": {"path": [a]}, "name": n} for a, n in CHECKS],
            },
            "executionMetadata": {
                "tags": [{"key": "dagster/partition", "value": "humanoid-robotics-ros2"}]
            },
        },
    )["launchPipelineExecution"]
    assert data["__typename"] == "LaunchRunSuccess", data
    run_id = data["run"]["runId"]
    # while it is queued and runs, documents' badge stays on what is known (every book
    # parsed): never a green ✓ beside "0 / 1 Passed" for the check the run planned (44.6)
    badges: list[str] = []

    def finished() -> str | None:
        node = dev.graphql(BADGE, path=["documents"])["assetNodeOrError"]
        badges.append(node_badge(node["assetChecksOrError"]["checks"]))
        status = dev.graphql(RUN_STATUS, runId=run_id)["runOrError"]["status"]
        return status if status in ("SUCCESS", "FAILURE", "CANCELED") else None

    status = dev.wait_for(finished, 240, "the UI-launched run")
    assert status == "SUCCESS"
    assert set(badges) == {"green ✓ 1 / 1 Passed"}, Counter(badges)
    # the collection's page shows the run launched from the graph within a sensor interval
    dev.wait_for(
        lambda: collection_rows(dev, lambda r: r["humanoid-robotics-ros2"]["last_run"] == run_id),
        REFRESH_S,
        "the graph-launched run on the collection's page",
    )

    # 4. a backfill of both books from the asset graph: its backfill policy runs them as one
    # batch (up to RAG_BATCH_BOOKS books a run)
    backfill = dev.graphql(
        BACKFILL,
        params={"partitionNames": books, "assetSelection": [{"path": [a]} for a in ASSETS]},
    )["launchPartitionBackfill"]
    assert backfill["__typename"] == "LaunchBackfillSuccess", backfill
    for book in books:
        dev.wait_for(
            lambda b=book: [r for r in dev.book_runs(b) if trigger(r) == "backfill"],
            300,
            f"the backfill's run of {book}",
        )
    backfill_runs = {
        book: next(r["runId"] for r in dev.book_runs(book) if trigger(r) == "backfill")
        for book in books
    }
    assert len(set(backfill_runs.values())) == 1
    dev.wait_for(
        lambda: collection_rows(
            dev, lambda r: all(r[b]["last_run"] == backfill_runs[b] for b in books)
        ),
        REFRESH_S,
        "the backfill's runs on the collection's page",
    )

    # 4b. the Launchpad: the ingest job with run config; an index setting there is refused
    def launchpad(run_config: str) -> dict:
        return dev.graphql(
            LAUNCH,
            executionParams={
                "mode": "default",
                "runConfigData": run_config,
                "selector": {
                    "repositoryLocationName": LOCATION,
                    "repositoryName": REPOSITORY,
                    "pipelineName": "ingest_books",
                },
                "executionMetadata": {
                    "tags": [{"key": "dagster/partition", "value": "ros2-fundamentals"}]
                },
            },
        )["launchPipelineExecution"]

    refused = launchpad('{"ops": {"chunks": {"config": {"chunk_target_tokens": 100}}}}')
    assert refused["__typename"] == "RunConfigValidationInvalid", refused
    assert "chunk_target_tokens" in str(refused["errors"])
    refused = launchpad('{"resources": {"recipe": {"config": {"model": "other-model"}}}}')
    assert refused["__typename"] == "RunConfigValidationInvalid", refused
    launched = launchpad('{"ops": {"source_files": {"config": {"force": true}}}}')
    assert launched["__typename"] == "LaunchRunSuccess", launched
    launchpad_run = launched["run"]["runId"]
    dev.wait_for(
        lambda: dev.graphql(RUN_STATUS, runId=launchpad_run)["runOrError"]["status"] == "SUCCESS",
        240,
        "the Launchpad run",
    )

    # 4c. a CLI ingest against the same instance (it waits for the store if a run holds it)
    cli = dev_cli(dev, tmp_path, sample_books)
    cli_run = cli.json("ingest", "--book", "ros2-fundamentals", "--force", "--json")
    cli_run_id = cli_run["books"]["ros2-fundamentals"]["run_id"]

    # 5. every run says who started it; every run that wrote or purged a book carries
    # rag-book/<book>=yes (the one filter, batches and backfills included)
    def runs_of(book: str) -> list[dict]:
        return runs_with_book_tag(dev, book)

    for book in books:
        assert {first["runId"], backfill_runs[book]} <= {r["runId"] for r in runs_of(book)}

    for book in books:
        assert {"books_sensor", "backfill", "ui"} <= {trigger(r) for r in dev.book_runs(book)}
    assert {trigger(r) for r in runs_of("ros2-fundamentals")} >= {"books_sensor", "ui", "cli"}
    ros2 = {r["runId"]: r for r in runs_of("ros2-fundamentals")}
    assert launchpad_run in ros2 and cli_run_id in ros2
    assert {"key": "rag/trigger", "value": "cli"} in ros2[cli_run_id]["tags"]
    assert any(r["runId"] == run_id for r in runs_of("humanoid-robotics-ros2"))  # the graph's

    # 6. the collection asset lists every book with its counts and check results
    # the CLI's run is the last of the book: on the page within a sensor interval or so
    rows = dev.wait_for(
        lambda: collection_rows(dev, lambda r: r["ros2-fundamentals"]["last_run"] == cli_run_id),
        120,
        "the collection asset's refresh",
    )
    for book in books:
        assert rows[book]["health"] == "ok" and rows[book]["why"] == "", rows[book]
    # refreshes add no runs to the run list
    assert not [r for r in dev.runs() if r["jobName"] == "refresh_collection"]

    # 7. after the webserver is gone, its terminal (as `make ui` shows it) named each run
    dev.stop()
    assert_terminal_after_stop(
        dev,
        {
            first["runId"]: "books_sensor",
            run_id: "ui",
            backfill_runs[books[0]]: "backfill",
            launchpad_run: "ui",
        },
    )


def test_a_broken_book_stays_shown_lineage_reaches_its_run_pages_render_and_a_purge_is_seen(
    dev, sample_books, tmp_path
):
    """A broken book stays visible (partition check status, the collection's health and
    check) after another book runs; lineage gives the full run URL of the run that wrote a
    point; the asset graph and the collection's pages render in Chromium; a removed book's
    purge is an observation, run by the sensor; the index holds what the books hold."""
    first = sensor_batch(dev)
    cli = dev_cli(dev, tmp_path, sample_books)

    # 1. a broken file (and an edit, to search for below): the book's partition of the
    # check, the collection's health and its check say so, and still do after another book
    # runs
    (sample_books / "ros2-fundamentals" / "broken.md").write_bytes(b"---\ntitle: [oops\n---\nx")
    edited = sample_books / "ros2-fundamentals" / "00-intro.md"
    edited.write_text(edited.read_text() + "\n\n## Sensor check\n\nZebra quartz umbrella.\n")

    def broken_shown() -> dict[str, dict]:
        return collection_rows(dev, lambda r: r["ros2-fundamentals"]["health"] == "warned")

    dev.wait_for(broken_shown, 240, "the broken book on the collection's page")
    before = len(dev.book_runs("humanoid-robotics-ros2"))
    other = sample_books / "humanoid-robotics-ros2" / "index.md"
    other.write_text(other.read_text() + "\n\n## Another edit\n\nQuiet lantern harbor.\n")
    dev.wait_for(
        lambda: len(dev.book_runs("humanoid-robotics-ros2")) > before, 240, "the other book's run"
    )
    rows = dev.wait_for(
        lambda: collection_rows(
            dev,
            lambda r: (
                r["humanoid-robotics-ros2"]["last_run"]
                == dev.book_runs("humanoid-robotics-ros2")[0]["runId"]
            ),
        ),
        120,
        "the page after the other book's run",
    )
    assert rows["ros2-fundamentals"]["health"] == "warned"
    assert "parse_errors warned" in rows["ros2-fundamentals"]["why"]

    def checks_of(asset: str) -> dict[str, dict]:
        node = dev.graphql(CHECK_STATUS, path=[asset])["assetNodeOrError"]
        return {c["name"]: c for c in node["assetChecksOrError"]["checks"]}

    statuses = checks_of("documents")["parse_errors"]["partitionStatuses"]
    assert "ros2-fundamentals" in statuses["failedPartitions"], statuses
    assert "humanoid-robotics-ros2" in statuses["succeededPartitions"], statuses
    latest = checks_of("qdrant_collection")["book_checks_pass"]["executionForLatestMaterialization"]
    assert latest["status"] == "FAILED" and latest["evaluation"]["severity"] == "WARN", latest
    # its result line, shown beside the status, names the book (issue 44)
    assert "1 book (ros2-fundamentals)" in latest["evaluation"]["description"], latest
    events = dev.graphql(ASSET_EVENTS, path=["qdrant_collection"], partitions=None)
    page = metadata(events["assetNodeOrError"]["assetMaterializations"][0])
    assert "ros2-fundamentals" in page["problems"]
    # refreshes add no runs to the run list
    assert not [r for r in dev.runs() if r["jobName"] == "refresh_collection"]

    # 2. a point's lineage gives the full URL of the run that wrote it
    hits = cli.json("search", "Zebra quartz umbrella", "--book", "ros2-fundamentals")
    lineage = cli.json("lineage", hits[0]["id"], "--book", "ros2-fundamentals")
    url = lineage["dagster_run_url"]
    assert url == f"{dev.url}/runs/{lineage['run_id']}"
    assert requests.get(url, timeout=30).ok
    writer = dev.graphql(RUN_STATUS, runId=lineage["run_id"])["runOrError"]
    assert writer["status"] == "SUCCESS"
    # ... and the run's page filtered to the line that names the point, its file and section
    assert lineage["dagster_point_url"] == f"{url}?logs={hits[0]['id']}"
    named = [m for m in run_messages(dev, lineage["run_id"]) if hits[0]["id"] in m]
    assert len(named) == 1 and f"{lineage['source_file']} § " in named[0], named

    # 3. pages render in a real browser: the asset graph and the collection asset
    dom = chromium_shot(
        f"{dev.url}/locations/{LOCATION}/asset-groups/ingestion", "asset-graph.png", tmp_path
    )
    assert "qdrant_points" in dom and "chunk_embeddings" in dom
    dom = chromium_shot(f"{dev.url}/assets/qdrant_collection", "collection-asset.png", tmp_path)
    assert "qdrant_collection" in dom and "book_table" in dom
    # the broken book is named on the collection's page without opening anything; the
    # per-book table (with its links) opens in a dialog
    assert "ros2-fundamentals (warned" in dom and "Show Markdown" in dom
    # the point's line on its run's page
    dom = chromium_shot(lineage["dagster_point_url"], "point-in-run-logs.png", tmp_path)
    assert hits[0]["id"] in dom and lineage["source_file"] in dom
    chromium_shot(f"{dev.url}/assets", "catalog.png", tmp_path)
    chromium_shot(
        f"{dev.url}/assets/documents?view=checks&checkDetail=parse_errors",
        "documents-check-partitions.png",
        tmp_path,
    )
    chromium_shot(f"{dev.url}/assets/documents?view=partitions", "partitions.png", tmp_path)
    assert "Join the Dagster community" not in dom  # no newsletter dialog over the pages

    # 4. a removed book is purged, and the purge is recorded on the assets it emptied
    shutil.rmtree(sample_books / "humanoid-robotics-ros2")

    def purge_event() -> dict:
        node = dev.graphql(
            ASSET_EVENTS, path=["qdrant_points"], partitions=["humanoid-robotics-ros2"]
        )["assetNodeOrError"]
        assert not any(metadata(e).get("purged") for e in node["assetMaterializations"])
        return next((e for e in node["assetObservations"] if metadata(e).get("purged")), {})

    purge = dev.wait_for(purge_event, 240, "the purge's event")
    assert metadata(purge)["points_in_book"] == 0
    purging = {r["runId"] for r in runs_with_book_tag(dev, "humanoid-robotics-ros2")}
    assert purge["runId"] in purging

    # 5. after the webserver is gone, its terminal named the runs, and the index holds
    # exactly the expected points
    dev.stop()
    assert_terminal_after_stop(
        dev, {first["runId"]: "books_sensor", purge["runId"]: "books_sensor"}
    )
    from rag_pipeline.config import load_settings
    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline.ingest.consistency import check_index
    from rag_pipeline.retrieve import search
    from rag_pipeline.schema import COLLECTION_SCHEMA
    from rag_pipeline.store import open_store

    config = load_settings(qdrant_path=str(tmp_path / "qdrant")).store()
    with open_store(config, COLLECTION_SCHEMA) as store:
        report = check_index(store, "ros2-fundamentals", 384)
        assert report.passed and report.points > 10, report.problems()
        assert store.tenants() == ["ros2-fundamentals"]
        hits = search(
            store,
            HashEmbedder(),
            "zebra quartz umbrella",
            "ros2-fundamentals",
            mode="sparse",
            limit=1,
        )
        assert hits and "Zebra quartz umbrella" in hits[0].text


def test_a_killed_run_worker_is_reaped_and_the_run_retried_without_a_manual_step(
    tmp_path, sample_books
):
    """kill -9 of a run worker under `dagster dev`: run monitoring (with the project's
    launcher health check) fails the run and frees its pool slots, run retries launch it
    again, and the retry succeeds. Nobody touches anything."""
    from dagster import DagsterInstance, DagsterRunStatus, RunsFilter
    from dagster._core.instance.ref import InstanceRef

    from rag_pipeline.defs.reaper import run_worker
    from rag_pipeline_tests.fakes import FakeOpenAI

    shutil.rmtree(sample_books / "humanoid-robotics-ros2")
    with FakeOpenAI() as openai:
        openai.hang_s = 120  # the first embedding request keeps the run worker busy
        openai.script.append("hang")
        dev = DagsterDev(tmp_path, sample_books)
        dev.env.update(
            RAG_EMBEDDER="openai",
            OPENAI_API_KEY="sk-test",
            OPENAI_BASE_URL=openai.base_url,
            RAG_OPENAI_TIMEOUT_S="300",
            RAG_OPENAI_MAX_RETRIES="0",
        )
        try:
            dev.start()
            dev.wait_for(lambda: openai.requests, 300, "the sensor's run to start embedding")
            ref = InstanceRef.from_dir(str(dev.home))
            with DagsterInstance.from_ref(ref) as instance:
                started = instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.STARTED]))
                assert len(started) == 1
                victim = started[0]
                worker = run_worker(instance, victim)
                assert worker is not None
                os.kill(worker.pid, signal.SIGKILL)

                def victim_status() -> str:
                    run = instance.get_run_by_id(victim.run_id)
                    return run.status.value if run and run.is_finished else ""

                assert dev.wait_for(victim_status, 120, "run monitoring to fail the run") == (
                    "FAILURE"
                )
                dev.wait_for(
                    lambda: dev.book_runs("ros2-fundamentals"), 300, "the retried run to succeed"
                )
                storage = instance.event_log_storage
                for pool in ("qdrant_store", "embedding_api"):
                    dev.wait_for(
                        lambda p=pool: not storage.get_concurrency_info(p).claimed_slots,
                        60,
                        f"pool {pool} to be free",
                    )
        finally:
            dev.stop()
    from rag_pipeline.config import load_settings
    from rag_pipeline.ingest.consistency import check_index
    from rag_pipeline.schema import COLLECTION_SCHEMA
    from rag_pipeline.store import open_store

    config = load_settings(qdrant_path=str(tmp_path / "qdrant")).store()
    with open_store(config, COLLECTION_SCHEMA) as store:
        report = check_index(store, "ros2-fundamentals", 1536)
        assert report.passed and report.points > 10, report.problems()


#: a run's whole event log, a page at a time (what the run page reads)
RUN_LOGS = """query Logs($runId: ID!, $after: String) {
  logsForRun(runId: $runId, afterCursor: $after, limit: 1000) { __typename
    ... on EventConnection { cursor hasMore events { __typename
      ... on MessageEvent { message level } } } } }"""


def run_messages(dev: DagsterDev, run_id: str) -> list[str]:
    messages, after = [], None
    while True:
        page = dev.graphql(RUN_LOGS, runId=run_id, after=after)["logsForRun"]
        assert page["__typename"] == "EventConnection", page
        messages += [e["message"] for e in page["events"] if e.get("message")]
        if not page["hasMore"]:
            return messages
        after = page["cursor"]


def big_book(root: Path, files: int = 40, sections: int = 50) -> Path:
    """A generated book of ``files * sections`` chunks (one per section, hash embedder)."""
    from rag_pipeline_tests.conftest import section

    for f in range(files):
        path = root / f"part-{f % 4}" / f"ch{f:02d}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            f"# Chapter {f}\n\n"
            + "\n".join(
                section(f"Topic {f} {s}", paragraphs=2, words=150, seed=f"c{f}s{s}")
                for s in range(sections)
            )
        )
    return root


def test_from_a_point_id_the_ui_reaches_its_run_and_line_and_one_filter_every_run_of_a_book(
    tmp_path, sample_books
):
    """Through the webserver's GraphQL API, after CLI ingests: a first ingest of three books
    together (one batch run writing thousands of points), an edit of one book, the removal of
    another. From any point id, ``lineage`` links the run page filtered to the point; that
    run's log has the line naming the point with its file and section, for every point it
    wrote (and its materialization lists a sample of 10, not all); the tag filter
    rag-book/<book>=yes finds every run that wrote or purged a book, batches included."""
    from rag_pipeline.config import load_settings
    from rag_pipeline.retrieve.lineage import POINTS_PER_MESSAGE
    from rag_pipeline.schema import COLLECTION_SCHEMA, book_filter
    from rag_pipeline.store import open_store
    from rag_pipeline_tests.helpers import Cli

    big_book(sample_books / "big-book")
    dev = DagsterDev(tmp_path, sample_books, webserver_only=True)  # its home, not started
    cli = Cli(tmp_path, sample_books)
    cli.env["DAGSTER_HOME"] = str(dev.home)
    first = cli.json("ingest", "--json")["books"]
    assert first["big-book"]["points"] >= 2000
    batch = {b: r["run_id"] for b, r in first.items()}
    assert len(set(batch.values())) == 1, batch  # new together: one run
    edited = sample_books / "ros2-fundamentals" / "00-intro.md"
    edited.write_text(edited.read_text() + "\n\n## Lineage check\n\nVelvet comet ladder.\n")
    edit_run = cli.json("ingest", "--json")["books"]["ros2-fundamentals"]["run_id"]
    shutil.rmtree(sample_books / "humanoid-robotics-ros2")
    purged = cli.json("ingest", "--json")["books"]["humanoid-robotics-ros2"]
    assert purged["status"] == "removed", purged

    config = load_settings(qdrant_path=str(tmp_path / "qdrant")).store()
    with open_store(config, COLLECTION_SCHEMA) as store:
        big_ids = {str(p.id) for p in store.scroll(book_filter("big-book"))}
    assert len(big_ids) >= 2040  # 2,000 chunks and 40 document records

    try:
        dev.start()
        cli.env["RAG_DAGSTER_URL"] = dev.url
        # 1. a point of the big batch run: lineage links its line on the run's page
        hit = cli.json("search", "c17s33topic1733w1x7", "--book", "big-book", "--mode", "sparse")[0]
        lineage = cli.json("lineage", hit["id"], "--book", "big-book")
        run_id = lineage["run_id"]
        assert run_id == batch["big-book"]
        assert lineage["dagster_point_url"] == f"{dev.url}/runs/{run_id}?logs={hit['id']}"
        assert requests.get(lineage["dagster_point_url"], timeout=30).ok
        messages = run_messages(dev, run_id)
        # the log filter on the id shows the one message holding it: a few short lines, the
        # id's line among them naming its file and section (the run page shows about 8 lines
        # of a message before "View full message")
        (found,) = [m for m in messages if hit["id"] in m]
        lines = found.splitlines()
        assert len(lines) <= 8 and all(len(line) <= 120 for line in lines), lines
        (line,) = [line for line in lines if hit["id"] in line]
        assert line == f"{lineage['source_file']} § {lineage['section_title']}: {hit['id']}"
        # every point the run wrote is on a line of its own, once, after the book's first
        # message; one event per POINTS_PER_MESSAGE points
        (head,) = [i for i, m in enumerate(messages) if m.startswith("[big-book] ")]
        count = -(-len(big_ids) // POINTS_PER_MESSAGE)
        assert messages[head].startswith(
            f"[big-book] {len(big_ids):,} points written by this run, in the {count:,} messages"
        ), messages[head]
        logged = [
            line.rsplit(": ", 1)[1]
            for m in messages[head + 1 : head + 1 + count]
            for line in m.splitlines()
        ]
        assert sorted(logged) == sorted(big_ids)
        # the materialization's table is a sample, whatever the run's size
        written = dev.graphql(ASSET_EVENTS, path=["qdrant_points"], partitions=["big-book"])[
            "assetNodeOrError"
        ]["assetMaterializations"]
        (event,) = [e for e in written if e["runId"] == run_id]
        assert len(metadata(event)["points_written"]) <= 10

        # 2. one filter per book finds every run that wrote or purged it, batches included
        def runs_of(book: str) -> set[str]:
            found = dev.graphql(
                RUNS_OF_BOOK, filter={"tags": [{"key": f"rag-book/{book}", "value": "yes"}]}
            )["runsOrError"]["results"]
            return {r["runId"] for r in found}

        assert runs_of("big-book") == {batch["big-book"]}
        assert runs_of("ros2-fundamentals") == {batch["ros2-fundamentals"], edit_run}
        assert runs_of("humanoid-robotics-ros2") == {
            batch["humanoid-robotics-ros2"],
            purged["run_id"],
        }
    finally:
        dev.stop()


JOB_RUNS = """query Job($params: PipelineSelector!) { pipelineOrError(params: $params) {
  __typename ... on Pipeline { pipelineSnapshotId runs { runId } } } }"""
RUN_ORIGIN = """query Run($runId: ID!) { runOrError(runId: $runId) { ... on Run {
  pipelineSnapshotId repositoryOrigin { repositoryLocationName repositoryName }
  tags { key value } } } }"""
REEXECUTE = """mutation Reexecute($params: ReexecutionParams!) {
  launchPipelineReexecution(reexecutionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
  }
}"""


def test_cli_and_live_runs_are_runs_of_the_ingest_job_launched_by_their_command(
    tmp_path, sample_books
):
    """Through the webserver's GraphQL API, after a CLI ingest and a live mode change: both
    runs are runs of the code location's ``ingest_books`` (the job's runs list them; each has
    the repository origin the Timeline and the run's Target need, and the job's own snapshot,
    so "Re-execute" carries no version warning and succeeds); "Launched by" names the command
    (and the file live mode saw change); the tags only the project reads are hidden."""
    from dagster import DagsterInstance

    from rag_pipeline.defs.live import LIVE_LAUNCHER
    from rag_pipeline.defs.reaper import run_worker
    from rag_pipeline.defs.runner import CLI_LAUNCHER
    from rag_pipeline.defs.runs import LAUNCHED_BY_TAG
    from rag_pipeline_tests.helpers import Cli, LiveProcess

    dev = DagsterDev(tmp_path, sample_books, webserver_only=True)  # its home, not started
    cli = Cli(tmp_path, sample_books)
    cli.env["DAGSTER_HOME"] = str(dev.home)
    cli_runs = {r["run_id"] for r in cli.json("ingest")["books"].values()}
    live = LiveProcess(cli)
    try:
        live.next_event("ready", timeout=180)
        live.drain()
        edited = sample_books / "ros2-fundamentals" / "00-intro.md"
        edited.write_text(edited.read_text() + "\n\nA live mode origin check.\n")
        applied = live.next_event("applied", timeout=120)["report"]["books"]
        live_run = applied["ros2-fundamentals"]["run_id"]
        assert applied["ros2-fundamentals"]["status"] == "ingested", applied
    finally:
        assert live.stop() == 0
    try:
        dev.start()
        job = dev.graphql(
            JOB_RUNS,
            params={
                "repositoryLocationName": LOCATION,
                "repositoryName": REPOSITORY,
                "pipelineName": "ingest_books",
            },
        )["pipelineOrError"]
        assert {live_run, *cli_runs} <= {r["runId"] for r in job["runs"]}, job
        for run_id, launcher in [
            (live_run, f"{LIVE_LAUNCHER}: ros2-fundamentals/00-intro.md"),
            *[(r, f"{CLI_LAUNCHER}: ") for r in cli_runs],
        ]:
            run = dev.graphql(RUN_ORIGIN, runId=run_id)["runOrError"]
            assert run["repositoryOrigin"] == {
                "repositoryLocationName": LOCATION,
                "repositoryName": REPOSITORY,
            }
            # the UI's "Re-execute" warns unless the run's snapshot is the loaded job's
            assert run["pipelineSnapshotId"] == job["pipelineSnapshotId"]
            tags = {t["key"]: t["value"] for t in run["tags"]}
            assert tags[LAUNCHED_BY_TAG].startswith(launcher), tags  # "Launched by"
            shown = {k for k in tags if not k.startswith("dagster/")}  # pinned in a run's row
            assert shown <= {LAUNCHED_BY_TAG, "rag/trigger", "rag/book", "rag/batch"} | {
                k for k in tags if k.startswith("rag-book/")
            }, shown
        relaunched = dev.graphql(
            REEXECUTE, params={"parentRunId": live_run, "strategy": "ALL_STEPS"}
        )["launchPipelineReexecution"]
        assert relaunched["__typename"] == "LaunchRunSuccess", relaunched
        # the re-execution copied the live run's hidden process tags: they do not make the
        # live process (now gone) its worker
        with DagsterInstance.from_config(str(dev.home)) as instance:
            child = instance.get_run_by_id(relaunched["run"]["runId"])
            parent = instance.get_run_by_id(live_run)
            assert child is not None and parent is not None
            assert run_worker(instance, parent) is not None  # the hidden tags are read
            assert run_worker(instance, child) is None
    finally:
        dev.stop()


def test_a_small_books_edit_runs_beside_a_big_books_first_ingest_never_two_runs_of_one_book(
    tmp_path, sample_books
):
    """Through the daemon's run queue (the books sensor's runs, launched by the
    QueuedRunCoordinator): while the first ingest of a big book is held in its embedding step
    (a fake embedding API that hangs on the big book's text, standing in for a 60-second
    ingest), the small book's first ingest and then a one-file edit of it run beside it, and
    the edit is searchable before the big ingest ends; an edit of the big book meanwhile waits
    in the queue (one run per book) and runs after, never overlapping the first."""
    from dagster import DagsterInstance, DagsterRunStatus, RunsFilter
    from dagster._core.instance.ref import InstanceRef

    from rag_pipeline.config import load_settings
    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline.retrieve import search
    from rag_pipeline.schema import COLLECTION_SCHEMA
    from rag_pipeline.store import open_store
    from rag_pipeline_tests.fakes import FakeOpenAI

    small, big = "ros2-fundamentals", "humanoid-robotics-ros2"
    marker = "Slow embedding marker"
    intro = sample_books / big / "index.md"
    intro.write_text(intro.read_text() + f"\n\n## Marker\n\n{marker}.\n")
    with FakeOpenAI() as openai:
        openai.hang_s = 300  # until released: longer than any wait below
        openai.hang_on = marker
        dev = DagsterDev(tmp_path, sample_books)
        dev.env.update(
            RAG_EMBEDDER="openai",
            OPENAI_API_KEY="sk-test",
            OPENAI_BASE_URL=openai.base_url,
            RAG_OPENAI_TIMEOUT_S="600",
            RAG_OPENAI_MAX_RETRIES="0",
            RAG_BATCH_BOOKS="1",  # the two new books: a run each
        )
        try:
            dev.start()
            ref = InstanceRef.from_dir(str(dev.home))
            with DagsterInstance.from_ref(ref) as instance:

                def runs_of(book: str, *statuses: DagsterRunStatus) -> list:
                    runs = instance.get_runs(RunsFilter(tags={"dagster/partition": book}))
                    return [r for r in runs if not statuses or r.status in statuses]

                # the big book's first ingest hangs in its embedding step; the small book's
                # runs beside it
                dev.wait_for(lambda: dev.book_runs(small), 300, "the small book's first ingest")
                [first] = runs_of(big, DagsterRunStatus.STARTED)
                edited = sample_books / small / "01-chapter-1-ros2-fundamentals" / "02-setup.md"
                edited.write_text(edited.read_text() + "\n\nZebra quartz umbrella setup.\n")
                intro.write_text(intro.read_text() + "\nChanged meanwhile.\n")
                dev.wait_for(lambda: len(dev.book_runs(small)) == 2, 120, "the small book's edit")
                config = load_settings(qdrant_path=str(tmp_path / "qdrant")).store()
                with open_store(config, COLLECTION_SCHEMA) as store:
                    hits = search(
                        store, HashEmbedder(), "zebra quartz umbrella", small, mode="sparse"
                    )
                    assert hits and "Zebra quartz umbrella" in hits[0].text
                assert instance.get_run_by_id(first.run_id).status == DagsterRunStatus.STARTED
                # the big book's edit waits in the queue for its first run
                dev.wait_for(lambda: len(runs_of(big)) == 2, 30, "the big book's edit's run")
                assert runs_of(big, DagsterRunStatus.QUEUED)
                assert [r.run_id for r in runs_of(big, DagsterRunStatus.STARTED)] == [first.run_id]
                openai.released.set()
                dev.wait_for(lambda: len(dev.book_runs(big)) == 2, 180, "both runs of the big book")
                records = sorted(
                    instance.get_run_records(RunsFilter(tags={"dagster/partition": big})),
                    key=lambda r: r.start_time or 0,
                )
                assert records[0].end_time is not None and records[1].start_time is not None
                assert records[0].end_time <= records[1].start_time  # never overlapping
                for run in runs_of(small):
                    assert run.tags.get("rag/trigger") == "books_sensor"  # through the queue
        finally:
            openai.released.set()
            dev.stop()

"""Readers never break a writer, and two writers take turns: searches in a loop while an
ingest runs, and two ingests started together, on one embedded store and one DAGSTER_HOME."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time

import pytest

from rag_pipeline_tests.conftest import REPO
from rag_pipeline_tests.helpers import Cli, assert_no_trace
from rag_pipeline_tests.test_crash import point_set

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def books_with_a_third(tmp_path):
    books = tmp_path / "books"
    shutil.copytree(REPO / "data" / "books", books)
    shutil.copytree(books / "ros2-fundamentals", books / "third-book")
    return books


def start_ingest(cli: Cli):  # type: ignore[no-untyped-def]
    return cli.start("ingest", "--json")


def finish(proc) -> dict:  # type: ignore[no-untyped-def]
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert_no_trace(err)
    return json.loads(out)


@pytest.fixture(scope="module")
def reference_points(tmp_path_factory) -> dict[str, set[str]]:
    """The points one ingest of the three books gives, alone (shared by the tests)."""
    ref = tmp_path_factory.mktemp("reference")
    cli = Cli(ref, books_with_a_third(ref))
    cli("ingest")
    return point_set(ref / "qdrant")


def test_searches_in_a_loop_while_an_ingest_runs(tmp_path, reference_points):
    from rag_pipeline.config import load_settings
    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline.retrieve import search
    from rag_pipeline.schema import COLLECTION_SCHEMA
    from rag_pipeline.store import open_store

    cli = Cli(tmp_path, books_with_a_third(tmp_path))
    config = load_settings(qdrant_path=cli.env["RAG_QDRANT_PATH"], busy_wait_s=60).store()
    embedder = HashEmbedder()
    stop = threading.Event()
    errors: list[str] = []
    counts = {"searches": 0, "with_hits": 0}

    def searcher(mode: str) -> None:
        while not stop.is_set():
            try:
                with open_store(config, COLLECTION_SCHEMA) as store:
                    hits = search(
                        store, embedder, "ROS 2 nodes and topics", "third-book", mode=mode
                    )
                counts["searches"] += 1
                counts["with_hits"] += bool(hits)
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
            time.sleep(0.05)

    threads = [threading.Thread(target=searcher, args=(m,)) for m in ("hybrid", "dense")]
    ingest = start_ingest(cli)
    for thread in threads:
        thread.start()
    try:
        report = finish(ingest)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=120)
    assert errors == []
    assert counts["searches"] >= 10
    assert {b["status"] for b in report["books"].values()} == {"ingested"}
    assert point_set(tmp_path / "qdrant") == reference_points


def test_a_search_process_during_an_ingest_never_fails_it(tmp_path):
    cli = Cli(tmp_path, books_with_a_third(tmp_path))
    cli("ingest", "--book", "ros2-fundamentals")
    ingest = start_ingest(cli)
    searches = []
    while ingest.poll() is None:
        proc = cli("search", "nodes", "--book", "ros2-fundamentals", "--json", check=False)
        searches.append(proc)
    finish(ingest)
    assert searches and all(p.returncode == 0 for p in searches), [p.stderr for p in searches]
    assert all(json.loads(p.stdout) for p in searches)  # the book stayed searchable


def test_two_ingests_started_together_both_succeed_and_agree(tmp_path, reference_points):
    cli = Cli(tmp_path, books_with_a_third(tmp_path))
    first, second = start_ingest(cli), start_ingest(cli)
    reports = [finish(first), finish(second)]
    for report in reports:
        assert {b["status"] for b in report["books"].values()} <= {"ingested", "unchanged"}
        assert all(b["points"] == b["chunks"] > 0 for b in report["books"].values())
    assert point_set(tmp_path / "qdrant") == reference_points
    again = cli.json("ingest")
    assert {b["status"] for b in again["books"].values()} == {"unchanged"}


OPEN_AT = """
import sys, time
time.sleep(max(0.0, float(sys.argv[1]) - time.time()))
from rag_pipeline.defs.instance import open_home_instance
with open_home_instance() as instance:
    instance.get_runs(limit=1)
    instance.get_dynamic_partitions("books")
"""


def test_processes_opening_a_fresh_dagster_home_together_take_turns(tmp_path):
    """A fresh SQLite home creates its schema on first open; processes racing to do it failed
    with 'table jobs already exists' (seen in CI with two ingests started together)."""
    import os

    for trial in range(2):
        home = tmp_path / f"home{trial}"
        home.mkdir()
        start_at = time.time() + 3.0  # after every interpreter has imported dagster
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", OPEN_AT, str(start_at)],
                env={**os.environ, "DAGSTER_HOME": str(home)},
                cwd=REPO,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(4)
        ]
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err[-2000:]

"""kill -9 at any point of an ingest: the next ingest, with the same DAGSTER_HOME and store,
finishes in bounded time with exactly the points a clean ingest gives.

The instance uses the project's dagster.yaml (pools with as few slots as runs), so a run killed
while a step holds a slot is the case that used to wedge every later run forever.

Each ingest is a real process killed with a real SIGKILL, forked from the warm interpreter
(warm.py) so that none of the 24 pays Python's and Dagster's imports; one scenario runs from
scratch (``python -m rag_pipeline_tests.crashpoint``), as a user's process would.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from rag_pipeline_tests.conftest import REPO
from rag_pipeline_tests.crashpoint import POINTS
from rag_pipeline_tests.helpers import Cli, assert_no_trace

pytestmark = [pytest.mark.slow, pytest.mark.integration]
RECOVERY_TIMEOUT_S = 240
#: the scenario whose two ingests start from scratch, not from the warm interpreter
FRESH_POINT = "upsert"


def point_set(qdrant: Path) -> dict[str, set[str]]:
    from rag_pipeline.config import load_settings
    from rag_pipeline.schema import COLLECTION_SCHEMA, book_filter
    from rag_pipeline.store import open_store

    with open_store(load_settings(qdrant_path=str(qdrant)).store(), COLLECTION_SCHEMA) as store:
        return {b: {r.id for r in store.scroll(book_filter(b), fields=[])} for b in store.tenants()}


def change_books(data_dir: Path) -> None:
    """An edit, a deletion, a new file, and a removed book: work for every kind of step."""
    intro = data_dir / "ros2-fundamentals" / "00-intro.md"
    intro.write_text(intro.read_text().replace("ROS 2", "ROS 2 (edited)", 3))
    os.remove(data_dir / "ros2-fundamentals" / "01-chapter-1-ros2-fundamentals" / "02-setup.md")
    (data_dir / "ros2-fundamentals" / "99-new.md").write_text("# New\n\n" + "fresh text " * 80)
    shutil.rmtree(data_dir / "gone-book")


@pytest.fixture(scope="module")
def ingested(tmp_path_factory):
    """Books ingested once (with a third book that each scenario then removes), and the
    point set a clean ingest of the changed books gives."""
    root = tmp_path_factory.mktemp("crash")
    books = root / "books"
    shutil.copytree(REPO / "data" / "books", books)
    shutil.copytree(books / "humanoid-robotics-ros2", books / "gone-book")
    cli = Cli(root, books)
    home = Path(cli.env["DAGSTER_HOME"])
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")  # pools: a slot per run
    cli("ingest")
    reference = root / "reference"
    shutil.copytree(books, reference / "books")
    change_books(reference / "books")
    fresh = Cli(reference, reference / "books")
    fresh("ingest")
    return root, point_set(reference / "qdrant")


@pytest.mark.parametrize("point", POINTS)
def test_kill_9_anywhere_then_the_next_ingest_converges(ingested, tmp_path, point):
    root, expected = ingested
    for part in ("books", "qdrant", "dagster_home"):
        shutil.copytree(root / part, tmp_path / part, symlinks=True)
    cli = Cli(tmp_path, tmp_path / "books", fresh=point == FRESH_POINT)
    change_books(tmp_path / "books")

    crashed = cli("ingest", "--json", point=point, check=False, timeout=300)
    assert crashed.returncode == -signal.SIGKILL, (crashed.returncode, crashed.stderr[-2000:])

    # bounded: a wedged run would hang here
    recovered = cli("ingest", "--json", check=False, timeout=RECOVERY_TIMEOUT_S)
    assert recovered.returncode == 0, recovered.stderr[-3000:]
    assert_no_trace(recovered.stderr)
    report = json.loads(recovered.stdout)
    assert {b["status"] for b in report["books"].values()} <= {"ingested", "unchanged", "removed"}
    assert point_set(tmp_path / "qdrant") == expected

    from dagster import DagsterInstance, DagsterRunStatus, RunsFilter
    from dagster._core.instance.ref import InstanceRef

    ref = InstanceRef.from_dir(str(tmp_path / "dagster_home"))
    with DagsterInstance.from_ref(ref) as instance:
        live = instance.get_run_records(
            RunsFilter(statuses=[DagsterRunStatus.STARTED, DagsterRunStatus.STARTING])
        )
        assert live == [], "a dead run is still STARTED"
        for pool in ("qdrant_store", "embedding_api"):
            info = instance.event_log_storage.get_concurrency_info(pool)
            assert not info.claimed_slots, f"pool {pool} still held by {info.active_run_ids}"

"""The scale-out instance config (deploy/dagster.postgres.yaml) against a real PostgreSQL."""

import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from rag_pipeline_tests.conftest import REPO
from rag_pipeline_tests.helpers import fresh_cli

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _pg_bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


def _as_postgres_user(cmd: list[str]) -> list[str]:
    # initdb and postgres refuse to run as root; CI runs as root, a developer usually not
    if os.geteuid() != 0:
        return cmd
    runuser = shutil.which("runuser")
    if runuser is None:
        pytest.skip("running as root without runuser: cannot start PostgreSQL")
    return [runuser, "-u", "postgres", "--", *cmd]


@pytest.fixture
def postgres(tmp_path):
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not initdb or not pg_ctl:
        pytest.skip(
            "PostgreSQL server binaries not found (Debian package `postgresql`; "
            ".ci/run installs it)"
        )
    # outside pytest's private (0700) tmp tree, so the postgres user can reach it
    root = Path(tempfile.mkdtemp(prefix="rag-pg-"))
    os.chmod(root, 0o755)
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = root / "data"
    subprocess.run(
        _as_postgres_user([initdb, "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync"]),
        check=True,
        capture_output=True,
        timeout=120,
    )
    subprocess.run(
        _as_postgres_user(
            [
                pg_ctl,
                "-D",
                str(data),
                "-l",
                str(root / "log"),
                "-w",
                "-t",
                "60",
                "start",
                "-o",
                f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off",
            ]
        ),
        check=True,
        capture_output=True,
        timeout=120,
    )
    try:
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres")
        conn.autocommit = True
        conn.cursor().execute("CREATE DATABASE dagster")
        conn.close()
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/dagster"
    finally:
        subprocess.run(
            _as_postgres_user([pg_ctl, "-D", str(data), "-m", "fast", "stop"]),
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(root, ignore_errors=True)


def test_ingest_two_books_through_a_postgres_instance(postgres, tmp_path, sample_books):
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "deploy" / "dagster.postgres.yaml", home / "dagster.yaml")
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "DAGSTER_PG_URL": postgres,
        "RAG_DATA_DIR": str(sample_books),
        "RAG_QDRANT_PATH": str(tmp_path / "q"),
        "RAG_EMBEDDER": "hash",
        "DO_NOT_TRACK": "1",
    }
    env.pop("RAG_QDRANT_URL", None)
    proc = fresh_cli(["ingest", "--json"], env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    books = json.loads(proc.stdout)["books"]
    assert {b["status"] for b in books.values()} == {"ingested"}
    check = subprocess.run(
        [
            sys.executable,
            "-c",
            """
import json
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter
from rag_pipeline.defs.runs import books_of_run
instance = DagsterInstance.get()
runs = instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.SUCCESS]))
order = instance.get_dynamic_partitions("books")
print(json.dumps({"storage": type(instance.run_storage).__name__,
                  "partitions": sorted(order),
                  "runs": [books_of_run(r.tags, order) for r in runs]}))
""",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stderr
    state = json.loads(check.stdout)
    assert state["storage"] == "PostgresRunStorage"
    assert state["partitions"] == sorted(books)
    assert state["runs"] == [sorted(books)]  # the two new books: one run of both


def test_instance_configs_are_valid(tmp_path, monkeypatch):
    """Both shipped dagster.yaml files load and resolve what they promise."""
    from dagster import DagsterInstance

    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    instance = DagsterInstance.get()
    assert type(instance.run_coordinator).__name__ == "BookRunCoordinator"
    assert type(instance.run_launcher).__name__ == "LocalRunLauncher"
    assert instance.run_launcher.supports_check_run_worker_health
    assert instance.run_monitoring_enabled
    assert instance.run_monitoring_settings["free_slots_after_run_end_seconds"] == 10
    config = instance.get_concurrency_config()
    # runs of different books side by side, one at a time per book (its partition, its tag)
    assert config.run_queue_config.max_concurrent_runs == 2
    limits = config.run_queue_config.tag_concurrency_limits
    assert [(limit["key"], limit["limit"]) for limit in limits] == [
        ("dagster/partition", 1),
        ("rag/book", 1),
    ]
    assert all(limit["value"] == {"applyLimitPerUniqueValue": True} for limit in limits)
    assert config.pool_config.default_pool_limit == 2
    assert instance.get_settings("telemetry")["enabled"] is False
    assert instance.run_retries_enabled and instance.run_retries_max_retries == 2
    text = (REPO / "deploy" / "dagster.postgres.yaml").read_text()
    assert "DAGSTER_PG_URL" in text and "BookRunCoordinator" in text
    assert Path(REPO / "docs" / "deploy.md").is_file()

"""Dagster's `dg` CLI on this project ([tool.dg] in pyproject.toml), run from the repository
folder as a user would: `dg check defs` loads the code location, `dg list defs --json` lists
every asset, check, job and sensor, a bad setting fails the check, and neither writes into the
checkout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from rag_pipeline_tests.conftest import ASSET_NAMES, REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DG = Path(sys.executable).with_name("dg")
ASSETS = ASSET_NAMES
CHECKS = {
    "documents:parse_errors",
    "chunks:chunks_valid",
    "chunk_embeddings:vector_dimension",
    "qdrant_points:index_consistency",
    "qdrant_collection:books_indexed",
    "qdrant_collection:book_checks_pass",
    "qdrant_collection:no_orphan_books",
}
JOBS = {"ingest_books", "purge_book", "refresh_collection"}
SENSORS = {"books_sensor", "collection_sensor"}


@pytest.fixture(scope="module")
def dg_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a `dg` call: every path the code location or Dagster writes in a temp
    folder, the project's dagster.yaml (telemetry off), dg's own user config with telemetry off,
    and this checkout first on the path."""
    tmp = tmp_path_factory.mktemp("dg")
    home = tmp / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    books = tmp / "books"
    books.mkdir()
    dg_config = tmp / "dg.toml"
    dg_config.write_text("[cli.telemetry]\nenabled = false\n")
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        # no __pycache__ written into the checkout by the subprocess
        "PYTHONDONTWRITEBYTECODE": "1",
        "DAGSTER_HOME": str(home),
        "DG_CLI_CONFIG": str(dg_config),
        "DO_NOT_TRACK": "1",
        "RAG_DATA_DIR": str(books),
        "RAG_QDRANT_PATH": str(tmp / "qdrant"),
        "RAG_CACHE_DIR": str(tmp / "cache"),
        "RAG_EMBEDDER": "hash",
    }
    env.pop("RAG_QDRANT_URL", None)
    return env


def dg(env: Mapping[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    if not DG.exists():
        pytest.fail(f"{DG} is absent: dagster-dg-cli is a dependency (pip install -e .)")
    return subprocess.run(
        [str(DG), *args],
        cwd=REPO,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=300,
    )


def checkout_state() -> list[str] | None:
    """Untracked and ignored paths of the checkout, or None where it is not a git work tree."""
    if shutil.which("git") is None:
        return None
    result = subprocess.run(
        ["git", "status", "--porcelain", "--ignored", "--untracked-files=all"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        return None
    return sorted(line for line in result.stdout.splitlines() if line[:2] in ("??", "!!"))


def test_dg_check_defs(dg_env: dict[str, str]) -> None:
    before = checkout_state()
    result = dg(dg_env, "check", "defs")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "All definitions loaded successfully" in result.stdout + result.stderr
    assert checkout_state() == before, "dg wrote into the checkout"


def test_dg_list_defs(dg_env: dict[str, str]) -> None:
    before = checkout_state()
    result = dg(dg_env, "list", "defs", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    listed = json.loads(result.stdout)
    assert {asset["asset_key"] for asset in listed["assets"]} == ASSETS
    assert {check["key"] for check in listed["asset_checks"]} == CHECKS
    assert {job["name"] for job in listed["jobs"]} == JOBS
    assert {sensor["name"] for sensor in listed["sensors"]} == SENSORS
    assert checkout_state() == before, "dg wrote into the checkout"
    # telemetry off: no usage events logged in the instance's folder
    assert not (Path(dg_env["DAGSTER_HOME"]) / "logs").exists()


def test_dg_check_defs_fails_on_a_bad_setting(dg_env: dict[str, str]) -> None:
    result = dg({**dg_env, "RAG_EMBEDDER": "bogus"}, "check", "defs")
    assert result.returncode != 0
    assert "RAG_EMBEDDER" in result.stdout + result.stderr

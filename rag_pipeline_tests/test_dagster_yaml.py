"""A home's dagster.yaml: the settings the product relies on (rag_pipeline/dagster_yaml.py),
an unmodified copy of an earlier version replaced, an edited one kept and named with the fix,
and `make` never copying over an existing one."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess

import pytest
import yaml

from rag_pipeline.config import ensure_dagster_home
from rag_pipeline.dagster_yaml import (
    COORDINATOR,
    EARLIER_VERSIONS,
    REQUIRED_SNIPPET,
    REQUIRED_TAG_LIMITS,
    missing_settings,
    review_home_config,
)
from rag_pipeline_tests.conftest import REPO
from rag_pipeline_tests.helpers import InProcessCli

#: the repository's dagster.yaml of 2026-12-01 (commit 7af2fdd): one run at a time, Dagster's
#: own QueuedRunCoordinator, no rag/book limit
OLD = REPO / "rag_pipeline_tests" / "fixtures" / "dagster_yaml" / "7af2fdd.yaml"


@pytest.mark.parametrize("config", ["dagster.yaml", "deploy/dagster.postgres.yaml"])
def test_the_shipped_files_have_every_setting_the_product_relies_on(config):
    assert missing_settings(yaml.safe_load((REPO / config).read_text())) == []


def test_the_fix_named_to_the_user_is_itself_complete():
    assert missing_settings(yaml.safe_load(REQUIRED_SNIPPET)) == []


def test_the_required_settings_name_the_products_coordinator_and_run_tags():
    from rag_pipeline.defs import coordinator, runs

    assert (coordinator.__name__, coordinator.BookRunCoordinator.__name__) == COORDINATOR
    assert [limit["key"] for limit in REQUIRED_TAG_LIMITS] == [runs.PARTITION_TAG, runs.BOOK_TAG]


def test_each_setting_is_required():
    config = yaml.safe_load((REPO / "dagster.yaml").read_text())
    config["run_coordinator"]["class"] = "QueuedRunCoordinator"
    config["concurrency"]["runs"].pop("max_concurrent_runs")
    config["concurrency"]["runs"]["tag_concurrency_limits"].pop()  # rag/book
    config["run_monitoring"]["enabled"] = False
    config.pop("run_retries")
    missing = "\n".join(missing_settings(config))
    for name in (
        "BookRunCoordinator",
        "max_concurrent_runs",
        "rag/book",
        "run_monitoring",
        "run_retries",
    ):
        assert name in missing, name
    assert "dagster/partition" not in missing
    # Dagster's older spelling: the queue's limits under run_coordinator.config
    queue = config.pop("concurrency")["runs"]
    queue["tag_concurrency_limits"] = yaml.safe_load(REQUIRED_SNIPPET)["concurrency"]["runs"][
        "tag_concurrency_limits"
    ]
    config["run_coordinator"]["config"] = {**queue, "max_concurrent_runs": 1}
    assert not [m for m in missing_settings(config) if "concurrency" in m]


@pytest.mark.integration  # git in a process
def test_every_earlier_dagster_yaml_of_the_repository_is_known():
    """Changing dagster.yaml: add the digest of the replaced version to EARLIER_VERSIONS, or
    homes holding it unmodified are not brought up to date."""
    git = shutil.which("git")
    if git is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    current = hashlib.sha256((REPO / "dagster.yaml").read_bytes()).hexdigest()
    commits = subprocess.run(
        [git, "log", "--format=%H", "--", "dagster.yaml"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for commit in commits:
        shown = subprocess.run(
            [git, "show", f"{commit}:dagster.yaml"], cwd=REPO, capture_output=True, check=True
        ).stdout
        digest = hashlib.sha256(shown).hexdigest()
        assert digest == current or digest in EARLIER_VERSIONS, commit


def test_an_unmodified_earlier_copy_is_replaced_and_kept_aside(home, capsys):
    shutil.copy(OLD, home / "dagster.yaml")
    assert ensure_dagster_home() == home
    assert (home / "dagster.yaml").read_bytes() == (REPO / "dagster.yaml").read_bytes()
    (kept,) = home.glob("dagster.yaml.*.old")
    assert kept.read_bytes() == OLD.read_bytes()
    err = capsys.readouterr().err
    assert f"{home / 'dagster.yaml'} was this project's dagster.yaml of an earlier" in err, err
    assert str(kept) in err and "warning" not in err
    ensure_dagster_home()  # the next command: nothing to say
    assert capsys.readouterr().err == ""


def test_an_edited_copy_is_kept_and_what_it_lacks_named_with_the_fix(home, capsys):
    edited = OLD.read_text().replace("max_concurrent_runs: 1", "max_concurrent_runs: 3")
    (home / "dagster.yaml").write_text(edited)
    ensure_dagster_home()
    assert (home / "dagster.yaml").read_text() == edited  # the owner's edit stands
    err = capsys.readouterr().err
    assert err.startswith(f"warning: {home / 'dagster.yaml'} lacks settings"), err
    assert "rag_pipeline.defs.coordinator.BookRunCoordinator" in err
    assert "rag/book, limit 1 per unique value" in err
    assert "dagster/partition" not in err.split("To fix it")[0]  # it has that one
    assert f"copy {REPO / 'dagster.yaml'} over it" in err
    assert REQUIRED_SNIPPET.splitlines()[1] in err  # the entries to add


def test_a_home_created_outside_the_repository_gets_the_projects_file(home, tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cli = InProcessCli(tmp_path, tmp_path / "books")
    cli.env["DAGSTER_HOME"] = str(home)
    cli.cwd = elsewhere
    shutil.copy(OLD, home / "dagster.yaml")  # what an older version left
    cli("init-instance")  # what `make ui` runs first
    assert (home / "dagster.yaml").read_bytes() == (REPO / "dagster.yaml").read_bytes()
    shutil.rmtree(home)
    cli("init-instance")
    assert (home / "dagster.yaml").read_bytes() == (REPO / "dagster.yaml").read_bytes()
    assert review_home_config(home).notice == ""


@pytest.mark.integration  # make in a process
def test_make_never_copies_over_an_existing_home_file(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n# mine\n")
    os.utime(home / "dagster.yaml", (0, 0))  # older than the repository's: make used to copy
    dry = subprocess.run(
        ["make", "-n", "-C", str(REPO), f"DAGSTER_HOME={home}", f"{home}/dagster.yaml"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "cp " not in dry, dry
    (home / "dagster.yaml").unlink()
    dry = subprocess.run(
        ["make", "-n", "-C", str(REPO), f"DAGSTER_HOME={home}", f"{home}/dagster.yaml"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f'cp dagster.yaml "{home}/dagster.yaml"' in dry, dry

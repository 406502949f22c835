"""Issue 43, item 6: a full ``DAGSTER_HOME``. ``ingest`` used to exit 1 with "unexpected
OperationalError ... disk I/O error", print no ``--json`` report, and leave a run NOT_STARTED
for good (nothing moves a run its process created but could not start)."""

from __future__ import annotations

import json

import pytest

from rag_pipeline_tests.helpers import (
    Cli,
    assert_no_trace,
    fill_disk,
    index_sample_books,
    small_tmpfs,
)

pytestmark = [pytest.mark.slow, pytest.mark.integration]

BOOK = "ros2-fundamentals"
#: free bytes left on the home's disk: the ingest fails opening the instance, creating the
#: run (left NOT_STARTED), or recording its events (left STARTED), as the space runs out
LEFT = (16 << 10, 128 << 10, 256 << 10)
UNFINISHED = {"NOT_STARTED", "STARTING", "STARTED", "CANCELING"}


def test_a_full_dagster_home_is_named_the_report_printed_and_no_run_left_unfinished(tmp_path):
    books = index_sample_books(tmp_path)
    cli = Cli(tmp_path, books)
    with small_tmpfs(tmp_path / "home", "16m") as home:
        cli.env["DAGSTER_HOME"] = str(home)
        cli("ingest")  # the instance and its partitions (nothing to run)
        for left in LEFT:
            (books / BOOK / "99-new.md").write_text(f"# New\n\nA new lesson, {left} left.\n")
            filler = fill_disk(home, left)
            done = cli("ingest", "--json", check=False)
            filler.unlink()
            assert done.returncode == 1, (left, done.stderr[-2000:])
            assert_no_trace(done.stderr)
            assert "unexpected" not in done.stderr, done.stderr
            report = json.loads(done.stdout)  # the report, whatever failed
            failed = report["books"][BOOK]
            assert failed["status"] == "failed", (left, failed)
            message = failed["error_messages"][0]
            assert f"DAGSTER_HOME={str(home)!r} is full" in message, message
            assert "KiB free on its file system" in message, message
            assert report["books"]["humanoid-robotics-ros2"]["status"] == "unchanged"
        done = cli.json("ingest")  # space again: the book is ingested, the runs reaped
        assert done["books"][BOOK]["status"] == "ingested", done
        assert _run_statuses(home) and not set(_run_statuses(home).values()) & UNFINISHED, (
            _run_statuses(home)
        )


def _run_statuses(home) -> dict[str, str]:  # type: ignore[no-untyped-def]
    from dagster import DagsterInstance

    with DagsterInstance.from_config(str(home)) as instance:
        return {
            r.dagster_run.run_id: r.dagster_run.status.value for r in instance.get_run_records()
        }

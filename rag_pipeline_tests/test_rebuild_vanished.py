"""Issue 43, item 4: a book removed or renamed while ``ingest --rebuild`` builds is a change
like any other: the rebuild is swapped in and the book caught up (purged; a renamed one
ingested under its new name). It used to come out ``missing``, fail the rebuild (exit 1) and
leave the damaged collection in service."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rag_pipeline_tests.conftest import REPO
from rag_pipeline_tests.helpers import Cli, assert_no_trace, index_books
from rag_pipeline_tests.removepoint import MARKER

pytestmark = [pytest.mark.slow, pytest.mark.integration]

DOOMED = "doomed-book"


def test_a_book_renamed_during_a_rebuild_is_caught_up_not_a_failure(tmp_path):
    """The old name is purged (nothing of it is in the rebuilt collection), the new one is
    ingested by the catch-up after the swap; exit 0. (Renamed, not deleted: one process
    covers both, the old name is a removed book.)"""
    new_name = "renamed-book"
    books = tmp_path / "books"
    shutil.copytree(REPO / "data" / "books", books)
    shutil.copytree(books / "ros2-fundamentals", books / DOOMED)
    (books / DOOMED / "zz-marker.md").write_text(f"# Marker\n\nThe {MARKER} goes here.\n")
    cli = Cli(tmp_path, books)
    index_books(books, cli.env["RAG_QDRANT_PATH"])
    rebuilt = subprocess.run(
        [
            sys.executable,
            "-m",
            "rag_pipeline_tests.removepoint",
            str(books / DOOMED),
            new_name,
            "ingest",
            "--rebuild",
            "--json",
        ],
        env={**cli.env, "PYTHONPATH": str(REPO)},  # the remove point's module
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    assert_no_trace(rebuilt.stderr)
    assert "rebuilt" in rebuilt.stderr and "not swapped in" not in rebuilt.stderr
    report = json.loads(rebuilt.stdout)["books"]
    assert not (books / DOOMED).exists()
    assert report[DOOMED]["status"] == "removed", report[DOOMED]
    assert any("removed while its run read it" in r for r in report[DOOMED]["reasons"])
    others = {b: r["status"] for b, r in report.items() if b != DOOMED}
    expected = {"ros2-fundamentals": "ingested", "humanoid-robotics-ros2": "ingested"}
    expected[new_name] = "ingested"  # the catch-up after the swap
    assert others == expected, report
    root = Path(cli.env["RAG_QDRANT_PATH"])
    assert not (root / ".rebuild-rag_chunks").exists()  # swapped in
    assert len(list(root.glob("rag_chunks.set-aside-*"))) == 1
    plan = cli.json("plan")
    assert {b: p["action"] for b, p in plan["books"].items()} == {
        b: "unchanged" for b in expected
    }, plan

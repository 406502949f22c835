"""A hostile corpus through the real CLI: every bad file is a per-file error naming the file and
the reason, the rest of the book is ingested, ``plan`` is what ``ingest`` then does, and no
command ever prints a traceback."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from rag_pipeline_tests.helpers import Cli, as_nobody_or_skip, assert_no_trace
from rag_pipeline_tests.hostile import MAX_FILE_BYTES, build_hostile_books

pytestmark = pytest.mark.integration


@pytest.fixture
def hostile(tmp_path):
    data_dir = tmp_path / "books"
    data_dir.mkdir()
    expected = build_hostile_books(data_dir)
    cli = Cli(tmp_path, data_dir)
    cli.env["RAG_MAX_FILE_BYTES"] = str(MAX_FILE_BYTES)
    return cli, data_dir, expected


def no_traceback(proc) -> None:
    assert_no_trace(proc.stderr + proc.stdout)


def test_hostile_corpus_plan_equals_ingest_and_every_file_is_accounted_for(hostile):
    cli, _data_dir, expected = hostile
    plan_proc = cli("plan", "--json")
    no_traceback(plan_proc)
    plan = json.loads(plan_proc.stdout)["books"]
    ingest_proc = cli("ingest", "--json")
    no_traceback(ingest_proc)
    report = json.loads(ingest_proc.stdout)["books"]

    for book in ("hostile", "other"):
        planned, done = plan[book], report[book]
        assert planned["action"] == "run" and done["status"] == "ingested"
        assert planned["chunks_to_embed"] == done["embedded"]
        assert planned["chunks"] == done["points"] == done["chunks"]
        assert planned["points_to_delete"] == done["deleted"]
        assert planned["files_new"] == done["files_new"]

    messages = "\n".join(report["hostile"]["error_messages"])
    warnings = "\n".join(report["hostile"]["warnings"])
    for name, outcome in expected["hostile"].items():
        kind, _, text = outcome.partition(":")
        if kind == "error":
            lines = [m for m in report["hostile"]["error_messages"] if f"hostile/{name}:" in m]
            assert lines, f"no error for {name!r} in:\n{messages}"
            assert text in lines[0], (name, lines[0])
        elif kind == "warn":
            assert any(
                w.startswith(f"{name}:") and text in w for w in report["hostile"]["warnings"]
            ), (
                name,
                warnings,
            )
    assert report["hostile"]["errors"] == len(report["hostile"]["error_messages"])

    # every readable file is in the index, under its own book only
    indexed = indexed_files(cli)
    for name, outcome in expected["hostile"].items():
        if outcome.startswith(("ok", "warn")) and name not in ("empty.md", "blank.md"):
            assert name in indexed["hostile"], name
    assert not {n for n in indexed["hostile"] if "secret" in n or "leak" in n}
    hits = cli.json("search", "Only for the other book", "--book", "hostile", "--limit", "50")
    assert all("Only for the other book" not in h["text"] for h in hits)

    # nothing changed: the plan says so, and the ingest agrees (standing errors still reported)
    again_plan = json.loads(cli("plan", "--json").stdout)["books"]
    assert {b["action"] for b in again_plan.values()} == {"unchanged"}
    again = json.loads(cli("ingest", "--json").stdout)["books"]
    assert {b["status"] for b in again.values()} == {"unchanged"}
    assert again["hostile"]["errors"] == report["hostile"]["errors"]


def indexed_files(cli) -> dict[str, set[str]]:
    from rag_pipeline.config import load_settings
    from rag_pipeline.schema import COLLECTION_SCHEMA, chunks_of
    from rag_pipeline.store import open_store

    config = load_settings(qdrant_path=cli.env["RAG_QDRANT_PATH"]).store()
    with open_store(config, COLLECTION_SCHEMA) as store:
        return {
            book: set(store.counts_by(chunks_of(book), "source_file"))
            for book in ("hostile", "other")
        }


def test_a_book_folder_that_turns_unreadable_is_kept_not_purged(hostile):
    """A book folder the process cannot list is an error; its points stay."""
    cli, data_dir, _ = hostile
    cli("ingest")
    before = indexed_files(cli)
    os.chmod(data_dir / "other", 0)
    try:
        if os.access(data_dir / "other", os.R_OK):
            pytest.skip("running as root: permissions do not apply (see the setpriv test)")
        report = cli.json("ingest")
    finally:
        os.chmod(data_dir / "other", 0o755)
    assert report["books"]["other"]["status"] in ("ingested", "unchanged")
    assert indexed_files(cli) == before


@pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/usr/bin/setpriv").exists(),
    reason="needs root and setpriv to run the CLI as another user",
)
def test_unreadable_file_and_folder_as_an_ordinary_user_keep_their_chunks(sample_books):
    """chmod 000 as a real user sees it (root ignores permissions): the ingest and the plan
    that meet the unreadable file and folder run as nobody (``python -m rag_pipeline.cli``
    through setpriv). The first ingest and those after the permissions are fixed, which no
    permission bears on, run as root, forked from the warm interpreter; everything under the
    test's folder (books, store, Dagster home) is nobody's between."""
    root = Path(tempfile.mkdtemp(prefix="rag-nobody-"))
    os.chmod(root, 0o755)
    data_dir = root / "books"
    import shutil

    shutil.copytree(sample_books, data_dir)
    cli = Cli(root, data_dir)
    cli.env["RAG_BUSY_WAIT_S"] = "5"
    prefix = as_nobody_or_skip()
    first = cli("ingest", "--json")
    for path in [root, *root.rglob("*")]:
        os.chown(path, 65534, 65534, follow_symlinks=False)
    book = data_dir / "ros2-fundamentals"
    locked_file = book / "00-intro.md"
    locked_dir = book / "01-chapter-1-ros2-fundamentals"
    os.chmod(locked_file, 0)
    os.chmod(locked_dir, 0)
    try:
        second = cli.as_user(prefix, "ingest", "--json")
        plan = cli.as_user(prefix, "plan", "--json")
    finally:
        os.chmod(locked_file, 0o644)
        os.chmod(locked_dir, 0o755)
    no_traceback(second)
    result = json.loads(second.stdout)["books"]["ros2-fundamentals"]
    assert result["files_deleted"] == 0 and result["deleted"] == 0
    assert result["points"] == json.loads(first.stdout)["books"]["ros2-fundamentals"]["points"]
    assert any("00-intro.md" in m and "denied" in m for m in result["error_messages"])
    assert any("01-chapter-1-ros2-fundamentals" in m for m in result["error_messages"])
    assert json.loads(plan.stdout)["books"]["ros2-fundamentals"]["points_to_delete"] == 0
    # permissions fixed, bytes as they were: the errors are cleared, nothing is re-embedded
    third = cli.json("ingest")
    healed = third["books"]["ros2-fundamentals"]
    assert healed["status"] == "ingested" and healed["errors"] == 0, healed
    assert healed["embedded"] == 0 and healed["points"] == result["points"]
    fourth = cli.json("ingest")
    assert fourth["books"]["ros2-fundamentals"]["status"] == "unchanged"
    assert fourth["books"]["ros2-fundamentals"]["errors"] == 0
    shutil.rmtree(root, ignore_errors=True)

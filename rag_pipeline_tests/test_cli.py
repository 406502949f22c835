"""The `rag-pipeline` command as users and other tools run it: its output and exit codes in
the test process (click's CliRunner), and what only a process shows (no Dagster import when
nothing changed, a busy store named by another process, a reader that exits early) in real
processes, marked integration."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from rag_pipeline_tests.conftest import REPO
from rag_pipeline_tests.helpers import Cli, InProcessCli, assert_no_trace, index_sample_books

INGEST_KEYS = {
    "files",
    "errors",
    "chunks",
    "embedded",
    "points",
    "reused",
    "deleted",
    "files_new",
    "files_modified",
    "files_deleted",
}
HIT_KEYS = {
    "id",
    "score",
    "book_id",
    "text",
    "source_file",
    "section_title",
    "chunk_index",
    "parent_doc_id",
}


@pytest.fixture
def cli(tmp_path, sample_books):
    """The command in the test process (no Dagster run: those start processes)."""
    return InProcessCli(tmp_path, sample_books)


@pytest.fixture
def process_cli(tmp_path, sample_books):
    """The command in real processes (forked from the warm interpreter, see warm.py): for
    ingests, whose Dagster runs start processes of their own (compute log capture)."""
    return Cli(tmp_path, sample_books)


@pytest.fixture(scope="module")
def ingested(tmp_path_factory):
    """The sample books indexed once (directly, without Dagster), for the read-only tests."""
    root = tmp_path_factory.mktemp("ingested")
    return InProcessCli(root, index_sample_books(root))


@pytest.mark.integration
@pytest.mark.parametrize("engine", ["edge", "client"])
def test_ingest_json_contract_and_incremental_rerun(process_cli, sample_books, engine):
    process_cli.env["RAG_QDRANT_EMBEDDED"] = engine
    report = process_cli.json("ingest")
    books = report["books"]
    assert set(books) == {"humanoid-robotics-ros2", "ros2-fundamentals"}
    for stats in books.values():
        assert set(stats) >= INGEST_KEYS
        assert stats["files"] == 5 and stats["errors"] == 0
        assert stats["chunks"] == stats["points"] == stats["embedded"] > 10
        assert stats["files_new"] == 5
    again = process_cli.json("ingest")["books"]
    assert all(b["embedded"] == 0 and b["status"] == "unchanged" for b in again.values())
    # edit one file, delete another: only that book runs
    book = sample_books / "ros2-fundamentals"
    (book / "00-intro.md").write_text((book / "00-intro.md").read_text() + "\n\n## Added\n\nNew.")
    os.remove(book / "01-chapter-1-ros2-fundamentals" / "02-setup.md")
    third = process_cli.json("ingest")["books"]
    assert third["humanoid-robotics-ros2"]["status"] == "unchanged"
    changed = third["ros2-fundamentals"]
    assert changed["files_modified"] == 1 and changed["files_deleted"] == 1
    assert changed["deleted"] > 0 and changed["reused"] > 0
    assert changed["points"] == changed["chunks"]


NO_DAGSTER_PROBE = """
import json, sys
from click.testing import CliRunner
from rag_pipeline.cli import main
result = CliRunner().invoke(main, ["ingest", "--json"])
print(json.dumps({"exit": result.exit_code, "dagster": "dagster" in sys.modules,
                  "report": json.loads(result.stdout)}))
"""


def probe_ingest(cli) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", NO_DAGSTER_PROBE],
        env=cli.env,
        cwd=cli.cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.integration
def test_no_change_ingest_answers_without_loading_dagster(process_cli, tmp_path):
    process_cli("ingest")
    probe = probe_ingest(process_cli)
    assert probe["exit"] == 0 and not probe["dagster"]
    assert "dagster_import" not in probe["report"]["phases"]
    books = probe["report"]["books"]
    assert {b["status"] for b in books.values()} == {"unchanged"}
    assert all(b["points"] == b["chunks"] > 0 for b in books.values())
    # without the record of the instance's partitions (a new DAGSTER_HOME, say), it goes
    # through Dagster (its report's phases say so: these processes are forked from the warm
    # interpreter, which imported Dagster already), which adds the partitions again
    (tmp_path / "dagster_home" / "rag_book_partitions.json").unlink()
    assert "dagster_import" in process_cli.json("ingest")["phases"]
    assert (tmp_path / "dagster_home" / "rag_book_partitions.json").is_file()
    # a new instance beside the kept index (DAGSTER_HOME reset): the ingest through Dagster
    # gives the unchanged books their partitions, so the one after it needs no Dagster
    shutil.rmtree(tmp_path / "dagster_home")
    assert "dagster_import" in process_cli.json("ingest")["phases"]
    assert not probe_ingest(process_cli)["dagster"]


@pytest.mark.integration
def test_ingest_named_book_and_dagster_records_runs(process_cli, tmp_path):
    report = process_cli.json("ingest", "--book", "ros2-fundamentals")
    assert list(report["books"]) == ["ros2-fundamentals"]
    run_id = report["books"]["ros2-fundamentals"]["run_id"]
    assert run_id
    from dagster import DagsterInstance
    from dagster._core.instance.ref import InstanceRef

    with DagsterInstance.from_ref(InstanceRef.from_dir(str(tmp_path / "dagster_home"))) as instance:
        run = instance.get_run_by_id(run_id)
        assert run is not None and run.is_success
        assert run.tags["dagster/partition"] == "ros2-fundamentals"
        assert "ros2-fundamentals" in instance.get_dynamic_partitions("books")


def test_unknown_or_unsafe_book(cli):
    missing = cli("ingest", "--book", "no-such-book", "--json", check=False)
    assert missing.returncode == 1
    assert (
        "no book folder" in json.loads(missing.stdout)["books"]["no-such-book"]["error_messages"][0]
    )
    unsafe = cli("ingest", "--book", "../etc", check=False)
    assert unsafe.returncode == 2 and "invalid book id" in unsafe.stderr


def test_search_context_document_lineage(ingested):
    cli = ingested
    hits = cli.json(
        "search",
        "How do nodes communicate with topics?",
        "--book",
        "ros2-fundamentals",
        "--limit",
        "4",
    )
    assert 1 <= len(hits) <= 4
    assert all(set(h) >= HIT_KEYS for h in hits)
    assert {h["book_id"] for h in hits} == {"ros2-fundamentals"}
    assert not hits[0]["source_file"].startswith("/")  # relative to the book folder
    top = hits[0]

    context = cli.json(
        "context", top["id"], "--book", "ros2-fundamentals", "--prev", "1", "--next", "1"
    )
    indexes = [c["chunk_index"] for c in context]
    assert top["chunk_index"] in indexes and indexes == sorted(indexes)
    assert len({c["parent_doc_id"] for c in context}) == 1

    document = cli.json("document", top["parent_doc_id"], "--book", "ros2-fundamentals")
    assert [c["chunk_index"] for c in document] == list(range(len(document)))

    lineage = cli.json("lineage", top["id"], "--book", "ros2-fundamentals")
    assert lineage["source_file"] == top["source_file"]
    assert lineage["file_changed_since_indexed"] is False
    assert lineage["run_id"] and lineage["embedding_model"] == "hash-384"

    # another book's id through this book: not found
    other = cli.json("search", "ROS", "--book", "humanoid-robotics-ros2", "--limit", "1")
    foreign = cli("context", other[0]["id"], "--book", "ros2-fundamentals", check=False)
    assert foreign.returncode == 1 and "no chunk" in foreign.stderr


def test_search_requires_a_book(cli):
    proc = cli("search", "anything", check=False)
    assert proc.returncode != 0
    assert "--book is required" in proc.stderr


def test_search_filters_and_modes(ingested):
    cli = ingested
    for mode in ("dense", "sparse", "hybrid"):
        hits = cli.json("search", "ROS 2 nodes", "--book", "ros2-fundamentals", "--mode", mode)
        assert hits, mode
    chapter_one = cli.json(
        "search",
        "ROS 2",
        "--book",
        "ros2-fundamentals",
        "--chapter-min",
        "1",
        "--chapter-max",
        "1",
        "--limit",
        "50",
    )
    assert chapter_one and all(h["chapter"] == 1 for h in chapter_one)
    a2 = cli.json(
        "search", "ROS 2", "--book", "ros2-fundamentals", "--proficiency", "A2", "--limit", "50"
    )
    assert a2 and all(h["proficiency_level"] == "A2" for h in a2)
    empty = cli.json("search", "ROS 2", "--book", "ros2-fundamentals", "--chapter-min", "99")
    assert empty == []
    bad = cli(
        "search",
        "x",
        "--book",
        "ros2-fundamentals",
        "--chapter-min",
        "3",
        "--chapter-max",
        "1",
        check=False,
    )
    assert bad.returncode == 2 and "chapter range is empty" in bad.stderr


@pytest.mark.integration
def test_plan_shows_work_without_writing(process_cli, sample_books):
    plan = process_cli.json("plan")["books"]
    assert plan["ros2-fundamentals"]["files_new"] == 5
    assert plan["ros2-fundamentals"]["chunks_to_embed"] > 0
    assert plan["ros2-fundamentals"]["cost_usd"] == 0
    assert process_cli.json("plan")["books"] == plan  # nothing was written
    process_cli("ingest")
    after = process_cli.json("plan")["books"]["ros2-fundamentals"]
    assert after["chunks_to_embed"] == 0 and after["files_unchanged"] == 5


@pytest.mark.integration
def test_removed_book_is_purged_by_ingest(process_cli, sample_books):
    process_cli("ingest")
    shutil.rmtree(sample_books / "humanoid-robotics-ros2")
    report = process_cli.json("ingest")["books"]
    assert report["humanoid-robotics-ros2"]["status"] == "removed"
    assert report["humanoid-robotics-ros2"]["deleted"] > 0
    gone = process_cli.json("search", "ROS", "--book", "humanoid-robotics-ros2")
    assert gone == []


def test_books_listing(ingested):
    assert ingested("books", "--first").stdout.strip() == "humanoid-robotics-ros2"


@pytest.mark.slow
@pytest.mark.integration
def test_end_to_end_with_the_default_local_model(tmp_path, sample_books):
    """The real offline model, through Dagster, into the embedded store, then a search."""
    shutil.rmtree(sample_books / "humanoid-robotics-ros2")
    cli = Cli(tmp_path, sample_books, embedder="local")
    report = cli.json("ingest")["books"]["ros2-fundamentals"]
    assert report["points"] == report["chunks"] > 50
    hits = cli.json(
        "search",
        "How do publishers and subscribers exchange messages on a topic?",
        "--book",
        "ros2-fundamentals",
        "--mode",
        "dense",
        "--limit",
        "3",
    )
    assert "topic" in hits[0]["text"].lower()
    assert hits[0]["source_file"].endswith("03-nodes-communication.md")
    lineage = cli.json("lineage", hits[0]["id"], "--book", "ros2-fundamentals")
    # the default precision is auto: int8 where the CPU has VNNI/AMX int8 instructions
    from rag_pipeline.embed.local import cpu_has_fast_int8

    suffix = "#int8" if cpu_has_fast_int8() else ""
    assert lineage["embedding_model"] == "sentence-transformers/all-MiniLM-L6-v2" + suffix
    assert lineage["embedding_dim"] == 384


@pytest.mark.integration
def test_busy_embedded_store_is_a_clear_error(ingested):
    """Another process holds the embedded store: the command says which, and exits 2."""
    cli = ingested
    from rag_pipeline.config import load_settings
    from rag_pipeline.schema import COLLECTION_SCHEMA, book_filter
    from rag_pipeline.store import open_store

    holder = open_store(
        load_settings(qdrant_path=cli.env["RAG_QDRANT_PATH"]).store(), COLLECTION_SCHEMA
    )
    holder.count(book_filter("ros2-fundamentals"))  # a handle locks a book when it touches it
    try:
        env = {**cli.env, "RAG_BUSY_WAIT_S": "0"}
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "rag_pipeline.cli",
                "search",
                "x",
                "--book",
                "ros2-fundamentals",
            ],
            env=env,
            cwd=cli.cwd,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 2
        assert "is in use by" in proc.stderr and f"pid {os.getpid()}" in proc.stderr
        assert_no_trace(proc.stderr)
    finally:
        holder.close()


@pytest.mark.integration
@pytest.mark.parametrize(
    "args", [("books",), ("books", "--json"), ("plan",), ("plan", "--json")], ids=" ".join
)
def test_a_reader_that_exits_early_ends_the_command_quietly(cli, args):
    """`rag-pipeline ... | head`: stdout's pipe is closed before anything is written. Exit 141
    (128 + SIGPIPE, README), no traceback, no 'unexpected' error, no complaint at exit."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "rag_pipeline.cli", *args],
            env=cli.env,
            cwd=cli.cwd,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 141, proc.stderr
    assert proc.stderr == "", proc.stderr


def test_repository_layout_is_as_documented():
    for name in (
        "pyproject.toml",
        "workspace.yaml",
        "dagster.yaml",
        "Makefile",
        "README.md",
        ".ci/run",
        "data/books",
    ):
        assert (REPO / name).exists(), name


@pytest.mark.slow
def test_an_ingest_writes_only_through_the_pipelines_stages(tmp_path, sample_books):
    """One path: `rag-pipeline ingest` runs the Dagster job, whose steps are the pipeline's
    stages in order, and every point it writes or deletes is written inside the pipeline's
    write stage (a CLI or asset that wrote through anything else fails here). In-process, so
    the spies see the job's steps."""
    from rag_pipeline_tests.pins import STAGES, pipeline_spies

    cli = InProcessCli(tmp_path, sample_books)
    with pipeline_spies() as spies:
        report = json.loads(cli("ingest", "--json").stdout)["books"]
    assert {r["status"] for r in report.values()} == {"ingested"}
    assert tuple(spies.stages) == STAGES  # one batch of both books: each stage once
    assert spies.writes > 0 and spies.outside == []
    (sample_books / "ros2-fundamentals" / "extra.md").write_text("# Extra\n\nA new file.\n")
    with pipeline_spies() as spies:
        cli("ingest")
    assert tuple(spies.stages) == STAGES and spies.outside == []

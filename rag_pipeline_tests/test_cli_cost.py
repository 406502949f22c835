"""What a one-book change through `rag-pipeline ingest` costs Dagster, counted: the instance
opened once, the run's events, the SQLite connections they open (kept per database file while
the instance is open, not one per statement), and the phases the command reports."""

import json
import random
import shutil
import subprocess
import sys

import numpy as np
import pytest
from dagster import DagsterInstance
from sqlalchemy import event
from sqlalchemy.pool import Pool

from rag_pipeline.defs import _dagster_private
from rag_pipeline.defs.instance import open_home_instance
from rag_pipeline.defs.runner import execute_plan
from rag_pipeline.embed.local import LocalEmbedder
from rag_pipeline.ingest.stages import percentile_95
from rag_pipeline_tests.conftest import REPO, hash_settings, section
from rag_pipeline_tests.helpers import Cli
from rag_pipeline_tests.test_runner import pipeline_of, plan_of

#: the events a one-book run of ingest_books records: 8 planned (5 materializations, 3
#: checks), the run's 6 (start, process, resources, logs, end of steps, success), per step its
#: start, inputs, outputs, materialization, checks and success, and the embed and write
#: steps' log lines (a guard: more events is a dearer run)
ONE_BOOK_RUN_EVENTS = 61
#: the SQLite connections a one-book ingest on the home instance may open: one per database
#: file (runs, index, schedules, the run's shard) and a few more for steps that overlap; each
#: statement opened its own before (324 for that run)
ONE_BOOK_RUN_CONNECTIONS = 20


@pytest.fixture
def home(tmp_path, monkeypatch):
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return home


@pytest.mark.integration  # a real DAGSTER_HOME: Dagster starts `tail` for its logs
def test_a_one_book_change_opens_the_instance_once_and_few_sqlite_connections(
    data_dir, tmp_path, write_book, home, monkeypatch
):
    write_book("alpha", {"a.md": "# Alpha\n\n" + section("One") + section("Two", seed="t")})
    write_book("beta", {"b.md": "# Beta\n\n" + section("Three", seed="b")})
    settings = hash_settings(data_dir, tmp_path)
    execute_plan(plan_of(settings), pipeline_of(settings), dagster_home=home)
    (data_dir / "alpha" / "a.md").write_text("# Alpha\n\n" + section("One", seed="edited"))

    opens = []
    real_get = DagsterInstance.get
    monkeypatch.setattr(DagsterInstance, "get", lambda: opens.append(1) or real_get())
    started: list[str] = []

    class Started(subprocess.Popen):  # type: ignore[type-arg]
        def __init__(self, args, *more, **options):  # type: ignore[no-untyped-def]
            started.append(str(args))
            super().__init__(args, *more, **options)

    monkeypatch.setattr(subprocess, "Popen", Started)
    connections = []
    record = lambda *_: connections.append(1)  # noqa: E731 - a listener, removed below
    event.listen(Pool, "connect", record)
    try:
        pipeline = pipeline_of(settings)
        report = execute_plan(plan_of(settings, pipeline=pipeline), pipeline, dagster_home=home)
    finally:
        event.remove(Pool, "connect", record)
    ran = {b: r for b, r in report.books.items() if r.status != "unchanged"}
    assert list(ran) == ["alpha"] and ran["alpha"].status == "ingested"
    assert len(opens) == 1  # the CLI opens the instance once, whatever it runs
    # its runs capture no output (as live mode's): Dagster started two `tail` processes a run
    assert not [a for a in started if "tail" in a], started
    assert len(connections) <= ONE_BOOK_RUN_CONNECTIONS, len(connections)
    with open_home_instance() as instance:
        logs = instance.all_logs(ran["alpha"].run_id or "")
        assert len(logs) <= ONE_BOOK_RUN_EVENTS, [e.dagster_event_type for e in logs]
        # the same record as ever: the materializations and checks of every asset
        kinds = [e.dagster_event_type.value for e in logs if e.dagster_event is not None]
        assert kinds.count("ASSET_MATERIALIZATION") == 5
        assert kinds.count("ASSET_CHECK_EVALUATION") == 4
        assert kinds[-1] == "PIPELINE_SUCCESS"
        # every kept connection writes ahead without an fsync per commit: the run's shard,
        # the runs and the schedules databases
        events = instance.event_log_storage
        for connect in (
            lambda: events._connect(ran["alpha"].run_id),
            instance.run_storage.connect,
            instance.schedule_storage.connect,
        ):
            with connect() as conn:
                assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
                assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL


def test_kept_engines_are_bounded_and_disposed():
    """A long-lived process (live mode) runs many runs, each with a shard of its own: the
    engines kept are the last few files', the others disposed of."""
    engines = _dagster_private._Engines()
    made = [engines.get(f"sqlite:///{i}.db", {}) for i in range(_dagster_private.KEPT_ENGINES + 3)]
    assert engines.get("sqlite:///0.db", {}) is not made[0]  # disposed, made again
    last = f"sqlite:///{_dagster_private.KEPT_ENGINES + 2}.db"
    assert engines.get(last, {}) is made[-1]  # kept
    assert engines.created == _dagster_private.KEPT_ENGINES + 4
    engines.dispose()
    assert engines.get(last, {}) is not made[-1]


def test_the_instance_keeps_its_sqlite_storages_engines_while_open(home):
    """Inside ``open_home_instance`` the SQLite storages connect through kept engines; after
    it, the storages are Dagster's own again."""
    with open_home_instance() as instance:
        storages = (instance.run_storage, instance.event_log_storage, instance.schedule_storage)
        assert all("connect" in vars(s) or "_connect" in vars(s) for s in storages)
        instance.get_runs(limit=1)
        instance.get_dynamic_partitions("books")
    assert not any("connect" in vars(s) or "_connect" in vars(s) for s in storages)


@pytest.mark.integration
def test_ingest_json_reports_its_phases(tmp_path, sample_books):
    """``ingest --json`` says where its time went: every phase's length and the CPU seconds
    at its end, in order; without a run, no Dagster phase."""
    cli = Cli(tmp_path, sample_books, fresh=True)
    ran = cli.json("ingest")["phases"]
    names = ["imports", "plan", "dagster_import", "instance_open", "runs", "collection"]
    assert list(ran) == [*names, "report"]
    assert all(p["wall_s"] >= 0 and p["cpu_s"] > 0 for p in ran.values())
    cpu = [p["cpu_s"] for p in ran.values()]
    assert cpu == sorted(cpu)
    assert ran["report"]["at_s"] == pytest.approx(sum(p["wall_s"] for p in ran.values()), abs=0.01)
    assert list(cli.json("ingest")["phases"]) == ["imports", "plan", "report"]


END_PROBE = """
import atexit, sys
from rag_pipeline.cli import main

class Teardown:
    def __del__(self):
        print("teardown", file=sys.stderr)

kept = Teardown()  # freed only by the interpreter's teardown
atexit.register(lambda: print("atexit ran", file=sys.stderr))
main(sys.argv[1:], prog_name="rag-pipeline")
"""


@pytest.mark.integration
@pytest.mark.parametrize(("args", "code"), [(["books", "--first"], 0), (["search", "q"], 2)])
def test_the_process_ends_without_the_interpreters_teardown(tmp_path, sample_books, args, code):
    """The command's process runs ``atexit`` and flushes its output, then exits with the
    command's status without freeing every module's objects (most of what a run leaves)."""
    import subprocess
    import sys

    cli = Cli(tmp_path, sample_books, fresh=True)
    proc = subprocess.run(
        [sys.executable, "-c", END_PROBE, *args],
        env=cli.env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == code, proc.stderr
    assert "atexit ran" in proc.stderr
    assert "teardown" not in proc.stderr
    if code == 0:
        assert proc.stdout.strip() == "humanoid-robotics-ros2"
    else:
        assert "--book" in proc.stderr


#: modules a one-file change's `ingest` has no use for (the UI's server, PostgreSQL, gRPC,
#: the cloud and git sources, the model's runtime on a deletion, numpy's masked arrays)
NOT_ON_A_CHANGES_PATH = (
    "dagster_webserver",
    "dagster_graphql",
    "dagster_postgres",
    "grpc",
    "pandas",
    "boto3",
    "git",
    "onnxruntime",
    "numpy.ma",
)

INGEST = ("ingest", "--json")
CHANGE_PROBE = """
import atexit, json, sys
from alembic.script.base import ScriptDirectory

reads = []
real = ScriptDirectory._load_revisions
ScriptDirectory._load_revisions = lambda self: reads.append(1) or real(self)

def said():
    names = [m for m in json.loads(sys.argv[1]) if m in sys.modules]
    print(json.dumps({"imported": names, "revision_reads": len(reads)}), file=sys.stderr)

atexit.register(said)
from rag_pipeline.cli import main
main(sys.argv[2:], prog_name="rag-pipeline")
"""


@pytest.mark.integration
def test_a_one_file_change_imports_only_what_it_needs(tmp_path, sample_books):
    """A fresh `ingest` of a one-file edit, then of a deletion: none of the modules a change
    has no use for is imported, and alembic's migration scripts are read once (the
    instance's storages and the run's new shard check their schema against the same
    scripts: three reads before)."""
    cli = Cli(tmp_path, sample_books, fresh=True)
    cli("ingest")
    book = next(p for p in sorted(sample_books.iterdir()) if p.is_dir())
    edited = sorted(book.rglob("*.md"))[-1]

    def probed() -> dict[str, object]:
        proc = subprocess.run(
            [sys.executable, "-c", CHANGE_PROBE, json.dumps(NOT_ON_A_CHANGES_PATH), *INGEST],
            env=cli.env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        ran = json.loads(proc.stdout)["books"][book.name]
        assert ran["status"] == "ingested", ran
        figures: dict[str, object] = json.loads(proc.stderr.strip().splitlines()[-1])
        return figures

    edited.write_text(edited.read_text() + "\n\n## Added\n\nA new paragraph.\n")
    assert probed() == {"imported": [], "revision_reads": 1}
    edited.unlink()
    assert probed() == {"imported": [], "revision_reads": 1}


def test_p95_is_numpys_percentile():
    """The chunks' p95 token count, computed without ``np.percentile`` (which imports
    ``numpy.ma``), is numpy's own figure."""
    draw = random.Random(7)
    for size in [1, 2, 3, 19, 20, 21, 100, 257]:
        for _ in range(30):
            counts = np.array([draw.randint(1, 512) for _ in range(size)])
            assert int(percentile_95(counts)) == int(np.percentile(counts, 95))


def test_the_models_input_tokenizer_waits_for_the_first_embedding(tmp_path):
    """A plan or a deletion counts tokens but embeds nothing: the model's second tokenizer
    (its inputs, truncated) is loaded at the first embedding, not with the embedder."""
    embedder = LocalEmbedder(cache_dir=tmp_path, batch_size=8)
    assert embedder.tokenizer.count(["one two three"])[0] > 0
    assert "_encoder" not in vars(embedder)

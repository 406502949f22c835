"""The in-process runner behind `rag-pipeline ingest`: what it runs, skips and refuses to purge."""

import uuid

import pytest
from dagster import AssetRecordsFilter, DagsterInstance, RunsFilter

from rag_pipeline.defs.metadata import markdown_rows
from rag_pipeline.defs.runner import execute_plan
from rag_pipeline.embed import create_embedder
from rag_pipeline.ingest.consistency import check_index
from rag_pipeline.ingest.pipeline import IngestPipeline
from rag_pipeline.recipes.recipe import IndexRecipe
from rag_pipeline.schema import COLLECTION_SCHEMA, chunks_of
from rag_pipeline.sources.crawl import DataDirError
from rag_pipeline.store import PointRecord, open_store
from rag_pipeline_tests.conftest import break_chunking_of, hash_settings, section


def pipeline_of(settings, recipe=None):
    """The pipeline of ``settings``, with one recipe built from them for every book."""
    recipe = recipe or IndexRecipe.build(create_embedder(settings.embedding()), settings.chunking())
    return IngestPipeline.from_settings(settings, recipe)


def plan_of(settings, book_ids=None, force=False, pipeline=None):
    """The plan `rag-pipeline ingest` makes."""
    pipeline = pipeline or pipeline_of(settings)
    with pipeline.store.open() as store:
        return pipeline.plan(store, book_ids, force=force)


def ingest_books(settings, instance, book_ids=None, force=False, batching=None, work_first=False):
    """What `rag-pipeline ingest` does: plan, then execute the plan through Dagster (with
    ``work_first``: as live mode does, the points written before the runs' events)."""
    pipeline = pipeline_of(settings)
    plan = plan_of(settings, book_ids, force, pipeline)
    return execute_plan(plan, pipeline, instance, batching=batching, work_first=work_first)


@pytest.fixture
def settings(data_dir, tmp_path, write_book):
    write_book("alpha", {"a.md": "# Alpha\n\n" + section("One") + section("Two", seed="t")})
    write_book("beta", {"b.md": "# Beta\n\n" + section("Three", seed="b")})
    return hash_settings(data_dir, tmp_path)


@pytest.fixture
def instance():
    with DagsterInstance.ephemeral() as inst:
        yield inst


def chunk_points(settings, book):
    with open_store(settings.store(), COLLECTION_SCHEMA) as store:
        return store.count(chunks_of(book))


def test_second_ingest_runs_nothing(settings, instance):
    first = ingest_books(settings, instance)
    assert {b: r.status for b, r in first.books.items()} == {
        "alpha": "ingested",
        "beta": "ingested",
    }
    again = ingest_books(settings, instance)
    assert {r.status for r in again.books.values()} == {"unchanged"}
    assert all(r.points == r.chunks > 0 for r in again.books.values())


def test_a_missing_data_folder_is_an_error_and_purges_nothing(settings, instance, data_dir):
    ingest_books(settings, instance)
    before = chunk_points(settings, "alpha")
    missing = settings.model_copy(update={"data_dir": data_dir / "not-mounted"})
    with pytest.raises(DataDirError, match="not-mounted"):
        ingest_books(missing, instance)
    assert chunk_points(settings, "alpha") == before > 0


def test_an_empty_data_folder_does_not_purge_every_book(settings, instance, tmp_path):
    ingest_books(settings, instance)
    empty = tmp_path / "empty"
    empty.mkdir()
    report = ingest_books(settings.model_copy(update={"data_dir": empty}), instance)
    assert report.books == {}
    assert "refusing to purge all 2" in report.warnings[0]
    assert chunk_points(settings, "alpha") > 0 and chunk_points(settings, "beta") > 0


def test_a_data_folder_holding_none_of_the_indexed_books_purges_nothing(
    settings, instance, tmp_path, write_book
):
    """A wrong RAG_DATA_DIR (other folders, none of the indexed books) is not taken for the
    replacement of every book: nothing is purged, and nothing ingested either (the next
    ingest would otherwise find one indexed book on disk and purge the rest), until books are
    named; ingesting again changes nothing."""
    ingest_books(settings, instance)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "stray").mkdir(parents=True)
    (elsewhere / "stray" / "notes.md").write_text("# Stray\n\n" + section("Notes", seed="s"))
    wrong = settings.model_copy(update={"data_dir": elsewhere})
    plan = plan_of(wrong)
    assert plan.books == {}
    for _ in range(2):
        report = ingest_books(wrong, instance)
        assert report.books == {}
        assert any("none of the 2 indexed books" in w for w in report.warnings), report.warnings
        assert chunk_points(settings, "alpha") > 0 and chunk_points(settings, "beta") > 0
    # named, a book runs (and named, a removed one would be purged)
    named = ingest_books(wrong, instance, ["stray"])
    assert named.books["stray"].status == "ingested"
    assert chunk_points(settings, "alpha") > 0 and chunk_points(settings, "beta") > 0


def test_a_purge_plan_counts_every_point_the_purge_deletes(settings, instance, data_dir):
    import shutil

    ingest_books(settings, instance)
    shutil.rmtree(data_dir / "beta")
    planned = plan_of(settings).books["beta"]
    report = ingest_books(settings, instance)
    assert planned.action == "purge" and report.books["beta"].status == "removed"
    assert planned.points == report.books["beta"].deleted > 0


def test_what_replaced_a_file_or_a_book_folder_is_named(settings, instance, data_dir):
    """A directory where an indexed file was, a file where a book folder was: each keeps its
    points and the message says what is there instead."""
    import shutil

    ingest_books(settings, instance)
    alpha_points, beta_points = chunk_points(settings, "alpha"), chunk_points(settings, "beta")
    (data_dir / "alpha" / "a.md").unlink()
    (data_dir / "alpha" / "a.md").mkdir()
    shutil.rmtree(data_dir / "beta")
    (data_dir / "beta").write_text("not a folder")
    report = ingest_books(settings, instance)
    messages = report.books["alpha"].error_messages
    assert any("a.md" in m and "is a directory, not a file" in m for m in messages), messages
    assert any("'beta' is a file, not a folder" in w for w in report.warnings), report.warnings
    assert chunk_points(settings, "alpha") == alpha_points
    assert chunk_points(settings, "beta") == beta_points


def test_a_removed_book_is_purged_when_others_remain(settings, instance, data_dir):
    import shutil

    ingest_books(settings, instance)
    shutil.rmtree(data_dir / "beta")
    report = ingest_books(settings, instance)
    assert report.books["beta"].status == "removed"
    assert chunk_points(settings, "beta") == 0 and chunk_points(settings, "alpha") > 0
    # the purge is recorded on every asset it emptied, and on the collection's page
    from dagster import AssetKey, AssetRecordsFilter

    for asset in ("source_files", "qdrant_points"):
        # an observation: a removal, not a new version fronting the asset's page
        latest = instance.fetch_observations(
            AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=["beta"]), limit=1
        ).records[0]
        metadata = latest.asset_observation.metadata
        assert metadata["purged"].value is True and metadata["points_in_book"].value == 0
        assert latest.run_id == report.books["beta"].run_id
    page = instance.get_latest_materialization_event(AssetKey("qdrant_collection"))
    table = page.asset_materialization.metadata["book_table"]
    assert [row["book"] for row in markdown_rows(table)] == ["alpha"]


def test_a_purge_keeps_the_partition_while_another_run_of_the_book_is_in_flight(
    settings, instance, data_dir
):
    """A daemon run of the book still running (here: started, not ended) must not lose its
    partition under it; once it ends, naming the book removes the partition."""
    import shutil

    from dagster import DagsterRunStatus
    from dagster._core.test_utils import create_run_for_test

    from rag_pipeline.defs.partitions import BOOKS_PARTITIONS_NAME

    ingest_books(settings, instance)
    running = create_run_for_test(
        instance,
        job_name="ingest_books",
        status=DagsterRunStatus.STARTED,
        tags={"dagster/partition": "beta"},
    )
    shutil.rmtree(data_dir / "beta")
    report = ingest_books(settings, instance)
    assert report.books["beta"].status == "removed" and chunk_points(settings, "beta") == 0
    assert any("kept while another run" in w for w in report.books["beta"].warnings)
    assert "beta" in instance.get_dynamic_partitions(BOOKS_PARTITIONS_NAME)
    instance.report_run_failed(running)
    named = ingest_books(settings, instance, ["beta"])
    assert named.books["beta"].status == "missing"  # nothing left to purge
    assert "beta" not in instance.get_dynamic_partitions(BOOKS_PARTITIONS_NAME)


def test_orphan_chunks_without_a_document_record_start_a_run(settings, instance):
    """What a run killed between its chunk upsert and its commit leaves for a file that was
    deleted before the next run: chunks no document record accounts for."""
    ingest_books(settings, instance)
    with open_store(settings.store(), COLLECTION_SCHEMA) as store:
        record = next(iter(store.scroll(chunks_of("alpha"), with_vectors=True)))
        orphan = {
            **record.payload,
            "source_file": "gone.md",
            "prev_chunk_id": None,
            "next_chunk_id": None,
        }
        store.upsert([PointRecord(str(uuid.uuid4()), orphan, dense=record.dense)])
    report = ingest_books(settings, instance)
    assert report.books["alpha"].status == "ingested"
    assert report.books["alpha"].deleted == 1
    assert report.books["beta"].status == "unchanged"
    with open_store(settings.store(), COLLECTION_SCHEMA) as store:
        assert check_index(store, "alpha").passed


def test_a_partition_another_process_adds_at_the_same_moment_is_not_an_error():
    """Two ingests (or an ingest and the sensor) add the same new book together: both read it
    as missing, the second insert hits the unique index; that run must go on, not fail."""
    from rag_pipeline.defs.partitions import BOOKS_PARTITIONS_NAME
    from rag_pipeline.defs.runner import add_book_partitions

    instance = DagsterInstance.ephemeral()
    real_add = instance.add_dynamic_partitions
    calls = []

    def racing_add(name, keys):
        calls.append(list(keys))
        real_add(name, keys)  # the other process's insert lands first...
        if len(calls) == 1:  # ...and ours then fails on the unique index
            raise RuntimeError(
                "(sqlite3.IntegrityError) UNIQUE constraint failed: dynamic_partitions"
            )

    instance.add_dynamic_partitions = racing_add
    add_book_partitions(instance, ["alpha", "beta"])
    assert set(instance.get_dynamic_partitions(BOOKS_PARTITIONS_NAME)) == {"alpha", "beta"}
    assert calls == [["alpha", "beta"]]  # read again: nothing left to add

    instance.add_dynamic_partitions = lambda name, keys: (_ for _ in ()).throw(OSError("disk"))
    with pytest.raises(OSError):  # any other failure is not swallowed
        add_book_partitions(instance, ["gamma"])


#: a sentence of the book below that only a chunk's full text holds
DISTINCTIVE = "The quartz heron recalibrates every torque sensor before the dawn patrol."
#: what a book run may add to DAGSTER_HOME, whatever the book's size: Dagster's own record of
#: the run (SQLite keeps each run's events in a database file of its own, about 230 KiB for
#: the ~60 events of a book run) and the run's bounded metadata
HOME_GROWTH_PER_RUN = 400 * 1024


def home_bytes(home):
    return sum(p.stat().st_size for p in home.rglob("*") if p.is_file())


@pytest.mark.integration  # runs on a real DAGSTER_HOME: Dagster starts `tail` for its logs
def test_dagster_home_keeps_no_chunk_text_or_vector_and_grows_little_per_book_run(
    settings, data_dir, tmp_path, monkeypatch, capsys
):
    """Step outputs stay in the run's memory: after CLI ingests, no file under DAGSTER_HOME
    holds a pickle, a vector or a chunk's text, and a book run adds a bounded amount however
    much text it embeds (the book here has 361 chunks: their 384-dimensional vectors alone
    would be 540 KiB)."""
    import shutil

    import numpy as np

    from rag_pipeline.defs.instance import open_home_instance
    from rag_pipeline_tests.conftest import REPO

    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    lead = " ".join(f"lead{i}" for i in range(30))
    book = data_dir / "gamma"
    book.mkdir()
    for f in range(30):
        (book / f"f{f:02d}.md").write_text(
            f"# File {f}\n\n" + "".join(section(f"S{s}", seed=f"{f}x") for s in range(12))
        )

    def edit(i):
        (book / "g.md").write_text(f"# Gamma\n\n## Sensors {i}\n\n{lead} {DISTINCTIVE}\n")

    edit(0)
    with open_home_instance() as instance:
        first = ingest_books(settings, instance)
    assert {r.status for r in first.books.values()} == {"ingested"}
    chunks = first.books["gamma"].chunks
    before = home_bytes(home)
    runs = 3
    for i in range(1, runs + 1):  # one file of the book edited: one book run each
        edit(i)
        with open_home_instance() as instance:
            report = ingest_books(settings, instance)
        assert [b for b, r in report.books.items() if r.status == "ingested"] == ["gamma"]
    growth = (home_bytes(home) - before) / runs
    with capsys.disabled():
        print(
            f"\nDAGSTER_HOME after {runs + 1} ingests of a book of {chunks} chunks: "
            f"{home_bytes(home)} bytes; {growth / 1024:.1f} KiB per book run"
        )

    with open_store(settings.store(), COLLECTION_SCHEMA) as store:
        dense = next(iter(store.scroll(chunks_of("gamma"), with_vectors=True))).dense
    vector_bytes = [np.asarray(dense, dtype=t).tobytes()[:32] for t in (np.float32, np.float64)]
    files = [p for p in home.rglob("*") if p.is_file()]
    assert not [p for p in files if p.suffix in (".pkl", ".pickle")]
    for path in files:
        data = path.read_bytes()
        assert DISTINCTIVE.encode() not in data, path
        assert lead[:40].encode() not in data, path  # the start of a chunk: no preview either
        assert not any(v in data for v in vector_bytes), path
    assert growth <= HOME_GROWTH_PER_RUN


@pytest.mark.parametrize("config", ["dagster.yaml", "deploy/dagster.postgres.yaml"])
def test_the_run_launcher_loads_from_its_module_and_from_the_old_ones(config):
    """dagster.yaml names the launcher in defs/, the Dagster layer's home; a copy made before
    it moved (the CLI writes $DAGSTER_HOME/dagster.yaml only when there is none) still names
    orchestration.launcher, and that name still loads the same class."""
    import importlib

    import yaml

    from rag_pipeline.defs.launcher import LocalRunLauncher
    from rag_pipeline_tests.conftest import REPO

    text = (REPO / config).read_text()
    assert "rag_pipeline.orchestration.launcher" not in text
    if config == "dagster.yaml":
        named = yaml.safe_load(text)["run_launcher"]
        module = importlib.import_module(named["module"])
        assert getattr(module, named["class"]) is LocalRunLauncher
    else:
        assert "rag_pipeline.defs.launcher.LocalRunLauncher" in text
    old = importlib.import_module("rag_pipeline.orchestration.launcher")
    assert old.LocalRunLauncher is LocalRunLauncher


def ingest_runs(instance):
    return instance.get_runs(RunsFilter(job_name="ingest_books"))


def add_books(write_book, names):
    for name in names:
        write_book(name, {f"{name}.md": f"# {name.title()}\n\n" + section("Body", seed=name)})


@pytest.mark.parametrize("work_first", [False, True], ids=["cli", "live"])
def test_many_changed_books_go_through_fewer_runs_than_books_each_point_naming_its_run(
    settings, instance, write_book, work_first
):
    """Books that change together share runs (a range of partitions each, at most
    RAG_BATCH_BOOKS books); every point still names the run that wrote it, and that run
    recorded the book's own materialization (live mode's work first included)."""
    from rag_pipeline.config import BatchConfig
    from rag_pipeline.defs.assets import qdrant_points
    from rag_pipeline.schema import RUN_ID

    add_books(write_book, ["gamma", "delta", "epsilon", "zeta"])  # 6 books with alpha, beta
    batching = BatchConfig(max_books=4)
    report = ingest_books(settings, instance, batching=batching, work_first=work_first)
    assert {r.status for r in report.books.values()} == {"ingested"}
    runs = ingest_runs(instance)
    assert len(runs) == 2 < len(report.books)
    assert sorted(r.tags.get("rag/batch", "") for r in runs) == ["2 books", "4 books"]
    with open_store(settings.store(), COLLECTION_SCHEMA) as store:
        for book, result in report.books.items():
            written = {p.payload[RUN_ID] for p in store.scroll(chunks_of(book), fields=[RUN_ID])}
            assert written == {result.run_id}, book
            latest = instance.fetch_materializations(
                AssetRecordsFilter(asset_key=qdrant_points.key, asset_partitions=[book]), limit=1
            ).records
            assert latest and latest[0].run_id == result.run_id
    # a later edit of one book runs it alone, with its own tags
    write_book("delta", {"delta.md": "# Delta\n\n" + section("Changed", seed="d2")})
    again = ingest_books(settings, instance, batching=batching, work_first=work_first)
    assert [b for b, r in again.books.items() if r.status == "ingested"] == ["delta"]
    latest_run = instance.get_run_by_id(again.books["delta"].run_id)
    assert (
        latest_run.tags["rag/book"] == "delta" and latest_run.tags["dagster/partition"] == "delta"
    )


@pytest.mark.parametrize("work_first", [False, True], ids=["cli", "live"])
def test_a_batch_that_fails_for_one_book_is_run_again_book_by_book(
    settings, instance, write_book, monkeypatch, work_first
):
    """A step fails for a whole batch; its books are then run alone, so one broken book
    fails alone and the others are ingested."""
    add_books(write_book, ["gamma"])
    break_chunking_of(monkeypatch, "beta")
    notes = []
    pipeline = pipeline_of(settings)
    plan = plan_of(settings, pipeline=pipeline)
    report = execute_plan(plan, pipeline, instance, notify=notes.append, work_first=work_first)
    assert {b: r.status for b, r in report.books.items()} == {
        "alpha": "ingested",
        "beta": "failed",
        "gamma": "ingested",
    }
    assert "chunker bug on beta" in report.books["beta"].error_messages[0]
    assert any("running them one by one" in n for n in notes)
    assert len(ingest_runs(instance)) == 4  # the batch, then one run per book
    assert chunk_points(settings, "beta") == 0 and chunk_points(settings, "gamma") > 0


def test_a_batch_that_fails_for_the_whole_run_is_not_run_again_book_by_book(
    settings, instance, monkeypatch
):
    """When the store or the embedding service cannot be used, every book would fail alike:
    the batch's books are reported failed with the reason, and no run is started per book."""
    from rag_pipeline.ingest import pipeline as pipeline_module
    from rag_pipeline.store import StoreBusyError

    def busy(*args, **kwargs):
        raise StoreBusyError("the store is busy (injected)")

    monkeypatch.setattr(pipeline_module, "take_inventory", busy)
    report = ingest_books(settings, instance)
    assert {r.status for r in report.books.values()} == {"failed"}
    assert all("busy (injected)" in r.error_messages[0] for r in report.books.values())
    assert len(ingest_runs(instance)) == 1


def test_one_busy_book_fails_alone_and_the_rest_of_its_batch_is_ingested(
    data_dir, tmp_path, write_book, instance
):
    """On Qdrant Edge each book has its own lock: a book another process holds past the busy
    wait fails with its own message, and the other books of its batch are ingested (the batch
    is split) instead of all failing with that book's message."""
    from rag_pipeline.store.edge import EdgeStore

    for book in ("alpha", "beta", "gamma"):
        write_book(book, {f"{book}.md": f"# {book}\n\n" + section("One", seed=book)})
    settings = hash_settings(data_dir, tmp_path, busy_wait_s=0.5)
    ingest_books(settings, instance)
    for book in ("alpha", "beta", "gamma"):
        write_book(book, {f"{book}.md": f"# {book}\n\n" + section("Two", seed=book + "2")})
    with EdgeStore("rag_chunks", settings.qdrant_path, COLLECTION_SCHEMA) as other:
        other.count(chunks_of("beta"))  # holds beta's lock (flock: per open file, as a process)
        report = ingest_books(settings, instance)
    statuses = {b: r.status for b, r in report.books.items()}
    assert statuses == {"alpha": "ingested", "beta": "failed", "gamma": "ingested"}, statuses
    assert "book 'beta'" in report.books["beta"].error_messages[0]
    assert "in use" in report.books["beta"].error_messages[0]
    assert ingest_books(settings, instance).books["beta"].status == "ingested"


def test_a_book_lock_taken_by_a_run_names_the_run(
    data_dir, tmp_path, write_book, instance, monkeypatch
):
    """What a waiter (the query service, a CLI) says about a book's holder names the Dagster
    run that holds it, not only the worker's command line."""
    from pathlib import Path

    from rag_pipeline.ingest import pipeline as pipeline_module
    from rag_pipeline.store.lock import FolderLock, describe_holder

    write_book("alpha", {"alpha.md": "# alpha\n\n" + section("One", seed="alpha")})
    settings = hash_settings(data_dir, tmp_path)
    seen: list[str] = []
    write_and_check = pipeline_module.write_and_check

    def spy(store, source, chunked, *args):  # type: ignore[no-untyped-def]
        written = write_and_check(store, source, chunked, *args)
        lock = Path(settings.qdrant_path) / "rag_chunks" / "locks" / f"{chunked.book_id}.lock"
        seen.append(describe_holder(FolderLock(lock, "book").holder()))
        return written

    monkeypatch.setattr(pipeline_module, "write_and_check", spy)
    report = ingest_books(settings, instance)
    run_id = report.books["alpha"].run_id
    assert report.books["alpha"].status == "ingested", report.books["alpha"].error_messages
    assert seen and f"for Dagster run {run_id} (" in seen[0], seen


def test_a_run_its_dead_process_created_but_never_started_is_reaped(instance):
    """Issue 43, item 6: a run the CLI created in process and could not start (a full
    DAGSTER_HOME) stays NOT_STARTED, which nothing else moves: reaped once its process is gone.
    Runs waiting for a launcher (no process of ours, or a re-execution that copied our tags)
    and runs of a live process are left alone."""
    import os
    import socket

    from dagster import DagsterRunStatus
    from dagster._core.test_utils import create_run_for_test

    from rag_pipeline.defs.reaper import HOST_TAG, PID_TAG, process_tags, reap_dead_runs

    gone = {PID_TAG: str(2**22 + 1), HOST_TAG: socket.gethostname()}  # above any pid_max

    def created(tags, **kwargs):  # type: ignore[no-untyped-def]
        return create_run_for_test(
            instance,
            job_name="ingest_books",
            status=DagsterRunStatus.NOT_STARTED,
            tags=tags,
            **kwargs,
        ).run_id

    orphan = created(gone)
    waiting = created({})
    parent = created({})
    reexecuted = created(gone, parent_run_id=parent, root_run_id=parent)
    ours = created(process_tags())
    assert process_tags()[PID_TAG] == str(os.getpid())
    assert reap_dead_runs(instance) == [orphan]
    status = {r: instance.get_run_by_id(r).status for r in (orphan, waiting, reexecuted, ours)}
    assert status[orphan] == DagsterRunStatus.FAILURE
    assert {status[r] for r in (waiting, reexecuted, ours)} == {DagsterRunStatus.NOT_STARTED}


def test_only_a_write_the_disk_refused_is_a_full_dagster_home(tmp_path):
    """SQLite's "disk is full" and ENOSPC name a full home; its "disk I/O error" does only when
    the home's file system is nearly full (here it is not), any other error never."""
    import sqlite3

    from rag_pipeline.defs.instance import home_full

    wrapped = RuntimeError("a run failed")
    wrapped.__cause__ = sqlite3.OperationalError("database or disk is full")
    assert "is full (database or disk is full)" in str(home_full(tmp_path, wrapped))
    assert home_full(tmp_path, OSError(28, "No space left on device")) is not None
    assert home_full(tmp_path, sqlite3.OperationalError("disk I/O error")) is None
    assert home_full(tmp_path, sqlite3.OperationalError("no such table: runs")) is None


def test_runs_naming_a_dead_process_under_the_old_or_the_hidden_tags_are_reaped(instance):
    """The process tags are hidden from the UI (``.dagster/`` keys); runs an older release
    recorded under the old ``rag/`` keys are still reaped; a re-execution, which copies its
    parent's tags, is not judged by its parent's process."""
    import socket
    from pathlib import Path

    from dagster import DagsterRunStatus, job, op

    from rag_pipeline.defs.reaper import HOST_TAG, PID_TAG, reap_dead_runs

    @op
    def noop() -> None:
        pass

    @job
    def one_op() -> None:
        noop()

    # no process has this pid: pids stay below pid_max
    dead = int(Path("/proc/sys/kernel/pid_max").read_text())
    host = socket.gethostname()
    assert PID_TAG.startswith(".dagster/") and HOST_TAG.startswith(".dagster/")

    def started(tags: dict[str, str]) -> str:
        run = instance.create_run_for_job(one_op, status=DagsterRunStatus.STARTED, tags=tags)
        return run.run_id

    old = started({"rag/pid": str(dead), "rag/host": host})
    hidden = started({PID_TAG: str(dead), HOST_TAG: host})
    child = started({PID_TAG: str(dead), HOST_TAG: host, "dagster/parent_run_id": hidden})
    assert sorted(reap_dead_runs(instance)) == sorted([old, hidden])
    statuses = {r: instance.get_run_by_id(r).status for r in (old, hidden, child)}
    assert statuses == {
        old: DagsterRunStatus.FAILURE,
        hidden: DagsterRunStatus.FAILURE,
        child: DagsterRunStatus.STARTED,
    }


def test_the_cli_records_its_runs_under_the_code_location_the_workspace_loads():
    """The CLI's and live mode's runs carry the origin of the code location that workspace.yaml
    (``make ui``) and pyproject's [tool.dg] (``dg dev``) load: the same name, module and
    attribute, or the UI would not find them under the job."""
    import tomllib

    import yaml

    from rag_pipeline.defs.location import LOCATION_ATTRIBUTE, LOCATION_MODULE, LOCATION_NAME
    from rag_pipeline_tests.conftest import REPO

    (entry,) = yaml.safe_load((REPO / "workspace.yaml").read_text())["load_from"]
    assert entry["python_module"] == {
        "module_name": LOCATION_MODULE,
        "attribute": LOCATION_ATTRIBUTE,
        "location_name": LOCATION_NAME,
    }
    dg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["dg"]["project"]
    assert (dg["code_location_name"], dg["code_location_target_module"]) == (
        LOCATION_NAME,
        LOCATION_MODULE,
    )


def test_a_removed_book_whose_only_run_failed_loses_its_partition(
    settings, instance, data_dir, monkeypatch
):
    """A book that never had a successful run holds no points, so no plan purges it: once
    its folder is gone, the next ingest (of every book or of others) drops its partition, as
    the books sensor does; a book still indexed keeps its partition until it is purged."""
    import shutil

    from rag_pipeline.defs.partitions import BOOKS_PARTITIONS_NAME

    with monkeypatch.context() as patched:
        break_chunking_of(patched, "beta")
        first = ingest_books(settings, instance)
    assert first.books["beta"].status == "failed" and chunk_points(settings, "beta") == 0
    shutil.rmtree(data_dir / "beta")
    ingest_books(settings, instance, ["alpha"])  # named books: the orphan goes all the same
    assert instance.get_dynamic_partitions(BOOKS_PARTITIONS_NAME) == ["alpha"]
    # an indexed book removed while other books are named keeps its partition (and points)
    shutil.rmtree(data_dir / "alpha")
    (data_dir / "beta").mkdir()
    (data_dir / "beta" / "b.md").write_text("# Beta\n\n" + section("Three", seed="b"))
    report = ingest_books(settings, instance, ["beta"])
    assert report.books["beta"].status == "ingested"
    assert set(instance.get_dynamic_partitions(BOOKS_PARTITIONS_NAME)) == {"alpha", "beta"}
    assert chunk_points(settings, "alpha") > 0

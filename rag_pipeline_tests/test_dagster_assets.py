"""The Dagster layer: definitions load, assets materialize per book, checks guard publishing."""

import logging

import pytest
from dagster import (
    AssetCheckSeverity,
    AssetKey,
    DagsterInstance,
    Definitions,
    SensorResult,
    SkipReason,
    materialize,
)

from rag_pipeline.config import load_settings
from rag_pipeline.definitions import build_definitions
from rag_pipeline.defs.assets import ingestion_assets
from rag_pipeline.defs.location import fixed_resources
from rag_pipeline.defs.metadata import markdown_rows, table_rows
from rag_pipeline.defs.partitions import BOOKS_PARTITIONS_NAME
from rag_pipeline.embed.hashing import HashEmbedder
from rag_pipeline.ingest.pipeline import IngestPipeline
from rag_pipeline.recipes.recipe import IndexRecipe
from rag_pipeline.schema import COLLECTION_SCHEMA, book_filter, chunks_of
from rag_pipeline.store import open_store
from rag_pipeline_tests.conftest import (
    ASSET_NAMES,
    hash_settings,
    make_recipe,
    materialized,
    step_failure,
)

BOOKS = ("humanoid-robotics-ros2", "ros2-fundamentals")


@pytest.fixture
def settings(sample_books, tmp_path):
    return hash_settings(sample_books, tmp_path)


def resources_for(settings, tmp_path, recipe=None):
    return fixed_resources(IngestPipeline.from_settings(settings, recipe))


@pytest.fixture
def resources(settings, tmp_path):
    return resources_for(settings, tmp_path)


@pytest.fixture
def instance():
    inst = DagsterInstance.ephemeral()
    inst.add_dynamic_partitions(BOOKS_PARTITIONS_NAME, list(BOOKS))
    return inst


def run_of(book, instance, resources, **options):
    """A run of the book's ingestion assets whose failure is looked at, not raised."""
    return materialize(
        ingestion_assets,
        partition_key=book,
        instance=instance,
        resources=resources,
        raise_on_error=False,
        **options,
    )


def chunk_count(settings, book):
    with open_store(settings.store(), COLLECTION_SCHEMA) as store:
        return store.count(chunks_of(book))


def test_definitions_load_with_everything_bound(monkeypatch, tmp_path):
    monkeypatch.setenv("RAG_EMBEDDER", "hash")
    monkeypatch.setenv("RAG_QDRANT_PATH", str(tmp_path / "q"))
    defs = build_definitions()
    Definitions.validate_loadable(defs)
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert keys == ASSET_NAMES
    checks = {k.name for k in graph.asset_check_keys}
    assert checks == {
        "parse_errors",
        "chunks_valid",
        "vector_dimension",
        "index_consistency",
        "books_indexed",
        "book_checks_pass",
        "no_orphan_books",
    }
    repo = defs.get_repository_def()
    assert {s.name for s in repo.sensor_defs} == {"books_sensor", "collection_sensor"}
    assert {"ingest_books", "purge_book", "refresh_collection"} <= set(repo.job_names)
    assert graph.get(AssetKey("chunk_embeddings")).kinds == {"python"}  # RAG_EMBEDDER=hash
    assert {"io_manager", "pipeline"} == set(defs.resources)
    # the chain is linear: files -> documents -> chunks -> embeddings -> points
    assert graph.get(AssetKey("qdrant_points")).parent_keys == {
        AssetKey("chunks"),
        AssetKey("chunk_embeddings"),
    }
    assert "qdrant" in graph.get(AssetKey("qdrant_points")).kinds
    assert graph.get(AssetKey("chunks")).code_version


def test_index_settings_are_not_per_run_config_and_force_is(monkeypatch, tmp_path):
    """The chunk budget or model changed from the Launchpad would be undone by the next sensor
    run: what defines the index is deployment configuration; a run may only ask to force."""
    monkeypatch.setenv("RAG_EMBEDDER", "hash")
    monkeypatch.setenv("RAG_QDRANT_PATH", str(tmp_path / "q"))
    job = build_definitions().resolve_job_def("ingest_books")
    fields = job.run_config_schema.config_type.fields
    for name in ("pipeline", "io_manager"):
        field = fields["resources"].config_type.fields[name]
        inner = field.config_type.fields["config"].config_type
        assert not getattr(inner, "fields", None), f"resource {name} takes run config"
    ops = fields["ops"].config_type.fields
    assert set(ops["source_files"].config_type.fields["config"].config_type.fields) == {"force"}


@pytest.mark.parametrize(
    "run_config",
    [
        {"resources": {"pipeline": {"config": {"chunk_target_tokens": 100}}}},
        {"resources": {"pipeline": {"config": {"model": "other-model"}}}},
        {"resources": {"pipeline": {"config": {"collection": "other"}}}},
        {"resources": {"pipeline": {"config": {"data_dir": "/elsewhere"}}}},
        {"resources": {"io_manager": {"config": {"base_dir": "/elsewhere"}}}},
        {"ops": {"chunks": {"config": {"chunk_target_tokens": 100}}}},
        {"ops": {"chunk_embeddings": {"config": {"model": "other-model"}}}},
        {"ops": {"source_files": {"config": {"force": True, "chunk_target_tokens": 100}}}},
    ],
    ids=lambda config: ":".join(_config_path(config)),
)
def test_run_config_that_would_be_ignored_is_refused_at_launch(monkeypatch, tmp_path, run_config):
    """What the Launchpad (and a launch from the asset graph, or GraphQL) validates against:
    an index setting in run config is an error naming the entry, never accepted and ignored."""
    from dagster import DagsterInvalidConfigError, validate_run_config

    monkeypatch.setenv("RAG_EMBEDDER", "hash")
    monkeypatch.setenv("RAG_QDRANT_PATH", str(tmp_path / "q"))
    defs = build_definitions()
    graph_job = defs.get_repository_def().get_implicit_job_def_for_assets([AssetKey("chunks")])
    for job in (defs.resolve_job_def("ingest_books"), graph_job):
        with pytest.raises(DagsterInvalidConfigError) as refused:
            validate_run_config(job, run_config)
        assert f'unexpected config entry "{_config_path(run_config)[-1]}"' in str(refused.value)
    validate_run_config(
        defs.resolve_job_def("ingest_books"), {"ops": {"source_files": {"config": {"force": True}}}}
    )


def _config_path(config: dict) -> list[str]:
    path = []
    while isinstance(config, dict) and len(config) == 1:
        ((key, config),) = config.items()
        path.append(key)
    if isinstance(config, dict):  # source_files: force plus an index setting
        path.append(next(k for k in config if k != "force"))
    return path


def test_the_real_code_location_module_loads():
    import importlib

    module = importlib.import_module("rag_pipeline.definitions")
    assert module.defs.resolve_job_def("ingest_books") is not None


def test_materialize_two_books_on_an_ephemeral_instance(settings, resources, instance):
    for book in BOOKS:
        result = materialize(
            ingestion_assets, partition_key=book, instance=instance, resources=resources
        )
        assert result.success
        materialized = {
            e.asset_key.to_user_string()
            for e in (ev.materialization for ev in result.get_asset_materialization_events())
        }
        assert materialized == {
            "source_files",
            "documents",
            "chunks",
            "chunk_embeddings",
            "qdrant_points",
        }
        checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
        assert set(checks) == {
            "parse_errors",
            "chunks_valid",
            "vector_dimension",
            "index_consistency",
        }
        assert all(c.passed for c in checks.values()), {
            n: {k: v.value for k, v in c.metadata.items()} for n, c in checks.items()
        }
        assert {c.partition for c in checks.values()} == {book}
        meta = {
            e.materialization.asset_key.to_user_string(): e.materialization.metadata
            for e in result.get_asset_materialization_events()
        }
        assert meta["source_files"]["files_new"].value == 5
        assert meta["chunks"]["chunks"].value == meta["qdrant_points"]["points_in_book"].value
        assert table_rows(meta["source_files"]["files_table"])[0]["file"]  # a table
        assert meta["chunk_embeddings"]["chunks_embedded"].value > 0
        assert chunk_count(settings, book) == meta["chunks"]["chunks"].value
        assert list(result.output_for_node("qdrant_points")) == [book]  # one result per book


def test_rematerializing_is_idempotent(settings, resources, instance):
    book = BOOKS[0]
    first = materialize(
        ingestion_assets, partition_key=book, instance=instance, resources=resources
    )
    points = chunk_count(settings, book)
    again = materialize(
        ingestion_assets, partition_key=book, instance=instance, resources=resources
    )
    assert first.success and again.success
    meta = {
        e.materialization.asset_key.to_user_string(): e.materialization.metadata
        for e in again.get_asset_materialization_events()
    }
    assert meta["chunk_embeddings"]["chunks_embedded"].value == 0
    assert meta["qdrant_points"]["points_upserted"].value == 0
    assert chunk_count(settings, book) == points


def test_parse_errors_warn_with_file_names(settings, resources, instance, sample_books):
    book = BOOKS[0]
    (sample_books / book / "broken.md").write_bytes(b"---\ntitle: [oops\n---\nbody")
    (sample_books / book / "empty.md").write_text("")
    result = materialize(
        ingestion_assets, partition_key=book, instance=instance, resources=resources
    )
    assert result.success  # a bad file does not fail the book
    check = next(c for c in result.get_asset_check_evaluations() if c.check_name == "parse_errors")
    assert not check.passed and check.severity == AssetCheckSeverity.WARN
    # the run log's row for it reads "Check parse_errors failed" (Dagster OSS labels any check
    # that did not pass so): a warning line beside it says what the result is (issue 44)
    logged = [
        r.event_log_entry.user_message
        for r in instance.get_records_for_run(result.run_id).records
        if r.event_log_entry.level == logging.WARNING
    ]
    assert f"{book}: parse_errors warned, not failed (WARN): 1 broken and 1 empty" in "\n".join(
        logged
    ), logged
    assert "broken.md" in str(check.metadata["files"].value)
    assert "empty.md" in check.metadata["empty_files"].value
    assert check.metadata["errors"].value == 1
    # the next run parses nothing new, but the files are still broken and empty: still reported
    again = materialize(
        ingestion_assets, partition_key=book, instance=instance, resources=resources
    )
    check = next(c for c in again.get_asset_check_evaluations() if c.check_name == "parse_errors")
    assert not check.passed
    assert check.metadata["errors"].value == 1 and check.metadata["new_errors"].value == 0
    assert "broken.md" in str(check.metadata["files"].value)
    assert "empty.md" in check.metadata["empty_files"].value


def test_blocking_chunk_check_stops_publishing(settings, resources, instance, monkeypatch):
    book = BOOKS[0]
    assert materialize(
        ingestion_assets, partition_key=book, instance=instance, resources=resources
    ).success
    before = chunk_count(settings, book)
    (settings.data_dir / book / "index.md").write_text("# Changed\n\nNew text for a new run.")
    monkeypatch.setattr(
        "rag_pipeline.ingest.stages.check_chunks",
        lambda chunks, limit: ["chunk 3: broken chain (injected)"],
    )
    result = run_of(book, instance, resources)
    assert not result.success
    done = materialized(result)
    assert "chunk_embeddings" not in done and "qdrant_points" not in done
    assert chunk_count(settings, book) == before  # nothing already indexed is lost


def test_a_model_with_another_size_is_built_beside_and_switched_on_qdrant_edge(
    settings, resources, instance, tmp_path
):
    """On Qdrant Edge each book generation has its own dimension: a model of another size is
    a recipe change like any other (a store without generations refuses it: test_store)."""
    book = BOOKS[0]
    assert materialize(
        ingestion_assets, partition_key=book, instance=instance, resources=resources
    ).success
    small = IndexRecipe.build(HashEmbedder(dimension=64), settings.chunking())
    swapped = resources_for(settings, tmp_path, recipe=small)
    result = materialize(ingestion_assets, partition_key=book, instance=instance, resources=swapped)
    check = next(
        c for c in result.get_asset_check_evaluations() if c.check_name == "vector_dimension"
    )
    assert check.passed
    with open_store(settings.store(), COLLECTION_SCHEMA) as store:
        assert store.dimension_of(book) == 64 and store.pending_recipe(book) is None
        assert (store.current_recipe(book) or {}).get("embedding_model") == "hash-64"
        models = store.counts_by(chunks_of(book), "embedding_model")
    assert set(models) == {"hash-64"} and sum(models.values()) == chunk_count(settings, book)


def test_the_collection_asset_shows_every_book_with_its_last_run_and_checks(
    settings, resources, instance, sample_books
):
    from rag_pipeline.defs.collection import qdrant_collection

    (sample_books / BOOKS[0] / "broken.md").write_bytes(b"---\ntitle: [oops\n---\nbody")
    runs = {
        book: materialize(
            ingestion_assets, partition_key=book, instance=instance, resources=resources
        )
        for book in BOOKS
    }
    assert all(r.success for r in runs.values())
    # a run whose warning check did not pass is marked in the run list
    assert instance.get_run_by_id(runs[BOOKS[0]].run_id).tags["rag/checks"] == "warned"
    assert "rag/checks" not in instance.get_run_by_id(runs[BOOKS[1]].run_id).tags
    result = materialize([qdrant_collection], instance=instance, resources=resources)
    assert result.success
    meta = result.get_asset_materialization_events()[0].materialization.metadata
    # the per-book table is table metadata (the UI draws it as a table), the broken book first
    rows = markdown_rows(meta["book_table"])
    assert [row["book"] for row in rows] == [BOOKS[0], BOOKS[1]]
    for row in rows:
        assert row["last_run"] == runs[row["book"]].run_id
        assert row["points"] == chunk_count(settings, row["book"]) > 0
    assert rows[0]["health"] == "warned" and "parse_errors warned" in rows[0]["why"]
    assert rows[1]["health"] == "ok" and rows[1]["why"] == ""
    assert meta["books_with_problems"].value == 1 and BOOKS[0] in meta["problems"].value
    # a book whose files are broken warned: it is not counted as failing
    assert meta["books"].value == 2 and meta["books_with_failing_checks"].value == 0
    assert meta["books_with_warning_checks"].value == 1
    # each book's last run and every run of it, as links; long enough for the UI's dialog
    table_md = meta["book_table"].value
    assert len(table_md) >= 1000
    for book, run in runs.items():
        assert f"[{run.run_id}](/runs/{run.run_id})" in table_md
        assert f"[all runs](/runs?q[0]=tag:rag-book/{book}=yes)" in table_md
    assert "hash-384" in meta["recipes"].value
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    assert checks["books_indexed"].passed
    warned = checks["book_checks_pass"]
    assert not warned.passed and warned.severity == AssetCheckSeverity.WARN
    assert BOOKS[0] in str(warned.metadata["books"].value)
    # its result line names the book, and is the evaluation's description (issue 44)
    line = f"warned, not failed: 1 book ({BOOKS[0]}) with a warning check only"
    assert warned.metadata["result"].value.startswith(line), warned.metadata["result"]
    assert warned.description == warned.metadata["result"].value
    assert checks["no_orphan_books"].passed


def test_every_run_names_its_book_and_trigger(settings, resources, instance):
    result = materialize(
        ingestion_assets, partition_key=BOOKS[1], instance=instance, resources=resources
    )
    tags = instance.get_run_by_id(result.run_id).tags
    assert tags["dagster/partition"] == BOOKS[1]
    assert tags["rag/book"] == BOOKS[1] and tags["rag/trigger"] == "ui"
    meta = {
        e.materialization.asset_key.to_user_string(): e.materialization.metadata
        for e in result.get_asset_materialization_events()
    }
    written = table_rows(meta["qdrant_points"]["points_written"])
    assert written and {"point id", "file", "section", "content hash"} <= set(written[0])
    assert "chunk points written" in meta["qdrant_points"]["summary"].value


def test_a_book_removed_during_its_run_is_not_written_and_a_late_purge_spares_it_if_back(
    settings, resources, instance, sample_books, tmp_path, monkeypatch
):
    """The folder goes between the embedding and the write: the write step ends cleanly with
    nothing written (its points would outlive the purge). A purge that runs after the folder
    came back keeps the points."""
    import shutil

    from rag_pipeline.defs.jobs import purge_book_job, purge_run_config
    from rag_pipeline.ingest import pipeline as pipeline_module

    book = BOOKS[0]
    real_embed_books = pipeline_module.embed_books

    def embed_then_remove_the_folder(*args, **kwargs):
        embedded = real_embed_books(*args, **kwargs)
        shutil.move(sample_books / book, tmp_path / "aside")
        return embedded

    monkeypatch.setattr(pipeline_module, "embed_books", embed_then_remove_the_folder)
    write = materialize(
        ingestion_assets, partition_key=book, instance=instance, resources=resources
    )
    monkeypatch.undo()
    assert write.success
    assert write.output_for_node("qdrant_points")[book].status == "missing"
    assert chunk_count(settings, book) == 0
    shutil.move(tmp_path / "aside", sample_books / book)
    assert materialize(
        ingestion_assets, partition_key=book, instance=instance, resources=resources
    ).success
    points = chunk_count(settings, book)
    purge = purge_book_job.execute_in_process(
        run_config=purge_run_config(book), instance=instance, resources=resources
    )
    assert purge.success and purge.output_for_node("purge_book_points") == 0
    assert chunk_count(settings, book) == points > 0


def test_collection_sensor_refreshes_after_any_run_without_starting_one(
    settings, resources, instance, sample_books, monkeypatch
):
    """A run launched from the asset graph (here: materialize(), an ad-hoc asset job, as the
    UI's "Materialize" makes) is on the collection's page after the next tick; the sensor
    reports the page itself, so no refresh run joins the run list. A broken book stays
    visible after another book runs."""
    from dagster import AssetCheckEvaluation, AssetMaterialization, build_sensor_context

    from rag_pipeline.defs import collection as collection_module
    from rag_pipeline.defs.collection import collection_sensor
    from rag_pipeline.store import StoreBusyError

    def tick(cursor):
        with build_sensor_context(instance=instance, cursor=cursor, resources=resources) as context:
            return collection_sensor(context), context

    def run(book):
        return materialize(
            ingestion_assets, partition_key=book, instance=instance, resources=resources
        )

    first, _ = tick(None)
    assert isinstance(first, SkipReason)
    run(BOOKS[1])
    (sample_books / BOOKS[0] / "broken.md").write_bytes(b"---\ntitle: [oops\n---\nbody")
    broken = run(BOOKS[0])
    result, _ = tick(None)
    assert isinstance(result, SensorResult) and not result.run_requests
    page = next(e for e in result.asset_events if isinstance(e, AssetMaterialization))
    rows = markdown_rows(page.metadata["book_table"])
    assert [(r["book"], r["health"]) for r in rows] == [(BOOKS[0], "warned"), (BOOKS[1], "ok")]
    assert rows[0]["last_run"] == broken.run_id and "parse_errors warned" in rows[0]["why"]
    checks = {e.check_name: e for e in result.asset_events if isinstance(e, AssetCheckEvaluation)}
    assert not checks["book_checks_pass"].passed
    # nothing ended since: the next tick skips
    again, _ = tick(result.cursor)
    assert isinstance(again, SkipReason)
    # another book runs (cleanly): the broken one still leads the page, still failing its check
    other = run(BOOKS[1])
    later, _ = tick(result.cursor)
    assert isinstance(later, SensorResult)
    page = next(e for e in later.asset_events if isinstance(e, AssetMaterialization))
    rows = markdown_rows(page.metadata["book_table"])
    assert [(r["book"], r["health"]) for r in rows] == [(BOOKS[0], "warned"), (BOOKS[1], "ok")]
    assert rows[1]["last_run"] == other.run_id
    checks = {e.check_name: e for e in later.asset_events if isinstance(e, AssetCheckEvaluation)}
    assert not checks["book_checks_pass"].passed
    assert checks["book_checks_pass"].severity == AssetCheckSeverity.WARN
    # only the three book runs: refreshes are not runs
    assert len(instance.get_run_records()) == 3

    # a store another process holds: the tick waits briefly, then skips without moving on
    def busy(*args, **kwargs):
        raise StoreBusyError("held by pid 1")

    monkeypatch.setattr(collection_module, "collection_page", busy)
    skipped, context = tick(result.cursor)
    assert isinstance(skipped, SkipReason) and "busy" in skipped.skip_message
    assert context.cursor == result.cursor


def test_a_queued_run_says_what_it_waits_for_and_once_started_what_it_waited_for(instance):
    """The UI says a queued run "will start soon"; the tag rag/waiting_for names the run in
    progress that holds it back (of the same book, or any: one run at a time), only when one
    does; at the run's start the tag turns to the past tense (how long, behind which runs), and
    a run that waited behind none gets no tag."""
    import time

    from dagster import DagsterEvent, DagsterEventType, DagsterRunStatus
    from dagster._core.remote_origin import (
        InProcessCodeLocationOrigin,
        RemoteJobOrigin,
        RemoteRepositoryOrigin,
    )
    from dagster._core.test_utils import create_run_for_test
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

    from rag_pipeline.defs.runs import QUEUE_TAG, explain_queue, note_queue_wait, one_book_tags

    # a queued run must name where its code lives (any origin does for this test)
    origin = RemoteJobOrigin(
        RemoteRepositoryOrigin(
            InProcessCodeLocationOrigin(
                LoadableTargetOrigin(module_name="rag_pipeline.definitions")
            ),
            "__repository__",
        ),
        "ingest_books",
    )

    def run(book, status, tags=None):
        return create_run_for_test(
            instance,
            job_name="ingest_books",
            status=status,
            tags=tags or {"dagster/partition": book},
            remote_job_origin=origin,
        )

    def tags(of):
        return instance.get_run_by_id(of.run_id).tags

    def event(of, kind):
        instance.report_dagster_event(
            DagsterEvent(event_type_value=kind.value, job_name="ingest_books"), of.run_id
        )

    alone = run("third-book", DagsterRunStatus.QUEUED)
    queued = run(BOOKS[0], DagsterRunStatus.QUEUED)
    explain_queue(instance)
    assert QUEUE_TAG not in tags(queued) and QUEUE_TAG not in tags(alone)  # nothing ahead
    # a batch in progress holding both books (its book keys name them)
    other = run(BOOKS[1], DagsterRunStatus.STARTED, one_book_tags(BOOKS[1]))
    explain_queue(instance)
    assert other.run_id[:8] in tags(queued)[QUEUE_TAG]
    assert "max_concurrent_runs" in tags(queued)[QUEUE_TAG]
    same = run(BOOKS[0], DagsterRunStatus.STARTED, one_book_tags(BOOKS[0]))
    explain_queue(instance)
    assert same.run_id[:8] in tags(queued)[QUEUE_TAG] and "same book" in tags(queued)[QUEUE_TAG]

    # both finish; the queued run starts: the tag says what it waited for, in the past tense
    time.sleep(0.01)
    for ahead in (other, same):
        event(ahead, DagsterEventType.RUN_SUCCESS)
    time.sleep(0.01)
    event(queued, DagsterEventType.RUN_START)
    note_queue_wait(instance, queued.run_id)
    note = tags(queued)[QUEUE_TAG]
    assert note.startswith("nothing now: waited") and same.run_id[:8] in note, note
    assert other.run_id[:8] in note and "finished" in note
    # a run started later, queued after those ended: it waited behind nothing, and says nothing
    later = run("third-book", DagsterRunStatus.QUEUED)
    event(later, DagsterEventType.RUN_START)
    note_queue_wait(instance, later.run_id)
    assert QUEUE_TAG not in tags(later)
    # a run tagged while queued whose blockers are gone by the next look says so
    assert "runs in progress" in tags(alone)[QUEUE_TAG]
    for started in (queued, later):
        event(started, DagsterEventType.RUN_SUCCESS)
    explain_queue(instance)
    assert tags(alone)[QUEUE_TAG].startswith("nothing now: no run in progress")


def test_a_step_reads_only_what_an_earlier_step_of_its_own_run_produced(
    settings, resources, instance
):
    """Step outputs live in the run's memory: a run of the last asset alone (after a complete
    run) cannot read its inputs, and says what to run instead."""
    book = BOOKS[0]
    assert materialize(
        ingestion_assets, partition_key=book, instance=instance, resources=resources
    ).success
    alone = materialize(
        ingestion_assets,
        selection=["qdrant_points"],
        partition_key=book,
        instance=instance,
        resources=resources,
        raise_on_error=False,
    )
    assert not alone.success
    message = step_failure(alone)
    assert f"chunk_embeddings of book {book!r} was not produced by this run" in message
    assert "ingest_books" in message and "all steps" in message


def test_run_retries_re_run_every_step(settings, resources, instance, monkeypatch):
    """The daemon retries a failed run with the strategy its tag names (Dagster's default
    re-runs only the failed steps, whose inputs died with the earlier run): the job carries
    ALL_STEPS, and a run launched outside the job (the asset graph) is tagged by its first step."""
    from dagster._core.execution.plan.resume_retry import ReexecutionStrategy
    from dagster._daemon.auto_run_reexecution.auto_run_reexecution import (
        get_reexecution_strategy,
    )

    monkeypatch.setenv("RAG_EMBEDDER", "hash")
    monkeypatch.setenv("RAG_QDRANT_PATH", str(settings.qdrant_path))
    job = build_definitions().resolve_job_def("ingest_books")
    assert job.tags["dagster/retry_strategy"] == "ALL_STEPS"
    result = materialize(
        ingestion_assets, partition_key=BOOKS[0], instance=instance, resources=resources
    )
    run = instance.get_run_by_id(result.run_id)
    assert get_reexecution_strategy(run, instance) == ReexecutionStrategy.ALL_STEPS


def test_the_resources_are_the_objects_built_once_from_the_settings(settings, monkeypatch):
    """One configuration: the runs get the settings' own source and store configuration, and
    the recipe is built on first use, once, from the settings' embedder and chunk budget."""
    from rag_pipeline.recipes import lazy as recipe_module

    built = []
    real_build = IndexRecipe.build

    def build(*args, **kwargs):
        built.append(args)
        return real_build(*args, **kwargs)

    monkeypatch.setattr(recipe_module.IndexRecipe, "build", build)
    pipeline = IngestPipeline.from_settings(settings)
    assert pipeline.source == settings.source()
    assert pipeline.parsing == settings.parsing()
    assert pipeline.store.config == settings.store()
    assert pipeline.recipes.embedding == settings.embedding()
    assert pipeline.recipes.chunking == settings.chunking()
    assert built == []  # nothing loaded until a step needs the recipe
    assert pipeline.recipes.get() is pipeline.recipes.get()
    assert len(built) == 1
    bound = fixed_resources(pipeline)
    from dagster import build_resources

    with build_resources({"pipeline": bound["pipeline"]}) as built_now:
        assert built_now.pipeline is pipeline


def count_storage_calls(instance, monkeypatch):
    """Every call of a public method of the instance's event log and run storages (the
    queries an instance makes), counted by name."""
    from collections import Counter

    calls = Counter()
    for storage in (instance.event_log_storage, instance.run_storage):
        for name in dir(type(storage)):
            attribute = getattr(type(storage), name, None)
            if name.startswith("_") or isinstance(attribute, property) or not callable(attribute):
                continue
            monkeypatch.setattr(storage, name, counting(calls, name, getattr(storage, name)))
    return calls


def counting(calls, name, method):
    def counted(*args, **kwargs):
        calls[name] += 1
        return method(*args, **kwargs)

    return counted


def test_a_collection_refresh_asks_the_instance_as_much_at_30_books_as_at_3(
    settings, instance, sample_books, monkeypatch
):
    """After one book's run, the page's last runs and check results take a fixed number of
    instance queries, however many books the collection holds (they were five a book)."""
    from dagster import AssetCheckEvaluation, AssetMaterialization

    from rag_pipeline.defs.assets import qdrant_points
    from rag_pipeline.defs.collection import BOOK_CHECKS, collection_page

    resources = IngestPipeline.from_settings(settings)
    bound = fixed_resources(resources)
    run = materialize(ingestion_assets, partition_key=BOOKS[0], instance=instance, resources=bound)

    def add_books(first, last):  # books materialized earlier, every check passed
        for n in range(first, last):
            book = f"extra-{n:02d}"
            (sample_books / book).mkdir()
            (sample_books / book / "index.md").write_text(f"# Extra {n}\n\nSome text.\n")
            instance.report_runless_asset_event(
                AssetMaterialization(asset_key=qdrant_points.key, partition=book)
            )
            for check in BOOK_CHECKS:
                instance.report_runless_asset_event(
                    AssetCheckEvaluation(
                        asset_key=check.asset_key,
                        check_name=check.name,
                        passed=True,
                        partition=book,
                    )
                )

    def refresh():
        calls = count_storage_calls(instance, monkeypatch)
        page = collection_page(instance, resources)
        monkeypatch.undo()
        return sum(calls.values()), {
            r["book"]: r for r in markdown_rows(page.metadata["book_table"])
        }

    add_books(0, 1)  # 3 books: the two samples and one more
    at_3, rows = refresh()
    assert len(rows) == 3 and rows[BOOKS[0]]["last_run"] == run.run_id
    add_books(1, 28)
    at_30, rows = refresh()
    assert len(rows) == 30
    assert at_30 == at_3
    # the rows are still each book's own: the run, the checks recorded for it
    assert rows[BOOKS[0]]["last_run"] == run.run_id
    assert rows[BOOKS[1]]["last_run"] == "" and rows[BOOKS[1]]["health"] == "failed"
    extra = rows["extra-27"]
    assert extra["last_run"] == "" and extra["why"] == "not indexed yet"


def test_the_collection_shows_the_last_completed_checks_of_a_book_whose_run_died(
    settings, resources, instance, monkeypatch
):
    """A run that failed before its later checks ran leaves them planned: the page still shows
    their last completed result and the book's last materializing run."""
    from rag_pipeline.defs._dagster_private import AssetCheckExecutionRecordStatus
    from rag_pipeline.defs.collection import BOOK_CHECKS, collection_page
    from rag_pipeline.ingest import pipeline as pipeline_module

    book = BOOKS[0]
    good = materialize(ingestion_assets, partition_key=book, instance=instance, resources=resources)

    def fail(*args, **kwargs):
        raise RuntimeError("embedder gone")

    # the chunking step has no retry policy: the run fails at once (embedding would retry twice)
    monkeypatch.setattr(pipeline_module, "chunk_book", fail)
    failed = run_of(book, instance, resources)
    monkeypatch.undo()
    assert good.success and not failed.success
    latest = {
        info.check_key.name: info.latest_execution_status
        for info in instance.event_log_storage.get_asset_check_partition_info(list(BOOK_CHECKS))
        if info.partition_key == book
    }
    assert latest["vector_dimension"] == AssetCheckExecutionRecordStatus.PLANNED
    pipeline = IngestPipeline.from_settings(settings)
    page = collection_page(instance, pipeline)
    row = next(r for r in markdown_rows(page.metadata["book_table"]) if r["book"] == book)
    assert row["last_run"] == good.run_id
    assert row["health"] == "ok" and row["why"] == ""
    assert page.checks["book_checks_pass"][0]


def test_a_run_of_two_books_records_each_on_its_own_partition(settings, resources, instance):
    """A batch is one run of a partition range: each book still gets its own materialization
    of every asset, with its own metadata, and its own evaluation of every check, evaluated
    against that materialization."""
    from rag_pipeline.defs.runs import batch_tags

    result = materialize(
        ingestion_assets, instance=instance, resources=resources, tags=batch_tags(list(BOOKS))
    )
    assert result.success
    by_asset: dict[str, dict[str, object]] = {}
    for event in result.get_asset_materialization_events():
        m = event.materialization
        by_asset.setdefault(m.asset_key.to_user_string(), {})[m.partition] = m.metadata
    assert set(by_asset) == {a.key.to_user_string() for a in ingestion_assets}
    assert all(set(parts) == set(BOOKS) for parts in by_asset.values())
    for book in BOOKS:  # each book's metadata is its own, not the batch's
        meta = by_asset["qdrant_points"][book]
        assert meta["points_in_book"].value == chunk_count(settings, book)
    assert by_asset["chunks"][BOOKS[0]]["chunks"] != by_asset["chunks"][BOOKS[1]]["chunks"]
    checks = result.get_asset_check_evaluations()
    assert len(checks) == 4 * len(BOOKS) and all(c.passed for c in checks)
    assert {(c.check_name, c.partition) for c in checks} == {
        (name, book)
        for name in ("parse_errors", "chunks_valid", "vector_dimension", "index_consistency")
        for book in BOOKS
    }
    assert all(c.target_materialization_data.run_id == result.run_id for c in checks)
    latest = instance.event_log_storage.get_asset_check_partition_info(
        list({c.asset_check_key for c in checks})
    )
    assert len(latest) == len(checks) and all(info.is_current for info in latest)
    outputs = result.output_for_node("qdrant_points")
    assert set(outputs) == set(BOOKS)
    assert {r.status for r in outputs.values()} == {"ingested"}
    tags = instance.get_run_by_id(result.run_id).tags
    assert tags["rag/batch"] == "2 books" and "rag/book" not in tags


def test_a_blocking_check_failing_for_one_book_of_a_batch_publishes_none_of_it(
    settings, resources, instance, monkeypatch
):
    """Dagster's blocking checks stop the step for the whole run: no book of the batch is
    embedded or written (the runner then runs each alone: test_runner)."""
    from rag_pipeline.defs.runs import batch_tags
    from rag_pipeline.ingest import stages

    real = stages.check_chunks

    def broken_for_one(chunks, limit):
        # the check of the whole book (its files' chunks together), not of each file's
        if len({c.source_file for c in chunks}) > 1 and chunks[0].book_id == BOOKS[1]:
            return ["chunk 3: broken chain (injected)"]
        return real(chunks, limit)

    monkeypatch.setattr(stages, "check_chunks", broken_for_one)
    result = materialize(
        ingestion_assets,
        instance=instance,
        resources=resources,
        tags=batch_tags(list(BOOKS)),
        raise_on_error=False,
    )
    assert not result.success
    done = materialized(result)
    assert "chunk_embeddings" not in done and "qdrant_points" not in done
    checks = {
        c.partition: c.passed
        for c in result.get_asset_check_evaluations()
        if c.check_name == "chunks_valid"
    }
    assert checks == {BOOKS[0]: True, BOOKS[1]: False}
    assert all(chunk_count(settings, book) == 0 for book in BOOKS)


def test_the_collection_page_takes_each_books_last_run_from_its_summary(
    settings, resources, instance, monkeypatch
):
    """The run that last wrote a book is saved in the book's summary: the page reads no
    materialization record (they were a second each per thousand books); a book whose
    summary does not say (written by an older version) is still asked of Dagster."""
    from rag_pipeline.defs.collection import collection_page
    from rag_pipeline.defs.runs import batch_tags

    run = materialize(
        ingestion_assets, instance=instance, resources=resources, tags=batch_tags(list(BOOKS))
    )
    pipeline = IngestPipeline.from_settings(settings)
    calls = count_storage_calls(instance, monkeypatch)
    page = collection_page(instance, pipeline)
    monkeypatch.undo()
    rows = {r["book"]: r for r in markdown_rows(page.metadata["book_table"])}
    assert {b: rows[b]["last_run"] for b in BOOKS} == dict.fromkeys(BOOKS, run.run_id)
    assert (
        "fetch_materializations" not in calls and "get_latest_storage_id_by_partition" not in calls
    )
    # a summary written by an older version, without the run: the book is asked of Dagster
    import json
    from pathlib import Path

    folder = Path(settings.qdrant_path) / settings.collection / "books"
    path = folder / BOOKS[0] / "summary.json"
    saved = json.loads(path.read_text())
    del saved["data"]["last_run"]
    path.write_text(json.dumps(saved))  # (a new file: its fingerprint check is done again)
    page = collection_page(instance, pipeline)
    rows = {r["book"]: r for r in markdown_rows(page.metadata["book_table"])}
    assert rows[BOOKS[0]]["last_run"] == run.run_id


def test_the_assets_run_the_pipelines_stages_and_only_they_write(
    settings, resources, instance, monkeypatch, tmp_path
):
    """One path: each asset calls its stage of the pipeline (assess, parse, chunk, embed,
    write), every point a run writes or deletes is written inside the pipeline's write stage,
    and the job's index is the one `IngestPipeline.run` builds from the same books."""
    from rag_pipeline_tests.pins import pipeline_spies

    with pipeline_spies() as spies:
        book = BOOKS[0]
        result = materialize(
            ingestion_assets, partition_key=book, instance=instance, resources=resources
        )
    assert result.success
    assert spies.stages == ["assess", "parse", "chunk", "embed", "write"]
    assert spies.writes > 0 and spies.outside == []
    with open_store(settings.store(), COLLECTION_SCHEMA) as store:
        by_job = {r.id for r in store.scroll(book_filter(book), fields=[])}
    direct = load_settings(
        data_dir=settings.data_dir,
        qdrant_path=str(tmp_path / "direct"),
        embedder="hash",
        cache_dir=tmp_path / "cache",
    )
    IngestPipeline.from_settings(direct, make_recipe(HashEmbedder())).run([book])
    with open_store(direct.store(), COLLECTION_SCHEMA) as store:
        by_run = {r.id for r in store.scroll(book_filter(book), fields=[])}
    assert by_job == by_run and by_job


def test_a_healthy_run_never_leaves_parse_errors_in_progress_while_another_book_warns(
    settings, resources, instance, monkeypatch
):
    """Dagster OSS draws a check as a red ✕ while its newest record is "in progress" and any
    book has failed it: the ingest job (what the sensor, the CLI and live mode run) does not
    plan parse_errors, its documents step writes each book's result, linked to the run; the
    check executed on its own (the UI's Materialize) gives the same answer."""
    from dagster import DagsterEventType

    from rag_pipeline.defs.assets import PARSE_ERRORS, parse_errors
    from rag_pipeline.defs.jobs import INGEST_JOB_NAME
    from rag_pipeline.defs.location import build_defs
    from rag_pipeline.ingest.pipeline import IngestPipeline

    broken, healthy = BOOKS
    (settings.data_dir / broken / "broken.md").write_bytes(b"---\ntitle: [oops\n---\nbody")
    job = build_defs(resources).resolve_job_def(INGEST_JOB_NAME)
    instance.add_dynamic_partitions(BOOKS_PARTITIONS_NAME, list(BOOKS))
    storage = instance.event_log_storage
    seen_during_run = []
    parse = IngestPipeline.parse

    def watched_parse(self, books):  # the newest parse_errors record, mid-run
        latest = storage.get_latest_asset_check_execution_by_key([PARSE_ERRORS])
        seen_during_run.append(latest.get(PARSE_ERRORS))
        return parse(self, books)

    monkeypatch.setattr(IngestPipeline, "parse", watched_parse)
    runs = {}
    for book in (broken, healthy):
        result = job.execute_in_process(partition_key=book, instance=instance)
        assert result.success
        runs[book] = result.run_id
        planned = instance.get_records_for_run(
            result.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED
        ).records
        assert not [r for r in planned if "parse_errors" in str(r.event_log_entry)]
    during = seen_during_run[1]  # the healthy book's run, after the broken book's
    assert during is not None and during.status.value == "FAILED", during
    assert during.event.asset_check_evaluation.severity == AssetCheckSeverity.WARN  # yellow
    for book, passed in ((broken, False), (healthy, True)):
        (record,) = storage.get_asset_check_execution_history(
            PARSE_ERRORS, limit=1, partition_filter=_partition(book)
        )
        assert record.run_id == runs[book] and record.status.value == (
            "SUCCEEDED" if passed else "FAILED"
        )
        assert record.event.asset_check_evaluation.target_materialization_data is not None
    # the check on its own (with its asset, as the UI's Materialize selects it)
    result = materialize(
        [*ingestion_assets, parse_errors],
        partition_key=broken,
        instance=instance,
        resources=resources,
    )
    assert result.success
    by_step = [c for c in result.get_asset_check_evaluations() if c.check_name == "parse_errors"]
    assert len(by_step) == 2 and {c.passed for c in by_step} == {False}
    assert {c.metadata["errors"].value for c in by_step} == {1}


def _partition(book):
    from rag_pipeline.defs._dagster_private import PartitionKeyFilter

    return PartitionKeyFilter(key=book)


def test_a_store_lock_taken_by_the_collection_sensor_names_the_sensor(
    settings, resources, instance, monkeypatch
):
    """What a waiter (the query service, a CLI) says about the holder of a book's lock, when
    the holder is the code server refreshing the collection page: the sensor, not the code
    server's command line."""
    import os
    from pathlib import Path

    from dagster import build_sensor_context

    from rag_pipeline.defs import collection as collection_module
    from rag_pipeline.defs.collection import collection_sensor
    from rag_pipeline.store.lock import FolderLock, describe_holder

    assert materialize(
        ingestion_assets, partition_key=BOOKS[0], instance=instance, resources=resources
    ).success
    # without its saved summary the page reads the book itself, under the book's lock
    for summary in Path(settings.qdrant_path).rglob("summary.json"):
        summary.unlink()
    seen: list[str] = []
    describe = collection_module.describe_collection

    def spy(store, on_disk):  # type: ignore[no-untyped-def]
        state = describe(store, on_disk)
        for lock in sorted(Path(settings.qdrant_path).rglob("*.lock")):
            holder = FolderLock(lock, "book").holder()
            if holder and holder["pid"] == os.getpid():
                seen.append(describe_holder(holder))
        return state

    monkeypatch.setattr(collection_module, "describe_collection", spy)
    with build_sensor_context(instance=instance, resources=resources) as context:
        assert isinstance(collection_sensor(context), SensorResult)
    assert seen and all(
        "for collection_sensor, refreshing the qdrant_collection" in h for h in seen
    )


def test_book_checks_pass_names_the_books_in_its_result_line():
    """The result line (also the evaluation's description, shown beside the status) names the
    books of each kind, the first CHECK_BOOKS_LISTED, then how many more (issue 44)."""
    from rag_pipeline.defs.collection import CHECK_BOOKS_LISTED, _checks_verdict

    assert _checks_verdict({"b"}, set()) == "failed: 1 book (b) with a failed check"
    warned = {f"w{i:02d}" for i in range(CHECK_BOOKS_LISTED + 3)}
    line = _checks_verdict({"b", "a"}, warned)
    named = ", ".join(sorted(warned)[:CHECK_BOOKS_LISTED])
    assert line.startswith(
        f"failed: 2 books (a, b) with a failed check; warned, not failed: "
        f"{len(warned)} books ({named} and 3 more) with a warning check only"
    ), line
    assert _checks_verdict(set(), set()) == "passed: every book's latest checks passed"

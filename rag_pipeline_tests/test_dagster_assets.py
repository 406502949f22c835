"""The Dagster layer: definitions load, assets materialize per book, checks guard publishing."""

import pytest
from dagster import (
    AssetCheckSeverity,
    AssetKey,
    DagsterInstance,
    Definitions,
    materialize,
)

from rag_pipeline.config import load_settings
from rag_pipeline.definitions import build_definitions
from rag_pipeline.defs.assets import ingestion_assets
from rag_pipeline.defs.location import fixed_resources
from rag_pipeline.defs.partitions import BOOKS_PARTITIONS_NAME
from rag_pipeline.embed.hashing import HashEmbedder
from rag_pipeline.ingest.recipe import IndexRecipe
from rag_pipeline.resources import BooksResource, IndexRecipeResource, QdrantStoreResource
from rag_pipeline.schema import COLLECTION_SCHEMA, chunks_of
from rag_pipeline.store import open_store

BOOKS = ("humanoid-robotics-ros2", "ros2-fundamentals")


@pytest.fixture
def settings(sample_books, tmp_path):
    return load_settings(
        data_dir=sample_books,
        qdrant_path=str(tmp_path / "qdrant"),
        embedder="hash",
        cache_dir=tmp_path / "cache",
    )


def resources_for(settings, tmp_path, recipe=None):
    return fixed_resources(
        BooksResource.from_settings(settings),
        QdrantStoreResource.from_settings(settings),
        IndexRecipeResource.from_settings(settings, recipe),
    )


@pytest.fixture
def resources(settings, tmp_path):
    return resources_for(settings, tmp_path)


@pytest.fixture
def instance():
    inst = DagsterInstance.ephemeral()
    inst.add_dynamic_partitions(BOOKS_PARTITIONS_NAME, list(BOOKS))
    return inst


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
    assert keys == {
        "source_files",
        "documents",
        "chunks",
        "chunk_embeddings",
        "qdrant_points",
        "qdrant_collection",
    }
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
    assert {"io_manager", "books", "qdrant", "recipe"} <= set(defs.resources)
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
    for name in ("books", "qdrant", "recipe"):
        field = fields["resources"].config_type.fields[name]
        inner = field.config_type.fields["config"].config_type
        assert not getattr(inner, "fields", None), f"resource {name} takes run config"
    ops = fields["ops"].config_type.fields
    assert set(ops["source_files"].config_type.fields["config"].config_type.fields) == {"force"}


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
        assert "| file" in meta["source_files"]["files_table"].value  # a Markdown table
        assert meta["chunk_embeddings"]["chunks_embedded"].value > 0
        assert chunk_count(settings, book) == meta["chunks"]["chunks"].value
        assert result.output_for_node("qdrant_points").book_id == book


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
    assert "broken.md" in check.metadata["files"].value
    assert "empty.md" in check.metadata["empty_files"].value
    assert check.metadata["errors"].value == 1
    # the next run parses nothing new, but the files are still broken and empty: still reported
    again = materialize(
        ingestion_assets, partition_key=book, instance=instance, resources=resources
    )
    check = next(c for c in again.get_asset_check_evaluations() if c.check_name == "parse_errors")
    assert not check.passed
    assert check.metadata["errors"].value == 1 and check.metadata["new_errors"].value == 0
    assert "broken.md" in check.metadata["files"].value
    assert "empty.md" in check.metadata["empty_files"].value


def test_blocking_chunk_check_stops_publishing(settings, resources, instance, monkeypatch):
    book = BOOKS[0]
    assert materialize(
        ingestion_assets, partition_key=book, instance=instance, resources=resources
    ).success
    before = chunk_count(settings, book)
    (settings.data_dir / book / "index.md").write_text("# Changed\n\nNew text for a new run.")
    monkeypatch.setattr(
        "rag_pipeline.defs.assets.check_chunks",
        lambda chunks, limit: ["chunk 3: broken chain (injected)"],
    )
    result = materialize(
        ingestion_assets,
        partition_key=book,
        instance=instance,
        resources=resources,
        raise_on_error=False,
    )
    assert not result.success
    done = {
        e.materialization.asset_key.to_user_string()
        for e in result.get_asset_materialization_events()
    }
    assert "chunk_embeddings" not in done and "qdrant_points" not in done
    assert chunk_count(settings, book) == before  # nothing already indexed is lost


def test_vector_dimension_check_blocks_a_model_with_another_size(
    settings, resources, instance, tmp_path
):
    book = BOOKS[0]
    assert materialize(
        ingestion_assets, partition_key=book, instance=instance, resources=resources
    ).success
    before = chunk_count(settings, book)
    (settings.data_dir / book / "index.md").write_text("# Changed\n\nNew text.")
    small = IndexRecipe.build(HashEmbedder(dimension=64), settings.chunking())
    swapped = resources_for(settings, tmp_path, recipe=small)
    result = materialize(
        ingestion_assets,
        partition_key=book,
        instance=instance,
        resources=swapped,
        raise_on_error=False,
    )
    assert not result.success
    check = next(
        c for c in result.get_asset_check_evaluations() if c.check_name == "vector_dimension"
    )
    assert not check.passed
    assert "384-dimensional" in check.metadata["details"].value
    assert chunk_count(settings, book) == before


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
    table = meta["book_table"].value
    for book in BOOKS:
        line = next(row for row in table.splitlines() if row.startswith(f"| {book}"))
        assert runs[book].run_id[:8] in line
        assert chunk_count(settings, book) and str(chunk_count(settings, book)) in line
    assert "warned" in next(r for r in table.splitlines() if r.startswith(f"| {BOOKS[0]}"))
    assert meta["books"].value == 2 and meta["books_with_failing_checks"].value == 1
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    assert checks["books_indexed"].passed
    assert not checks["book_checks_pass"].passed and BOOKS[0] in str(
        checks["book_checks_pass"].metadata["books"].value
    )
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
    written = meta["qdrant_points"]["points_written"].value
    assert "| point id" in written and "| file" in written
    assert "chunk points written" in meta["qdrant_points"]["summary"].value


def test_a_book_removed_during_its_run_is_not_written_and_a_late_purge_spares_it_if_back(
    settings, resources, instance, sample_books, tmp_path, monkeypatch
):
    """The folder goes between the embedding and the write: the write step ends cleanly with
    nothing written (its points would outlive the purge). A purge that runs after the folder
    came back keeps the points."""
    import shutil

    from rag_pipeline.defs import assets as assets_module
    from rag_pipeline.defs.jobs import purge_book_job, purge_run_config

    book = BOOKS[0]
    real_embed_book = assets_module.embed_book

    def embed_then_remove_the_folder(*args, **kwargs):
        embedded = real_embed_book(*args, **kwargs)
        shutil.move(sample_books / book, tmp_path / "aside")
        return embedded

    monkeypatch.setattr(assets_module, "embed_book", embed_then_remove_the_folder)
    write = materialize(
        ingestion_assets, partition_key=book, instance=instance, resources=resources
    )
    monkeypatch.undo()
    assert write.success
    assert write.output_for_node("qdrant_points").status == "missing"
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
    failure = next(e for e in alone.all_events if e.is_step_failure)
    message = failure.step_failure_data.error.to_string()
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

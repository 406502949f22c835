"""The in-process runner behind `rag-pipeline ingest`: what it runs, skips and refuses to purge."""

import uuid

import pytest
from dagster import DagsterInstance

from rag_pipeline.config import load_settings
from rag_pipeline.consistency import check_index
from rag_pipeline.defs.runner import DataDirError, ingest_books
from rag_pipeline.index import CHUNK
from rag_pipeline.store import open_store
from rag_pipeline.store.base import PointRecord
from rag_pipeline.store.filters import Match, tenant_filter
from rag_pipeline_tests.conftest import section


@pytest.fixture
def settings(data_dir, tmp_path, write_book):
    write_book("alpha", {"a.md": "# Alpha\n\n" + section("One") + section("Two", seed="t")})
    write_book("beta", {"b.md": "# Beta\n\n" + section("Three", seed="b")})
    return load_settings(
        data_dir=data_dir,
        qdrant_path=str(tmp_path / "qdrant"),
        embedder="hash",
        cache_dir=tmp_path / "cache",
    )


@pytest.fixture
def instance():
    with DagsterInstance.ephemeral() as inst:
        yield inst


def chunk_points(settings, book):
    with open_store(settings) as store:
        return store.count(tenant_filter(book, Match("record_type", CHUNK)))


def test_second_ingest_runs_nothing(settings, instance):
    first = ingest_books(settings=settings, instance=instance)
    assert {b: r.status for b, r in first.books.items()} == {
        "alpha": "ingested",
        "beta": "ingested",
    }
    again = ingest_books(settings=settings, instance=instance)
    assert {r.status for r in again.books.values()} == {"unchanged"}
    assert all(r.points == r.chunks > 0 for r in again.books.values())


def test_a_missing_data_folder_is_an_error_and_purges_nothing(settings, instance, data_dir):
    ingest_books(settings=settings, instance=instance)
    before = chunk_points(settings, "alpha")
    missing = settings.model_copy(update={"data_dir": data_dir / "not-mounted"})
    with pytest.raises(DataDirError, match="not-mounted"):
        ingest_books(settings=missing, instance=instance)
    assert chunk_points(settings, "alpha") == before > 0


def test_an_empty_data_folder_does_not_purge_every_book(settings, instance, tmp_path):
    ingest_books(settings=settings, instance=instance)
    empty = tmp_path / "empty"
    empty.mkdir()
    report = ingest_books(
        settings=settings.model_copy(update={"data_dir": empty}), instance=instance
    )
    assert report.books == {}
    assert "refusing to purge all 2" in report.warnings[0]
    assert chunk_points(settings, "alpha") > 0 and chunk_points(settings, "beta") > 0


def test_a_removed_book_is_purged_when_others_remain(settings, instance, data_dir):
    import shutil

    ingest_books(settings=settings, instance=instance)
    shutil.rmtree(data_dir / "beta")
    report = ingest_books(settings=settings, instance=instance)
    assert report.books["beta"].status == "removed"
    assert chunk_points(settings, "beta") == 0 and chunk_points(settings, "alpha") > 0


def test_orphan_chunks_without_a_document_record_start_a_run(settings, instance):
    """What a run killed between its chunk upsert and its commit leaves for a file that was
    deleted before the next run: chunks no document record accounts for."""
    ingest_books(settings=settings, instance=instance)
    with open_store(settings) as store:
        record = next(
            iter(
                store.scroll(tenant_filter("alpha", Match("record_type", CHUNK)), with_vectors=True)
            )
        )
        orphan = {
            **record.payload,
            "source_file": "gone.md",
            "prev_chunk_id": None,
            "next_chunk_id": None,
        }
        store.upsert([PointRecord(str(uuid.uuid4()), orphan, dense=record.dense)])
    report = ingest_books(settings=settings, instance=instance)
    assert report.books["alpha"].status == "ingested"
    assert report.books["alpha"].deleted == 1
    assert report.books["beta"].status == "unchanged"
    with open_store(settings) as store:
        assert check_index(store, "alpha").passed

"""Issue 41.1: what live mode's edit pays besides its work (see also test_store_shards's
hold test and test_embed's token counts)."""

from __future__ import annotations

from pathlib import Path

from rag_pipeline_tests.conftest import make_pipeline, make_recipe, section, store_config


def test_dagsters_migration_scripts_are_read_once_per_process(monkeypatch):
    """Each run's event database has its schema checked and stamped by alembic, which read
    every migration script again each time: a live process reads them once."""
    from alembic.script import ScriptDirectory, base
    from dagster._core.storage.event_log.sqlite import sqlite_event_log
    from dagster._core.storage.sql import get_alembic_config

    from rag_pipeline.defs.migration_scripts import keep_migration_scripts

    reads: list[str] = []
    real = base.ScriptDirectory._load_revisions

    def counting(self):  # type: ignore[no-untyped-def]
        reads.append(self.dir)
        return real(self)

    monkeypatch.setattr(base.ScriptDirectory, "_load_revisions", counting)
    keep_migration_scripts()
    config = get_alembic_config(sqlite_event_log.__file__)
    first = ScriptDirectory.from_config(config)
    head = first.as_revision_number("head")
    again = ScriptDirectory.from_config(get_alembic_config(sqlite_event_log.__file__))
    assert again is first and again.as_revision_number("head") == head
    assert len(reads) <= 1  # none when an earlier run of this process read them


def test_an_edits_stages_are_timed_for_its_breakdown(tmp_path: Path, hash_embedder):
    """live mode's stages of a run say what each took (bench/freshness.py's breakdown)."""
    data = tmp_path / "books"
    (data / "book").mkdir(parents=True)
    (data / "book" / "a.md").write_text("# A\n\n" + section("One", seed="a"))
    pipeline = make_pipeline(data, store_config(tmp_path / "qdrant"), make_recipe(hash_embedder))
    prepared = pipeline.prepare(["book"], run_id="r1")
    assert prepared.written
    assert list(prepared.seconds) == ["assess", "parse", "chunk", "embed", "write", "close"]
    assert all(s >= 0 for s in prepared.seconds.values())

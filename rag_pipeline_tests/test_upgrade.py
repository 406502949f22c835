"""An upgrade that changes the parse rules converges by itself: the books sensor's tick and
live mode's first look start a run for exactly the books holding an error record written under
other parse rules, and for no other book (no file of any book changed)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterInstance, SkipReason

from rag_pipeline.sources.scan import clear_scan_cache
from rag_pipeline_tests.conftest import hash_settings, settle_files
from rag_pipeline_tests.helpers import parse_rules_of_version_1
from rag_pipeline_tests.test_live import NoWatchSource
from rag_pipeline_tests.test_sensors import Harness, requested_books


@pytest.fixture
def upgraded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Books indexed before an upgrade of the parse rules: ``old`` holds a file refused by
    the older rules only, ``current`` a file refused by every version (its error record
    written under today's rules), ``clean`` no error. (data folder, the older pipeline, the
    upgraded one.)"""
    from rag_pipeline.embed import create_embedder
    from rag_pipeline.ingest.pipeline import IngestPipeline
    from rag_pipeline.recipes.recipe import IndexRecipe

    data_dir = tmp_path / "books"
    for book_id, files in {
        "old": {"slides.md": "---\n\n# Slides\n\nOne.\n\n---\n\nTwo.\n", "a.md": "# A\n\na\n"},
        "current": {"list.md": "---\n- a\n---\nx\n", "a.md": "# A\n\nb\n"},
        "clean": {"a.md": "# A\n\nc\n"},
    }.items():
        (data_dir / book_id).mkdir(parents=True)
        for name, text in files.items():
            (data_dir / book_id / name).write_text(text)
    settle_files()
    settings = hash_settings(data_dir, tmp_path)  # what a run in Dagster builds its own of
    recipe = IndexRecipe.build(create_embedder(settings.embedding()), settings.chunking())
    pipeline = IngestPipeline.from_settings(settings, recipe)
    older = IngestPipeline.from_settings(settings, dataclasses.replace(recipe, parse_rules="1"))
    with parse_rules_of_version_1():
        assert older.run(["old", "clean"])["old"].outcome.result.errors == 1
    assert pipeline.run(["current"])["current"].outcome.result.errors == 1
    clear_scan_cache()
    return data_dir, older, pipeline


def test_the_sensor_runs_once_the_books_whose_errors_older_parse_rules_wrote(upgraded):
    """Fault: the sensor decided from file changes alone: after an upgrade under ``make ui``
    a file refused by the older rules kept its error until it changed (the index differed
    from a clean build). The first tick under the new rules requests a run of ``old`` only
    (``current``'s error is of today's rules, ``clean`` has none); the next tick none."""
    data_dir, older, pipeline = upgraded
    harness = Harness(data_dir)
    harness.pipeline = older  # the daemon before the upgrade: every book seen
    assert sorted(b for run in requested_books(harness.tick(), harness.instance) for b in run) == [
        "clean",
        "current",
        "old",
    ]
    assert isinstance(harness.tick(), SkipReason)

    harness.pipeline = pipeline  # upgraded: no file changed
    assert requested_books(harness.tick(), harness.instance) == [["old"]]
    assert isinstance(harness.tick(), SkipReason)  # checked once per parse-rules version

    # a cursor written before the check existed: every book checked once, the same answer
    cursor = json.loads(harness.cursor)
    del cursor["parse"]
    harness.cursor = json.dumps(cursor)
    assert requested_books(harness.tick(), harness.instance) == [["old"]]
    assert isinstance(harness.tick(), SkipReason)


def test_a_store_busy_at_the_check_is_checked_at_a_later_tick(upgraded, monkeypatch):
    """A store a run holds makes the check wait for a later tick, not skip the books."""
    from rag_pipeline.defs import sensors
    from rag_pipeline_tests.test_sensors import store_busy_at

    data_dir, older, pipeline = upgraded
    harness = Harness(data_dir)
    harness.pipeline = older
    harness.tick()
    harness.pipeline = pipeline
    free = store_busy_at(monkeypatch, "books_of_other_parse_rules")
    assert isinstance(harness.tick(), SkipReason)
    assert sensors.read_parse_check(harness.cursor)[1] == {"clean", "current", "old"}
    free()
    assert requested_books(harness.tick(), harness.instance) == [["old"]]
    assert sensors.read_parse_check(harness.cursor)[1] == set()


def test_live_modes_first_look_runs_only_the_books_whose_errors_older_rules_wrote(
    upgraded, tmp_path
):
    """Live mode's catch-up plans every indexed book (its first look knows no digest), and
    the plan reads again an error of other rules: ``old`` runs, no other book. The decision
    was already the plan's (this proves it); a second look starts nothing."""
    from rag_pipeline.config import BatchConfig
    from rag_pipeline.defs.live import LiveRuns, _indexed_books
    from rag_pipeline.ingest.live import LiveLoop

    data_dir, _, pipeline = upgraded
    instance = DagsterInstance.ephemeral()
    home = tmp_path / "home"
    home.mkdir()
    notes: list[str] = []
    reports: list[Any] = []
    runs = LiveRuns(pipeline, instance, home, BatchConfig(), notes.append, reports.append)
    live = LiveLoop(NoWatchSource(data_dir), runs, indexed=lambda: _indexed_books(pipeline))

    def ingest_runs() -> list[str]:
        return sorted(
            run.tags.get("dagster/partition", "")
            for run in instance.get_runs()
            if run.job_name == "ingest_books"
        )

    assert live.look() == ["clean", "current", "old"]  # each planned; only one runs
    assert ingest_runs() == ["old"], (notes, reports)
    assert live.look() == []
    assert ingest_runs() == ["old"]
    with pipeline.store.open() as reader:
        assert pipeline.plan(reader).needs_runs is False

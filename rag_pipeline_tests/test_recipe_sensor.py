"""A change of the configured recipe alone (a settings change and a restart, no file
changed) converges by itself: the books sensor requests a run of exactly the books whose
searched index was built with another recipe, once per configured recipe, and a tick under
an unchanged recipe opens no store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from dagster import SkipReason

from rag_pipeline.sources.scan import clear_scan_cache
from rag_pipeline_tests.conftest import hash_settings, settle_files
from rag_pipeline_tests.test_sensors import Harness, requested_books


@pytest.fixture
def changed_recipe(tmp_path: Path) -> Any:
    """Books ``a`` and ``c`` indexed with the 384-dimension hash model, ``b`` with the
    256-dimension one (then configured). (data folder, the pipeline before the settings
    change, the one after: built from the settings, as the code server's.)"""
    from rag_pipeline.ingest.pipeline import IngestPipeline

    data_dir = tmp_path / "books"
    for book_id in ("a", "b", "c"):
        (data_dir / book_id).mkdir(parents=True)
        (data_dir / book_id / "x.md").write_text(f"# {book_id}\n\ntext of {book_id}\n")
    settle_files()
    before = IngestPipeline.from_settings(hash_settings(data_dir, tmp_path))
    after = IngestPipeline.from_settings(hash_settings(data_dir, tmp_path, hash_dimension=256))
    assert before.run(["a", "c"])["a"].outcome.result.errors == 0
    assert after.run(["b"])["b"].outcome.result.errors == 0
    clear_scan_cache()
    return data_dir, before, after


def ran(result: Any, harness: Harness) -> list[str]:
    return sorted(b for run in requested_books(result, harness.instance) for b in run)


def settled(data_dir: Path, before: Any) -> Harness:
    """A sensor that has seen every book under the settings before the change."""
    harness = Harness(data_dir)
    harness.pipeline = before
    assert ran(harness.tick(), harness) == ["a", "b", "c"]  # new to the sensor
    assert isinstance(harness.tick(), SkipReason)
    return harness


def test_a_recipe_change_alone_runs_exactly_the_books_of_another_recipe(changed_recipe):
    """Fault: the sensor decided from file changes (and parse rules) alone: after the model
    was changed and ``make ui`` restarted, every book stayed on the old recipe until a file
    changed. The first tick under the new settings requests ``a`` and ``c`` (``b`` is
    searched with the configured recipe already); the next tick nothing."""
    data_dir, before, after = changed_recipe
    harness = settled(data_dir, before)
    harness.pipeline = after
    assert ran(harness.tick(), harness) == ["a", "c"]
    from rag_pipeline.defs.sensors import configured_recipe_key, read_recipe_check

    assert read_recipe_check(harness.cursor) == (configured_recipe_key(after.recipes), set())
    assert isinstance(harness.tick(), SkipReason)  # checked once per configured recipe
    # (and a change back runs the books of the other recipe: b, searched with 256)
    harness.pipeline = before
    assert ran(harness.tick(), harness) == ["b"]


def test_a_store_busy_at_the_recipe_check_is_checked_at_a_later_tick(changed_recipe, monkeypatch):
    """A store a run holds makes the recipe check wait for a later tick, not skip books."""
    from rag_pipeline.defs import sensors
    from rag_pipeline_tests.test_sensors import store_busy_at

    data_dir, before, after = changed_recipe
    harness = settled(data_dir, before)
    harness.pipeline = after
    free = store_busy_at(monkeypatch, "books_of_other_recipes")
    assert isinstance(harness.tick(), SkipReason)
    assert sensors.read_recipe_check(harness.cursor)[1] == {"a", "b", "c"}
    free()
    assert ran(harness.tick(), harness) == ["a", "c"]
    assert sensors.read_recipe_check(harness.cursor)[1] == set()


def test_a_tick_under_an_unchanged_recipe_opens_no_store(changed_recipe, monkeypatch):
    """The check costs a tick nothing while the configured recipe stays: no store opened,
    no recipe read, no model built; a changed recipe opens it once."""
    from rag_pipeline.defs import sensors

    data_dir, before, after = changed_recipe
    harness = settled(data_dir, before)
    opener = type(after.store)
    real_open = opener.open
    opens: list[int] = []

    def counting_open(self: Any, *args: Any, **kwargs: Any) -> Any:
        opens.append(1)
        return real_open(self, *args, **kwargs)

    checks: list[list[str]] = []
    real_check = sensors.books_of_other_recipes

    def counting_check(store: Any, book_ids: Any, *args: Any) -> Any:
        checks.append(list(book_ids))
        return real_check(store, book_ids, *args)

    monkeypatch.setattr(opener, "open", counting_open)
    monkeypatch.setattr(sensors, "books_of_other_recipes", counting_check)
    for _ in range(3):
        assert isinstance(harness.tick(), SkipReason)
    assert (opens, checks) == ([], [])
    harness.pipeline = after
    assert ran(harness.tick(), harness) == ["a", "c"]
    assert (len(opens), checks) == (1, [["a", "b", "c"]])
    assert isinstance(harness.tick(), SkipReason)
    assert (len(opens), len(checks)) == (1, 1)


def test_a_pending_build_is_left_to_its_run_and_one_of_another_recipe_runs(changed_recipe):
    """``a``'s build of the configured recipe is pending: while a run of it is in flight it
    is that run's work (no second run), else the book runs to resume it. ``b`` is searched
    with the configured recipe but holds a pending build of the old one (the setting changed
    back before it switched): it runs, and the run drops that build."""
    from rag_pipeline.ingest.plan import books_of_other_recipes
    from rag_pipeline_tests.test_store_shards import points_of

    _, before, after = changed_recipe
    for pipeline, book in ((after, "a"), (before, "b")):
        recipe = pipeline.recipes.get()
        with pipeline.store.open(recipe=recipe) as builder:  # a build killed half way
            builder.upsert(points_of(book, 1, recipe.dimension, "partial"))
    with after.store.open() as reader:
        assert reader.pending_recipe("a") is not None and reader.pending_recipe("b") is not None
        check = books_of_other_recipes(reader, ["a", "b", "c"], after.recipes, {"a"})
        assert (check.stale, check.busy) == (("b", "c"), ())
        check = books_of_other_recipes(reader, ["a", "b", "c"], after.recipes)
        assert check.stale == ("a", "b", "c")

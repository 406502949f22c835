"""A change of the settings that decide what a file gives besides its bytes and the recipe
(``RAG_PATH_PATTERNS``, ``RAG_DEFAULT_HARDWARE_TIER``: a chunk's metadata; ``RAG_MAX_FILE_BYTES``,
``RAG_MAX_FILE_BLOCKS``: whether it is refused) converges: the plan, a run, the books sensor and
live mode read again every file read under other settings, and embed nothing for texts that
did not change.

Fault (before): none of them was part of anything a plan compares, so after a change every
unchanged file kept what the old settings gave for good (``plan``: "unchanged"; a search
filtered by tier or module answered from the old values; a file past a lowered limit stayed
indexed, unnamed), while a clean build gave the new."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from dagster import SkipReason

from rag_pipeline.sources.scan import clear_scan_cache
from rag_pipeline_tests.conftest import hash_settings, settle_files
from rag_pipeline_tests.test_sensors import Harness, requested_books

#: the payload fields a run writes anew whatever it reads (not part of what a build gives)
_OF_THE_RUN = {"run_id", "indexed_at", "pipeline_version"}

FILES = {
    "b": {
        "module-1-intro/page-1.md": "# Intro\n\nRobots walk on two legs.\n",
        "notes.md": "---\nhardware_tier: 2\n---\n# Notes\n\nSensors and motors.\n",
        "plain.md": "# Plain\n\nNo tier is stated here.\n",
    },
    "other": {"a.md": "# A\n\nAnother book.\n"},
}
CUSTOM_PATTERNS = '["^(?P<module>[a-z]+)"]'


def write_books(data_dir: Path) -> None:
    for book_id, files in FILES.items():
        for name, text in files.items():
            path = data_dir / book_id / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    settle_files()


def pipeline_of(data_dir: Path, work: Path, **settings: Any) -> Any:
    from rag_pipeline.embed import create_embedder
    from rag_pipeline.ingest.pipeline import IngestPipeline
    from rag_pipeline.recipes.recipe import IndexRecipe

    loaded = hash_settings(data_dir, work, **settings)
    recipe = IndexRecipe.build(create_embedder(loaded.embedding()), loaded.chunking())
    return IngestPipeline.from_settings(loaded, recipe)


def points(pipeline: Any, book_id: str) -> dict[str, dict[str, Any]]:
    """Every point of the book: id -> its payload, less what each run writes anew."""
    from rag_pipeline.schema import book_filter

    with pipeline.store.open() as store:
        return {
            str(r.id): {k: v for k, v in r.payload.items() if k not in _OF_THE_RUN}
            for r in store.scroll(book_filter(book_id), fields=None)
        }


def clean_build(data_dir: Path, work: Path, **settings: Any) -> dict[str, dict[str, Any]]:
    """The points of ``b`` a clean build under ``settings`` gives (a copy, a fresh store)."""
    shutil.copytree(data_dir, work / "books")
    fresh = pipeline_of(work / "books", work, **settings)
    fresh.run(["b"])
    return points(fresh, "b")


def plan_of(pipeline: Any, book_id: str) -> Any:
    from rag_pipeline.ingest.plan import plan_ingest

    with pipeline.store.open() as store:
        return plan_ingest(pipeline, store, [book_id], detail=True).books[book_id]


SETTINGS = [
    pytest.param({"default_hardware_tier": 3}, id="default tier"),
    pytest.param({"path_patterns": CUSTOM_PATTERNS}, id="path patterns"),
    pytest.param(
        {"default_hardware_tier": 0, "path_patterns": CUSTOM_PATTERNS}, id="both settings"
    ),
]


@pytest.mark.parametrize("changed", SETTINGS)
def test_a_metadata_setting_changed_and_back_reads_every_file_again_and_embeds_nothing(
    tmp_path: Path, changed: dict[str, Any]
) -> None:
    data_dir = tmp_path / "books"
    write_books(data_dir)
    before = pipeline_of(data_dir, tmp_path)
    before.run(["b", "other"])
    for step, settings in enumerate((changed, {})):  # the change, then back to the defaults
        pipeline = pipeline_of(data_dir, tmp_path, **settings)
        planned = plan_of(pipeline, "b")
        assert planned.action == "run", planned.reasons
        assert len(planned.changes.modified) == len(FILES["b"])
        assert planned.preview is not None and planned.preview.to_embed == 0
        assert any("read settings changed" in r for r in planned.reasons), planned.reasons
        result = pipeline.run(["b"])["b"].outcome.result
        assert (result.embedded, result.errors) == (0, 0)  # every vector reused
        clean = clean_build(data_dir, tmp_path / f"clean{step}", **settings)
        assert points(pipeline, "b") == clean
        assert plan_of(pipeline, "b").action == "unchanged"
        # the book's saved summary is a shortcut: its answer is the records' answer
        for summary in (tmp_path / "qdrant").rglob("summary.json"):
            summary.unlink()
        assert plan_of(pipeline, "b").action == "unchanged"
    tiers = {p.get("source_file"): p.get("hardware_tier") for p in points(pipeline, "b").values()}
    assert tiers["notes.md"] == 2 and tiers["plain.md"] == 1  # the frontmatter's tier wins


@pytest.mark.parametrize(
    ("lowered", "named"),
    [
        pytest.param({"max_file_bytes": 60}, "RAG_MAX_FILE_BYTES", id="bytes"),
        pytest.param({"max_file_blocks": 2}, "RAG_MAX_FILE_BLOCKS", id="blocks"),
    ],
)
def test_a_lowered_file_limit_names_the_files_past_it_and_a_raised_one_takes_them_back(
    tmp_path: Path, lowered: dict[str, Any], named: str
) -> None:
    """Lowered: the files past the limit are errors naming the setting (their last good
    chunks stay, as for any file that turns unreadable), the others embed nothing; set back:
    the index is a clean build's again."""
    data_dir = tmp_path / "books"
    write_books(data_dir)
    big = data_dir / "b" / "big.md"
    big.write_text("# Big\n\n" + "\n\n".join(f"Paragraph {i} of the big file." for i in range(6)))
    settle_files()
    pipeline_of(data_dir, tmp_path).run(["b"])
    pipeline = pipeline_of(data_dir, tmp_path, **lowered)
    assert plan_of(pipeline, "b").action == "run"
    result = pipeline.run(["b"])["b"].outcome.result
    assert result.embedded == 0 and result.errors >= 1
    assert any("big.md" in m and named in m for m in result.error_messages), result
    assert plan_of(pipeline, "b").action == "unchanged"  # refused once, then left alone
    restored = pipeline_of(data_dir, tmp_path)
    assert plan_of(restored, "b").action == "run"
    again = restored.run(["b"])["b"].outcome.result
    assert (again.embedded, again.errors) == (0, 0)
    assert points(restored, "b") == clean_build(data_dir, tmp_path / "clean")


def test_the_sensor_runs_once_the_books_parsed_under_other_metadata_settings(
    tmp_path: Path,
) -> None:
    """After a settings change and a restart of the code server, the first tick requests a
    run of every book read under other settings (no file changed), once."""
    data_dir = tmp_path / "books"
    write_books(data_dir)
    before = pipeline_of(data_dir, tmp_path)
    before.run(["b", "other"])
    clear_scan_cache()
    harness = Harness(data_dir)
    harness.pipeline = before
    harness.tick()
    assert isinstance(harness.tick(), SkipReason)
    harness.pipeline = pipeline_of(data_dir, tmp_path, default_hardware_tier=4)
    assert requested_books(harness.tick(), harness.instance) == [["b", "other"]]
    assert isinstance(harness.tick(), SkipReason)  # checked once per settings
    harness.pipeline.run(["b", "other"])
    harness.pipeline = pipeline_of(data_dir, tmp_path)  # back: they run again, once
    assert requested_books(harness.tick(), harness.instance) == [["b", "other"]]
    assert isinstance(harness.tick(), SkipReason)

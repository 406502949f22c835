"""Hostile sequences of recipe changes (README "Recipe changes: build beside, switch per
book"): flipping a book's recipe back and forth, with and without runs between, must leave
what a clean build of the final recipe leaves, and say why each book runs in true words."""

from __future__ import annotations

from pathlib import Path

from rag_pipeline.embed.hashing import HashEmbedder
from rag_pipeline.ingest.assess import DAMAGED_VECTORS
from rag_pipeline_tests.helpers import InProcessCli, index_sample_books


def test_a_plan_of_a_change_of_dimension_says_recipe_change_not_damaged_vectors(
    tmp_path: Path,
) -> None:
    """hash-256 indexed, hash-384 configured: the stored vectors are sound 256-dimension
    vectors of the recorded model, not damage; the plan says the recipe changed, as the
    run does (it used to probe them against the configured dimension)."""
    books = index_sample_books(tmp_path, HashEmbedder(256))
    cli = InProcessCli(tmp_path, books)
    plan = cli.json("plan")
    for book, entry in plan["books"].items():
        assert entry["action"] == "run", (book, entry)
        assert DAMAGED_VECTORS not in entry["reasons"], (book, entry["reasons"])
        assert any("model changed" in r for r in entry["reasons"]), (book, entry["reasons"])
        assert entry["recipe_change"]["from"] == "hash-256", entry

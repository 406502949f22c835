"""The plan says what the run does (README "Command line", `plan`): for a book that runs, ``plan``'s
chunks to embed and reuse, tokens, cost, points to delete and file counts are the figures
its ``ingest`` then reports. The resumed recipe build (the plan used to read the searched
generation, the run reads the pending build) is in ``test_hostile_recipe.py``; this is the
ordinary incremental change of a book."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rag_pipeline.embed.hashing import HashEmbedder
from rag_pipeline_tests.helpers import InProcessCli, index_sample_books

#: plan field -> the run report's field of the same figure
_SAME_FIGURE = {
    "chunks_to_embed": "embedded",
    "chunks_reused": "reused",
    "tokens_to_embed": "tokens",
    "cost_usd": "cost_usd",
    "points_to_delete": "deleted",
    "files_new": "files_new",
    "files_modified": "files_modified",
    "files_deleted": "files_deleted",
    "files_unreadable": "files_unreadable",
}


def plan_figures(plan: dict[str, Any]) -> dict[str, Any]:
    """A book's entry of ``plan --json``, keyed as the run reports the same figures."""
    return {run: plan[field] for field, run in _SAME_FIGURE.items()}


def run_figures(run: dict[str, Any]) -> dict[str, Any]:
    """A book's entry of ``ingest --json``: the figures its plan also gives."""
    return {run_field: run[run_field] for run_field in _SAME_FIGURE.values()}


def test_the_plan_of_an_incremental_change_gives_the_figures_its_run_reports(
    tmp_path: Path,
) -> None:
    """One file edited (a paragraph added: most of its chunks keep their text), one new,
    one deleted: the plan's figures are the run's."""
    books = index_sample_books(tmp_path, HashEmbedder(384))
    cli = InProcessCli(tmp_path, books)
    book = sorted(p.name for p in books.iterdir() if p.is_dir())[0]
    edited, gone = sorted((books / book).rglob("*.md"))[:2]
    edited.write_text(edited.read_text() + "\n\n## Added\n\nA new closing paragraph.\n")
    gone.unlink()
    (books / book / "added.md").write_text("# Added\n\nA page of its own, new to the book.\n")
    plan = cli.json("plan", "--book", book)["books"][book]
    assert plan["action"] == "run", plan
    assert (plan["files_new"], plan["files_modified"], plan["files_deleted"]) == (1, 1, 1)
    run = cli.json("ingest", "--book", book)["books"][book]
    assert run["status"] == "ingested", run
    assert plan["chunks_reused"] > 0 and plan["points_to_delete"] > 0, plan
    assert plan_figures(plan) == run_figures(run), (plan, run)
    assert cli.json("plan", "--book", book)["books"][book]["action"] == "unchanged"

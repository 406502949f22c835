"""Hostile sequences of recipe changes (README "Recipe changes: build beside, switch per
book"): flipping a book's recipe back and forth, with and without runs between, must leave
what a clean build of the final recipe leaves, and say why each book runs in true words."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rag_pipeline.embed.hashing import HashEmbedder
from rag_pipeline.ingest.assess import DAMAGED_VECTORS
from rag_pipeline_tests.helpers import InProcessCli, index_books, index_sample_books
from rag_pipeline_tests.test_plan_says_what_the_run_does import plan_figures, run_figures


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


def _held_back_build(tmp_path: Path) -> tuple[Path, InProcessCli, str, str]:
    """Books indexed with hash-384, then hash-256 built beside and held back (a file the old
    index serves was broken while it ran), the file then fixed: (books, cli, store, book)."""
    books = index_sample_books(tmp_path, HashEmbedder(384))
    cli = InProcessCli(tmp_path, books)
    qdrant = cli.env["RAG_QDRANT_PATH"]
    book = sorted(p.name for p in books.iterdir() if p.is_dir())[0]
    victim = sorted((books / book).rglob("*.md"))[0]
    original = victim.read_bytes()
    victim.write_bytes(b"# broken \x80\x81 not utf-8\n")
    index_books(books, qdrant, HashEmbedder(256))
    victim.write_bytes(original)
    return books, cli, qdrant, book


def _pending(qdrant: str, book: str) -> dict[str, str] | None:
    from rag_pipeline.config import load_settings
    from rag_pipeline.schema import COLLECTION_SCHEMA
    from rag_pipeline.store import open_store

    with open_store(load_settings(qdrant_path=qdrant).store(), COLLECTION_SCHEMA) as store:
        return store.pending_recipe(book)


@pytest.mark.slow
def test_a_recipe_changed_back_drops_the_build_left_pending_for_the_other_one(
    tmp_path: Path,
) -> None:
    """hash-384 indexed; hash-256 built beside and held back (a file the old index serves
    was broken); the setting changed back and the file fixed: the book matches hash-384 again,
    but its abandoned hash-256 build was pending forever (on disk, shown "pending" on the
    collection page) since a book whose files match starts no run. The plan now runs it,
    saying why, and its run drops the build."""
    _books, cli, qdrant, book = _held_back_build(tmp_path)
    assert (_pending(qdrant, book) or {}).get("embedding_model") == "hash-256"
    plan = cli.json("plan")["books"][book]
    assert plan["action"] == "run", plan
    assert any("hash-256" in r and "pending" in r for r in plan["reasons"]), plan
    report = cli.json("ingest")["books"][book]
    assert report["status"] == "ingested" and report["run_id"], report
    assert _pending(qdrant, book) is None
    generations = [p.name for p in (Path(qdrant) / "rag_chunks" / "books" / book).iterdir()]
    assert len([g for g in generations if g.startswith("g")]) == 1, generations
    assert cli.json("plan")["books"][book]["action"] == "unchanged"


@pytest.mark.slow
def test_a_switch_killed_after_its_replace_leaves_nothing_behind_after_the_next_ingest(
    tmp_path: Path,
) -> None:
    """kill -9 inside a switch, after ``current.json`` was replaced and before the pending
    pointer and the old generation were removed: the book is searched on its new recipe and
    its files match it, so no run came, and the old generation (a whole shard) and the stale
    pointer stayed on disk for good. The plan now runs the book and its run tidies them."""
    books, cli, qdrant, book = _held_back_build(tmp_path)
    index_books(books, qdrant, HashEmbedder(256))  # switched: keep the state before it
    folder = Path(qdrant) / "rag_chunks" / "books" / book
    # as a switch killed after its replace leaves it: current.json names the new generation,
    # pending.json still names it too, the old generation is still there
    new = json.loads((folder / "current.json").read_text())
    old = folder / "g20000101000000-abcdef"
    shutil.copytree(folder / new["generation"], old)
    (folder / "pending.json").write_text(json.dumps(new))
    cli.env["RAG_HASH_DIMENSION"] = "256"
    hits = cli.json("search", "nodes and topics", "--book", book)
    assert hits and {h["embedding_model"] for h in hits} == {"hash-256"}
    plan = cli.json("plan")["books"][book]
    assert plan["action"] == "run" and any("cut short" in r for r in plan["reasons"]), plan
    assert cli.json("ingest")["books"][book]["status"] == "ingested"
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith(("g", "pending"))) == [
        new["generation"]
    ]
    assert cli.json("plan")["books"][book]["action"] == "unchanged"


def test_a_search_of_an_openai_book_without_the_api_key_names_the_missing_key(
    tmp_path: Path,
) -> None:
    """A book built with OpenAI, the key removed, the process now on another embedder: the
    search is refused (exit 1) naming the book, the model and the reason, the missing
    OPENAI_API_KEY (it used to say only that this process cannot embed with it)."""
    openai_like = HashEmbedder(1536)
    openai_like.model_name = "text-embedding-3-small"
    books = index_sample_books(tmp_path, openai_like)
    book = sorted(p.name for p in books.iterdir() if p.is_dir())[0]
    cli = InProcessCli(tmp_path, books)
    cli.env.pop("OPENAI_API_KEY", None)
    done = cli("search", "topics", "--book", book, check=False)
    assert done.returncode == 1, done
    assert book in done.stderr and "text-embedding-3-small" in done.stderr
    assert "OPENAI_API_KEY is not set" in done.stderr, done.stderr


@pytest.mark.slow
def test_a_change_of_dimension_refused_by_a_store_without_generations_names_the_reason(
    sample_books: Path, tmp_path: Path
) -> None:
    """qdrant-client's folder has no generations: a change of dimension is refused by the
    blocking ``vector_dimension`` check (README: use another RAG_COLLECTION). The book's
    error used to name only the check ("1 blocking asset check failed ...
    vector_dimension"), not why: it now carries the check's reason, and the plan names it
    before anything is embedded."""
    cli = InProcessCli(tmp_path, sample_books)
    cli.env["RAG_QDRANT_EMBEDDED"] = "client"
    book = sorted(p.name for p in sample_books.iterdir() if p.is_dir())[0]
    cli("ingest", "--book", book)
    cli.env["RAG_HASH_DIMENSION"] = "256"
    planned = cli.json("plan", "--book", book)["books"][book]  # the plan says so first
    assert any("384-dimensional" in e and "RAG_COLLECTION" in e for e in planned["errors"])
    done = cli("ingest", "--json", "--book", book, check=False)
    assert done.returncode == 1, done
    result = json.loads(done.stdout)["books"][book]
    assert result["status"] == "failed" and result["run_id"], result
    (message,) = result["error_messages"]
    assert "384-dimensional" in message and "makes 256" in message, message
    assert "RAG_COLLECTION" in message and book in message, message


def test_the_plan_of_a_resumed_build_prices_only_what_the_run_embeds(tmp_path: Path) -> None:
    """hash-384 indexed; hash-256 built beside and held back (one broken file): the pending
    build holds every other file's vectors. With the file fixed, the run resumes the build
    and embeds that file's chunks only; the plan priced every chunk of the book (for OpenAI:
    dollars the run does not spend), read from the searched generation. It now reads the
    pending build, as the run does, and says what the run then does."""
    _books, cli, _qdrant, book = _held_back_build(tmp_path)
    cli.env["RAG_HASH_DIMENSION"] = "256"
    plan = cli.json("plan", "--book", book)["books"][book]
    assert plan["action"] == "run", plan
    assert plan["recipe_change"]["from"] == "hash-384", plan  # still a migration
    run = cli.json("ingest", "--book", book)["books"][book]
    assert run["status"] == "ingested", run
    assert 0 < plan["chunks_to_embed"] == run["embedded"] < run["chunks"], (plan, run)
    assert plan_figures(plan) == run_figures(run), (plan, run)
    assert any("pending" in r and "resumes" in r for r in plan["reasons"]), plan
    assert plan["recipe_change"]["chunks_to_embed"] == run["embedded"], plan

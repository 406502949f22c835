"""A cache or shortcut is never the truth: the plan a book's saved summary gives (and the
summary check a process keeps, ``_checked``) is the plan a read of the book gives, whatever
happened to the book before. A git book and a folder book go through a random sequence of
commits, edits and ingests (in-process, on the production pipeline and Qdrant Edge store),
some ingests under a clock that stands still or steps back, some summaries left as an older
version wrote them; after every step each book's plan is made from the summaries as saved,
then again with every ``summary.json`` removed, the caches cleared and sources of its own
(no in-process cache of a git remote's commits): they must be equal.

The flake this caught (``test_git_books``: a rename planned as "2 commits"): a plan that read
the book took the commit of the record with the greatest ``indexed_at`` (whole seconds, ties
decided by read order), while the summary said the last run's commit."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rag_pipeline import schema
from rag_pipeline.schema import COLLECTION_SCHEMA
from rag_pipeline.store.edge import EdgeStore
from rag_pipeline_tests.conftest import make_recipe, section, store_config
from rag_pipeline_tests.gitbooks import NEEDS_GIT, GitRepo, write_sources

COLLECTION = "rag_chunks"

#: what each book's plan must say alike, whichever way it was made (BookPlan.as_dict)
COMPARED = (
    "action",
    "reasons",
    "files",
    "errors",
    "chunks",
    "chunks_to_embed",
    "chunks_reused",
    "points_to_delete",
    "indexed_revision",
    "revision",
    "revisions",
)

#: clocks an ingest may run under: the real one, one that stands still at a whole second (a
#: store written before indexed_at had microseconds; two runs in one second), one stepped back
CLOCKS: dict[str, Callable[[], str] | None] = {
    "real": None,
    "still": lambda: "2026-01-01T00:00:00+00:00",
    "back": lambda: "2020-01-01T00:00:00.000000+00:00",
}


def page(seed: str) -> str:
    return f"# Page {seed}\n\n" + section("One", paragraphs=1, words=30, seed=seed)


class World:
    """A git book (``handbook``: a repository's ``docs``) and a folder book (``notes``),
    indexed by one pipeline into one Edge store."""

    def __init__(self, root: Path, embedder: Any, rng: random.Random) -> None:
        from rag_pipeline.config import DEFAULT_PATH_PATTERNS
        from rag_pipeline.ingest.pipeline import IngestPipeline
        from rag_pipeline.recipes.choice import FixedRecipe
        from rag_pipeline.resources import StoreOpener
        from rag_pipeline.sources.base import ParseOptions
        from rag_pipeline.sources.declared import DeclaredSources
        from rag_pipeline.sources.folder import FolderSource

        self.rng = rng
        self.made = 0
        self.repo = GitRepo(root / "handbook")
        self.repo.commit("first", {"README.md": "# not the book\n", **self.pages(3)})
        self.first_commit = self.repo.head()
        self.notes = root / "books" / "notes"
        self.notes.mkdir(parents=True)
        for name, text in self.pages(2, prefix="").items():
            (self.notes / name).write_text(text)
        sources = write_sources(
            root / "sources.yaml",
            {"handbook": {"git": str(self.repo.path), "ref": "main", "path": "docs"}},
        )
        self.qdrant = root / "qdrant"
        recipes = FixedRecipe(make_recipe(embedder))

        def new_pipeline() -> IngestPipeline:
            """A pipeline with sources of its own (their in-process caches empty)."""
            return IngestPipeline(
                DeclaredSources(FolderSource(root / "books"), sources, cache_dir=root / "cache"),
                StoreOpener(store_config(self.qdrant)),
                recipes,
                parsing=ParseOptions(DEFAULT_PATH_PATTERNS, 1),
            )

        self.new_pipeline = new_pipeline
        self.pipeline = new_pipeline()  # ingests and plans as one long-lived process would

    def pages(self, count: int, prefix: str = "docs/") -> dict[str, str]:
        out = {}
        for _ in range(count):
            self.made += 1
            out[f"{prefix}page-{self.made}.md"] = page(f"p{self.made}")
        return out

    def open(self) -> EdgeStore:
        return EdgeStore(COLLECTION, self.qdrant, COLLECTION_SCHEMA)

    def plan(self, pipeline: Any = None) -> dict[str, dict[str, Any]]:
        """Each book's plan as ``rag-pipeline plan`` shows it (the compared fields), by
        ``pipeline`` (default: the long-lived one)."""
        with self.open() as store:
            plan = (pipeline or self.pipeline).plan(store, detail=True)
        if pipeline is not None:
            close_sources(pipeline)
        return {
            b: {k: v for k, v in p.as_dict(0.0).items() if k in COMPARED}
            for b, p in plan.books.items()
        }

    def forget_summaries(self) -> None:
        """Every book's summary removed, and every cache of this process cleared."""
        from rag_pipeline.sources.scan import clear_scan_cache
        from rag_pipeline.store.edge import catalog

        for summary in (self.qdrant / COLLECTION / "books").glob("*/summary.json"):
            summary.unlink()
        with catalog._checked_lock:
            catalog._checked.clear()
        clear_scan_cache()

    # -- the steps ----------------------------------------------------------------------------

    def git_pages(self) -> list[str]:
        return sorted(p for p in self.repo.files("docs"))

    def commit_edit(self) -> str:
        name = self.rng.choice(self.git_pages())
        self.made += 1
        self.repo.commit("edit", {name: page(f"e{self.made}")})
        return f"edit {name}"

    def commit_new(self) -> str:
        added = self.pages(1)
        self.repo.commit("add", added)
        return f"add {next(iter(added))}"

    def commit_rename(self) -> str:
        name = self.rng.choice(self.git_pages())
        self.made += 1
        self.repo.git("mv", name, f"docs/renamed-{self.made}.md")
        self.repo.commit("rename")
        return f"rename {name}"

    def commit_removal(self) -> str:
        pages = self.git_pages()
        if len(pages) < 2:
            return self.commit_new()
        name = self.rng.choice(pages)
        self.repo.git("rm", "--quiet", name)
        self.repo.commit("remove")
        return f"remove {name}"

    def commit_outside(self) -> str:
        self.made += 1
        self.repo.commit("outside the book", {"README.md": f"# readme {self.made}\n"})
        return "commit outside the book"

    def edit_folder(self) -> str:
        files = sorted(self.notes.glob("*.md"))
        choice = self.rng.choice(["edit", "add", "remove"] if len(files) > 1 else ["edit", "add"])
        if choice == "add":
            for name, text in self.pages(1, prefix="").items():
                (self.notes / name).write_text(text)
            return "folder: add"
        target = self.rng.choice(files)
        if choice == "remove":
            target.unlink()
        else:
            self.made += 1
            target.write_text(page(f"f{self.made}"))
        return f"folder: {choice} {target.name}"

    def ingest(self, monkeypatch: pytest.MonkeyPatch) -> str:
        """The books the plan runs, run (as ``ingest`` does) under a clock of :data:`CLOCKS`."""
        runs = [b for b, p in self.plan().items() if p["action"] == "run"]
        clock = self.rng.choice(list(CLOCKS))
        with monkeypatch.context() as patched:
            fake = CLOCKS[clock]
            if fake is not None:
                patched.setattr(schema, "_now", fake)
            if runs:
                self.pipeline.run(runs, run_id=f"run-{self.made}")
        return f"ingest {runs} ({clock} clock)"

    def older_summary(self) -> str:
        """The git book's summary as a version before records' revisions wrote it: the last
        run's commit, or here the first commit (a run that only deleted files said its own)."""
        with self.open() as store:
            data = store.summary("handbook")
            if data is None:
                return "older summary: none saved"
            data = {k: v for k, v in data.items() if k not in ("record_revisions",)}
            data.pop("revision_of_records", None)
            data["revision"] = self.first_commit
            store.save_summary("handbook", data)
        return "older summary"


def close_sources(pipeline: Any) -> None:
    """End the git processes the pipeline's sources started."""
    for source in pipeline.source.declared_books().values():
        close = getattr(source, "close", None)
        if close is not None:
            close()


STEPS = ("commit_edit", "commit_new", "commit_rename", "commit_removal", "commit_outside")


@NEEDS_GIT
@pytest.mark.integration  # git processes
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_plan_from_saved_summaries_is_the_plan_from_the_books(
    tmp_path, hash_embedder, monkeypatch, seed
):
    rng = random.Random(seed)
    world = World(tmp_path, hash_embedder, rng)
    try:
        check_steps(world, rng, monkeypatch)
    finally:
        close_sources(world.pipeline)


def check_steps(world: World, rng: random.Random, monkeypatch: pytest.MonkeyPatch) -> None:
    done = [world.ingest(monkeypatch)]
    for _ in range(7):
        made = getattr(world, rng.choice(STEPS))()
        done.append(made)
        if rng.random() < 0.5:
            done.append(world.edit_folder())
        if rng.random() < 0.8:
            done.append(world.ingest(monkeypatch))
        if rng.random() < 0.25:
            done.append(world.older_summary())
        from_summaries = world.plan()
        world.forget_summaries()
        from_books = world.plan(world.new_pipeline())
        assert not differences(from_summaries, from_books), (done, from_summaries, from_books)
    # the summaries the last slow plan saved are read back as they were made
    assert not differences(world.plan(), from_books), done


def differences(
    fast: dict[str, dict[str, Any]], slow: dict[str, dict[str, Any]]
) -> dict[str, dict[str, tuple[Any, Any]]]:
    """book -> field -> (fast answer, slow answer), where they differ."""
    assert fast.keys() == slow.keys()
    out = {}
    for book in fast:
        differ = {
            k: (fast[book][k], slow[book][k]) for k in COMPARED if fast[book][k] != slow[book][k]
        }
        if differ:
            out[book] = differ
    return out


def test_a_summary_outlives_the_first_read_after_a_write_that_deleted_points(
    tmp_path, hash_embedder
):
    """The first load of a shard after a write that deleted points rewrites its id tracker's
    versions file: that read must not make the summary stale (every later plan read the
    book, the path that had the tied revisions)."""
    from rag_pipeline.schema import documents_of
    from rag_pipeline.store.edge import catalog
    from rag_pipeline_tests.conftest import make_pipeline

    data = tmp_path / "books"
    (data / "b").mkdir(parents=True)
    for name in ("one", "two"):
        (data / "b" / f"{name}.md").write_text(page(name))
    qdrant = tmp_path / "qdrant"
    pipeline = make_pipeline(data, store_config(qdrant), make_recipe(hash_embedder))
    pipeline.run(["b"], run_id="first")
    (data / "b" / "one.md").write_text(page("edited"))  # its old chunks are deleted
    pipeline.run(["b"], run_id="second")
    with EdgeStore(COLLECTION, qdrant, COLLECTION_SCHEMA) as store:
        assert len(list(store.scroll(documents_of("b"), fields=[]))) == 2  # a load: a read
    with catalog._checked_lock:
        catalog._checked.clear()
    with EdgeStore(COLLECTION, qdrant, COLLECTION_SCHEMA) as store:
        assert store.summary("b") is not None

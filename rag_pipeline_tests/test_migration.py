"""A recipe change migrates each book beside its searched index and switches it atomically
(issue 21): searches running all the while never fail, never see a mix of recipes, never see
the new one before the book switched; afterwards every point has the new recipe and the old
index is gone (or kept with ``RAG_KEEP_OLD_RECIPE=1``)."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rag_pipeline.config import Settings, load_settings
from rag_pipeline.defs.runs import MIGRATION_TAG, books_of_run
from rag_pipeline.ingest.overview import describe_collection
from rag_pipeline.recipes.lazy import LazyRecipe
from rag_pipeline.retrieve.request import SearchRequest
from rag_pipeline.schema import COLLECTION_SCHEMA, SIGNATURE, book_filter, chunks_of
from rag_pipeline.store import open_store
from rag_pipeline_tests.helpers import InProcessCli, index_books
from rag_pipeline_tests.test_recipe_choice import FP32, INT8, FakeLocal

#: every test runs the pipeline through Dagster in-process (its compute-log tail is a process)
pytestmark = pytest.mark.slow
THIRD = "ros2-copy"
#: between two searches: a step waiting for a book's lock gets it (flock is not fair)
SEARCH_PAUSE_S = 0.05


@pytest.fixture
def three_books(sample_books: Path) -> Path:
    """The two sample books and a third (a copy of one under another id)."""
    shutil.copytree(sample_books / "ros2-fundamentals", sample_books / THIRD)
    return sample_books


def _settings(cli: InProcessCli, **overrides: Any) -> Settings:
    env = cli.env
    return load_settings(
        embedder=env["RAG_EMBEDDER"],
        qdrant_path=env["RAG_QDRANT_PATH"],
        data_dir=env["RAG_DATA_DIR"],
        **overrides,
    )


def _signatures(settings: Settings, book: str) -> dict[str, int]:
    with open_store(settings.store(), COLLECTION_SCHEMA) as store:
        counts: dict[str, int] = {}
        for record in store.scroll(book_filter(book), fields=[SIGNATURE]):
            sig = str(record.payload.get(SIGNATURE))
            counts[sig] = counts.get(sig, 0) + 1
        return counts


@dataclass
class Searches:
    """Searches of every book in a loop, each through its own store handle (as another
    process's would be), on the CLI's search path: the book's recipe, then the query."""

    settings: Settings
    books: list[str]
    #: book -> the signature of every answer, in order
    seen: dict[str, list[str]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        recipes = LazyRecipe(self.settings.embedding(), self.settings.chunking())
        while not self.stop.is_set():
            for book in self.books:
                try:
                    self._search(recipes, book)
                except Exception as exc:  # a busy wait is fine, a failure is not
                    self.failures.append(f"{book}: {exc!r}")
                self.stop.wait(SEARCH_PAUSE_S)

    def _search(self, recipes: LazyRecipe, book: str) -> None:
        with open_store(self.settings.store(), COLLECTION_SCHEMA) as store:
            recipe = recipes.for_book(store, book, purpose="search").recipe
            searched = store.searched_recipe(book)
            hits = SearchRequest("nodes topics publishers", book, limit=8, mode="hybrid").run(
                store, recipe.embedder, recipe.sparse
            )
            ids = [h.id for h in hits]  # type: ignore[union-attr]
            records = store.retrieve(chunks_of(book), ids, fields=[SIGNATURE])
        signatures = {str(r.payload[SIGNATURE]) for r in records}
        if not hits or len(signatures) != 1:
            self.failures.append(f"{book}: {len(hits)} hits of recipes {signatures}")
            return
        (signature,) = signatures
        if searched is not None and searched["signature"] != signature:
            self.failures.append(f"{book}: searched {searched['signature']}, hits {signature}")
        self.seen.setdefault(book, []).append(signature)

    def wait_until_seen(self, wanted: dict[str, str], timeout_s: float = 20.0) -> None:
        """Go on searching until each book's latest answer has its wanted signature."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(
            (self.seen.get(b) or [""])[-1] != sig for b, sig in wanted.items()
        ):
            time.sleep(0.05)

    def __enter__(self) -> Searches:
        self._thread = threading.Thread(target=self.run, name="searches", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self._thread.join(timeout=60)


def _assert_switched_once(seen: list[str], old: str, new: str) -> None:
    """Old answers, then new ones: never a new one followed by an old one."""
    assert set(seen) <= {old, new}, seen
    first_new = seen.index(new) if new in seen else len(seen)
    assert all(s == old for s in seen[:first_new]) and all(s == new for s in seen[first_new:])


def _generations(qdrant: str, book: str) -> list[str]:
    folder = Path(qdrant) / "rag_chunks" / "books" / book
    return sorted(p.name for p in folder.iterdir() if p.is_dir())


def _migration_tags(cli: InProcessCli) -> dict[str, str]:
    from dagster import DagsterInstance

    old = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = cli.env["DAGSTER_HOME"]
    try:
        with DagsterInstance.get() as instance:
            runs = instance.get_runs()
            order = instance.get_dynamic_partitions("books")
            return {
                book: r.tags[MIGRATION_TAG]
                for r in runs
                if MIGRATION_TAG in r.tags
                for book in books_of_run(r.tags, order)
            }
    finally:
        if old is None:
            os.environ.pop("DAGSTER_HOME")
        else:
            os.environ["DAGSTER_HOME"] = old


@pytest.mark.parametrize("keep_old", [False, True])
def test_a_chunk_budget_change_migrates_each_book_beside_while_searches_run(
    three_books: Path, tmp_path: Path, keep_old: bool
) -> None:
    cli = InProcessCli(tmp_path, three_books)
    cli("ingest")
    books = sorted(p.name for p in three_books.iterdir() if p.is_dir())
    assert len(books) == 3
    before = _settings(cli)
    old = {b: next(iter(_signatures(before, b))) for b in books}
    cli.env["RAG_CHUNK_TARGET_TOKENS"] = "150"
    if keep_old:
        cli.env["RAG_KEEP_OLD_RECIPE"] = "1"
    after = _settings(cli, chunk_target_tokens=150)
    with Searches(before, books) as searches:
        report = cli.json("ingest", "--json")
        searches.wait_until_seen({b: next(iter(_signatures(after, b))) for b in books})
    assert searches.failures == []
    assert all(b["status"] == "ingested" for b in report["books"].values()), report
    for book in books:
        new = _signatures(after, book)
        assert len(new) == 1 and next(iter(new)) != old[book]  # every point: the new recipe
        assert searches.seen.get(book), f"no search of {book} answered"
        _assert_switched_once(searches.seen[book], old[book], next(iter(new)))
        assert searches.seen[book][0] == old[book] and searches.seen[book][-1] != old[book]
        generations = _generations(cli.env["RAG_QDRANT_PATH"], book)
        assert len([g for g in generations if g.startswith("g")]) == 1
        assert len([g for g in generations if g.startswith("old-")]) == (1 if keep_old else 0)
    tags = _migration_tags(cli)
    assert sorted(tags) == books and all(v.startswith("recipe ") for v in tags.values())
    with open_store(after.store(), COLLECTION_SCHEMA) as store:
        # the switch left each book a catalog entry of its new generation: no shard to open
        assert all(store.summary(b) is not None for b in books)
        state = describe_collection(store, books)
    assert all(b.recipe == "hash-384" for b in state.books)


def test_a_held_back_build_keeps_searches_on_the_old_index_and_shows_pending(
    three_books: Path, tmp_path: Path
) -> None:
    """A file the old index serves that fails in the new build: the book stays on the old
    recipe (its build pending, said in the run), and the next good run switches it."""
    cli = InProcessCli(tmp_path, three_books)
    cli("ingest")
    before = _settings(cli)
    book = THIRD
    old = _signatures(before, book)
    victim = next((three_books / book).rglob("*.md"))
    original = victim.read_bytes()
    victim.write_bytes(b"# broken \x80\x81 not utf-8 \x80\n" * 10)
    cli.env["RAG_CHUNK_TARGET_TOKENS"] = "150"
    report = cli.json("ingest", "--json", "--book", book)
    result = report["books"][book]
    assert any("stays pending" in w for w in result["warnings"]), result
    assert _signatures(before, book) == old  # searches still answer from the old index
    with open_store(before.store(), COLLECTION_SCHEMA) as store:
        assert store.pending_recipe(book) is not None
        health = {b.book_id: b for b in describe_collection(store, [book]).books}
    assert health[book].recipe.startswith("hash-384 → recipe ") and "pending" in health[book].recipe
    victim.write_bytes(original)
    cli.json("ingest", "--json", "--book", book)
    new = _signatures(_settings(cli, chunk_target_tokens=150), book)
    assert len(new) == 1 and set(new) != set(old)


def test_a_precision_change_of_a_book_indexed_before_tags_is_built_beside(
    sample_books: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Books indexed at fp32 by an install before recipe tags (untagged generations): an
    explicit int8 is built beside each, the queries follow the switch to int8."""

    def create(config):  # type: ignore[no-untyped-def]
        return FakeLocal(config.local_precision)

    monkeypatch.setattr("rag_pipeline.embed.create_embedder", create)
    monkeypatch.setattr("rag_pipeline.embed.local.cpu_has_fast_int8", lambda: False)
    cli = InProcessCli(tmp_path, sample_books, embedder="local")
    qdrant = cli.env["RAG_QDRANT_PATH"]
    index_books(sample_books, qdrant, FakeLocal("fp32"))
    books = sorted(p.name for p in sample_books.iterdir() if p.is_dir())
    for book in books:  # as an install before recipe tags left them
        pointer = Path(qdrant) / "rag_chunks" / "books" / book / "current.json"
        pointer.write_text(json.dumps({**json.loads(pointer.read_text()), "recipe": None}))
    settings = _settings(cli, local_precision="fp32")
    with open_store(settings.store(), COLLECTION_SCHEMA) as store:
        assert all(store.current_recipe(b) is None for b in books)  # untagged
    cli.env["RAG_LOCAL_PRECISION"] = "int8"
    with Searches(settings, books) as searches:
        cli("ingest")
    assert searches.failures == []
    for book in books:  # one recipe, then the other: never back
        runs = [
            s
            for i, s in enumerate(searches.seen[book])
            if i == 0 or s != searches.seen[book][i - 1]
        ]
        assert len(runs) <= 2, runs
    with open_store(settings.store(), COLLECTION_SCHEMA) as store:
        for book in books:
            assert (store.current_recipe(book) or {})["embedding_model"] == INT8
            models = store.counts_by(chunks_of(book), "embedding_model")
            assert set(models) == {INT8}
            assert len(_generations(qdrant, book)) == 1
    tags = _migration_tags(cli)
    assert tags == dict.fromkeys(books, f"{FP32} -> {INT8}")
    hits = cli.json("search", "publishers and subscribers", "--book", books[0], "--mode", "dense")
    assert hits and all(h["embedding_model"] == INT8 for h in hits)


def test_a_migration_killed_mid_write_leaves_the_old_index_searched_and_resumes(
    sample_books: Path, tmp_path: Path
) -> None:
    """kill -9 between a book's chunk writes and its document records: the book is still
    searched on its old recipe; the next ingest resumes the pending build (the chunks it had
    written are reused, not embedded again) and switches."""
    import signal

    from rag_pipeline_tests.helpers import Cli

    cli = Cli(tmp_path, sample_books)
    cli("ingest")
    books = sorted(p.name for p in sample_books.iterdir() if p.is_dir())
    before = InProcessCli(tmp_path, sample_books)
    old = {b: _signatures(_settings(before), b) for b in books}
    cli.env["RAG_CHUNK_TARGET_TOKENS"] = "150"
    crashed = cli("ingest", "--json", point="commit", check=False, timeout=300)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    settings = _settings(before)
    with open_store(settings.store(), COLLECTION_SCHEMA) as store:
        killed = [b for b in books if store.pending_recipe(b) is not None]
    assert killed, "the kill left no pending build"
    assert {b: _signatures(settings, b) for b in books} == old  # searches: the old index
    recovered = json.loads(cli("ingest", "--json").stdout)
    assert all(recovered["books"][b]["reused"] > 0 for b in killed), recovered
    after = _settings(before, chunk_target_tokens=150)
    for book in books:
        new = _signatures(after, book)
        assert len(new) == 1 and set(new) != set(old[book])
        assert len(_generations(cli.env["RAG_QDRANT_PATH"], book)) == 1


def test_a_model_of_another_dimension_is_built_beside_while_searches_run(
    sample_books: Path, tmp_path: Path
) -> None:
    """hash-384 -> hash-256: a change of model *and* dimension. The searches run with the
    new settings from the start (a service restarted with them): books not switched yet are
    searched with the model they record, which this process still produces."""
    cli = InProcessCli(tmp_path, sample_books)
    cli("ingest")
    books = sorted(p.name for p in sample_books.iterdir() if p.is_dir())
    cli.env["RAG_HASH_DIMENSION"] = "256"
    after = _settings(cli, hash_dimension=256)
    with Searches(after, books) as searches:
        searches.wait_until_seen({b: next(iter(_signatures(after, b))) for b in books})
        report = cli.json("ingest", "--json")
        new = {b: next(iter(_signatures(after, b))) for b in books}
        searches.wait_until_seen(new)
    assert searches.failures == []
    assert all(b["status"] == "ingested" for b in report["books"].values()), report
    with open_store(after.store(), COLLECTION_SCHEMA) as store:
        for book in books:
            assert store.dimension_of(book) == 256
            assert (store.current_recipe(book) or {}).get("embedding_model") == "hash-256"
            points = list(store.scroll(chunks_of(book), with_vectors=True))
            assert points and {len(p.dense) for p in points if p.dense is not None} == {256}
            assert searches.seen[book][-1] == new[book] != searches.seen[book][0]
        assert {b.recipe for b in describe_collection(store, books).books} == {"hash-256"}
    assert set(_migration_tags(cli).values()) == {"hash-384 -> hash-256"}
    searched = cli.json("search", "nodes and topics", "--book", books[0], "--json")
    assert searched and all(h["book_id"] == books[0] for h in searched)

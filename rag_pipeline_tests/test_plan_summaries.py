"""A plan decides an unchanged book from its saved summary, without opening its Qdrant Edge
shard (issue 17), and never trusts a summary whose shard changed behind it: written through
another handle, damaged by other hands, or a summary half written."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path

import pytest
import qdrant_edge as qe

from rag_pipeline.ingest.catalog import book_summary
from rag_pipeline.schema import COLLECTION_SCHEMA, chunks_of
from rag_pipeline.store import BookDamagedError
from rag_pipeline.store.edge import EdgeStore
from rag_pipeline_tests.conftest import (
    make_pipeline,
    make_recipe,
    section,
    settle_files,
    store_config,
)

COLLECTION = "rag_chunks"


@pytest.fixture
def fingerprints(monkeypatch) -> Counter[str]:
    """Every fingerprint check of a shard, counted by its book."""
    from rag_pipeline.store.edge import catalog as edge

    checked: Counter[str] = Counter()
    original = edge._fingerprint

    def counting(generation: Path):  # type: ignore[no-untyped-def]
        checked[generation.parent.name] += 1
        return original(generation)

    monkeypatch.setattr(edge, "_fingerprint", counting)
    return checked


class Books:
    """``count`` books of three files indexed in-process (hash embedder) into one Edge store."""

    def __init__(self, root: Path, count: int, embedder, age_s: float = 0) -> None:  # type: ignore[no-untyped-def]
        """``age_s``: the files are dated that long before their run reads them."""
        self.data = root / f"books{count}"
        self.qdrant = root / f"qdrant{count}"
        self.ids = [f"book-{i:02d}" for i in range(count)]
        for i, book in enumerate(self.ids):
            (self.data / book).mkdir(parents=True)
            for f in range(3):
                text = f"# Book {i} file {f}\n\n" + section("One", seed=f"b{i}f{f}")
                (self.data / book / f"{f}.md").write_text(text)
        (self.data / self.ids[0] / "bad.md").write_bytes(b"---\ntitle: [unclosed\n---\nbody")
        if age_s:
            then = time.time() - age_s
            for path in self.data.rglob("*.md"):
                os.utime(path, (then, then))
            settle_files()  # their ctime is now: past the racy window, a stat is trusted
        self.recipe = make_recipe(embedder)
        self.pipeline = make_pipeline(self.data, store_config(self.qdrant), self.recipe)
        self.pipeline.run(self.ids, run_id="first")

    def open(self) -> EdgeStore:
        return EdgeStore(COLLECTION, self.qdrant, COLLECTION_SCHEMA)

    def plan(self, *, detail: bool = False):  # type: ignore[no-untyped-def]
        """The plan ``ingest`` makes (``detail``: the one ``rag-pipeline plan`` shows)."""
        with self.open() as store:
            return self.pipeline.plan(store, detail=detail)

    def folder(self, book: str) -> Path:
        return self.qdrant / COLLECTION / "books" / book

    def generation(self, book: str) -> Path:
        current = json.loads((self.folder(book) / "current.json").read_text())
        return self.folder(book) / current["generation"]


def test_a_plan_of_unchanged_books_opens_no_shard_whatever_the_collection(
    tmp_path, hash_embedder, loads
):
    for count in (3, 12):
        books = Books(tmp_path, count, hash_embedder)
        loads.clear()
        plan = books.plan()
        assert {b.action for b in plan.books.values()} == {"unchanged"}
        assert loads == Counter(), f"{count} books: shards opened {dict(loads)}"
        kept = plan.books["book-00"]
        assert kept.errors and "bad.md" in kept.errors[0]  # a recorded error still shown
        assert all(b.points == b.chunks > 0 for b in plan.books.values())
        shown = books.plan(detail=True)  # `rag-pipeline plan`: no preview of unchanged books
        assert {b.action for b in shown.books.values()} == {"unchanged"} and loads == Counter()


def test_the_plan_from_summaries_is_the_plan_from_the_shards(tmp_path, hash_embedder, loads):
    books = Books(tmp_path, 3, hash_embedder)
    loads.clear()  # a new shard is made, then loaded: the plan's loads only
    (books.data / "book-01" / "0.md").write_text("# Edited\n\n" + section("New", seed="e"))
    (books.data / "book-02" / "2.md").unlink()
    from_summaries = books.plan()
    assert loads == Counter()
    for book in books.ids:
        (books.folder(book) / "summary.json").unlink()
    from_shards = books.plan()
    assert loads == Counter({book: 1 for book in books.ids})
    for book in books.ids:
        a, b = from_summaries.books[book], from_shards.books[book]
        assert (a.action, a.reasons, a.changes, a.errors, a.points, a.chunks) == (
            b.action,
            b.reasons,
            b.changes,
            b.errors,
            b.points,
            b.chunks,
        )
        assert a.recorded_model == b.recorded_model == books.recipe.embedding_model
    assert from_summaries.books["book-01"].action == from_summaries.books["book-02"].action == "run"
    for book in books.ids:  # summaries again (a write through the store, nothing changed)
        with books.open() as store:
            store.save_summary(book, book_summary(store, book))
    loads.clear()
    shown = books.plan(detail=True)
    assert loads == Counter({"book-01": 1, "book-02": 1})  # only the books that run: previews
    assert shown.books["book-01"].preview is not None and shown.books["book-00"].preview is None


def test_a_book_read_for_want_of_a_summary_is_summarized_once(tmp_path, hash_embedder, loads):
    """A book without a summary (a store migrated from the single-shard layout, a summary
    found stale) is read once by a plan or a collection look, which leaves it one."""
    from rag_pipeline.ingest.overview import describe_collection

    books = Books(tmp_path, 3, hash_embedder)
    loads.clear()  # a new shard is made, then loaded: the plan's loads only
    for book in books.ids:
        (books.folder(book) / "summary.json").unlink()
    first = books.plan()
    assert loads == Counter({book: 1 for book in books.ids})
    loads.clear()
    assert books.plan().books.keys() == first.books.keys() and loads == Counter()
    (books.folder("book-01") / "summary.json").unlink()
    with books.open() as store:
        describe_collection(store, books.ids)
    assert loads == Counter({"book-01": 1})
    loads.clear()
    with books.open() as store:
        describe_collection(store, books.ids)
    assert books.plan() and loads == Counter()


def test_a_shard_written_behind_its_summary_is_read(tmp_path, hash_embedder, loads):
    books = Books(tmp_path, 2, hash_embedder)
    with books.open() as store:
        lost = next(iter(store.scroll(chunks_of("book-01")))).id
    raw = qe.EdgeShard.load(str(books.generation("book-01")))  # other hands: no store, no lock
    try:
        raw.update(qe.UpdateOperation.delete_points([lost]))
        raw.flush()
    finally:
        raw.close()
    loads.clear()
    plan = books.plan()
    assert loads == Counter({"book-01": 1})
    book = plan.books["book-01"]
    # its summary promised one point more than the shard holds: damage, rebuilt by its run
    assert book.action == "run" and any("summary promises" in r for r in book.reasons)
    assert plan.books["book-00"].action == "unchanged"
    with books.open() as store, pytest.raises(BookDamagedError, match="summary promises"):
        store.count(chunks_of("book-01"))  # a reader is told, never served the rest


@pytest.mark.parametrize("damage", ["vectors overwritten", "segments emptied", "config lost"])
def test_a_shard_damaged_behind_its_summary_is_read(tmp_path, hash_embedder, loads, damage):
    from rag_pipeline.store import StoreDamagedError

    books = Books(tmp_path, 2, hash_embedder)
    shard = books.generation("book-01")
    if damage == "vectors overwritten":  # same size, other bytes
        for path in (shard / "segments").rglob("vector_storage-dense/vectors/chunk_*.mmap"):
            # not random bytes (test_damage's, in a process): huge floats warn in-process
            path.write_bytes(b"\x01" * path.stat().st_size)
    elif damage == "segments emptied":
        for path in (shard / "segments").rglob("*"):
            if path.is_file():
                path.write_bytes(b"")
    else:
        (shard / "edge_config.json").unlink()
    with books.open() as store:
        assert store.summary("book-01") is None and store.summary("book-00") is not None
    loads.clear()
    book = books.plan().books["book-01"]
    assert book.action == "run" and "damaged" in book.reasons[0]
    assert loads["book-00"] == 0  # (a shard without its config is not even loaded)
    assert loads["book-01"] >= (0 if damage == "config lost" else 1)
    if damage != "vectors overwritten":  # a reader is told which book, never served nothing
        with books.open() as store, pytest.raises(StoreDamagedError, match="book-01"):
            store.count(chunks_of("book-01"))


def test_a_summary_is_written_after_the_shard_is_closed_and_survives_reads(tmp_path, hash_embedder):
    """Saved in memory, written with its fingerprint once the shard is flushed and closed;
    searches, counts and scrolls by other handles (which rewrite some shard files) leave it
    valid: the fingerprint rule holds for this qdrant-edge."""
    books = Books(tmp_path, 1, hash_embedder)
    summary = books.folder("book-00") / "summary.json"
    summary.unlink()
    store = books.open()
    try:
        store.count(chunks_of("book-00"))  # loaded
        store.save_summary("book-00", book_summary(store, "book-00"))
        assert not summary.exists() and store.summary("book-00") is not None
    finally:
        store.close()
    assert summary.is_file()
    for _ in range(2):
        with books.open() as reader:
            vector = next(iter(reader.scroll(chunks_of("book-00"), with_vectors=True))).dense
            assert reader.query_dense(chunks_of("book-00"), vector, limit=3)
            assert reader.count(chunks_of("book-00")) > 0
            assert len(reader.counts_by(chunks_of("book-00"), "source_file")) == 3
    with books.open() as store:
        assert store.summary("book-00") is not None


def test_a_summary_killed_before_it_is_complete_is_never_read(
    tmp_path, hash_embedder, monkeypatch, loads
):
    from rag_pipeline.store.edge import catalog as edge

    books = Books(tmp_path, 1, hash_embedder)
    folder = books.folder("book-00")
    (folder / "summary.json").unlink()

    class Killed(BaseException):
        """The process killed between the summary's tmp file and its rename."""

    def killed(src, dst):  # type: ignore[no-untyped-def]
        raise Killed

    with monkeypatch.context() as patched, pytest.raises(Killed), books.open() as store:
        patched.setattr(edge.os, "replace", killed)
        store.count(chunks_of("book-00"))
        store.save_summary("book-00", {"records": {}, "signatures": [], "chunk_points": 0})
    assert not (folder / "summary.json").exists() and list(folder.glob(".summary.json.*.tmp"))
    (folder / "summary.json").write_text('{"store": {"generation": ')  # torn by other hands
    loads.clear()
    with books.open() as store:
        assert store.summary("book-00") is None
    assert books.plan().books["book-00"].action == "unchanged"
    assert loads == Counter({"book-00": 1})  # read from the shard


def test_a_builder_of_another_recipe_reads_no_summary_of_the_current_generation(
    tmp_path, hash_embedder
):
    from rag_pipeline.store import CollectionSpec

    books = Books(tmp_path, 1, hash_embedder)
    with books.open() as store:
        assert store.summary("book-00") is not None
        other = CollectionSpec(COLLECTION, hash_embedder.dimension * 2, recipe={"signature": "x"})
        store.ensure_collection(other)  # another dimension: the book is built beside
        assert store.summary("book-00") is None  # it reads and writes a pending generation
    with books.open() as reader:
        assert reader.summary("book-00") is not None  # readers still read the current one


def test_the_recorded_recipe_comes_from_the_summary(tmp_path, hash_embedder, loads):
    from rag_pipeline.recipes.choice import recorded_recipe

    books = Books(tmp_path, 1, hash_embedder)
    loads.clear()
    with books.open() as store:
        from_summary = recorded_recipe(store, "book-00")
    assert loads == Counter()
    (books.folder("book-00") / "summary.json").unlink()
    with books.open() as store:
        assert recorded_recipe(store, "book-00") == from_summary is not None
    assert from_summary.embedding_model == books.recipe.embedding_model


def test_a_plan_checks_each_books_fingerprint_once(tmp_path, hash_embedder, fingerprints):
    books = Books(tmp_path, 3, hash_embedder)
    checked = fingerprints
    checked.clear()  # (the books' first runs saved their summaries)
    assert {b.action for b in books.plan().books.values()} == {"unchanged"}
    assert checked == Counter({book: 1 for book in books.ids})  # the recipe, then the index


def test_a_plan_reads_no_file_its_last_run_read_unless_its_stat_moved(
    tmp_path, hash_embedder, monkeypatch
):
    """A book's summary keeps the size and modification time of each file as its run read it:
    a plan (every ingest makes one of every book) reads only the files whose stat moved, as
    the books sensor does, so a no-change ingest of many books reads none."""
    from rag_pipeline.sources import folder

    books = Books(tmp_path, 2, hash_embedder, age_s=10)
    read: list[str] = []
    real = folder.hash_file
    monkeypatch.setattr(
        folder, "hash_file", lambda path, *rest: read.append(Path(path).name) or real(path, *rest)
    )
    assert {b.action for b in books.plan().books.values()} == {"unchanged"} and read == []
    edited = books.data / "book-01" / "0.md"
    edited.write_text("# Edited\n\n" + section("New", seed="e"))
    touched = books.data / "book-00" / "1.md"
    os.utime(touched, None)  # same bytes, a new time: read, and found unchanged
    plan = books.plan()
    assert sorted(read) == ["0.md", "1.md"]
    assert plan.books["book-01"].action == "run" and plan.books["book-00"].action == "unchanged"


def test_a_book_summarized_by_a_plan_keeps_the_stats_of_the_files_it_read(
    tmp_path, hash_embedder, monkeypatch, loads
):
    """A summary gone or stale (lost, written by an older version, a shard written behind it)
    is rebuilt by the next plan from the shard: with the stats of the files that plan read,
    so the plan after it neither opens the shard nor reads a file again."""
    from rag_pipeline.sources import folder

    books = Books(tmp_path, 2, hash_embedder, age_s=10)
    (books.folder("book-01") / "summary.json").unlink()
    read: list[str] = []
    real = folder.hash_file
    monkeypatch.setattr(
        folder, "hash_file", lambda path, *rest: read.append(Path(path).name) or real(path, *rest)
    )
    loads.clear()
    books.plan()
    assert loads == Counter({"book-01": 1}) and sorted(read) == ["0.md", "1.md", "2.md"]
    read.clear()
    loads.clear()
    assert {b.action for b in books.plan().books.values()} == {"unchanged"}
    assert read == [] and loads == Counter()


def test_files_read_in_the_tick_they_were_written_are_read_again_by_the_next_plan(
    tmp_path, hash_embedder, monkeypatch
):
    """A file modified just before its run read it may change again within the same tick of a
    coarse clock, keeping its size and time: its stat is not trusted."""
    from rag_pipeline.sources import folder

    books = Books(tmp_path, 1, hash_embedder)  # written, then read at once
    read: list[str] = []
    real = folder.hash_file
    monkeypatch.setattr(
        folder, "hash_file", lambda path, *rest: read.append(Path(path).name) or real(path, *rest)
    )
    books.plan()
    assert len(read) == 4  # 3 files and bad.md


def test_a_process_checks_a_summary_once_a_minute_and_a_write_ends_the_trust(
    tmp_path, hash_embedder, monkeypatch, fingerprints
):
    """A CLI ingest looks at every summary up to four times (recipe, files, index, then the
    collection page after its runs): the fingerprint is checked once per process, and taken
    on trust for a minute while the summary file and the generation are the same; a write
    through the pipeline replaces the summary, which ends the trust at once. Damage by other
    hands is seen once the minute is over."""
    from rag_pipeline.store.edge import catalog as edge

    books = Books(tmp_path, 2, hash_embedder)
    checked = fingerprints
    checked.clear()  # (the books' first runs saved their summaries)
    books.plan()
    books.plan()
    with books.open() as store:
        assert store.summary("book-00") is not None
    assert checked == Counter({"book-00": 1, "book-01": 1})
    (books.data / "book-01" / "0.md").write_text("# Edited\n\n" + section("New", seed="e"))
    books.pipeline.run(["book-01"], run_id="edit")
    books.plan()
    assert checked["book-01"] == 3  # the new summary: fingerprinted to save it, then checked
    for path in (books.generation("book-00") / "segments").rglob("*"):
        if path.is_file():
            path.write_bytes(b"")  # other hands, behind a summary checked a moment ago
    with books.open() as store:
        assert store.summary("book-00") is not None  # trusted, within the minute
    later = time.monotonic() + edge._RECHECK_AFTER_S + 1
    monkeypatch.setattr(edge.time, "monotonic", lambda: later)
    with books.open() as store:
        assert store.summary("book-00") is None


@pytest.mark.parametrize(
    "name", ["plain.md", 'a, "store": {"book": "x"}.md', 'q\\", "store": .md', "ünï.md"]
)
def test_a_summary_is_read_back_whatever_its_file_names_and_refused_once_edited(tmp_path, name):
    """The summary's checksum is over its data as the file holds them: any file name reads
    back, and any edit of the data or the stamp makes the summary unread."""
    from rag_pipeline.store.edge import catalog as edge

    folder = tmp_path / "book-00"
    (folder / "g1").mkdir(parents=True)
    (folder / "g1" / "edge_config.json").write_text("{}")
    data = {"records": {name: ["ab" * 32, 1, 0]}, "stats": {name: [1, 2, 3, 4, 5, 6]}}
    edge._write_summary(folder, "g1", data, points=2)
    sound = edge._sound_summary(folder, "g1")
    assert sound is not None and sound[1] == data and sound[0]["points"] == 2
    text = (folder / "summary.json").read_text()
    for edited in (text.replace('"ab', '"cd', 1), text.replace('"points": 2', '"points": 3')):
        assert edited != text  # each edit really changes the file
        (folder / "summary.json").write_text(edited)
        assert edge._sound_summary(folder, "g1") is None
    (folder / "summary.json").write_text(json.dumps(json.loads(text), indent=1))  # reformatted
    assert edge._sound_summary(folder, "g1") is None


def edit_ingest_reads(root: Path, count: int, monkeypatch) -> dict[str, Counter[str]]:  # type: ignore[no-untyped-def]
    """What `rag-pipeline ingest` (in-process) reads of each book to ingest a one-file edit of
    book-00 among ``count`` books, in a process that has checked no summary yet: pointer
    files read, fingerprints checked and book folders resolved, counted by book."""
    from rag_pipeline.store.edge import catalog, files
    from rag_pipeline_tests.helpers import InProcessCli

    data = root / f"cli{count}" / "books"
    for i in range(count):
        (data / f"book-{i:02d}").mkdir(parents=True)
        for f in range(2):
            text = f"# Book {i} file {f}\n\n" + section("One", seed=f"c{i}f{f}")
            (data / f"book-{i:02d}" / f"{f}.md").write_text(text)
    cli = InProcessCli(data.parent, data)
    cli("ingest")
    edited = data / "book-00" / "1.md"
    edited.write_text(edited.read_text() + "\n" + section("Edit", seed="edit"))
    counts: dict[str, Counter[str]] = {"pointers": Counter(), "fingerprints": Counter()}
    counts["resolved"] = Counter()
    read_json, fingerprint, realpath = files._read_json, catalog._fingerprint, os.path.realpath

    def reading(path: Path):  # type: ignore[no-untyped-def]
        if path.name in ("current.json", "pending.json"):
            counts["pointers"][path.parent.name] += 1
        return read_json(path)

    def fingerprinting(generation: Path):  # type: ignore[no-untyped-def]
        counts["fingerprints"][generation.parent.name] += 1
        return fingerprint(generation)

    def resolving(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if Path(path).parent == data:
            counts["resolved"][Path(path).name] += 1
        return realpath(path, *args, **kwargs)

    monkeypatch.setattr(files, "_read_json", reading)
    monkeypatch.setattr(catalog, "_fingerprint", fingerprinting)
    monkeypatch.setattr(os.path, "realpath", resolving)
    catalog._checked.clear()  # as a new process: no summary checked yet
    try:
        report = cli.json("ingest")
    finally:
        monkeypatch.undo()
    assert [b for b, r in report["books"].items() if r["status"] != "unchanged"] == ["book-00"]
    return counts


@pytest.mark.integration  # Dagster's compute logs start a process
def test_a_one_file_edits_ingest_reads_each_other_book_once_whatever_the_collection(
    tmp_path, monkeypatch
):
    """Issue 40: the plan of a book that did not change and the collection page refreshed
    after the edit's run read its pointer once, check its summary's fingerprint once and
    resolve its folder once (the plan's scan of its files), at 2 books as at 6: its cost is
    a constant per book, the least a process that knows nothing yet can do."""
    small = edit_ingest_reads(tmp_path, 2, monkeypatch)
    large = edit_ingest_reads(tmp_path, 6, monkeypatch)
    for counts, count in ((small, 2), (large, 6)):
        others = [f"book-{i:02d}" for i in range(1, count)]
        for what in ("pointers", "fingerprints", "resolved"):
            assert {b: counts[what][b] for b in others} == dict.fromkeys(others, 1), what


def test_the_recipes_a_checked_summary_lends_are_the_pointers_on_disk(tmp_path, hash_embedder):
    """The collection page takes each book's current pointer from the summary check the plan
    just made (issue 40): the same answer as reading the pointers, also right after a book's
    current.json is replaced (a recipe switch by another process)."""
    from rag_pipeline.store.edge.files import _read_pointer

    def on_disk(book: str):  # type: ignore[no-untyped-def]
        """(current recipe, pending recipe) read from the pointers (no build is pending)."""
        current = _read_pointer(books.folder(book) / "current.json")
        assert current is not None and not (books.folder(book) / "pending.json").exists()
        return dict(current[1]["recipe"]), None

    books = Books(tmp_path, 3, hash_embedder)
    books.plan()  # the summary checks the page's recipes reuse
    with books.open() as store:
        assert all(store.recipes(b) == on_disk(b) for b in books.ids)
        pointer = books.folder("book-01") / "current.json"
        data = json.loads(pointer.read_text())
        data["recipe"] = {**data["recipe"], "model": "switched-elsewhere"}
        part = pointer.with_name("current.json.part")
        part.write_text(json.dumps(data))
        os.replace(part, pointer)
        assert store.recipes("book-01") == on_disk("book-01")
        assert store.recipes("book-01")[0]["model"] == "switched-elsewhere"

"""The Qdrant Edge store as one shard per book (issue 17): its layout, lazy per-book locks,
whole-collection looks that open no shard, purge and set aside; summaries; the migration of the
single-shard layout; generations built beside and switched atomically (issue 21)."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import qdrant_edge as qe

from rag_pipeline.schema import COLLECTION_SCHEMA
from rag_pipeline.schema import book_filter as tenant_filter
from rag_pipeline.store import CollectionSpec, StoreBusyError, StoreDamagedError
from rag_pipeline.store.edge import EdgeStore
from rag_pipeline_tests.test_store import DIM, fill, vec

COLLECTION = "c"


def open_edge(root: Path, busy_wait_s: float = 0.0) -> EdgeStore:
    return EdgeStore(COLLECTION, root, COLLECTION_SCHEMA, busy_wait_s=busy_wait_s)


def book_folder(root: Path, book: str) -> Path:
    return root / COLLECTION / "books" / book


def generation(root: Path, book: str) -> str:
    return str(json.loads((book_folder(root, book) / "current.json").read_text())["generation"])


@pytest.fixture
def filled(tmp_path: Path) -> Path:
    with open_edge(tmp_path) as store:
        fill(store, books=("a", "b", "c"))
    return tmp_path


def test_each_book_is_its_own_shard_folder(filled):
    root = filled / COLLECTION
    assert json.loads((root / "layout.json").read_text())["layout"] == "book-shards"
    for book in "abc":
        assert (book_folder(filled, book) / generation(filled, book) / "edge_config.json").is_file()
    assert not (root / "edge_config.json").exists()


def test_whole_collection_looks_open_no_shard(filled, loads):
    with open_edge(filled) as store:
        assert store.tenants() == ["a", "b", "c"]
        assert store.collection_exists() and store.dense_dimension() == DIM
        assert "Keyword" in store.payload_indexes()["book_id"]
        assert not store.folder_lock.held  # no book touched, no book locked
        assert store.count(tenant_filter("b")) == 10
    assert loads == Counter({"b": 1})


def test_a_handle_locks_only_the_books_it_touches(filled):
    reader = open_edge(filled)
    try:
        assert reader.count(tenant_filter("a")) == 10
        with open_edge(filled) as writer:  # another book: no wait
            writer.delete_where(tenant_filter("b"))
            assert writer.count(tenant_filter("b")) == 0
        with open_edge(filled) as other, pytest.raises(StoreBusyError, match="book 'a'"):
            other.count(tenant_filter("a"))
    finally:
        reader.close()
    with open_edge(filled) as store:
        assert store.count(tenant_filter("a")) == 10


def test_the_lock_group_sees_a_waiter_on_any_book_it_holds(filled):
    holder = open_edge(filled)
    holder.count(tenant_filter("a"))
    holder.count(tenant_filter("c"))
    group = holder.folder_lock
    assert not group.others_waiting()
    waiter = open_edge(filled, busy_wait_s=30)
    thread = threading.Thread(target=lambda: waiter.count(tenant_filter("c")))
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not group.others_waiting():
            assert time.monotonic() < deadline, "the waiter on book c was not seen"
            time.sleep(0.02)
        probe = group.probe()
        holder.close()
        thread.join(timeout=10)
        assert not probe.others_waiting()  # it got the lock: no one waits any more
    finally:
        waiter.close()
        holder.close()


def held_books(store: EdgeStore) -> list[str]:
    return [lock.path.name.removesuffix(".lock") for lock in store.folder_lock.members()]


def test_a_reader_holds_at_most_its_loaded_books_and_a_writer_keeps_what_it_wrote(tmp_path):
    """The bound of the lock discipline: descriptors do not grow with the collection."""
    books = tuple(f"b{i}" for i in range(6))
    with open_edge(tmp_path) as store:
        fill(store, books=books, per_book=2)
    with EdgeStore(COLLECTION, tmp_path, COLLECTION_SCHEMA, loaded_books=2) as reader:
        for book in books:
            assert reader.count(tenant_filter(book)) == 2
            assert len(held_books(reader)) <= 2
        assert held_books(reader) == ["b4", "b5"]  # the least recently used were let go
        with open_edge(tmp_path) as other:  # a book let go is free for another process
            assert other.count(tenant_filter("b0")) == 2
    with EdgeStore(COLLECTION, tmp_path, COLLECTION_SCHEMA, loaded_books=2) as writer:
        writer.delete_where(tenant_filter("b0"))  # written: kept until close
        for book in books[1:]:
            writer.count(tenant_filter(book))
        assert held_books(writer) == ["b0", "b4", "b5"]
        with open_edge(tmp_path) as other, pytest.raises(StoreBusyError, match="book 'b0'"):
            other.count(tenant_filter("b0"))


def test_two_readers_that_want_each_others_books_both_finish(filled):
    """Try, back off, wait: a handle lets go of what it only read before it waits, so two
    readers taking books in opposite orders never wait for each other (the old lock-up, a plan
    against the query service, ended only by RAG_BUSY_WAIT_S with one side failing)."""
    first, second = open_edge(filled, busy_wait_s=5), open_edge(filled, busy_wait_s=5)
    first.count(tenant_filter("a"))
    second.count(tenant_filter("c"))
    errors: list[BaseException] = []

    def read(store: EdgeStore, book: str) -> None:
        try:
            for _ in range(20):  # each holds one book and wants the other's, many times
                store.count(tenant_filter(book))
                store.count(tenant_filter("b"))
        except BaseException as exc:
            errors.append(exc)
        finally:
            store.close()  # a command ends: what it held is free

    threads = [
        threading.Thread(target=read, args=(first, "c")),
        threading.Thread(target=read, args=(second, "a")),
    ]
    started = time.monotonic()
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not errors, errors
        assert time.monotonic() - started < 5  # no side waited out its busy wait
        assert first.folder_lock.let_go + second.folder_lock.let_go > 0
    finally:
        first.close()
        second.close()


def test_a_purge_removes_the_books_folder_only(filled):
    with open_edge(filled) as store:
        assert store.purge(tenant_filter("b")) == 10
        assert store.tenants() == ["a", "c"]
        assert store.count(tenant_filter("b")) == 0
    assert not book_folder(filled, "b").exists()
    assert not list((filled / COLLECTION / "books").glob(".trash-*"))
    with open_edge(filled) as store:
        assert store.tenants() == ["a", "c"] and store.count(tenant_filter("a")) == 10
        store.upsert([])  # nothing written: no folder comes back
    assert not book_folder(filled, "b").exists()


def test_a_book_emptied_by_deletes_is_no_tenant(filled):
    with open_edge(filled) as store:
        store.delete_where(tenant_filter("c"))
        assert store.tenants() == ["a", "b"]
    with open_edge(filled) as store:
        assert store.tenants() == ["a", "b"]


def test_set_aside_renames_the_layout_and_waits_for_book_locks(filled):
    from rag_pipeline.config import load_settings
    from rag_pipeline.store import set_aside

    config = load_settings(qdrant_path=str(filled), collection=COLLECTION, busy_wait_s=0).store()
    busy = open_edge(filled)
    busy.count(tenant_filter("a"))
    with pytest.raises(StoreBusyError, match="book 'a'"):
        set_aside(config)
    busy.close()
    assert "moved" in set_aside(config)
    assert not (filled / COLLECTION).exists()
    assert list(filled.glob(f"{COLLECTION}.set-aside-*"))
    with open_edge(filled) as store:
        assert not store.collection_exists() and store.tenants() == []


def test_a_generation_named_but_missing_is_damage_not_an_empty_book(filled):
    import shutil

    shutil.rmtree(book_folder(filled, "a") / generation(filled, "a"))
    with open_edge(filled) as store, pytest.raises(StoreDamagedError, match="ingest --rebuild"):
        store.count(tenant_filter("a"))


def test_a_point_without_a_book_is_refused(tmp_path):
    from rag_pipeline.store import PointRecord

    with open_edge(tmp_path) as store:
        store.ensure_collection(CollectionSpec(COLLECTION, DIM))
        with pytest.raises(ValueError, match="every point belongs to a book"):
            store.upsert([PointRecord("00000000-0000-0000-0000-000000000001", {}, vec(1))])


# -- summaries --------------------------------------------------------------------------------


@pytest.fixture
def indexed(tmp_path: Path) -> Path:
    """The sample books indexed by the pipeline (hash embedder) into ``tmp_path/qdrant``."""
    from rag_pipeline_tests.helpers import index_sample_books

    index_sample_books(tmp_path)
    return tmp_path / "qdrant"


def describe(qdrant: Path, books: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    from rag_pipeline.ingest.overview import describe_collection

    with EdgeStore("rag_chunks", qdrant, COLLECTION_SCHEMA) as store:
        return describe_collection(store, books)


def test_the_collection_look_reads_summaries_and_opens_no_shard(indexed, loads):
    books = sorted(p.name for p in (indexed / "rag_chunks" / "books").iterdir())
    assert len(books) == 2
    for book in books:
        assert (indexed / "rag_chunks" / "books" / book / "summary.json").is_file()
    from_summaries = describe(indexed, tuple(books))
    assert loads == Counter()
    for book in books:
        (indexed / "rag_chunks" / "books" / book / "summary.json").unlink()
    from_shards = describe(indexed, tuple(books))
    assert loads == Counter({book: 1 for book in books})
    # the same, but the run that last wrote the book: the run's summary names it, a read not
    assert {b.last_run for b in from_summaries.books} == {"direct"}
    unnamed = tuple(dataclasses.replace(b, last_run=None) for b in from_summaries.books)
    assert dataclasses.replace(from_summaries, books=unnamed) == from_shards
    assert all(b.points == b.chunks > 0 and b.state == "ok" for b in from_summaries.books)


def test_a_write_drops_the_books_summary_before_it_writes(indexed, loads):
    from rag_pipeline.schema import documents_of

    book = sorted(p.name for p in (indexed / "rag_chunks" / "books").iterdir())[0]
    summary = indexed / "rag_chunks" / "books" / book / "summary.json"
    before = next(b.files for b in describe(indexed).books if b.book_id == book)
    store = EdgeStore("rag_chunks", indexed, COLLECTION_SCHEMA)
    try:
        assert book in store.summaries()
        first = next(iter(store.scroll(documents_of(book))))
        store.delete_ids(tenant_filter(book), [first.id])
        assert not summary.exists()  # gone before the write: a kill leaves no stale summary
        assert book not in store.summaries()
    finally:
        store.close()
    loads.clear()
    state = describe(indexed)
    assert loads == Counter({book: 1})  # only the book without a summary is read
    assert next(b.files for b in state.books if b.book_id == book) == before - 1


def test_a_purge_takes_the_summary_with_the_folder(indexed):
    book = sorted(p.name for p in (indexed / "rag_chunks" / "books").iterdir())[0]
    with EdgeStore("rag_chunks", indexed, COLLECTION_SCHEMA) as store:
        assert store.purge(tenant_filter(book)) > 0
        assert book not in store.summaries()
    assert not (indexed / "rag_chunks" / "books" / book).exists()


def test_capabilities_are_what_a_backend_declares():
    """Qdrant Edge declares a catalog and generations; qdrant-client (and a server) declare
    neither: callers ask, and find none, instead of calling hooks that do nothing."""
    from rag_pipeline.store.capabilities import (
        catalog_of,
        generations_of,
        saved_summary,
        searched_recipe,
    )
    from rag_pipeline.store.qdrant import QdrantStore

    store = QdrantStore("m", COLLECTION_SCHEMA, path=":memory:")
    try:
        fill(store)
        assert catalog_of(store) is None and generations_of(store) is None
        assert saved_summary(store, "a") is None and searched_recipe(store, "a") is None
        assert not hasattr(store, "switch") and not hasattr(store, "save_summary")
    finally:
        store.close()


# -- the single-shard layout of earlier versions ----------------------------------------------


def write_single_shard(folder: Path, points) -> None:  # type: ignore[no-untyped-def]
    """A collection folder as the single-shard EdgeStore wrote it: one Edge shard in
    ``<path>/<collection>`` holding every book, with the same vectors and payload indexes."""
    from rag_pipeline.schema import PAYLOAD_INDEXES
    from rag_pipeline.store.edge import EDGE
    from rag_pipeline.store.native import native_point

    folder.mkdir(parents=True)
    config = qe.EdgeConfig(
        vectors={"dense": qe.EdgeVectorParams(size=DIM, distance=qe.Distance.Cosine)},
        sparse_vectors={"sparse": qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)},
    )
    shard = qe.EdgeShard.create(str(folder), config)
    try:
        indexes = {"book_id": qe.KeywordIndexParams(is_tenant=True)}
        for name, kind in PAYLOAD_INDEXES.items():
            indexes[name] = (
                qe.IntegerIndexParams(lookup=True, range=True)
                if kind == "integer"
                else qe.KeywordIndexParams()
            )
        for name, params in indexes.items():
            shard.update(qe.UpdateOperation.create_field_index(name, params))
        shard.update(qe.UpdateOperation.upsert_points([native_point(EDGE, p) for p in points]))
        shard.flush()
    finally:
        shard.close()


def answers(store, books=("a", "b", "c")):  # type: ignore[no-untyped-def]
    """Dense, sparse and hybrid answers in every book, whole (every point of a book comes
    back), ids and scores; equal scores ordered by id (the engine returns ties in any order)."""
    from rag_pipeline.sparse import Bm25Encoder

    query = Bm25Encoder().encode_query("shared words number 3")
    out = {}
    for book in books:
        where = tenant_filter(book)
        for mode, hits in (
            ("dense", store.query_dense(where, vec(3), limit=20)),
            ("sparse", store.query_sparse(where, query, limit=20)),
            ("hybrid", store.query_hybrid(where, vec(3), query, limit=20, prefetch_limit=20)),
        ):
            found = [(round(h.score, 5), h.id, h.payload) for h in hits]
            out[book, mode] = sorted(found, key=lambda f: (-f[0], f[1]))
        out[book, "count"] = store.count(where)
    return out


def test_a_single_shard_folder_is_migrated_to_book_shards_and_answers_the_same(tmp_path, caplog):
    with open_edge(tmp_path / "fresh") as fresh:
        points = fill(fresh, books=("a", "b", "c"))
        expected = answers(fresh)
    write_single_shard(tmp_path / "old" / COLLECTION, points)
    with caplog.at_level("WARNING"), open_edge(tmp_path / "old") as store:
        assert store.tenants() == ["a", "b", "c"] and store.dense_dimension() == DIM
        assert answers(store) == expected  # dense, sparse (both vectors copied) and payloads
        assert set(store.payload_indexes()) == set(fresh.payload_indexes())
    kept = list((tmp_path / "old").glob(f"{COLLECTION}.single-shard-*"))
    assert len(kept) == 1 and (kept[0] / "edge_config.json").is_file()
    message = [r.getMessage() for r in caplog.records if "migrated" in r.getMessage()]
    assert len(message) == 1 and "30 points of 3 books" in message[0] and str(kept[0]) in message[0]
    with open_edge(tmp_path / "old") as again:  # once only
        assert again.count(tenant_filter("b")) == 10
    assert len(list((tmp_path / "old").glob(f"{COLLECTION}.single-shard-*"))) == 1


def test_a_single_shard_folder_that_cannot_be_migrated_is_damage_naming_the_rebuild(tmp_path):
    folder = tmp_path / COLLECTION
    write_single_shard(folder, [])
    (folder / "edge_config.json").write_text("{not json")
    with pytest.raises(StoreDamagedError, match=r"rag-pipeline ingest --rebuild") as caught:
        open_edge(tmp_path)
    assert str(folder) in str(caught.value)
    assert (folder / "edge_config.json").exists()  # left as it was, never read as empty


def test_a_migration_killed_between_its_renames_is_finished_at_the_next_open(tmp_path):
    """...by the opener that holds the layout lock: while a migration in progress holds it
    (between its two renames), an opener waits instead of completing the swap for it."""
    from rag_pipeline.store.edge import layout_lock

    with open_edge(tmp_path / "fresh") as fresh:
        points = fill(fresh, books=("a",))
    write_single_shard(tmp_path / COLLECTION, points)
    with open_edge(tmp_path):
        pass
    (tmp_path / COLLECTION).rename(tmp_path / f".{COLLECTION}.migrating")  # as if killed
    lock = layout_lock(tmp_path, COLLECTION)
    lock.acquire(0)  # as the migrating process holds it between its renames
    try:
        with pytest.raises(StoreBusyError):
            open_edge(tmp_path, busy_wait_s=0.2)
        assert not (tmp_path / COLLECTION).exists()  # left for the lock's holder
    finally:
        lock.release()
    with open_edge(tmp_path) as store:
        assert store.count(tenant_filter("a")) == 10


def test_a_migration_of_many_books_keeps_few_shards_open_and_answers_the_same(
    tmp_path, monkeypatch
):
    """Each book's new shard is closed as the copy goes (reloaded when its points come back):
    open shards, and so memory maps and descriptors, stay bounded whatever the book count."""
    from rag_pipeline.store.edge import engine, migration

    books = tuple(f"book-{i:02d}" for i in range(12))
    with open_edge(tmp_path / "fresh") as fresh:
        points = fill(fresh, books=books, per_book=4)
        expected = answers(fresh, books)
    write_single_shard(tmp_path / "old" / COLLECTION, points)
    monkeypatch.setattr(migration, "MIGRATION_OPEN_SHARDS", 3)
    monkeypatch.setattr(migration, "_MIGRATE_PAGE", 5)  # each book's points in several pages
    open_now = peak = 0
    real_create, real_load = qe.EdgeShard.create, qe.EdgeShard.load
    real_close = migration._close_shard

    def opened(shard):  # type: ignore[no-untyped-def]
        nonlocal open_now, peak
        open_now += 1
        peak = max(peak, open_now)
        return shard

    def closed(shard, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal open_now
        open_now -= 1
        return real_close(shard, **kwargs)

    monkeypatch.setattr(qe.EdgeShard, "create", staticmethod(lambda *a: opened(real_create(*a))))
    monkeypatch.setattr(qe.EdgeShard, "load", staticmethod(lambda *a: opened(real_load(*a))))

    def small_wal(folder, shard):  # type: ignore[no-untyped-def]  # closes the new shard
        nonlocal open_now
        open_now -= 1
        return real_small_wal(folder, shard)

    real_small_wal = engine._small_wal
    monkeypatch.setattr(migration, "_close_shard", closed)
    monkeypatch.setattr(engine, "_small_wal", small_wal)
    migration.migrate_single_shard(tmp_path / "old", COLLECTION, COLLECTION_SCHEMA)
    assert peak <= 3 + 1  # (+1: the old single shard, read throughout)
    monkeypatch.undo()
    with open_edge(tmp_path / "old") as store:
        assert answers(store, books) == expected


# -- generations: a new recipe built beside, switched atomically ----------------------------


R1 = {"signature": "r1", "embedding_model": "m1"}
R2 = {"signature": "r2", "embedding_model": "m2"}


def points_of(book: str, n: int, dim: int, tag: str):  # type: ignore[no-untyped-def]
    import numpy as np

    from rag_pipeline.store import PointRecord
    from rag_pipeline_tests.test_store import pid

    out = []
    for i in range(n):
        v = np.random.default_rng(i).standard_normal(dim).astype(np.float32)
        payload = {"book_id": book, "record_type": "chunk", "recipe": tag}
        out.append(PointRecord(pid(book, tag, i), payload, v / np.linalg.norm(v)))
    return out


def builder(root: Path, recipe, dim: int) -> EdgeStore:  # type: ignore[no-untyped-def]
    store = open_edge(root)
    store.ensure_collection(CollectionSpec(COLLECTION, dim, recipe=recipe))
    return store


def recipes_seen(store: EdgeStore, book: str = "a") -> set[str]:
    return {r.payload["recipe"] for r in store.scroll(tenant_filter(book))}


@pytest.fixture
def built_r1(tmp_path: Path) -> Path:
    with builder(tmp_path, R1, DIM) as store:
        store.upsert(points_of("a", 6, DIM, "r1") + points_of("b", 3, DIM, "r1"))
    return tmp_path


def test_a_new_recipe_is_built_beside_and_readers_see_the_old_until_the_switch(built_r1):
    with builder(built_r1, R2, 16) as store:  # another model: another dimension too
        assert recipes_seen(store) == set()  # the builder reads the pending generation
        store.upsert(points_of("a", 4, 16, "r2"))
        assert recipes_seen(store) == {"r2"} and store.count(tenant_filter("a")) == 4
        assert store.pending_recipe("a") == R2 and store.current_recipe("a") == R1
    with open_edge(built_r1) as reader:  # never a mix
        assert recipes_seen(reader) == {"r1"} and reader.count(tenant_filter("a")) == 6
        assert reader.query_dense(tenant_filter("a"), vec(1), limit=3)
    with builder(built_r1, R2, 16) as store:  # a later run resumes the same pending build
        assert store.count(tenant_filter("a")) == 4
        store.upsert(points_of("a", 5, 16, "r2"))
        old = generation(built_r1, "a")
        assert store.switch("a") is True
        assert store.pending_recipe("a") is None and store.current_recipe("a") == R2
        assert recipes_seen(store) == {"r2"}
    with open_edge(built_r1) as reader:
        assert recipes_seen(reader) == {"r2"} and reader.count(tenant_filter("a")) == 5
        assert recipes_seen(reader, "b") == {"r1"}  # another book keeps its generation
        assert reader.dense_dimension() == 16
    assert not (book_folder(built_r1, "a") / old).exists()
    assert not list(book_folder(built_r1, "a").glob(".trash-*"))


def test_a_run_of_the_searched_recipe_drops_a_pending_build_of_another_never_switches_to_it(
    built_r1,
):
    """A build of R2 killed half way, then the setting changed back: the next run (of R1,
    written in place) must not switch the book to the partial R2 build."""
    from rag_pipeline.ingest.migration import finish_build

    with builder(built_r1, R2, 16) as store:
        store.upsert(points_of("a", 1, 16, "r2"))  # the partial build
    pending = generation(built_r1, "a")  # still the current one's name: read the pointer
    with builder(built_r1, R1, DIM) as store:
        store.upsert(points_of("a", 7, DIM, "r1"))  # the run of the searched recipe
    with open_edge(built_r1) as reader:
        assert reader.pending_recipe("a") == R2
        outcome = finish_build(reader, "a", failed_files=(), checks_passed=True, recipe=R1)
        assert not outcome.switched and outcome.state == "in place"
        assert reader.pending_recipe("a") is None and reader.current_recipe("a") == R1
    with open_edge(built_r1) as reader:
        assert recipes_seen(reader) == {"r1"} and reader.count(tenant_filter("a")) == 7
    assert generation(built_r1, "a") == pending
    assert [p.name for p in book_folder(built_r1, "a").iterdir() if p.name.startswith("g")] == [
        pending
    ]


def test_a_tenant_that_names_no_book_folder_has_no_recipe(built_r1):
    with open_edge(built_r1) as reader:
        for tenant in ("../a", "/etc", "a/../../x", ".."):
            assert reader.current_recipe(tenant) is None
            assert reader.pending_recipe(tenant) is None


def test_a_builder_of_the_current_recipe_writes_in_place(built_r1):
    with builder(built_r1, R1, DIM) as store:
        store.upsert(points_of("a", 8, DIM, "r1"))
        assert store.pending_recipe("a") is None and store.switch("a") is False
    with open_edge(built_r1) as reader:
        assert reader.count(tenant_filter("a")) == 8


def test_a_book_written_before_recipes_were_tagged_is_adopted_in_place(tmp_path):
    with open_edge(tmp_path) as store:
        store.ensure_collection(CollectionSpec(COLLECTION, DIM))
        store.upsert(points_of("a", 3, DIM, "untagged"))
    assert open_edge(tmp_path).current_recipe("a") is None
    with builder(tmp_path, R1, DIM) as store:
        store.upsert(points_of("a", 1, DIM, "r1"))
        assert store.count(tenant_filter("a")) == 3 + 1
    assert open_edge(tmp_path).current_recipe("a") == R1


def test_keep_old_keeps_the_old_generation_folder(built_r1):
    old = generation(built_r1, "a")
    with builder(built_r1, R2, DIM) as store:
        store.upsert(points_of("a", 2, DIM, "r2"))
        assert store.switch("a", keep_old=True)
    assert (book_folder(built_r1, "a") / f"old-{old}" / "edge_config.json").is_file()
    with open_edge(built_r1) as reader:
        assert recipes_seen(reader) == {"r2"}


def test_a_switch_killed_anywhere_leaves_one_generation_searched(built_r1):
    with builder(built_r1, R2, DIM) as store:
        store.upsert(points_of("a", 2, DIM, "r2"))
    folder = book_folder(built_r1, "a")
    # killed while writing current.json: its tmp file is left; current.json is the old one
    (folder / ".current.json.dead.tmp").write_text('{"generation": "nonsense"')
    with open_edge(built_r1) as reader:
        assert recipes_seen(reader) == {"r1"}
    # killed after the replace, before pending.json was removed: the switch is done
    pending = json.loads((folder / "pending.json").read_text())
    (folder / "current.json").write_text(json.dumps(pending))
    with open_edge(built_r1) as reader:
        assert recipes_seen(reader) == {"r2"} and reader.pending_recipe("a") is None
    with builder(built_r1, R2, DIM) as store:
        assert store.count(tenant_filter("a")) == 2  # routed to it as the current one
        assert store.switch("a") is False
    assert not (folder / "pending.json").exists()


def test_a_recipe_tag_needs_a_signature():
    with pytest.raises(ValueError, match="signature"):
        CollectionSpec(COLLECTION, DIM, recipe={"embedding_model": "m"})


# -- issue 17: what an edit run opens ---------------------------------------------------------


def edit_run_loads(tmp_path: Path, books: int, loads: Counter[str]) -> Counter[str]:
    """Shard loads of a one-file edit run (planned for its book, executed through Dagster,
    hash embedder) in a collection of ``books`` books."""
    from dagster import DagsterInstance

    from rag_pipeline.config import load_settings
    from rag_pipeline_tests.conftest import section
    from rag_pipeline_tests.test_runner import ingest_books

    data = tmp_path / f"books{books}"
    for i in range(books):
        (data / f"book-{i:02d}").mkdir(parents=True)
        for f in range(3):
            text = f"# Book {i} file {f}\n\n" + section("One", seed=f"b{i}f{f}")
            (data / f"book-{i:02d}" / f"{f}.md").write_text(text)
    settings = load_settings(
        data_dir=data,
        qdrant_path=str(tmp_path / f"qdrant{books}"),
        embedder="hash",
        cache_dir=tmp_path / "cache",
    )
    with DagsterInstance.ephemeral() as instance:
        ingest_books(settings, instance)
        edited = data / "book-01" / "1.md"
        edited.write_text(edited.read_text() + "\n" + section("Edit", seed="edit"))
        loads.clear()
        report = ingest_books(settings, instance, ["book-01"])
    assert report.books["book-01"].status == "ingested"
    return Counter(loads)


def test_a_one_file_edit_run_opens_only_its_books_shard_whatever_the_collection(tmp_path, loads):
    small = edit_run_loads(tmp_path, 3, loads)
    large = edit_run_loads(tmp_path, 12, loads)
    assert set(small) == set(large) == {"book-01"}  # no other book's shard is opened
    # as many loads at 12 books as at 3: one, the run keeps its handle from step to step
    assert small == large and large["book-01"] == 1
    print(f"shard loads of a one-file edit run: {dict(large)}")


def test_an_index_the_schema_gained_reaches_existing_book_shards_at_their_next_write(tmp_path):
    from rag_pipeline.store import CollectionSchema

    with EdgeStore(COLLECTION, tmp_path, CollectionSchema("book_id")) as bare:
        bare.ensure_collection(CollectionSpec(COLLECTION, DIM))
        bare.upsert(points_of("a", 2, DIM, "r"))
    with open_edge(tmp_path) as store:
        store.ensure_collection(CollectionSpec(COLLECTION, DIM))
        assert "chapter" in store.payload_indexes()
        store.upsert(points_of("a", 1, DIM, "r"))
    shard = qe.EdgeShard.load(str(book_folder(tmp_path, "a") / generation(tmp_path, "a")))
    try:
        indexed = set(shard.info().payload_schema)
    finally:
        shard.close()
    # a core index at once; a search filter's index once the book is large (none at 3 points)
    assert "parent_doc_id" in indexed and "chapter" not in indexed


def test_a_handle_walking_every_book_keeps_only_a_few_shards_loaded(tmp_path, loads):
    from rag_pipeline.store.edge import MAX_OPEN_SHARDS

    books = tuple(f"b{i}" for i in range(MAX_OPEN_SHARDS + 3))
    with open_edge(tmp_path) as store:
        fill(store, books=books, per_book=3)  # written past the limit: flushed as closed
        assert len(store._open) == MAX_OPEN_SHARDS
        store.delete_where(tenant_filter("b0"))  # reloaded, emptied, unloaded again below
        for book in books[1:]:
            assert store.count(tenant_filter(book)) == 3
        assert len(store._open) == MAX_OPEN_SHARDS
    with open_edge(tmp_path) as store:
        assert store.tenants() == sorted(books[1:])  # b0 emptied: its folder went at close
        assert [store.count(tenant_filter(b)) for b in books[1:]] == [3] * (len(books) - 1)


def test_a_purge_killed_after_its_rename_leaves_no_book_and_is_swept_later(filled):
    books = filled / COLLECTION / "books"
    (books / "a").rename(books / ".trash-a-dead")  # killed before the rmtree
    with open_edge(filled) as store:
        assert store.tenants() == ["b", "c"] and store.count(tenant_filter("a")) == 0
        store.purge(tenant_filter("b"))
    assert sorted(p.name for p in books.iterdir()) == ["c"]


def test_a_store_lets_the_process_hold_a_lock_file_per_book(tmp_path):
    """One open lock file per book a handle touched: opening a store raises the soft limit of
    open files (often 1,024) to the hard limit, so a walk over a thousand books never ends
    with EMFILE."""
    import resource

    from rag_pipeline.store.lock import allow_open_files

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft <= 64:
        pytest.skip(f"the soft limit of open files is {soft} already")
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
    allow_open_files.cache_clear()
    try:
        open_edge(tmp_path).close()
        raised, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        assert raised == (min(hard, 1 << 20) if hard != resource.RLIM_INFINITY else 1 << 20)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, raised), hard))


def test_a_generation_folder_no_pointer_names_is_swept_at_the_next_write(built_r1):
    """A kill between a generation's creation and its pointer (or between a switch and the
    old folder's removal) leaves a folder nothing reads: the book's next write removes it."""
    orphan = book_folder(built_r1, "a") / "g20200101000000-abcdef"
    kept = book_folder(built_r1, "a") / "old-g20200101000000-fedcba"
    for folder in (orphan, kept):
        folder.mkdir()
        (folder / "edge_config.json").write_text("{}")
    searched = generation(built_r1, "a")
    with open_edge(built_r1) as reader:  # a reader removes nothing
        assert reader.count(tenant_filter("a")) == 6
    assert orphan.exists()
    with builder(built_r1, R1, DIM) as store:
        store.upsert(points_of("a", 1, DIM, "r1"))
    assert not orphan.exists() and kept.exists()
    assert (
        generation(built_r1, "a") == searched and (book_folder(built_r1, "a") / searched).is_dir()
    )


def test_a_handle_kept_between_a_runs_steps_steps_aside_for_a_waiting_process(filled):
    """Within kept_open (a run), an idle handle stays open for the next step, until another
    process waits for a book it holds: then it is closed at once (the waiter gets the book),
    and the next use opens it again."""
    import fcntl
    import os
    import time

    from rag_pipeline.store import sharing

    key = ("test", str(filled))

    def use() -> EdgeStore:
        with sharing.shared_store(key, lambda: open_edge(filled)) as store:
            assert store.count(tenant_filter("a")) > 0  # takes book a's lock
            return store  # type: ignore[return-value]

    with sharing.kept_open():
        first = use()
        assert use() is first  # kept: the same handle, the shard not loaded again
        waiter = os.open(filled / COLLECTION / "locks" / "a.wait", os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(waiter, fcntl.LOCK_SH)  # what another process waiting for book a holds
            deadline = time.monotonic() + 5
            while sharing._slots[key].store is not None and time.monotonic() < deadline:
                time.sleep(0.01)
            assert sharing._slots[key].store is None  # stepped aside
        finally:
            os.close(waiter)
        assert use() is not first  # opened again on the next use
    assert sharing._slots[key].store is None  # closed when the run ends


def test_a_handle_held_for_an_edits_stages_steps_aside_only_after_the_hold(filled):
    """Issue 41.1: live mode's stages of an edit (kept_open with hold_s) keep their idle
    handle even while another process waits, for hold_s: a search waits a moment instead
    of taking the book between two stages (a hand-over and a shard load on each side);
    past the hold, the handle steps aside as ever."""
    import fcntl
    import os
    import time

    from rag_pipeline.store import sharing

    key = ("test-hold", str(filled))

    def use() -> EdgeStore:
        with sharing.shared_store(key, lambda: open_edge(filled)) as store:
            assert store.count(tenant_filter("a")) > 0
            return store  # type: ignore[return-value]

    started = time.monotonic()  # before the hold starts: it is counted from the block's start
    with sharing.kept_open(hold_s=1.5):
        first = use()
        waiter = os.open(filled / COLLECTION / "locks" / "a.wait", os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(waiter, fcntl.LOCK_SH)
            time.sleep(0.3)  # six watcher rounds while another process waits
            assert sharing._slots[key].store is first and time.monotonic() - started < 1.5
            assert use() is first  # the next stage: no hand-over, no load
            deadline = time.monotonic() + 5
            while sharing._slots[key].store is not None and time.monotonic() < deadline:
                time.sleep(0.01)
            assert sharing._slots[key].store is None  # past the hold: stepped aside
            assert time.monotonic() - started >= 1.5
        finally:
            os.close(waiter)
    assert sharing._slots[key].store is None


def test_a_small_books_shard_has_the_core_indexes_and_a_grown_one_all(tmp_path, monkeypatch):
    """Every payload index costs each shard files, time to create and load and memory, and a
    filter on a small book costs little without one: a book's shard has the schema's core
    indexes, and every index once it holds ALL_INDEXES_FROM_POINTS points (added after the
    write that grew it). A facet of a field a small book does not index reads its payloads."""
    from rag_pipeline.store.edge import engine as edge

    monkeypatch.setattr(edge, "ALL_INDEXES_FROM_POINTS", 20)

    def indexes(book: str) -> set[str]:
        folder = book_folder(tmp_path, book) / generation(tmp_path, book)
        shard = qe.EdgeShard.load(str(folder))
        try:
            return set(shard.info().payload_schema)
        finally:
            shard.close()

    def chaptered(book: str, n: int):  # type: ignore[no-untyped-def]
        return [
            dataclasses.replace(p, payload={**p.payload, "chapter": i % 3})
            for i, p in enumerate(points_of(book, n, DIM, "r"))
        ]

    with open_edge(tmp_path) as store:
        store.ensure_collection(CollectionSpec(COLLECTION, DIM))
        store.upsert(chaptered("small", 5))
        store.upsert(chaptered("grown", 30))
    core = {"book_id", *COLLECTION_SCHEMA.core_indexes}  # type: ignore[misc]
    assert indexes("small") == core
    assert indexes("grown") == {"book_id", *COLLECTION_SCHEMA.payload_indexes}
    with open_edge(tmp_path) as store:
        read = store.counts_by(tenant_filter("small"), "chapter")  # not indexed: read
        faceted = store.counts_by(tenant_filter("grown"), "chapter")
    assert read == {"0": 2, "1": 2, "2": 1} and faceted == {"0": 10, "1": 10, "2": 10}


def test_a_rebuild_swap_killed_between_its_renames_is_finished_by_the_next_opener(tmp_path):
    from rag_pipeline.store.edge.rebuild import _REBUILT, clear_rebuild_root, rebuild_root

    with open_edge(tmp_path) as store:
        fill(store, books=("old",))
    staged = rebuild_root(tmp_path, COLLECTION)
    with open_edge(staged) as store:
        fill(store, books=("new",))
    (staged / _REBUILT).touch()  # the swap marked it complete...
    (tmp_path / COLLECTION).rename(tmp_path / f"{COLLECTION}.set-aside-x")  # ...and was killed
    with open_edge(tmp_path) as store:
        assert store.tenants() == ["new"]
    assert not staged.exists()
    # a leftover that was never marked complete is cleared by the next rebuild, never served
    with open_edge(staged) as store:
        fill(store, books=("partial",))
    assert clear_rebuild_root(tmp_path, COLLECTION, 0) == staged and not staged.exists()
    with open_edge(tmp_path) as store:
        assert store.tenants() == ["new"]

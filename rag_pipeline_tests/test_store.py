"""The store contract, run on both embedded backends (qdrant-client local and Qdrant Edge)."""

import uuid

import numpy as np
import pytest

from rag_pipeline.retrieve import SearchFilters
from rag_pipeline.schema import PAYLOAD_INDEXES
from rag_pipeline.schema import book_filter as tenant_filter
from rag_pipeline.sparse import Bm25Encoder
from rag_pipeline.store import (
    CollectionSpec,
    Fusion,
    HasIds,
    Match,
    MatchAny,
    PointRecord,
    Range,
    StoreDamagedError,
    StoreError,
    TenantFilter,
)

DIM = 8


def vec(i: int) -> np.ndarray:
    rng = np.random.default_rng(i)
    v = rng.standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def pid(*parts: object) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "/".join(map(str, parts))))


def fill(store, books=("a", "b"), per_book=10):
    store.ensure_collection(CollectionSpec(store.collection, DIM))
    encoder = Bm25Encoder()
    points = []
    for book in books:
        for i in range(per_book):
            payload = {
                "book_id": book,
                "record_type": "chunk",
                "chapter": i % 5 + 1,
                "module": f"m{i % 2}",
                "hardware_tier": i % 3 + 1,
                "lesson": i,
                "proficiency_level": ["A2", "B1", "C1"][i % 3],
                "source_file": f"f{i}",
                "text": f"shared words number {i}",
                "color": "red" if i < 5 else "blue",
            }
            points.append(
                PointRecord(
                    pid(book, i), payload, vec(i), encoder.encode_documents([payload["text"]])[0]
                )
            )
    store.upsert(points)
    return points


def test_collection_has_named_vectors_and_every_payload_index(store):
    fill(store)
    assert store.dense_dimension() == DIM
    if store.description.startswith("qdrant-client"):
        pytest.skip("qdrant-client local mode keeps no payload indexes (filters run in Python)")
    indexes = store.payload_indexes()
    assert set(PAYLOAD_INDEXES) <= set(indexes)
    assert "Keyword" in indexes["book_id"] and "Integer" in indexes["chapter"]


def test_dimension_mismatch_is_refused(store):
    fill(store)
    with pytest.raises(StoreError, match="8-dimensional vectors but the embedder makes 16"):
        store.ensure_collection(CollectionSpec(store.collection, 16))


def test_ensure_collection_is_idempotent(store):
    fill(store)
    store.ensure_collection(CollectionSpec(store.collection, DIM))
    assert store.count(tenant_filter("a")) == 10


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        (SearchFilters(), set(range(10))),
        (SearchFilters(module="m1"), {1, 3, 5, 7, 9}),
        (SearchFilters(chapter_min=2, chapter_max=3), {1, 2, 6, 7}),
        (SearchFilters(chapter_min=5), {4, 9}),
        (SearchFilters(chapter_max=1), {0, 5}),
        (SearchFilters(lesson=7), {7}),
        (SearchFilters(hardware_tier=1), {0, 3, 6, 9}),
        (SearchFilters(hardware_tier=2), {0, 1, 3, 4, 6, 7, 9}),
        (SearchFilters(proficiency_levels=("A2", "C1")), {0, 2, 3, 5, 6, 8, 9}),
        (SearchFilters(equals={"color": "blue"}), {5, 6, 7, 8, 9}),
        (SearchFilters(module="m0", hardware_tier=1, equals={"color": "red"}), {0}),
    ],
)
def test_filter_semantics(store, filters, expected):
    fill(store)
    where = tenant_filter("a", Match("record_type", "chunk"), *filters.conditions())
    hits = store.query_dense(where, vec(0), limit=100)
    assert {int(h.payload["lesson"]) for h in hits} == expected
    assert {h.payload["book_id"] for h in hits} <= {"a"}
    assert store.count(where) == len(expected)


def test_score_threshold(store):
    fill(store)
    hits = store.query_dense(tenant_filter("a"), vec(3), limit=10, score_threshold=0.999)
    assert [h.payload["lesson"] for h in hits] == [3]


def test_tenant_isolation_for_every_operation(store):
    points = fill(store, books=("a", "b", "c", "d", "e"))
    b_ids = [p.id for p in points if p.payload["book_id"] == "b"]
    for book in "abcde":
        where = tenant_filter(book)
        assert {h.payload["book_id"] for h in store.query_dense(where, vec(1), limit=50)} == {book}
        assert {r.payload["book_id"] for r in store.scroll(where)} == {book}
    # ids of book b asked for through book a: nothing comes back, nothing is deleted
    assert store.retrieve(tenant_filter("a"), b_ids) == []
    assert store.delete_ids(tenant_filter("a"), b_ids) == 0
    assert store.count(tenant_filter("b")) == 10
    assert store.delete_where(tenant_filter("c")) == 10
    assert store.count(tenant_filter("c")) == 0
    assert store.count(tenant_filter("d")) == 10
    assert store.tenants() == ["a", "b", "d", "e"]


def test_tenant_filter_cannot_be_built_unsafely(store):
    with pytest.raises(ValueError, match="invalid book id"):
        tenant_filter("")
    with pytest.raises(ValueError, match="needs a tenant"):
        TenantFilter("")
    fill(store)
    with pytest.raises(ValueError, match="tenant key"):
        store.count(TenantFilter("a", (Match("book_id", "b"),)))
    with pytest.raises(ValueError, match="cannot be used as a free filter"):
        SearchFilters(equals={"book_id": "b"}).conditions()
    with pytest.raises(ValueError, match="chapter range is empty"):
        SearchFilters(chapter_min=3, chapter_max=1).conditions()


def test_scroll_pages_and_selects_fields(store):
    fill(store, books=("a",), per_book=25)
    records = list(store.scroll(tenant_filter("a"), fields=["lesson"], page_size=7))
    assert len(records) == 25
    assert all(set(r.payload) == {"lesson"} for r in records)
    with_vectors = list(store.scroll(tenant_filter("a"), with_vectors=True))
    assert all(r.dense is not None and r.dense.shape == (DIM,) for r in with_vectors)


def test_points_without_vectors_are_stored_but_never_searched(store):
    fill(store)
    doc_id = pid("doc")
    store.upsert([PointRecord(doc_id, {"book_id": "a", "record_type": "document"})])
    assert store.retrieve(tenant_filter("a"), [doc_id])[0].payload["record_type"] == "document"
    hits = store.query_dense(tenant_filter("a"), vec(0), limit=100)
    assert doc_id not in {h.id for h in hits}


def test_sparse_and_hybrid_queries(store):
    store.ensure_collection(CollectionSpec(store.collection, DIM))
    encoder = Bm25Encoder()
    texts = ["the robot walks", "quantum zorblax calibration", "robots walking fast"]
    store.upsert(
        [
            PointRecord(
                pid(i), {"book_id": "a", "text": t}, vec(i), encoder.encode_documents([t])[0]
            )
            for i, t in enumerate(texts)
        ]
    )
    sparse = store.query_sparse(tenant_filter("a"), encoder.encode_query("zorblax"), limit=3)
    assert [h.payload["text"] for h in sparse] == ["quantum zorblax calibration"]
    fused = store.query_hybrid(
        tenant_filter("a"), vec(0), encoder.encode_query("zorblax"), limit=3, prefetch_limit=3
    )
    assert {h.payload["text"] for h in fused} == set(texts)
    assert fused[0].payload["text"] in ("the robot walks", "quantum zorblax calibration")


def test_conditions_translate_for_both_backends():
    from rag_pipeline.store.edge import EDGE
    from rag_pipeline.store.native import native_filter
    from rag_pipeline.store.qdrant import CLIENT

    where = tenant_filter(
        "a",
        Match("m", "x"),
        MatchAny("p", ("A2",)),
        Range("c", gte=1, lte=2),
        HasIds((pid(1),)),
    )
    native = native_filter(CLIENT, "book_id", where)
    assert native.must[0].key == "book_id" and native.must[0].match.value == "a"
    assert len(native.must) == 5
    assert repr(native_filter(EDGE, "book_id", where)).startswith(
        'Filter(must=[FieldCondition(key="book_id"'
    )


@pytest.mark.parametrize("bad", ["not-a-uuid", "", "1e23", "../x", "12345"])
def test_point_ids_are_checked_before_reaching_the_engine(bad):
    with pytest.raises(ValueError, match="is not a point id"):
        HasIds((bad,))
    assert HasIds((pid(1).upper(),)).ids == (pid(1),)


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 10**23])
def test_filter_integers_must_fit_the_index(value):
    with pytest.raises(ValueError, match="64 bits"):
        Match("chapter", value)
    with pytest.raises(ValueError, match="64 bits"):
        Range("chapter", gte=value)


def test_counts_by_a_keyword_field(store):
    fill(store, books=("a", "b"), per_book=6)
    counts = store.counts_by(tenant_filter("a", Match("record_type", "chunk")), "module")
    assert counts == {"m0": 3, "m1": 3}


@pytest.mark.parametrize("fusion", ["minmax", "dbsf", "rrf"])
def test_a_score_no_cosine_can_have_is_damage_not_a_result(store, monkeypatch, fusion):
    from rag_pipeline.store.base import ScoredRecord

    fill(store)
    monkeypatch.setattr(
        type(store),
        "_query_batch",
        lambda self, queries: [[ScoredRecord(pid(1), 3.2e28, {})] for _ in queries],
    )
    with pytest.raises(StoreDamagedError, match="damaged"):
        store.query_dense(tenant_filter("a"), vec(0), limit=3)
    with pytest.raises(StoreDamagedError, match="damaged"):
        store.query_hybrid(
            tenant_filter("a"),
            vec(0),
            Bm25Encoder().encode_query("shared"),
            limit=3,
            prefetch_limit=3,
            fusion=Fusion(fusion),
        )


@pytest.mark.parametrize("kind", ["dense", "sparse", "minmax", "rrf"])
def test_queries_return_only_the_payload_fields_asked_for(store, kind):
    fill(store)
    where, query = tenant_filter("a"), Bm25Encoder().encode_query("number 3")
    fields = ("lesson", "source_file")
    if kind == "dense":
        hits = store.query_dense(where, vec(3), limit=4, fields=fields)
    elif kind == "sparse":
        hits = store.query_sparse(where, query, limit=4, fields=fields)
    else:
        hits = store.query_hybrid(
            where, vec(3), query, limit=4, prefetch_limit=10, fusion=Fusion(kind), fields=fields
        )
    assert hits and all(set(h.payload) == set(fields) for h in hits)
    assert hits[0].payload["lesson"] == 3
    full = store.retrieve(where, [h.id for h in hits])
    assert all("text" in r.payload for r in full)
    assert all(
        set(r.payload) == {"lesson"} for r in store.retrieve(where, [hits[0].id], fields=["lesson"])
    )

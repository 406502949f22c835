"""Retrieval on both backends: tenant scoping, context expansion, documents, hybrid search."""

import itertools

import pytest

from rag_pipeline.retrieve import SearchFilters, expand_context, get_document, search
from rag_pipeline_tests.conftest import make_pipeline, make_recipe, section

BOOKS = [f"book-{i}" for i in range(5)]


@pytest.fixture
def store(opened):
    """The store on each embedded backend, indexed by the pipeline (see conftest's StoreView)."""
    return opened


@pytest.fixture
def indexed(store, data_dir, write_book, hash_embedder):
    """Five books with the same text (overlapping tenants) plus a distinct long document."""
    recipe = make_recipe(hash_embedder, target_tokens=120, max_tokens=160, min_tokens=100)
    for i, book in enumerate(BOOKS):
        write_book(
            book,
            {
                "shared.md": "---\ntitle: Shared\n---\n" + section("Robots", 2, 40),
                "long.md": f"---\ntitle: Long {i}\nchapter: {i}\n---\n"
                + "".join(section(f"Part {j}", 2, 60, seed=f"b{i}") for j in range(5)),
            },
        )
        make_pipeline(data_dir, store, recipe).run([book])
    return store


def test_search_never_crosses_books(indexed, hash_embedder):
    for book in BOOKS:
        hits = search(indexed, hash_embedder, "robotsw0x1 robotsw1x2", book, limit=50)
        assert hits and {h.book_id for h in hits} == {book}


@pytest.mark.parametrize("book_id", ["", None])
def test_search_without_a_book_is_an_error(indexed, hash_embedder, book_id):
    with pytest.raises(ValueError, match="book id"):
        search(indexed, hash_embedder, "x", book_id)  # type: ignore[arg-type]


def test_filters_apply_within_the_book(indexed, hash_embedder):
    hits = search(
        indexed,
        hash_embedder,
        "part",
        "book-3",
        limit=100,
        filters=SearchFilters(chapter_min=3, chapter_max=3),
    )
    assert hits and all(h.payload["chapter"] == 3 for h in hits)
    assert (
        search(indexed, hash_embedder, "part", "book-3", filters=SearchFilters(chapter_min=4)) == []
    )


def _document(store, book, title):
    from rag_pipeline.schema import book_filter as tenant_filter
    from rag_pipeline.store import Match

    records = store.scroll(tenant_filter(book, Match("title", title)), fields=["parent_doc_id"])
    return next(iter(records)).payload["parent_doc_id"]


def test_get_document_orders_chunks(indexed):
    doc_id = _document(indexed, "book-2", "Long 2")
    chunks = get_document(indexed, "book-2", doc_id)
    assert len(chunks) >= 5
    assert [c.chunk_index for c in chunks] == list(range(len(chunks)))
    assert get_document(indexed, "book-1", doc_id) == []  # another book's document id


@pytest.mark.parametrize(
    ("position", "prev", "nxt", "expected"),
    [
        ("first", 2, 2, [0, 1, 2]),
        ("last", 2, 2, [-3, -2, -1]),
        ("middle", 1, 1, [-1, 0, 1]),
        ("middle", 0, 0, [0]),
        ("middle", 50, 50, "all"),
    ],
)
def test_expand_context_walks_the_chain_and_stops_at_edges(indexed, position, prev, nxt, expected):
    doc_id = _document(indexed, "book-0", "Long 0")
    chunks = get_document(indexed, "book-0", doc_id)
    n = len(chunks)
    center = {"first": 0, "last": n - 1, "middle": n // 2}[position]
    got = expand_context(indexed, "book-0", chunks[center].id, prev=prev, next=nxt)
    indexes = [h.chunk_index for h in got]
    if expected == "all":
        assert indexes == list(range(n))
    elif position == "last":
        assert indexes == [n + e for e in expected]
    elif position == "middle":
        assert indexes == [center + e for e in expected]
    else:
        assert indexes == expected


def test_expand_context_refuses_another_books_chunk(indexed):
    doc_id = _document(indexed, "book-4", "Long 4")
    chunk = get_document(indexed, "book-4", doc_id)[1]
    assert expand_context(indexed, "book-0", chunk.id) == []


@pytest.mark.slow
def test_hybrid_finds_a_keyword_only_match_that_dense_search_misses(
    store, data_dir, write_book, local_embedder
):
    """A rare identifier means nothing to a sentence embedding; BM25 matches it exactly."""
    paragraphs = {
        f"topic-{i}.md": f"---\ntitle: {title}\n---\n## {title}\n\n{text}\n"
        for i, (title, text) in enumerate(
            [
                (
                    "Error handling",
                    "Use try and catch blocks to handle terminating errors in "
                    "scripts, and inspect the error record for details about the failure.",
                ),
                (
                    "Troubleshooting errors",
                    "When a command fails, read the error message, check "
                    "the exception type and search the documentation for the error.",
                ),
                (
                    "Common error messages",
                    "Errors such as access denied or path not found usually "
                    "come from permissions or typos in file paths.",
                ),
                (
                    "Debugging scripts",
                    "Set breakpoints and step through a script to find where an "
                    "error is thrown and what the variables contain at that point.",
                ),
                (
                    "Event logs",
                    "Windows event logs record application errors; filter them by "
                    "level and source to find failures.",
                ),
                (
                    "Error codes",
                    "Every failing command sets an exit code; a non-zero code means an "
                    "error and the code tells you which kind.",
                ),
                (
                    "Retry failed commands",
                    "Transient errors such as timeouts go away when a failed "
                    "command is retried after a short wait.",
                ),
                (
                    "Firmware notes",
                    "The controller ships with firmware build mxq-7731-rz which "
                    "changes the fan curve and the boot order of the attached storage devices.",
                ),
            ]
        )
    }
    write_book("errors", paragraphs)
    make_pipeline(data_dir, store, make_recipe(local_embedder)).run(["errors"])
    query = "mxq-7731-rz error when the command fails"
    top = 3

    def titles(mode):
        return [
            h.payload["title"]
            for h in search(store, local_embedder, query, "errors", limit=top, mode=mode)
        ]

    assert "Firmware notes" not in titles("dense")  # dense prefers the many error articles
    assert titles("sparse")[0] == "Firmware notes"
    assert "Firmware notes" in titles("hybrid")


# -- sparse encoder --------------------------------------------------------------------------


def test_bm25v2_tokens_keep_decimals_and_drop_possessives():
    from rag_pipeline.sparse import Bm25Encoder

    text = "The patient's p53 rose 3.5-fold in PowerShell 7.5 (COVID-19); don't"
    assert Bm25Encoder().terms(text) == [
        "patient",
        "p53",
        "rose",
        "3.5",
        "fold",
        "powershel",
        "7.5",
        "covid",
        "19",
        "don't",
    ]
    assert Bm25Encoder().terms("x_y c-d 1,000") == ["x", "y", "c", "d", "1,000"]
    legacy = Bm25Encoder.legacy()  # the first encoder, exactly
    assert legacy.terms("patient's 3.5") == ["patient", "s", "3", "5"]
    assert legacy.name == "bm25-english-k1=1.2-b=0.75-avg=200"


def test_bm25_average_length_is_a_parameter_and_part_of_the_name():
    from rag_pipeline.sparse import DEFAULT_AVG_LEN, Bm25Encoder, fallback_avg_len, measure_avg_len

    assert Bm25Encoder().avg_len == DEFAULT_AVG_LEN == round(fallback_avg_len(256))
    short, long = Bm25Encoder(avg_len=10), Bm25Encoder(avg_len=1000)
    assert short.name == "bm25v2-english-k1=1.2-b=0.75-avg=10" != long.name
    assert Bm25Encoder.from_name(short.name) == short
    assert Bm25Encoder.from_name(Bm25Encoder.legacy().name) == Bm25Encoder.legacy()
    # a document longer than the average weighs its terms less
    text = "robot " + " ".join(f"w{i}" for i in range(40))
    assert short.encode_documents([text])[0].values[0] < long.encode_documents([text])[0].values[0]
    # the query side does not depend on the average
    assert short.encode_query("robot arms") == long.encode_query("robot arms")
    assert measure_avg_len(["robots walk", "the a of", "one two three four"]) == 3.0
    assert measure_avg_len([], fallback=42.0) == 42.0
    with pytest.raises(ValueError, match="avg_len"):
        Bm25Encoder(avg_len=0)
    with pytest.raises(ValueError, match="avg_len"):
        short.with_avg_len(-1.0)
    # another average, the same analysis: its stems are learned once for both
    other = short.with_avg_len(1000)
    assert other == long and other.name == long.name
    other.terms("walking robots")
    assert short.terms("walking robots") == ["walk", "robot"] == other.terms("walking robots")
    assert "walking" in short._stems  # the cache one analysis filled serves the other


# -- fusion ----------------------------------------------------------------------------------


def test_minmax_fuse_by_hand():
    from rag_pipeline.store.base import minmax_fuse

    dense = [("a", 0.9), ("b", 0.7), ("c", 0.5)]
    sparse = [("c", 12.0), ("d", 4.0)]
    fused = dict(minmax_fuse([dense, sparse], [0.5, 0.5]))
    assert fused == pytest.approx({"a": 0.5, "b": 0.25, "c": 0.5, "d": 0.0})
    # ties: the higher single normalized score first (a and c both have 1.0), then the id
    assert [p for p, _ in minmax_fuse([dense, sparse], [0.5, 0.5])] == ["a", "c", "b", "d"]
    assert minmax_fuse([[("z", 3.0)], []], [0.5, 0.5]) == [("z", 0.5)]  # one item maps to 1


@pytest.fixture
def hybrid_book(store, data_dir, write_book, hash_embedder):
    recipe = make_recipe(hash_embedder, target_tokens=120, max_tokens=160, min_tokens=100)
    files = {
        f"topic-{i}.md": f"---\ntitle: Topic {i}\nchapter: {i % 3 + 1}\n---\n"
        + section(f"Robots {i % 4}", 2, 30, seed=f"t{i}")
        + ("\nThe zorblax calibration matters here.\n" if i % 5 == 0 else "")
        for i in range(12)
    }
    write_book("fusion", files)
    make_pipeline(data_dir, store, recipe).run(["fusion"])
    return store


def test_default_hybrid_fusion_is_client_side_minmax(hybrid_book, hash_embedder):
    from rag_pipeline.schema import chunks_of
    from rag_pipeline.sparse import Bm25Encoder
    from rag_pipeline.store.base import minmax_fuse

    query = "zorblax calibration robots0w0x1"
    hits = search(hybrid_book, hash_embedder, query, "fusion", limit=8, prefetch_limit=20)
    where = chunks_of("fusion")
    dense = hybrid_book.query_dense(where, hash_embedder.embed_query(query), limit=20)
    sparse = hybrid_book.query_sparse(where, Bm25Encoder().encode_query(query), limit=20)
    expected = minmax_fuse(
        [[(r.id, r.score) for r in dense], [(r.id, r.score) for r in sparse]], [0.5, 0.5]
    )[:8]
    assert [(h.id, h.score) for h in hits] == [(i, pytest.approx(s)) for i, s in expected]
    assert all(h.payload["book_id"] == "fusion" and h.text for h in hits)


def test_native_fusions_are_selectable(hybrid_book, hash_embedder):
    query = "zorblax calibration robots0w0x1"

    def scores(**kw):
        return [h.score for h in search(hybrid_book, hash_embedder, query, "fusion", **kw)]

    minmax, dbsf = scores(), scores(fusion="dbsf")
    rrf60, rrf2 = scores(fusion="rrf"), scores(fusion="rrf", rrf_k=2)
    assert max(minmax) <= 1.0 and dbsf != minmax
    # rrf: sum over the two lists of 1 / (k + rank), rank from 0
    assert max(rrf60) <= 2 / 60 + 1e-6 and max(rrf2) > 2 / 60 + 1e-3  # float32 scores
    assert all(a >= b for a, b in itertools.pairwise(rrf60))
    with pytest.raises(ValueError, match="unknown fusion"):
        scores(fusion="sum")


@pytest.mark.parametrize("fusion", ["minmax", "dbsf", "rrf"])
def test_hybrid_order_is_deterministic_with_ties_by_id(store, hash_embedder, fusion):
    """Identical chunks tie on every score: they come back in id order, every time."""
    import uuid

    from rag_pipeline.schema import COLLECTION_SCHEMA, chunks_of
    from rag_pipeline.sparse import Bm25Encoder
    from rag_pipeline.store import CollectionSpec, Fusion, PointRecord

    store.ensure_collection(CollectionSpec(store.collection, hash_embedder.dimension))
    assert COLLECTION_SCHEMA.tenant_field == "book_id"
    encoder = Bm25Encoder()
    points = []
    for i in range(30):
        text = "robot arm grasp" if i % 3 else f"unrelated words {i}"
        payload = {"book_id": "ties", "record_type": "chunk", "text": text}
        points.append(
            PointRecord(
                str(uuid.uuid5(uuid.NAMESPACE_URL, f"tie/{i}")),
                payload,
                hash_embedder.embed_query(text),
                encoder.encode_documents([text])[0],
            )
        )
    store.upsert(points)
    dense = hash_embedder.embed_query("robot arm grasp")
    runs = [
        store.query_hybrid(
            chunks_of("ties"),
            dense,
            encoder.encode_query("robot arm grasp"),
            limit=12,
            prefetch_limit=15,
            fusion=Fusion(fusion),
        )
        for _ in range(4)
    ]
    ids = [[r.id for r in run] for run in runs]
    assert all(i == ids[0] for i in ids)
    first = runs[0]
    for a, b in itertools.pairwise(first):
        assert a.score > b.score or (a.score == b.score and a.id < b.id)


def test_hybrid_score_threshold_applies_to_the_fused_score(hybrid_book, hash_embedder):
    query = "zorblax calibration robots0w0x1"
    everything = search(hybrid_book, hash_embedder, query, "fusion", limit=50)
    assert min(h.score for h in everything) < 0.3 < max(h.score for h in everything) <= 1.0
    kept = search(hybrid_book, hash_embedder, query, "fusion", limit=50, score_threshold=0.3)
    assert kept == [h for h in everything if h.score >= 0.3]


# -- grouped results -------------------------------------------------------------------------


@pytest.fixture
def grouped_books(store, data_dir, write_book, hash_embedder):
    """Two books with the same files (names and text); files of 1 to 5 chunks."""
    recipe = make_recipe(hash_embedder, target_tokens=60, max_tokens=80, min_tokens=40)
    for book in ("alpha", "beta"):
        write_book(
            book,
            {
                f"file-{i}.md": f"---\ntitle: File {i}\n---\n"
                + "".join(section(f"Robots {j}", 1, 45, seed=f"f{i}") for j in range(i + 1))
                for i in range(5)
            },
        )
        make_pipeline(data_dir, store, recipe).run([book])
    return store


@pytest.mark.parametrize("mode", ["dense", "sparse", "hybrid"])
@pytest.mark.parametrize(("limit", "size"), [(3, 2), (10, 3), (2, 1)])
def test_grouped_search_gives_the_best_chunks_per_file(
    grouped_books, hash_embedder, mode, limit, size
):
    from rag_pipeline.retrieve import group_hits, search_groups

    query = "f1robots0w0x3 f3robots2w0x4 f4robots1w0x5 f2robots0w0x1 f4robots3w0x2"
    groups = search_groups(
        grouped_books, hash_embedder, query, "alpha", limit=limit, group_size=size, mode=mode
    )
    assert 1 <= len(groups) <= limit
    files = [g.source_file for g in groups]
    assert len(set(files)) == len(files)
    for g in groups:
        hits = list(g.hits)
        assert {h.payload["source_file"] for h in hits} == {g.source_file}
        assert {h.book_id for h in hits} == {"alpha"}  # never the other book's same file
        whole = hits[0].payload["total_chunks"]
        if mode == "sparse":  # only chunks holding a query term are candidates
            assert len(hits) <= min(size, whole)
        else:  # the size is honoured, or the file is whole
            assert len(hits) == min(size, whole)
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
        assert g.score == hits[0].score
    assert [g.score for g in groups] == sorted((g.score for g in groups), reverse=True)
    if mode != "hybrid":  # scores do not depend on the candidate lists: grouping is exact
        everything = search(grouped_books, hash_embedder, query, "alpha", limit=500, mode=mode)
        reference = group_hits(everything, "source_file", limit, size)
        assert [(g.source_file, [h.id for h in g.hits]) for g in groups] == [
            (g.source_file, [h.id for h in g.hits]) for g in reference
        ]
        assert [g.score for g in groups] == pytest.approx([g.score for g in reference])


def test_group_json_shape(grouped_books, hash_embedder):
    from rag_pipeline.retrieve import search_groups

    (group,) = search_groups(grouped_books, hash_embedder, "robots", "beta", limit=1)
    body = group.as_dict()
    assert set(body) == {"source_file", "parent_doc_id", "title", "score", "hits"}
    assert body["hits"] == [h.as_dict() for h in group.hits]
    assert body["parent_doc_id"] == group.hits[0].payload["parent_doc_id"]
    assert body["title"].startswith("File ")
    with pytest.raises(ValueError, match="cannot group by"):
        search_groups(grouped_books, hash_embedder, "x", "beta", group_by="chapter")  # type: ignore[arg-type]


@pytest.mark.parametrize("chunks", [0, 1, 7, 8, 9, 2_345])
def test_a_runs_point_messages_name_every_point_once_on_a_short_line(chunks):
    """What a run logs about the points it wrote: a first message saying how many and how to
    read them, then each id once, on a line of its own naming its file and section (or the
    file's document record), a short line (a long name shortened), POINTS_PER_MESSAGE lines a
    message: the run page shows a filtered message whole, the id's line in it (issue 44)."""
    from rag_pipeline.retrieve.lineage import (
        POINTS_PER_MESSAGE,
        WHERE_CHARS,
        point_log_path,
        written_points_messages,
    )

    files = [f"part-{i % 7}/ch{i % 13}.md" for i in range(chunks)]
    points = [(f"p{i:05d}", files[i], f"Heading {i % 5}" if i % 3 else "") for i in range(chunks)]
    documents = [(f, f"doc-{f}") for f in sorted(set(files))]
    messages = written_points_messages("bk", points, documents)
    total = chunks + len(documents)
    if not total:
        assert messages == []
        return
    head, *lists = messages
    assert len(lists) == -(-total // POINTS_PER_MESSAGE)
    assert head.startswith(f"[bk] {total:,} points written by this run, in the {len(lists):,} ")
    named: dict[str, list[str]] = {}
    for message in lists:
        lines = message.split("\n")
        assert 1 <= len(lines) <= POINTS_PER_MESSAGE
        for line in lines:
            where, pid = line.rsplit(": ", 1)
            named.setdefault(pid, []).append(where)
    assert set(named) == {p[0] for p in points} | {d[1] for d in documents}
    for pid, file, heading in points:
        assert named[pid] == [f"{file} § {heading or '(no heading)'}"]
    for file, doc in documents:
        assert named[doc] == [f"{file} (its document record)"]
    assert point_log_path("r-1", "a b") == "/runs/r-1?logs=a%20b"
    # a long file or section is shortened: the line stays short, the file's name stays in it
    long_file, long_section = "deep/" * 30 + "the-file-name.md", "A heading " * 30
    _, line = written_points_messages("bk", [("p1", long_file, long_section)])
    where, pid = line.rsplit(": ", 1)
    assert pid == "p1" and len(where) <= WHERE_CHARS, where
    assert "the-file-name.md § A heading" in where and where.endswith("…")

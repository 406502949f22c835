"""Retrieval on both backends: tenant scoping, context expansion, documents, hybrid search."""

import pytest

from rag_pipeline.ingest.stages import ingest_book
from rag_pipeline.retrieve import SearchFilters, expand_context, get_document, search
from rag_pipeline_tests.conftest import make_recipe, make_source, section

BOOKS = [f"book-{i}" for i in range(5)]


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
        ingest_book(make_source(data_dir), book, store, recipe)
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
    ingest_book(make_source(data_dir), "errors", store, make_recipe(local_embedder))
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

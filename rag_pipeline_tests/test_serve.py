"""`rag-pipeline serve`: a real server process, its answers against the CLI's, its errors, and
its coexistence with an ingest run on the embedded store."""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from rag_pipeline.embed import EmbeddingAnswerError
from rag_pipeline_tests.conftest import REPO, make_recipe
from rag_pipeline_tests.fakes import FakeOpenAI
from rag_pipeline_tests.helpers import Cli, Server, index_sample_books

BOOK = "ros2-fundamentals"
OTHER = "humanoid-robotics-ros2"


def _indexed_cli(root, embedder=None) -> Cli:  # type: ignore[no-untyped-def]
    """A CLI of the sample books indexed directly (without Dagster) into its embedded store,
    by ``embedder`` (default: the hash embedder)."""
    return Cli(root, index_sample_books(root, embedder))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Cli]]:
    cli = _indexed_cli(tmp_path_factory.mktemp("served"))
    server = Server(cli)
    yield server, cli
    server.stop()


def _cli_args(params: dict[str, object]) -> list[str]:
    args: list[str] = []
    for key, value in params.items():
        option = "--" + {"where": "where", "proficiency": "proficiency"}.get(key, key).replace(
            "_", "-"
        )
        for v in value if isinstance(value, list) else [value]:
            args += [option, str(v)]
    return args


SEARCHES: list[dict[str, object]] = [
    {},
    {"limit": 8, "mode": "dense"},
    {"mode": "sparse", "limit": 3},
    {"fusion": "dbsf"},
    {"fusion": "rrf", "rrf_k": 10, "limit": 7},
    {"group_by": "file", "limit": 3, "group_size": 2},
    {"group_by": "file", "mode": "sparse"},
    {"chapter_min": 1, "chapter_max": 1, "limit": 20, "proficiency": ["A2", "B1"]},
    {"where": ["lesson=1"], "score_threshold": 0.2, "limit": 50},
]


@pytest.mark.integration
@pytest.mark.parametrize(
    "params", SEARCHES, ids=lambda p: "&".join(f"{k}={v}" for k, v in p.items()) or "default"
)
def test_search_body_equals_the_cli_json(served, params):
    server, cli = served
    query = "How do nodes communicate with topics?"
    response = server.get("/search", q=query, book=BOOK, **params)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body, "the request should find something"
    assert body == cli.json("search", query, "--book", BOOK, *_cli_args(params))


@pytest.mark.integration
def test_context_document_lineage_bodies_equal_the_cli_json(served):
    server, cli = served
    top = server.get("/search", q="publish subscribe", book=BOOK, limit=1).json()[0]
    context = server.get(f"/context/{top['id']}", book=BOOK, prev=2, next=1)
    assert context.status_code == 200
    assert context.json() == cli.json("context", top["id"], "--book", BOOK, "--prev", "2")
    document = server.get(f"/document/{top['parent_doc_id']}", book=BOOK)
    assert document.json() == cli.json("document", top["parent_doc_id"], "--book", BOOK)
    lineage = server.get(f"/lineage/{top['id']}", book=BOOK)
    assert lineage.json() == cli.json("lineage", top["id"], "--book", BOOK)
    assert lineage.json()["source_file"] == top["source_file"]


@pytest.mark.integration
def test_grouped_search_over_http(served):
    server, _ = served
    groups = server.get("/search", q="ROS 2 nodes", book=BOOK, group_by="file", limit=4).json()
    assert 1 <= len(groups) <= 4
    assert len({g["source_file"] for g in groups}) == len(groups)
    for g in groups:
        assert set(g) == {"source_file", "parent_doc_id", "title", "score", "hits"}
        assert 1 <= len(g["hits"]) <= 3 and g["score"] == g["hits"][0]["score"]
        assert {h["source_file"] for h in g["hits"]} == {g["source_file"]}
        assert {h["book_id"] for h in g["hits"]} == {BOOK}
    assert [g["score"] for g in groups] == sorted((g["score"] for g in groups), reverse=True)


def absent(n: int) -> str:
    """An id no test writes, the same in every process (xdist workers collect the same ids)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"absent-{n}"))


NO_BOOK_REQUESTS = [
    ("/search", {"q": "x"}),
    ("/search", {"q": "x", "book": ""}),
    ("/search", {"limit": "abc"}),  # wrong in more ways than one: the book comes first
    ("/context/" + absent(1), {}),
    ("/document/" + absent(2), {}),
    ("/lineage/" + absent(3), {"book": ""}),
    ("/lineage/not-an-id", {}),
]


@pytest.mark.integration
@pytest.mark.parametrize(("path", "params"), NO_BOOK_REQUESTS)
def test_no_book_no_answer(served, path, params):
    server, _ = served
    response = server.get(path, **params)
    assert response.status_code == 400
    assert "book" in response.json()["detail"]


BAD_REQUESTS = [
    ("/search", {"q": "x", "book": "../etc"}, 400, "invalid book id"),
    ("/search", {"q": "x", "book": BOOK, "chapter_min": 3, "chapter_max": 1}, 400, "empty"),
    ("/search", {"q": "x", "book": BOOK, "where": "nokey"}, 400, "key=value"),
    ("/search", {"q": "x", "book": BOOK, "where": "book_id=x"}, 400, "free filter"),
    ("/search", {"q": "x", "book": BOOK, "chapter_min": 2**70}, 400, "64 bits"),
    ("/search", {"q": " ", "book": BOOK}, 400, "query is empty"),
    ("/search", {"q": "?!", "book": BOOK, "mode": "sparse"}, 400, "no searchable words"),
    ("/search", {"q": "x", "book": BOOK, "score_threshold": "nan"}, 400, "finite"),
    ("/search", {"q": "x", "book": BOOK, "where": "chapter=abc"}, 400, "integer field"),
    ("/search", {"q": "x", "book": BOOK, "where": "text=x"}, 400, "not a filterable field"),
    ("/search", {"q": "x", "book": BOOK, "where": ["lesson=1", "lesson=2"]}, 400, "'lesson'"),
    ("/search", {"q": "x", "book": BOOK, "proficiency": ""}, 400, "needs a level"),
    ("/search", {"q": "x", "book": BOOK, "limit": 0}, 422, "limit"),
    ("/search", {"q": "x", "book": BOOK, "mode": "fuzzy"}, 422, "mode"),
    ("/search", {"q": "x", "book": BOOK, "fusion": "sum"}, 422, "fusion"),
    ("/search", {"q": "x", "book": BOOK, "group_by": "chapter"}, 422, "group_by"),
    ("/search", {"book": BOOK}, 422, "q"),
    ("/context/not-an-id", {"book": BOOK}, 400, "not a point id"),
    ("/context/" + absent(4), {"book": BOOK}, 404, "no chunk"),
    ("/document/" + absent(5), {"book": BOOK}, 404, "no document"),
    ("/lineage/" + absent(6), {"book": BOOK}, 404, "no point"),
    ("/context/" + absent(7), {"book": BOOK, "prev": -1}, 422, "prev"),
]


@pytest.mark.integration
@pytest.mark.parametrize(("path", "params", "status", "message"), BAD_REQUESTS)
def test_bad_input_is_answered_with_a_code_and_a_message(served, path, params, status, message):
    server, _ = served
    response = server.get(path, **params)
    assert response.status_code == status, response.text
    assert message in response.text


@pytest.mark.integration
def test_another_books_ids_are_not_found(served):
    server, _ = served
    other = server.get("/search", q="ROS", book=OTHER, limit=1).json()[0]
    assert other["book_id"] == OTHER
    assert server.get(f"/context/{other['id']}", book=BOOK).status_code == 404
    assert server.get(f"/lineage/{other['id']}", book=BOOK).status_code == 404
    assert server.get(f"/document/{other['parent_doc_id']}", book=BOOK).status_code == 404


def _declared_params() -> dict[str, list[dict[str, Any]]]:
    """Each endpoint's parameters as the app's OpenAPI spec declares them (the app is built in
    this process and never started: nothing is opened)."""
    from rag_pipeline.config import Settings
    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline.serve.app import create_app

    spec = create_app(Settings(), make_recipe(HashEmbedder())).openapi()
    return {path: ops["get"].get("parameters", []) for path, ops in spec["paths"].items()}


DECLARED = _declared_params()


def _is_list(schema: dict[str, Any]) -> bool:
    return any(s.get("type") == "array" for s in (schema, *schema.get("anyOf", ())))


def _valid_value(param: dict[str, Any]) -> object:
    """A value the parameter accepts: its default, else one of its type."""
    known = {"book": BOOK, "q": "nodes and topics"}
    schema = param["schema"]
    if param["name"] in known:
        return known[param["name"]]
    if "default" in schema:
        return schema["default"]
    kind = next(s for s in (schema, *schema.get("anyOf", ())) if s.get("type") != "null")
    if "enum" in kind or "const" in kind:
        return kind.get("const", (kind.get("enum") or [None])[0])
    return {"integer": 1, "number": 0.5}.get(kind.get("type", ""), "x")


def _request(path: str) -> tuple[str, dict[str, object]]:
    """The endpoint's URL for a random id and its required query parameters with ``book``."""
    url = path
    query: dict[str, object] = {"book": BOOK}
    for param in DECLARED[path]:
        if param["in"] == "path":
            url = url.replace("{" + param["name"] + "}", str(uuid.uuid4()))
        elif param.get("required"):
            query[param["name"]] = _valid_value(param)
    return url, query


#: every single-valued query parameter of every endpoint, and every path parameter
SINGLE_VALUED = [
    (path, p)
    for path, declared in DECLARED.items()
    for p in declared
    if p["in"] == "query" and not _is_list(p["schema"])
]
IN_PATH = [(path, p) for path, declared in DECLARED.items() for p in declared if p["in"] == "path"]


def test_the_single_valued_list_is_derived_from_every_endpoint():
    names = {(path, p["name"]) for path, p in SINGLE_VALUED}
    for tenant_path in ("/search", "/context/{chunk_id}", "/document/{parent_doc_id}"):
        assert (tenant_path, "book") in names
    assert {("/search", "q"), ("/search", "limit"), ("/context/{chunk_id}", "next")} <= names
    assert not {n for _, n in names} & {"proficiency", "where"}  # legitimately repeatable
    assert {p["name"] for _, p in IN_PATH} == {"chunk_id", "parent_doc_id", "point_id"}


@pytest.mark.integration
@pytest.mark.parametrize(
    ("path", "param"),
    [*SINGLE_VALUED, *IN_PATH],
    ids=lambda v: f"{v['in']}:{v['name']}" if isinstance(v, dict) else v,
)
def test_a_request_with_two_meanings_is_400_naming_the_parameter(served, path, param):
    """A single-valued parameter given twice, or a path parameter given in the query too."""
    server, _ = served
    url, query = _request(path)
    if param["in"] == "path":
        response = server.get(url, **query, **{param["name"]: str(uuid.uuid4())})
        said = f"{param['name']!r} is a path parameter"
    else:
        value = query.get(param["name"], _valid_value(param))
        response = server.get(url, **{**query, param["name"]: [value, value]})
        said = f"{param['name']!r} is given 2 times"
    assert response.status_code == 400, response.text
    assert said in response.json()["detail"]


@pytest.mark.integration
def test_repeatable_parameters_stay_repeatable(served):
    server, _ = served
    response = server.get(
        "/search", q="nodes", book=BOOK, proficiency=["A2", "B1"], where=["lesson=1", "chapter=1"]
    )
    assert response.status_code == 200, response.text


@pytest.mark.integration
def test_a_second_book_never_reads_the_other_book(served):
    """A gateway that checks (or sets) the first ``book`` cannot be bypassed by a second one."""
    server, _ = served
    other = server.get("/search", q="ROS", book=OTHER, limit=1).json()[0]
    assert other["book_id"] == OTHER
    requests_of_other = [
        ("/search", {"q": other["text"][:200]}),
        (f"/context/{other['id']}", {}),
        (f"/document/{other['parent_doc_id']}", {}),
        (f"/lineage/{other['id']}", {}),
    ]
    for path, query in requests_of_other:
        for books in ([BOOK, OTHER], [OTHER, BOOK]):
            response = server.get(path, **query, book=books)
            assert response.status_code == 400, (path, books, response.text)
            assert "'book' is given 2 times" in response.json()["detail"]
            assert other["text"][:200] not in response.text and OTHER not in response.text


@pytest.mark.integration
def test_health_and_docs(served):
    server, _ = served
    health = server.get("/health").json()
    assert health["status"] == "ok" and health["embedding_model"] == "hash-384"
    assert health["sparse_model"].startswith("bm25v2-")
    assert server.get("/docs").status_code == 200
    spec = server.get("/openapi.json").json()
    assert {"/search", "/context/{chunk_id}", "/document/{parent_doc_id}"} <= set(spec["paths"])
    names = {p["name"] for p in spec["paths"]["/search"]["get"]["parameters"]}
    assert {"q", "book", "fusion", "group_by", "where", "proficiency"} <= names


@pytest.mark.slow
@pytest.mark.integration
def test_ingest_while_serving_then_the_new_text_is_found(tmp_path):
    """A real `rag-pipeline ingest` runs while the service answers a stream of searches: the
    service steps aside for it, no request fails, and the new text is found right after."""
    cli = _indexed_cli(tmp_path)
    server = Server(cli)
    try:
        assert server.get("/search", q="x", book=BOOK).status_code == 200  # holds the store
        (Path(cli.env["RAG_DATA_DIR"]) / BOOK / "99-quokkatron.md").write_text(
            "---\ntitle: Quokkatron\n---\n## Flux\n\nThe quokkatron flux capacitor needs "
            "exactly 1.21 gigawatts of zorblaxian power.\n",
            encoding="utf-8",
        )
        codes: list[int] = []
        stop = threading.Event()

        def hammer() -> None:
            while not stop.is_set():
                codes.append(server.get("/search", q="nodes and topics", book=BOOK).status_code)

        thread = threading.Thread(target=hammer)
        thread.start()
        try:
            report = cli.json("ingest")
        finally:
            stop.set()
            thread.join()
        assert report["books"][BOOK]["files_new"] == 1, report
        hits = server.get("/search", q="quokkatron flux capacitor", book=BOOK, limit=1).json()
        assert hits and hits[0]["source_file"] == "99-quokkatron.md"
        print(f"{len(codes)} searches during the ingest")
        assert len(codes) >= 3 and set(codes) == {200}, codes
        assert server.get("/health").json()["store_step_asides"] >= 1
    finally:
        server.stop()


def test_the_holder_steps_aside_for_a_waiting_writer_then_reopens(tmp_path):
    """In one process: flock conflicts between open files, so a thread can play the writer."""
    import numpy as np

    from rag_pipeline.schema import COLLECTION_SCHEMA
    from rag_pipeline.schema import book_filter as tenant_filter
    from rag_pipeline.serve import StoreHolder
    from rag_pipeline.store import CollectionSpec, PointRecord
    from rag_pipeline.store.edge import EdgeStore

    def point(i: int) -> PointRecord:
        return PointRecord(str(uuid.UUID(int=i + 1)), {"book_id": "b"}, np.eye(4)[i % 4])

    def opener(wait_s: float) -> EdgeStore:
        return EdgeStore("c", tmp_path, COLLECTION_SCHEMA, busy_wait_s=wait_s)

    holder = StoreHolder(opener, busy_wait_s=20, poll_s=0.02)
    holder.start()
    try:
        with holder.store() as store:
            store.ensure_collection(CollectionSpec("c", 4))
            store.upsert([point(0)])
        assert holder.is_open  # kept open between requests
        writing = threading.Event()

        def writer() -> None:
            store = opener(20)
            # its first touch of book b waits for the holder, which steps aside while idle
            store.upsert([point(1)])
            writing.set()
            time.sleep(0.5)
            store.close()

        thread = threading.Thread(target=writer)
        thread.start()
        assert writing.wait(10), "the idle holder did not step aside"
        assert not holder.is_open
        asked = time.monotonic()
        with holder.store() as store:  # waits for the writer, then reopens: no error
            assert store.count(tenant_filter("b")) == 2
        assert time.monotonic() - asked > 0.2
        thread.join()
        assert (holder.stats.opens, holder.stats.step_asides) == (2, 1)
    finally:
        holder.close()


@pytest.mark.integration
def test_a_store_busy_past_its_wait_is_503(tmp_path):
    from rag_pipeline.schema import COLLECTION_SCHEMA
    from rag_pipeline.schema import book_filter as tenant_filter
    from rag_pipeline.store.edge import EdgeStore

    cli = _indexed_cli(tmp_path)
    cli.env["RAG_BUSY_WAIT_S"] = "1"
    server = Server(cli)
    holder = EdgeStore("rag_chunks", cli.env["RAG_QDRANT_PATH"], COLLECTION_SCHEMA)
    holder.count(tenant_filter(BOOK))  # a handle locks a book when it first touches it
    try:  # this process holds the book and never steps aside
        response = server.get("/search", q="nodes", book=BOOK)
        assert response.status_code == 503
        assert "is in use by" in response.json()["detail"]
        holder.close()
        assert server.get("/search", q="nodes", book=BOOK).status_code == 200
    finally:
        holder.close()
        server.stop()


@pytest.mark.integration
def test_a_bad_or_unavailable_embedding_api_is_502_or_503_naming_it(tmp_path):
    """Before, a NaN query vector answered 200 with no hits (dense) or the sparse half only
    (hybrid), and the embedder's other failures were 500. A bad vector is never cached."""
    from rag_pipeline.embed.openai import OpenAIEmbedder

    with FakeOpenAI() as api:
        cli = _indexed_cli(tmp_path, OpenAIEmbedder("sk-test", base_url=api.base_url))
        cli.env.update(
            RAG_EMBEDDER="openai",
            OPENAI_API_KEY="sk-test",
            OPENAI_BASE_URL=api.base_url,
            RAG_OPENAI_MAX_RETRIES="0",
        )
        server = Server(cli)
        try:
            source = f"the API at {api.base_url}/ (text-embedding-3-small)"
            for mode in ("dense", "hybrid"):
                api.script.append("nan")
                response = server.get("/search", q="nodes", book=BOOK, mode=mode)
                assert response.status_code == 502, response.text
                detail = response.json()["detail"]
                assert detail == f"{source} returned non-finite values for 1 of 1 inputs"
            api.script.append("garbage")
            assert server.get("/search", q="nodes", book=BOOK).status_code == 502
            api.script.append(429)
            response = server.get("/search", q="nodes", book=BOOK)
            assert response.status_code == 503 and "HTTP 429" in response.json()["detail"]
            assert api.base_url in response.json()["detail"]
            response = server.get("/search", q="nodes", book=BOOK, mode="dense")
            assert response.status_code == 200 and response.json(), response.text
        finally:
            server.stop()


class _FlakyQueryEmbedder:
    """A query embedder whose first answer is NaN."""

    dimension = 4
    model_name = "flaky"

    def __init__(self) -> None:
        self.answers = [np.full(4, np.nan), np.ones(4)]

    def embed_query(self, text: str) -> np.ndarray:
        return self.answers.pop(0)


def test_the_query_cache_never_keeps_a_bad_vector():
    from rag_pipeline.serve.app import CachedQueryEmbedder

    cache = CachedQueryEmbedder(_FlakyQueryEmbedder())
    with pytest.raises(EmbeddingAnswerError, match="the flaky embedder returned non-finite"):
        cache.embed_query("q")
    good = cache.embed_query("q")  # asked again: the bad one was not kept
    np.testing.assert_array_equal(good, np.ones(4))
    assert cache.embed_query("q") is good and (cache.hits, cache.misses) == (1, 1)


def test_search_refuses_a_bad_query_vector_of_any_query_embedder():
    """Not only the Embedder's own answers: whatever a search is given is checked."""
    from rag_pipeline.retrieve import search
    from rag_pipeline.schema import COLLECTION_SCHEMA
    from rag_pipeline.store.qdrant import QdrantStore

    store = QdrantStore("c", COLLECTION_SCHEMA, path=":memory:")
    try:
        with pytest.raises(EmbeddingAnswerError, match="the flaky embedder returned non-finite"):
            search(store, _FlakyQueryEmbedder(), "q", BOOK, mode="dense")
    finally:
        store.close()


def test_the_service_keeps_the_books_it_serves_loaded(tmp_path, write_book, data_dir, loads):
    """Requests for a few books in turn load each book's shard once (a handle that walks
    every book keeps two; the service keeps SERVED_BOOKS_LOADED)."""
    from fastapi.testclient import TestClient

    from rag_pipeline.config import load_settings
    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline.ingest.pipeline import IngestPipeline
    from rag_pipeline.serve.app import SERVED_BOOKS_LOADED, create_app
    from rag_pipeline_tests.conftest import section

    books = [f"book-{i}" for i in range(4)]
    for book in books:
        write_book(book, {"a.md": f"# {book}\n\n" + section("Nodes", seed=book)})
    settings = load_settings(
        data_dir=data_dir, qdrant_path=str(tmp_path / "q"), embedder="hash", cache_dir=tmp_path
    )
    recipe = make_recipe(HashEmbedder())
    IngestPipeline.from_settings(settings, recipe).run(books, run_id="r")
    loads.clear()
    assert len(books) <= SERVED_BOOKS_LOADED
    with TestClient(create_app(settings, recipe, cache_size=0)) as client:
        for _ in range(3):
            for book in books:
                response = client.get("/search", params={"q": "nodes", "book": book})
                assert response.status_code == 200 and response.json()
    assert dict(loads) == dict.fromkeys(books, 1)


@pytest.mark.integration
def test_a_service_started_before_the_first_ingest_finds_its_books(tmp_path):
    """The store did not exist when the service opened it: after an ingest (another process)
    the service answers from it, without a restart (it answered [] forever before)."""
    books = tmp_path / "books"
    shutil.copytree(REPO / "data" / "books", books)
    cli = Cli(tmp_path, books)
    server = Server(cli)
    try:
        assert server.get("/search", q="nodes", book=BOOK, mode="sparse").json() == []
        cli("ingest")
        hits = server.get("/search", q="nodes", book=BOOK, mode="sparse", limit=1).json()
        assert hits and hits[0]["book_id"] == BOOK
    finally:
        server.stop()


@pytest.mark.integration
def test_a_switch_to_another_model_between_embedding_and_search_is_searched_again(tmp_path):
    """A real ingest switches the book from hash-384 to hash-256 after the service embedded a
    query and before it searched (the service had let go of the book, as it does when another
    request backs off): the query is embedded again with hash-256 and answered 200. It was a
    500 with the engine's "Vector dimension error: expected dim: 256, got 384"."""
    from rag_pipeline.schema import COLLECTION_SCHEMA
    from rag_pipeline.store.edge import EdgeStore
    from rag_pipeline_tests.switchpoint import MARKER

    cli = _indexed_cli(tmp_path)
    server = Server(cli, entry=["rag_pipeline_tests.switchpoint", BOOK, "256"])
    try:
        for mode in ("dense", "hybrid"):
            response = server.get("/search", q=f"nodes {mode}", book=BOOK, mode=mode)
            assert response.status_code == 200 and response.json(), response.text
        response = server.get("/search", q=f"nodes and topics {MARKER}", book=BOOK)
        assert response.status_code == 200, response.text
        hits = response.json()
        assert hits and {h["book_id"] for h in hits} == {BOOK}
        assert hits == server.get("/search", q=f"nodes and topics {MARKER}", book=BOOK).json()
        assert server.get("/search", q="nodes", book=OTHER).status_code == 200
    finally:
        server.stop()
    with EdgeStore("rag_chunks", cli.env["RAG_QDRANT_PATH"], COLLECTION_SCHEMA) as store:
        assert (store.current_recipe(BOOK) or {}).get("embedding_model") == "hash-256"


#: the service's open-files limit in the slow-clients test: about 18 descriptors are its own
SLOW_FILES_LIMIT = 64
#: clients that send half a request: more than the limit leaves for connections
SLOW_CLIENTS = 50


@pytest.mark.integration
def test_half_sent_requests_are_closed_and_complete_ones_answered_meanwhile(tmp_path):
    """Clients that send half a request and stay: before, each held a descriptor for as long
    as it stayed, the process ran out of them and every other client was reset. Now at most
    half the open-files limit is held (the one that waited longest makes room), a complete
    request is answered meanwhile, and each half-sent one is answered 408 or 503 and closed
    within RAG_SERVE_READ_TIMEOUT_S."""
    from collections import Counter

    cli = _indexed_cli(tmp_path)
    cli.env["RAG_SERVE_READ_TIMEOUT_S"] = "1"
    server = Server(cli, files_limit=SLOW_FILES_LIMIT)
    slow: list[socket.socket] = []
    try:
        assert server.get("/search", q="nodes", book=BOOK).status_code == 200  # the store open
        started = time.monotonic()
        slow.append(socket.create_connection(("127.0.0.1", server.port), timeout=10))
        silent = slow[-1]  # sends nothing
        half = f"GET /search?q=nodes&book={BOOK} HTTP/1.1\r\nHost: x\r\n".encode()
        for _ in range(SLOW_CLIENTS):
            slow.append(socket.create_connection(("127.0.0.1", server.port), timeout=10))
            slow[-1].sendall(half)  # the headers never end
        held = len(os.listdir(f"/proc/{server.proc.pid}/fd"))
        assert held < SLOW_FILES_LIMIT - 8, held
        response = requests.get(
            f"{server.url}/search", params={"q": "nodes", "book": BOOK}, timeout=10
        )
        assert response.status_code == 200 and response.json(), response.text
        # each is answered and closed by the service (its reads end), within the bound
        assert _read_to_end(silent) == b""  # closed without an answer to no request
        answers = Counter(_read_to_end(s).split(b"\r\n")[0] for s in slow[1:])
        assert time.monotonic() - started < 8
        timed_out, refused = b"HTTP/1.1 408 Request Timeout", b"HTTP/1.1 503 Service Unavailable"
        assert set(answers) == {timed_out, refused}, answers
        assert server.get("/search", q="nodes", book=BOOK).status_code == 200
    finally:
        for s in slow:
            s.close()
        server.stop()


def _read_to_end(sock: socket.socket) -> bytes:
    """What the peer sends until it closes the connection."""
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


def test_a_book_whose_view_keeps_changing_or_disagrees_is_503_naming_it(
    tmp_path, write_book, data_dir, monkeypatch
):
    """The bounds of Service.search: a book switched under every try is 503 after 3 tries,
    and a generation tagged with a model of another dimension than its vectors' is 503 naming
    both (it was the engine's "Vector dimension error" as a 500)."""
    import json

    from fastapi.testclient import TestClient

    from rag_pipeline.config import load_settings
    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline.ingest.pipeline import IngestPipeline
    from rag_pipeline.retrieve import view
    from rag_pipeline.serve import app as app_module
    from rag_pipeline_tests.conftest import section

    write_book("b", {"a.md": "# b\n\n" + section("Nodes", seed="b")})
    settings = load_settings(
        data_dir=data_dir, qdrant_path=str(tmp_path / "q"), embedder="hash", cache_dir=tmp_path
    )
    IngestPipeline.from_settings(settings, make_recipe(HashEmbedder())).run(["b"], run_id="r")
    recipes = app_module.query_recipe(settings)[0]
    with TestClient(app_module.create_app(settings, recipes, cache_size=0)) as client:
        looks = iter(range(1000))
        with monkeypatch.context() as patched:  # a new generation at every look
            patched.setattr(view, "searched_signature", lambda s, b: str(next(looks)))
            response = client.get("/search", params={"q": "nodes", "book": "b"})
        assert response.status_code == 503
        assert response.json()["detail"] == (
            "book 'b': it switched to another model 3 times while this search ran "
            "(an ingest is migrating it): ask again"
        )
    # the generation's tag says hash-256, its vectors are 384-dimension ones
    pointer = tmp_path / "q" / "rag_chunks" / "books" / "b" / "current.json"
    data = json.loads(pointer.read_text())
    data["recipe"] = make_recipe(HashEmbedder(256)).tag()
    pointer.write_text(json.dumps(data))
    with TestClient(app_module.create_app(settings, recipes, cache_size=0)) as client:
        response = client.get("/search", params={"q": "nodes", "book": "b"})
        assert response.status_code == 503, response.text
        assert response.json()["detail"] == (
            "book 'b': its searched index holds 384-dimension vectors while the model it "
            "records (hash-256) makes 256"
        )
        sparse = client.get("/search", params={"q": "nodes", "book": "b", "mode": "sparse"})
        assert sparse.status_code == 200 and sparse.json()

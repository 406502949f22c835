"""Hostile probes of what README.md states as a contract: the retrieval commands' ``--json``
fields, the query service's answers to odd requests, the settings' refusals, and that a
search embeds its query with the store let go of. Each test names the fault it caught; all
run in-process (click's CliRunner, FastAPI's TestClient) over books indexed by the
production pipeline."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rag_pipeline_tests.conftest import section, write_two_file_books
from rag_pipeline_tests.helpers import InProcessCli, assert_no_trace, index_books

BOOK, OTHER = "alpha", "beta"


def write_books(root: Path) -> Path:
    return write_two_file_books(root, (BOOK, OTHER))


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessCli]:
    """Two books indexed directly into the store a CLI of the folder reads."""
    root = tmp_path_factory.mktemp("contract")
    books = write_books(root)
    cli = InProcessCli(root, books)
    index_books(books, cli.env["RAG_QDRANT_PATH"])
    yield cli


def cli_json(cli: InProcessCli, *args: str) -> Any:
    done = cli(*args, "--json")
    assert_no_trace(done.stderr)
    return json.loads(done.stdout)


# -- the CLI's search embeds with the model the book records -----------------------------


def test_a_book_not_migrated_to_the_configured_api_is_searched_while_the_api_is_down(indexed):
    """The configured model is an OpenAI API that cannot be reached; the book records another
    model this process makes (the hash model, as a local model before a change of provider):
    its search answers, and the API's error is never raised for it (nor the API called)."""
    cli = InProcessCli(indexed.cwd, Path(indexed.env["RAG_DATA_DIR"]))
    cli.env = {
        **indexed.env,
        "RAG_EMBEDDER": "openai",
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_BASE_URL": "http://127.0.0.1:9",  # nothing listens: connection refused
        "RAG_OPENAI_MAX_RETRIES": "0",
    }
    hits = cli_json(cli, "search", "nodes", "--book", BOOK, "--mode", "dense")
    assert hits and {h["embedding_model"] for h in hits} == {"hash-384"}


def test_a_book_recording_another_model_than_the_configured_one_is_searched_with_its_own(
    indexed,
):
    """The configured model (hash-128) is not the book's (hash-384, not migrated yet): the
    book's model embeds the query, never compared across models (a 128-dimension vector
    searched against 384 would be an engine error)."""
    cli = InProcessCli(indexed.cwd, Path(indexed.env["RAG_DATA_DIR"]))
    cli.env = {**indexed.env, "RAG_HASH_DIMENSION": "128"}
    for mode in ("dense", "hybrid"):
        hits = cli_json(cli, "search", "nodes", "--book", BOOK, "--mode", mode)
        assert hits and {h["embedding_model"] for h in hits} == {"hash-384"}, mode


# -- lineage --json: every documented field, from every kind of hit ----------------------

LINEAGE_DOCUMENTED = {
    "file_path",
    "file_exists",
    "current_file_hash",
    "file_changed_since_indexed",
    "file_problem",
    "source_version",
    "document_status",
    "document_run_id",
    "dagster_run_url_path",
    "dagster_run_url",
}


def test_lineage_has_every_documented_field_for_a_chunk_and_a_document_record(indexed):
    """Fault: `lineage --json` of a document record (a `parent_doc_id`, a point of its own)
    had no `document_status`, `document_run_id` (the record is its own document), and a
    point without a run id no `dagster_run_url*`: a client reading the documented fields
    failed on a KeyError. Every answer now holds each of them (null when unknown)."""
    hit = cli_json(indexed, "search", "nodes", "--book", BOOK, "--limit", "1")[0]
    chunk = cli_json(indexed, "lineage", hit["id"], "--book", BOOK)
    record = cli_json(indexed, "lineage", hit["parent_doc_id"], "--book", BOOK)
    for info in (chunk, record):
        assert info.keys() >= LINEAGE_DOCUMENTED, LINEAGE_DOCUMENTED - info.keys()
        assert info["book_id"] == BOOK and info["file_changed_since_indexed"] is False
        assert info["document_status"] == "ok" and info["document_run_id"] == "direct"
        assert info["dagster_run_url"].endswith("/runs/direct")
    assert record["record_type"] == "document" and chunk["record_type"] == "chunk"
    assert set(chunk) == set(record)


# -- the query service: HEAD, odd query strings -------------------------------------------


@pytest.fixture(scope="module")
def served(indexed: InProcessCli) -> Iterator[Any]:
    """The production app over the books of ``indexed``."""
    from fastapi.testclient import TestClient

    from rag_pipeline.config import load_settings
    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline.serve.app import create_app
    from rag_pipeline_tests.conftest import make_recipe

    settings = load_settings(
        data_dir=indexed.env["RAG_DATA_DIR"],
        qdrant_path=indexed.env["RAG_QDRANT_PATH"],
        embedder="hash",
        cache_dir=indexed.env["RAG_CACHE_DIR"],
    )
    with TestClient(create_app(settings, make_recipe(HashEmbedder()), cache_size=0)) as client:
        yield client


def test_head_is_answered_as_get_without_a_body(served):
    """Fault: HEAD of every route was 405 (FastAPI's routes take GET alone), so a load
    balancer's or monitor's `HEAD /health` took the service for down. HEAD answers as GET
    does (status, headers, Content-Length), without the body."""
    hit = served.get("/search", params={"q": "nodes", "book": BOOK, "limit": 1}).json()[0]
    for path, params in [
        ("/health", {}),
        ("/search", {"q": "nodes", "book": BOOK}),
        (f"/lineage/{hit['id']}", {"book": BOOK}),
        (f"/document/{hit['parent_doc_id']}", {"book": BOOK}),
        ("/search", {"q": "nodes"}),  # no book: 400, as GET
        (f"/lineage/{hit['id']}", {"book": OTHER}),  # another book's point: 404, as GET
    ]:
        got = served.get(path, params=params)
        head = served.head(path, params=params)
        assert head.status_code == got.status_code, (path, params, head.status_code)
        assert head.content == b""
        assert head.headers["content-length"] == got.headers["content-length"]
    refused = served.request("PUT", "/health")
    assert refused.status_code == 405
    assert {m.strip() for m in refused.headers["allow"].split(",")} == {"GET", "HEAD"}


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("q=%ff&book=alpha", "'q'"),  # read as U+FFFD, and searched for
        ("q=nodes&book=alpha&module=%ff", "'module'"),  # a filter matching nothing: []
        ("q=nodes&book=alpha&where=source_file%3D%c3", "'where'"),
        ("q=nodes&book=alpha&proficiency=%fe", "'proficiency'"),
        ("q=nodes&book=alpha&modul=x", "'modul'"),  # misspelled: dropped, a wider answer
        ("q=nodes&book=alpha&chapter-min=3", "'chapter-min'"),  # the CLI's spelling
        ("q=nodes&book=alpha&Book=beta", "'Book'"),
    ],
)
def test_a_query_parameter_the_service_would_misread_is_400_naming_it(served, query, named):
    """Fault: a percent-escape that is not UTF-8 was read as U+FFFD (a search for it, a
    filter that matches nothing: 200 and [] where the CLI exits 2), and an unknown
    parameter was dropped silently (a misspelled filter widened the answer). Both are 400
    naming the parameter, as the CLI refuses them."""
    response = served.get(f"/search?{query}")
    assert response.status_code == 400, response.text
    assert named in response.json()["detail"]


def test_context_document_and_lineage_refuse_what_they_do_not_take(served):
    hit = served.get("/search", params={"q": "nodes", "book": BOOK, "limit": 1}).json()[0]
    for path in (f"/context/{hit['id']}", f"/document/{hit['parent_doc_id']}"):
        response = served.get(path, params={"book": BOOK, "limit": 1})
        assert response.status_code == 400 and "'limit'" in response.json()["detail"]
    response = served.get(f"/lineage/{hit['id']}", params={"book": BOOK, "x": "%ff"})
    assert response.status_code == 400


# -- settings: a bad value is exit 2 naming its variable, a key never shown ----------------


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        # fault: a host an HTTP client cannot parse passed the check, then failed the first
        # request as "unexpected LocationParseError" (exit 1), or went into lineage's links
        ("RAG_QDRANT_URL", "http://qdrant host:6333"),
        ("RAG_QDRANT_URL", "http://a..b:6333"),
        ("OPENAI_BASE_URL", "https://api.openai.com\t/v1"),
        ("RAG_DAGSTER_URL", "http://dagster\u00a0ui:3000"),
        # fault: a key that cannot be sent in a header (non-ASCII: an encoding error naming
        # the header; a newline read from a file, spaces: a wrong key for the server)
        ("OPENAI_API_KEY", "sk-caf\u00e9"),
        ("OPENAI_API_KEY", "sk-abc\n"),
        ("OPENAI_API_KEY", "   "),
        ("RAG_QDRANT_API_KEY", "key with spaces"),
        # fault: no upper bound (a number no window can reach)
        ("RAG_OPENAI_REQUESTS_PER_MINUTE", "9" * 30),
        ("RAG_OPENAI_TOKENS_PER_MINUTE", "9" * 30),
        # fault: a blank model name was taken as a model
        ("RAG_OPENAI_MODEL", " "),
    ],
)
def test_a_bad_setting_is_exit_2_naming_its_variable_and_never_showing_a_key(
    indexed, variable, value
):
    cli = InProcessCli(indexed.cwd, Path(indexed.env["RAG_DATA_DIR"]))
    cli.env = {**indexed.env, variable: value}
    done = cli("search", "nodes", "--book", BOOK, "--json", check=False)
    assert done.returncode == 2, (variable, value, done.stdout, done.stderr)
    assert variable in done.stderr and done.stdout == ""
    # fault: OPENAI_* variables were named RAG_OPENAI_*, which the README does not list
    assert f"RAG_{variable}" not in done.stderr
    assert_no_trace(done.stderr)
    if "API_KEY" in variable and value.strip():
        assert value.strip() not in done.stderr  # the key itself is never printed


def test_good_urls_and_keys_are_still_taken():
    from rag_pipeline.config import load_settings

    for url in (
        "http://localhost:6333",
        "https://xyz-example.eu-central.aws.cloud.qdrant.io:6333",
        "http://[::1]:6333",
        "http://qdrant_db:6333",  # a compose service name
        "http://b\u00fccher.example/api/",  # IDNA
    ):
        settings = load_settings(qdrant_url=url, dagster_url=url, openai_base_url=url)
        assert settings.qdrant_url == url.rstrip("/")
    key = "sk-proj-AbC_123-xyz"
    settings = load_settings(openai_api_key=key, qdrant_api_key="")
    assert settings.embedding().openai_api_key == key and settings.qdrant_api_key is not None


# -- JSON output: always UTF-8 -------------------------------------------------------------


def test_json_output_is_utf8_under_a_data_folder_whose_name_is_not(tmp_path):
    """Fault: a data folder whose name holds a byte that is not UTF-8 (Linux allows it;
    Python reads it as a lone surrogate) reached `lineage --json`'s `file_path`: the CLI
    failed writing it ("unexpected UnicodeEncodeError", exit 1) and the service answered
    500. Both now write the byte as its JSON escape: valid UTF-8, parsed back as read."""
    import os

    from fastapi.testclient import TestClient

    from rag_pipeline.config import load_settings
    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline.serve.app import create_app
    from rag_pipeline_tests.conftest import make_recipe

    books = Path(os.fsdecode(bytes(tmp_path) + b"/b\xffooks"))
    (books / BOOK).mkdir(parents=True)
    (books / BOOK / "a.md").write_text("# A\n\n" + section("Nodes", seed="x"))
    cli = InProcessCli(tmp_path, books)
    index_books(books, cli.env["RAG_QDRANT_PATH"])
    hit = cli_json(cli, "search", "nodes", "--book", BOOK)[0]
    done = cli("lineage", hit["id"], "--book", BOOK, "--json")
    assert json.loads(done.stdout)["file_path"] == str(books / BOOK / "a.md")
    settings = load_settings(
        data_dir=books, qdrant_path=cli.env["RAG_QDRANT_PATH"], embedder="hash", cache_dir=tmp_path
    )
    with TestClient(create_app(settings, make_recipe(HashEmbedder()), cache_size=0)) as client:
        response = client.get(f"/lineage/{hit['id']}", params={"book": BOOK})
        assert response.status_code == 200, response.text
        response.content.decode("utf-8")  # valid UTF-8
        assert json.loads(response.content)["file_path"] == str(books / BOOK / "a.md")


# -- exit codes: 0, 1, 2 or 141, whatever fails ---------------------------------------------


def test_serve_that_cannot_listen_is_exit_2_for_a_bad_host_and_1_for_a_busy_port(indexed):
    """Fault: `serve` passed on uvicorn's own exit code 3 (its startup failure) for a host
    name that does not resolve and for a port already in use; the README's codes are 0, 1,
    2 and 141. A host that is not an address is now a bad argument (2, naming --host), a
    port in use failed work (1)."""
    import socket

    done = indexed("serve", "--host", "no such host", "--port", "8999", check=False)
    assert done.returncode == 2 and "--host" in done.stderr, done.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        done = indexed("serve", "--host", "127.0.0.1", "--port", port, check=False)
    assert done.returncode == 1, done.stderr
    assert "address already in use" in done.stderr
    assert_no_trace(done.stderr)


def test_every_error_body_is_a_detail_text_naming_the_parameter(served):
    """Fault: the service's errors are `{"detail": "..."}`, except a 422, whose detail was
    FastAPI's list of objects: a client showing the reason showed a Python list. Every
    error now gives its reason as text, naming the parameter and the value given."""
    hit = served.get("/search", params={"q": "nodes", "book": BOOK, "limit": 1}).json()[0]
    cases = [
        ("/search", {"q": "nodes", "book": BOOK, "limit": 1001}, 422, "'limit'"),
        ("/search", {"q": "nodes", "book": BOOK, "mode": "DENSE"}, 422, "'DENSE'"),
        ("/search", {"book": BOOK}, 422, "'q'"),
        (f"/context/{hit['id']}", {"book": BOOK, "prev": "x"}, 422, "'prev'"),
        ("/search", {"q": "nodes", "book": BOOK, "where": "nope=1"}, 400, "nope"),
        (f"/lineage/{hit['id']}", {"book": OTHER}, 404, OTHER),
        ("/nothing", {}, 404, "Not Found"),
    ]
    for path, params, status, named in cases:
        response = served.get(path, params=params)
        assert response.status_code == status, (path, params, response.text)
        detail = response.json()["detail"]
        assert isinstance(detail, str) and named in detail, (path, params, detail)
    assert isinstance(served.delete("/health").json()["detail"], str)


# -- the CLI and the service read every shared parameter by one rule ----------------------

SHARED_VALUES = [
    ("limit", "1.0"),  # the service's int took it, the CLI refused it
    ("limit", "٣"),  # the CLI's int took Arabic-Indic digits, the service refused them
    ("limit", "3"),
    ("limit", "+3"),
    ("limit", ""),
    ("limit", "1001"),
    ("score_threshold", "0.1"),
    ("score_threshold", "٠.5"),
    ("score_threshold", "nan"),
    ("group_size", "2.0"),
    ("chapter_min", "1.0"),
    ("chapter_max", "2"),
    ("lesson", "٢"),
    ("hardware_tier", "1e0"),
    ("rrf_k", "60.0"),
    ("fusion", "RRF"),
    ("fusion", "rrf"),
    ("mode", "Dense"),
    ("mode", "sparse"),
    ("group_by", "file"),
    ("where", "module=m"),
    ("where", "nope=1"),
    ("proficiency", ""),
    ("proficiency", "beginner"),
    ("module", "m"),
]


@pytest.mark.parametrize(("name", "text"), SHARED_VALUES)
def test_the_cli_and_the_service_accept_and_refuse_the_same_values(indexed, served, name, text):
    """Fault: the service read its parameters with pydantic's types and the CLI with
    click's: `limit=1.0` was a search in the service and exit 2 in the CLI, `--limit ٣`
    the other way round. Both now read every value by one rule (Param.read): a value is
    taken by both or refused by both, the CLI with exit 2, the service with 400/422 naming
    the parameter."""
    from rag_pipeline.retrieve.params import param

    flag = param(name).flag
    done = indexed("search", "nodes", "--book", BOOK, flag, text, "--json", check=False)
    response = served.get("/search", params={"q": "nodes", "book": BOOK, name: text})
    assert_no_trace(done.stderr)
    if done.returncode == 0:
        assert response.status_code == 200, (response.text, done.stdout)
        assert response.json() == json.loads(done.stdout)
    else:
        assert done.returncode == 2, done.stderr
        assert response.status_code in (400, 422), response.text
        detail = response.json()["detail"]
        assert name in detail or text in detail, detail


@pytest.mark.parametrize("text", ["1.0", "٢", "2", "101"])
def test_context_reads_prev_and_next_by_the_same_rule(indexed, served, text):
    hit = served.get("/search", params={"q": "nodes", "book": BOOK, "limit": 1}).json()[0]
    done = indexed("context", hit["id"], "--book", BOOK, "--prev", text, "--json", check=False)
    response = served.get(f"/context/{hit['id']}", params={"book": BOOK, "prev": text})
    assert (done.returncode, response.status_code) in ((0, 200), (2, 422)), (
        done.stderr,
        response.text,
    )


def test_the_openapi_document_describes_the_error_bodies_the_service_sends(served):
    """Fault: a 422's body is `{"detail": "text"}`, but /openapi.json still described
    FastAPI's list of objects: a client generated from it failed to read every 422. The
    document's 422 body is the detail text; the parameters keep their types."""
    document = served.get("/openapi.json").json()
    schemas = document["components"]["schemas"]
    search = document["paths"]["/search"]["get"]
    ref = search["responses"]["422"]["content"]["application/json"]["schema"]["$ref"]
    body = schemas[ref.rsplit("/", 1)[1]]
    assert body["properties"] == {"detail": {"type": "string", "title": "Detail"}}
    assert body["required"] == ["detail"]
    sent = served.get("/search", params={"q": "nodes", "book": BOOK, "limit": "x"})
    assert sent.status_code == 422 and set(sent.json()) == {"detail"}
    assert isinstance(sent.json()["detail"], str)
    params = {p["name"]: p["schema"] for p in search["parameters"]}
    assert params["limit"]["type"] == "integer" and params["limit"]["maximum"] == 1000
    assert params["mode"]["enum"] == ["dense", "sparse", "hybrid"]
    assert params["where"]["type"] == "array"


# -- a read-only command never creates the store it reads ----------------------------------

ABSENT_ID = "11111111-1111-1111-1111-111111111111"


def test_read_only_commands_never_create_the_store_or_dagster_home(tmp_path):
    """Fault: `search` on a fresh RAG_QDRANT_PATH created the store's folder, its
    collection and a lock (`context`, `document`, `lineage` and `plan` a lock file): a
    read wrote where nothing was asked to be written (a mistyped path became an empty
    store). A store that holds nothing is read as an empty one: `[]` with a note for
    search, "no ..." (exit 1) for an id, and nothing is created."""
    books = write_books(tmp_path)
    cli = InProcessCli(tmp_path, books)
    store, home = Path(cli.env["RAG_QDRANT_PATH"]), Path(cli.env["DAGSTER_HOME"])
    done = cli("search", "nodes", "--book", BOOK, "--json")
    assert json.loads(done.stdout) == [] and "nothing indexed" in done.stderr
    for command in ("context", "document", "lineage"):
        done = cli(command, ABSENT_ID, "--book", BOOK, check=False)
        assert done.returncode == 1 and "no " in done.stderr, (command, done.stderr)
    cli("plan", "--json")
    cli("books")
    assert not store.exists() and not home.exists(), sorted(tmp_path.rglob("*"))


def test_the_service_never_creates_the_store_it_reads(tmp_path):
    from fastapi.testclient import TestClient

    from rag_pipeline.config import load_settings
    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline.serve.app import create_app
    from rag_pipeline_tests.conftest import make_recipe

    store = tmp_path / "qdrant"
    settings = load_settings(
        data_dir=str(write_books(tmp_path)), qdrant_path=str(store), embedder="hash"
    )
    with TestClient(create_app(settings, make_recipe(HashEmbedder()), cache_size=0)) as client:
        assert client.get("/health").status_code == 200
        found = client.get("/search", params={"q": "nodes", "book": BOOK})
        assert found.status_code == 200 and found.json() == []
        for path in ("context", "document", "lineage"):
            assert client.get(f"/{path}/{ABSENT_ID}", params={"book": BOOK}).status_code == 404
    assert not store.exists()


def test_books_first_without_books_is_exit_1_and_without_a_data_folder_exit_2(tmp_path):
    """Fault: `books --first` over an empty data folder exited 2, the code of a bad argument
    or setting, though the same folder is listed (`books`, exit 0), planned and ingested as
    empty: the settings are good and what was asked does not exist, which is exit 1 (as an
    id no book holds). A data folder that does not exist is a setting: exit 2 everywhere."""
    empty = tmp_path / "books"
    empty.mkdir()
    cli = InProcessCli(tmp_path, empty)
    assert cli("books").stdout == ""
    done = cli("books", "--first", check=False)
    assert done.returncode == 1 and "no book folders" in done.stderr, done.stderr
    empty.rmdir()
    for command in (("books",), ("books", "--first"), ("plan",)):
        done = cli(*command, check=False)
        assert done.returncode == 2 and "RAG_DATA_DIR" in done.stderr, (command, done.stderr)


# -- a failed book's errors count its failure ----------------------------------------------


@pytest.mark.slow  # a run whose step fails at every retry (the waits shortened)
def test_a_failed_books_errors_count_every_entry_of_its_error_messages(
    tmp_path, monkeypatch, quick_step_retries
):
    """Fault: a book whose embedding step failed reported `"errors": 0` beside the step's
    failure in `error_messages` (the run's result was built from the message alone). README:
    `errors` counts the entries of `error_messages`, each bad file and a failed step or run;
    the table's errors column is the same number."""
    from rag_pipeline.embed import EmbedServiceError
    from rag_pipeline.embed.base import Embedder

    def refuse(self: Any, texts: Any, progress: Any = None) -> Any:
        raise EmbedServiceError("the embedding service refused the batch")

    monkeypatch.setattr(Embedder, "embed", refuse)
    books = write_books(tmp_path)
    cli = InProcessCli(tmp_path, books)
    done = cli("ingest", "--book", BOOK, "--json", check=False)
    assert done.returncode == 1, done.stderr
    book = json.loads(done.stdout)["books"][BOOK]
    assert book["status"] == "failed" and book["error_messages"], book
    assert book["errors"] == len(book["error_messages"]), book
    assert quick_step_retries, "the step's retries were not in this path"


def test_a_results_errors_count_its_error_messages_whoever_made_it():
    """The rule of `errors` lives in BookResult: a failed run's result made by live mode or
    the runner (one message, no count) says 1 error in `watch --json` as in `ingest --json`."""
    from rag_pipeline.ingest.report import BookResult

    failed = BookResult("alpha", "failed", error_messages=["step embeddings failed: boom"])
    assert failed.as_dict()["errors"] == 1
    counted = BookResult("alpha", "ingested", errors=3, error_messages=["a", "b", "c"])
    assert counted.as_dict()["errors"] == 3

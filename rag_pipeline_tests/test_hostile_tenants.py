"""Hostile probes of retrieval's tenant scoping, through the product's paths: the CLI
(in-process CliRunner) and the query service (FastAPI's TestClient over the production app),
over an embedded store indexed by the production pipeline with the hash embedder.

Books ``alpha`` and ``Alpha`` (a case variant), ``docs`` and ``docs-old`` (a prefix) and
``beta`` are indexed side by side. Each probe asks for one book and checks that no answer,
count or message of another book comes back, and that what cannot be answered is an exit 2 /
a 4xx naming the value and why, bounded in what it costs. test_hostile_serve.py and
test_serve.py probe the service's own parsing (odd ids on some endpoints, a book given twice,
a filter that names the tenant); this file covers the CLI beside it, every endpoint, and the
faults it found (each test says which)."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rag_pipeline_tests.conftest import make_recipe, section, write_two_file_books
from rag_pipeline_tests.gitbooks import NEEDS_GIT
from rag_pipeline_tests.helpers import InProcessCli, index_books

BOOKS = ("alpha", "Alpha", "docs", "docs-old", "beta")
#: a Dagster UI behind basic authentication: lineage links it, never with its password
DAGSTER_WITH_CREDENTIALS = "http://admin:s3cret@dagster.example:3000/"


@dataclass
class Indexed:
    client: Any  # the service's TestClient
    cli: InProcessCli
    data_dir: Path
    store_path: Path
    #: one hit of each book (search --json), by book
    hits: dict[str, dict[str, Any]]


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Indexed]:
    from fastapi.testclient import TestClient

    from rag_pipeline.config import load_settings
    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline.serve.app import create_app

    root = tmp_path_factory.mktemp("tenants")
    data_dir = write_two_file_books(root, BOOKS)
    cli = InProcessCli(root, data_dir)
    cli.env["RAG_BUSY_WAIT_S"] = "5"
    cli.env["RAG_DAGSTER_URL"] = DAGSTER_WITH_CREDENTIALS
    store_path = Path(cli.env["RAG_QDRANT_PATH"])
    index_books(data_dir, str(store_path))
    settings = load_settings(
        data_dir=data_dir,
        qdrant_path=str(store_path),
        embedder="hash",
        cache_dir=root / "cache",
        dagster_url=DAGSTER_WITH_CREDENTIALS,
    )
    app = create_app(settings, make_recipe(HashEmbedder()), cache_size=0)
    # a bug's 500 is answered as a client sees it (test_an_unexpected_error_...)
    with TestClient(app, raise_server_exceptions=False) as client:
        hits = {
            book: client.get("/search", params={"q": "nodes", "book": book, "limit": 1}).json()[0]
            for book in BOOKS
        }
        yield Indexed(client, cli, data_dir, store_path, hits)


def _cli(indexed: Indexed, *args: str) -> tuple[int, str, str]:
    done = indexed.cli(*args, check=False)
    assert "Traceback" not in done.stdout + done.stderr
    return done.returncode, done.stdout, done.stderr


def _secrets_of(hit: dict[str, Any]) -> list[str]:
    """What of a book's point must never appear in an answer about another book."""
    return [hit["text"][:60], hit["source_file_hash"], hit["content_hash"], hit["parent_doc_id"]]


# -- a point of book B asked as book A ---------------------------------------------------------

BY_ID = [("lineage", "id"), ("context", "id"), ("document", "parent_doc_id")]


@pytest.mark.parametrize(("command", "field"), BY_ID)
@pytest.mark.parametrize("asked", ["alpha", "Beta", "BETA", "bet", "beta-old", "docs"])
def test_another_books_point_is_not_found_and_nothing_of_it_is_said(indexed, command, field, asked):
    """beta's chunk and document ids asked of another book (a case variant, a prefix, a
    longer name included): 404 / exit 1 saying the id and the book asked, nothing of beta."""
    theirs = indexed.hits["beta"]
    point = theirs[field]
    response = indexed.client.get(f"/{command}/{point}", params={"book": asked})
    assert response.status_code == 404, response.text
    assert response.json()["detail"].endswith(f"{point} in book {asked}")
    code, out, err = _cli(indexed, command, point, "--book", asked, "--json")
    assert code == 1 and out == "", out
    assert f"in book {asked}" in err
    for said in (response.text, err):
        assert "beta" not in said.replace(asked, "")
        assert not any(secret in said for secret in _secrets_of(theirs) if secret != point)


def test_a_document_record_id_is_a_point_of_its_book_only(indexed):
    """lineage takes a document record's id too (it is a point): of its own book only."""
    doc = indexed.hits["beta"]["parent_doc_id"]
    own = indexed.client.get(f"/lineage/{doc}", params={"book": "beta"})
    assert own.status_code == 200 and own.json()["book_id"] == "beta", own.text
    assert indexed.client.get(f"/lineage/{doc}", params={"book": "alpha"}).status_code == 404
    # and a chunk id is no document: context and document never mix the two
    chunk = indexed.hits["beta"]["id"]
    assert indexed.client.get(f"/document/{chunk}", params={"book": "beta"}).status_code == 404
    assert indexed.client.get(f"/context/{doc}", params={"book": "beta"}).status_code == 404


# -- book ids: case variants and prefixes are other books; hostile ones are refused -----------


@pytest.mark.parametrize(
    ("asked", "answered"),
    [
        ("alpha", "alpha"),
        ("Alpha", "Alpha"),
        ("ALPHA", None),  # no such book: nothing, never alpha's or Alpha's
        ("aLpha", None),
        ("docs", "docs"),
        ("docs-old", "docs-old"),
        ("doc", None),
        ("docs-", None),
        ("docs-ol", None),
        ("docs.old", None),
        ("docs_old", None),
        ("alpha.", None),
    ],
)
def test_case_variants_and_prefixes_are_other_books(indexed, asked, answered):
    for mode in ("dense", "sparse", "hybrid"):
        response = indexed.client.get(
            "/search", params={"q": "nodes topics", "book": asked, "mode": mode, "limit": 50}
        )
        assert response.status_code == 200, response.text
        books = {h["book_id"] for h in response.json()}
        assert books == ({answered} if answered else set()), (mode, books)
        grouped = indexed.client.get(
            "/search", params={"q": "nodes", "book": asked, "mode": mode, "group_by": "file"}
        ).json()
        assert {h["book_id"] for g in grouped for h in g["hits"]} <= {answered}
    code, out, _ = _cli(indexed, "search", "nodes topics", "--book", asked, "--json")
    assert code == 0 and {h["book_id"] for h in json.loads(out)} <= {answered}


HOSTILE_BOOKS = [
    ("..", "starts with '.'"),
    (".", "starts with '.'"),
    ("a/b", "contains '/'"),
    ("alpha/../beta", "contains '/'"),
    ("%2e%2e", "contains '%'"),
    ("a,b", "contains ','"),
    ("alpha beta", "contains ' '"),
    ("alpha*", "contains '*'"),
    ("\u0391lpha", "U+0391 GREEK CAPITAL LETTER ALPHA"),
    ("alph\u0430", "U+0430 CYRILLIC SMALL LETTER A"),
    ("\uff41lpha", "U+FF41 FULLWIDTH LATIN SMALL LETTER A"),
    ("alpha\u200b", "U+200B ZERO WIDTH SPACE"),
    ("alpha\x00", "contains"),
    ("alpha\n", "contains"),
    ("-alpha", "starts with '-'"),
    ("x" * 129, "129 characters long"),
    ("x" * 60_000, "60000 characters long"),
    ("beta..", "'..'"),
]


@pytest.mark.parametrize(("book", "why"), HOSTILE_BOOKS, ids=lambda v: repr(v)[:30])
def test_a_hostile_book_id_is_refused_everywhere_naming_it_and_why(indexed, book, why):
    """Every place a book id is taken, the one rule (models.validate_book_id): 400 / exit 2
    saying the value (shown printable) and what is wrong; never an answer."""
    theirs = indexed.hits["beta"]
    for path, params in (
        ("/search", {"q": "nodes"}),
        (f"/context/{theirs['id']}", {}),
        (f"/document/{theirs['parent_doc_id']}", {}),
        (f"/lineage/{theirs['id']}", {}),
    ):
        response = indexed.client.get(path, params={**params, "book": book})
        assert response.status_code == 400, (path, response.text[:300])
        detail = response.json()["detail"]
        assert "invalid book id" in detail and why in detail, detail[:300]
        assert len(detail) < 600  # a long id is shown, not echoed whole
    for command, point in (
        ("search", "nodes"),
        ("context", theirs["id"]),
        ("document", theirs["parent_doc_id"]),
        ("lineage", theirs["id"]),
    ):
        code, out, err = _cli(indexed, command, point, "--book", book, "--json")
        assert code == 2 and out == "", (command, out)
        assert "invalid book id" in err and why in " ".join(err.split()), err[:300]


@pytest.mark.parametrize("book", ["", None])
def test_no_book_is_refused_before_anything_is_read(indexed, book):
    params = {} if book is None else {"book": book}
    for path in ("/search?q=nodes", f"/lineage/{indexed.hits['beta']['id']}"):
        response = indexed.client.get(path, params=params)
        assert response.status_code == 400 and "book" in response.json()["detail"]
    args = [] if book is None else ["--book", book]
    code, _, err = _cli(indexed, "lineage", indexed.hits["beta"]["id"], *args)
    assert code == 2 and "--book is required" in err


# -- what a caller passes beside the book: bounded, clear errors ------------------------------

HUGE = "1" * 5000  # past Python's 4300-digit conversion limit


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"limit": HUGE}, "'limit'"),
        ({"chapter_min": HUGE}, "'chapter_min'"),
        ({"rrf_k": "-" + HUGE}, "'rrf_k'"),
        ({"where": "chapter=" + HUGE}, "chapter is an integer field"),
        ({"where": "lesson=--5"}, "lesson is an integer field"),
        ({"where": "lesson=5.0"}, "lesson is an integer field"),
        ({"where": "lesson=\u0663"}, "lesson is an integer field"),
    ],
)
def test_an_integer_text_is_read_by_one_rule_with_a_clear_reason(indexed, params, named):
    """Fault: 5000 digits answered "Exceeds the limit (4300 digits) for integer string
    conversion ... use sys.set_int_max_str_digits()" (Python's own words, naming no
    parameter), and ``where lesson=--5`` "invalid literal for int() with base 10"; a
    ``where`` integer and a parameter's were read by two rules (``+5`` taken by one only)."""
    response = indexed.client.get("/search", params={"q": "nodes", "book": "alpha", **params})
    assert response.status_code in (400, 422), response.text[:300]
    detail = response.json()["detail"]
    assert named in detail and "sys." not in detail and "int()" not in detail, detail[:300]
    assert len(detail) < 400
    name, value = next(iter(params.items()))
    flag = "--where" if name == "where" else "--" + name.replace("_", "-")
    code, _, err = _cli(indexed, "search", "nodes", "--book", "alpha", flag, value)
    assert code == 2, err
    assert "sys." not in err and "int()" not in err, err[:300]


def test_a_where_integer_takes_what_an_integer_parameter_takes(indexed):
    for value in ("+1", "0001", "-0"):
        response = indexed.client.get(
            "/search", params={"q": "nodes", "book": "alpha", "where": f"lesson={value}"}
        )
        assert response.status_code == 200, (value, response.text)
        code, _, err = _cli(
            indexed, "search", "nodes", "--book", "alpha", "--where", f"lesson={value}"
        )
        assert code == 0, err


def test_a_query_longer_than_the_bound_is_refused_naming_it(indexed):
    """Fault: a query of any length was embedded, analysed and kept in the service's cache
    (the CLI took 128 KiB, the service what uvicorn let through: about 64 KiB, and past it
    uvicorn's text/plain 400). Now one bound, said."""
    from rag_pipeline.retrieve.request import MAX_QUERY_CHARS

    words = ("nodes " * MAX_QUERY_CHARS)[:MAX_QUERY_CHARS]
    ok = indexed.client.get("/search", params={"q": words, "book": "alpha", "mode": "sparse"})
    assert ok.status_code == 200, ok.text[:200]
    for mode in ("dense", "sparse", "hybrid"):
        response = indexed.client.get(
            "/search", params={"q": words + "x", "book": "alpha", "mode": mode}
        )
        assert response.status_code == 400, response.text[:200]
        assert f"at most {MAX_QUERY_CHARS:,}" in response.json()["detail"]
    code, _, err = _cli(indexed, "search", words + "x", "--book", "alpha")
    assert code == 2 and f"at most {MAX_QUERY_CHARS:,}" in err


@pytest.mark.parametrize(
    ("params", "status"),
    [
        ({"q": "the of and a", "mode": "sparse"}, 400),  # only stop words
        ({"q": "\U0001f680\U0001f916", "mode": "sparse"}, 400),  # only emoji
        ({"q": "\U0001f680\U0001f916", "mode": "hybrid"}, 200),
        ({"limit": "1000000000"}, 422),
        ({"limit": "-1"}, 422),
        ({"score_threshold": "NaN"}, 400),
        ({"score_threshold": "-inf"}, 400),
        ({"score_threshold": "1e999"}, 400),
        ({"offset": "10"}, 400),  # not a parameter: never silently dropped
        ({"book_id": "beta"}, 400),
        ({"tenant": "beta"}, 400),
        ({"where": "book_id=beta"}, 400),
        ({"where": "record_type=document"}, 400),
        ({"where": "section_title=Nodes"}, 400),
        ({"where": "source_file=../beta/a.md"}, 200),
        ({"group_by": "book"}, 422),
        ({"group_by": "file", "limit": "1000", "group_size": "100"}, 200),
    ],
)
def test_filters_and_bounds_never_widen_the_scope(indexed, params, status):
    response = indexed.client.get("/search", params={"q": "nodes", "book": "alpha", **params})
    assert response.status_code == status, response.text[:300]
    if status == 200:
        body = response.json()
        hits = [h for g in body for h in g["hits"]] if "group_by" in params else body
        assert {h["book_id"] for h in hits} <= {"alpha"}
    else:
        assert response.json()["detail"]
        assert "beta" not in response.text.replace("beta'", "").replace("=beta", "")


# -- the HTTP surface ----------------------------------------------------------------------------


def test_bodies_methods_and_content_types_never_change_the_book(indexed):
    client = indexed.client
    alpha_only = {"q": "nodes", "book": "alpha", "mode": "sparse"}
    # a JSON body naming another book, on a GET: the query string is the request
    response = client.request(
        "GET",
        "/search",
        params=alpha_only,
        content=json.dumps({"book": "beta", "book_id": "beta", "where": "x"}),
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 200 and {h["book_id"] for h in response.json()} == {"alpha"}
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        for path in ("/search", f"/lineage/{indexed.hits['beta']['id']}"):
            response = client.request(
                method,
                path,
                params=alpha_only,
                content=b'{"book": "beta", "book": "beta"}',
                headers={"content-type": "application/json"},
            )
            assert response.status_code == 405, (method, path, response.text)
            assert response.headers["content-type"] == "application/json"
            assert "GET" in response.headers["allow"]
    # a form body, a wrong content type, a body on HEAD: answered as the GET they carry
    for headers in ({"content-type": "application/x-www-form-urlencoded"}, {}):
        response = client.request(
            "GET", "/search", params=alpha_only, content=b"book=beta", headers=headers
        )
        assert {h["book_id"] for h in response.json()} == {"alpha"}


def test_no_cors_and_no_path_or_trace_in_any_error(indexed):
    """No CORS headers (a browser page of another origin cannot read answers: the proxy in
    front decides); no error body names the store's or the data folder's path, or shows a
    traceback."""
    client = indexed.client
    preflight = client.options(
        "/search",
        params={"q": "nodes", "book": "alpha"},
        headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "GET"},
    )
    assert preflight.status_code == 405
    answered = client.get(
        "/search", params={"q": "nodes", "book": "alpha"}, headers={"Origin": "http://x"}
    )
    for response in (preflight, answered):
        assert not any(h.lower().startswith("access-control-") for h in response.headers)
    point = indexed.hits["beta"]["id"]
    errors = [
        client.get("/search", params={"q": "nodes", "book": "../../etc"}),
        client.get("/search", params={"q": "", "book": "alpha"}),
        client.get(f"/lineage/{point}", params={"book": "alpha"}),
        client.get(f"/lineage/{point}/..", params={"book": "beta"}),
        client.get("/lineage/../../etc/passwd", params={"book": "beta"}),
        client.get("/search", params={"q": "nodes", "book": "alpha", "limit": "x"}),
        client.get("/nothing"),
    ]
    for response in errors:
        assert 400 <= response.status_code < 500, response.text
        assert set(response.json()) == {"detail"}
        for secret in (str(indexed.store_path), str(indexed.data_dir), "Traceback", 'File "'):
            assert secret not in response.text, response.text


def test_an_unexpected_error_is_a_json_500_that_shows_nothing_of_it(indexed, monkeypatch):
    """Fault: a bug (an exception no handler knows) was Starlette's text/plain "Internal
    Server Error", where every error body is documented as ``{"detail": ...}``."""
    import rag_pipeline.serve.app as app_module

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError(f"secret {indexed.store_path} of another request")

    monkeypatch.setattr(app_module, "read_point", broken)
    monkeypatch.setattr(app_module, "get_document", broken)
    hit = indexed.hits["alpha"]
    for path in (f"/lineage/{hit['id']}", f"/document/{hit['parent_doc_id']}"):
        response = indexed.client.get(path, params={"book": "alpha"})
        assert response.status_code == 500
        assert response.headers["content-type"] == "application/json"
        assert response.json() == {"detail": "internal error"}


@pytest.mark.parametrize(
    ("error", "status", "said"),
    [
        ("store", 500, "$RAG_QDRANT_PATH/rag_chunks/books/alpha is not"),
        ("disk", 503, "'$RAG_QDRANT_PATH/rag_chunks/books/alpha/x'"),
        ("data", 500, "$RAG_DATA_DIR/alpha/a.md is not"),
    ],
)
def test_a_store_or_disk_error_names_folders_by_their_settings(
    indexed, monkeypatch, error, status, said
):
    """Fault: a store's error (a damaged file, a full disk) was answered with the folders'
    paths on the service's machine; they are named by their settings (the log keeps all)."""
    import errno

    import rag_pipeline.serve.app as app_module
    from rag_pipeline.store import StoreError

    book = indexed.store_path / "rag_chunks" / "books" / "alpha"

    def broken(*args: object, **kwargs: object) -> None:
        if error == "disk":
            raise OSError(errno.ENOSPC, "No space left on device", str(book / "x"))
        where = book if error == "store" else indexed.data_dir / "alpha" / "a.md"
        raise StoreError(f"{where} is not what this program wrote")

    monkeypatch.setattr(app_module, "read_point", broken)
    response = indexed.client.get(
        f"/lineage/{indexed.hits['alpha']['id']}", params={"book": "alpha"}
    )
    assert response.status_code == status
    detail = response.json()["detail"]
    assert said in detail and str(indexed.store_path) not in detail, detail
    assert str(indexed.data_dir) not in detail


def test_the_service_remembers_a_bounded_number_of_books(indexed, monkeypatch):
    """Fault: the service remembered the model of every book id it was ever asked for, a
    client naming ever new (valid, unknown) books grew the process without bound."""
    import rag_pipeline.serve.app as app_module

    monkeypatch.setattr(app_module, "BOOKS_REMEMBERED", 8)
    service = indexed.client.app.state.service
    for i in range(20):
        response = indexed.client.get("/search", params={"q": "nodes", "book": f"nobook{i}"})
        assert response.status_code == 200 and response.json() == []
        assert len(service._books) <= 8
    # a book forgotten is read again when asked: its answer unchanged
    again = indexed.client.get("/search", params={"q": "nodes", "book": "alpha", "limit": 1})
    assert again.json()[0]["id"] == indexed.hits["alpha"]["id"]


def test_reads_of_books_the_store_does_not_hold_create_nothing_in_it(indexed):
    """Fault: Qdrant Edge routed a book it does not hold as one it does: every read took the
    book's lock, creating ``locks/<book>.lock`` and ``.wait``, two files for every id a
    client named (a read-only service writing without bound into the store's folder)."""
    locks = indexed.store_path / "rag_chunks" / "locks"
    before = set(os.listdir(locks))
    for i in range(3):
        for mode in ("dense", "sparse", "hybrid"):
            answer = indexed.client.get(
                "/search", params={"q": "nodes", "book": f"ghost{i}", "mode": mode}
            )
            assert answer.status_code == 200 and answer.json() == []
        grouped = {"q": "nodes", "book": f"ghost{i}", "group_by": "file"}
        assert indexed.client.get("/search", params=grouped).json() == []
        for path in ("lineage", "context", "document"):
            response = indexed.client.get(f"/{path}/{uuid.uuid4()}", params={"book": f"ghost{i}"})
            assert response.status_code == 404
        code, out, _ = _cli(indexed, "search", "nodes", "--book", f"ghost{i}", "--json")
        assert code == 0 and json.loads(out) == []
    assert set(os.listdir(locks)) == before
    assert not (indexed.store_path / "rag_chunks" / "books" / "ghost0").exists()


# -- credentials in a setting's URL are never shown -----------------------------------------


def test_lineage_links_the_dagster_ui_without_its_credentials(indexed):
    """Fault: ``RAG_DAGSTER_URL=http://admin:s3cret@...`` was linked whole in every
    lineage answer (``dagster_run_url``, ``dagster_point_url``), to any client."""
    hit = indexed.hits["alpha"]
    info = indexed.client.get(f"/lineage/{hit['id']}", params={"book": "alpha"}).json()
    code, out, _ = _cli(indexed, "lineage", hit["id"], "--book", "alpha", "--json")
    assert code == 0 and json.loads(out) == info
    assert info["dagster_run_url"].startswith("http://dagster.example:3000/runs/")
    assert info["dagster_point_url"].startswith("http://dagster.example:3000/runs/")
    assert "s3cret" not in out and "admin" not in out


def test_the_service_never_shows_a_store_or_api_urls_credentials(tmp_path):
    """Fault: ``RAG_QDRANT_URL=http://user:s3cret@host`` was answered whole by ``/health``
    ("store") and in every 503 of the server unreachable ("Qdrant server http://user:
    s3cret@..."); an API's ``OPENAI_BASE_URL`` likewise in the embedder's messages."""
    from fastapi.testclient import TestClient

    from rag_pipeline.config import load_settings
    from rag_pipeline.embed import create_embedder
    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline.serve.app import create_app

    settings = load_settings(
        data_dir=tmp_path,
        qdrant_url="http://user:s3cret@127.0.0.1:1",  # nothing listens: refused at once
        qdrant_retries=1,
        embedder="hash",
        cache_dir=tmp_path,
    )
    app = create_app(settings, make_recipe(HashEmbedder()))
    with TestClient(app, raise_server_exceptions=False) as client:
        health = client.get("/health")
        assert health.json()["store"] == "http://***@127.0.0.1:1"
        down = client.get("/search", params={"q": "nodes", "book": "alpha"})
        assert down.status_code == 503 and "127.0.0.1:1" in down.json()["detail"]
        assert "s3cret" not in health.text + down.text and "user" not in down.text
    api = load_settings(
        embedder="openai",
        openai_api_key="sk-test",
        openai_base_url="http://user:s3cret@127.0.0.1:1/v1",
        cache_dir=tmp_path,
    )
    source = create_embedder(api.embedding()).source  # what its errors name
    assert "127.0.0.1:1" in source and "s3cret" not in source


# -- lineage: the file it reports, read within the book -------------------------------------


@pytest.fixture
def lineage_book(tmp_path: Path) -> Iterator[tuple[Any, Path, dict[str, dict[str, Any]]]]:
    """A book ``alpha`` (a.md, b.md, sub/c.md) beside ``beta``, served; its hits by file."""
    from fastapi.testclient import TestClient

    from rag_pipeline.config import load_settings
    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline.serve.app import create_app

    data_dir = write_two_file_books(tmp_path, ("alpha", "beta"))
    (data_dir / "alpha" / "sub").mkdir()
    (data_dir / "alpha" / "sub" / "c.md").write_text("# C\n\n" + section("Cee", seed="c"))
    index_books(data_dir, str(tmp_path / "q"))
    settings = load_settings(
        data_dir=data_dir, qdrant_path=str(tmp_path / "q"), embedder="hash", cache_dir=tmp_path
    )
    with TestClient(create_app(settings, make_recipe(HashEmbedder()), cache_size=0)) as client:
        found = client.get("/search", params={"q": "x", "book": "alpha", "limit": 10}).json()
        yield client, data_dir, {h["source_file"]: h for h in found}


def _lineage(client: Any, hit: dict[str, Any]) -> dict[str, Any]:
    response = client.get(f"/lineage/{hit['id']}", params={"book": hit["book_id"]})
    assert response.status_code == 200, response.text
    info: dict[str, Any] = response.json()
    return info


def test_lineage_follows_renames_deletes_and_links_without_leaving_the_book(lineage_book):
    client, data_dir, hits = lineage_book
    alpha, beta = data_dir / "alpha", data_dir / "beta"
    info = _lineage(client, hits["sub/c.md"])
    assert info["file_path"] == str(alpha / "sub" / "c.md")
    assert (info["file_exists"], info["file_changed_since_indexed"]) == (True, False)

    (alpha / "a.md").rename(alpha / "renamed.md")  # renamed: the indexed path is gone
    info = _lineage(client, hits["a.md"])
    assert info["file_path"] == str(alpha / "a.md")
    assert (info["file_exists"], info["current_file_hash"]) == (False, None)
    assert info["file_changed_since_indexed"] is True

    # a.md again, as a link within the book: followed (a run reads it so too)
    (alpha / "a.md").symlink_to("renamed.md")
    info = _lineage(client, hits["a.md"])
    assert (info["file_exists"], info["file_changed_since_indexed"]) == (True, False)
    # sub/ replaced by a link to the other book's folder: refused, never hashed
    shutil.rmtree(alpha / "sub")
    (beta / "c.md").write_text((data_dir / "alpha" / "renamed.md").read_text())
    (alpha / "sub").symlink_to(beta)
    info = _lineage(client, hits["sub/c.md"])
    assert (info["file_exists"], info["current_file_hash"]) == (False, None)
    assert "outside its book" in info["file_problem"]
    # b.md a link to /dev/zero, then a FIFO: refused, never opened
    (alpha / "b.md").unlink()
    (alpha / "b.md").symlink_to("/dev/zero")
    info = _lineage(client, hits["b.md"])
    assert info["file_exists"] is False and info["file_problem"]
    (alpha / "b.md").unlink()
    os.mkfifo(alpha / "b.md")
    info = _lineage(client, hits["b.md"])  # would hang on open
    assert info["file_exists"] is False and "regular file" in info["file_problem"]


def test_lineage_of_a_book_whose_folder_is_gone_or_a_link_into_another_book(lineage_book):
    client, data_dir, hits = lineage_book
    alpha = data_dir / "alpha"
    alpha.rename(data_dir.parent / "alpha-away")
    info = _lineage(client, hits["a.md"])
    assert (info["file_exists"], info["current_file_hash"]) == (False, None)
    assert info["file_path"] == str(alpha / "a.md")
    # the book folder is now a link to beta's: never beta's file, whose name is the same
    alpha.symlink_to(data_dir / "beta")
    info = _lineage(client, hits["a.md"])
    assert (info["file_exists"], info["current_file_hash"]) == (False, None)
    assert "beta" in info["file_problem"]  # the refusal names where it leads: the operator's


def test_a_book_purged_while_served_answers_nothing_and_the_others_are_untouched(
    lineage_book, tmp_path
):
    """beta purged as the purge job purges a removed book (its store call, through the
    opener a run uses) while the service holds the store: beta's ids are then 404, its
    search empty; alpha's answers unchanged."""
    from rag_pipeline.resources import StoreOpener
    from rag_pipeline.schema import book_filter
    from rag_pipeline_tests.conftest import store_config

    client, data_dir, hits = lineage_book
    beta = client.get("/search", params={"q": "nodes", "book": "beta", "limit": 1}).json()[0]
    shutil.rmtree(data_dir / "beta")
    with StoreOpener(store_config(tmp_path / "q")).open() as store:
        assert store.purge(book_filter("beta")) > 0
    assert client.get("/search", params={"q": "nodes", "book": "beta"}).json() == []
    for path in (f"/lineage/{beta['id']}", f"/context/{beta['id']}"):
        assert client.get(path, params={"book": "beta"}).status_code == 404
    document = client.get(f"/document/{beta['parent_doc_id']}", params={"book": "beta"})
    assert document.status_code == 404
    after = client.get("/search", params={"q": "x", "book": "alpha", "limit": 10}).json()
    assert {h["id"] for h in after} == {h["id"] for h in hits.values()}


def test_a_book_being_written_is_answered_whole_before_or_whole_after(tmp_path):
    """Searches while a run writes a book the first time, then rewrites every file of it:
    each answer holds none of its files or all of them, of one version: never part of a
    first write, never old and new files mixed (found fine: a run's write is one switch)."""
    import threading

    from fastapi.testclient import TestClient

    from rag_pipeline.config import load_settings
    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline.ingest.pipeline import IngestPipeline
    from rag_pipeline.serve.app import create_app

    files = 12
    data_dir = tmp_path / "books"
    (data_dir / "seed").mkdir(parents=True)
    (data_dir / "seed" / "s.md").write_text("# S\n\n" + section("Seed"))
    (data_dir / "big").mkdir()

    def write(title: str) -> None:
        for i in range(files):
            text = f"# {title}{i}\n\n" + section("Nodes", paragraphs=4, seed=f"{title}{i}")
            (data_dir / "big" / f"f{i:02}.md").write_text(text)

    write("F")
    settings = load_settings(
        data_dir=data_dir, qdrant_path=str(tmp_path / "q"), embedder="hash", cache_dir=tmp_path
    )
    recipe = make_recipe(HashEmbedder())
    pipeline = IngestPipeline.from_settings(settings, recipe)
    pipeline.run(["seed"], run_id="r0")
    answers: list[tuple[int, int]] = []
    stop = threading.Event()
    with TestClient(create_app(settings, recipe, cache_size=0)) as client:

        def poll() -> None:
            params = {"q": "nodes", "book": "big", "limit": 1000, "mode": "dense"}
            while not stop.is_set():
                hits = client.get("/search", params=params).json()
                old = {h["source_file"] for h in hits if h["title"].startswith("F")}
                new = {h["source_file"] for h in hits if h["title"].startswith("G")}
                answers.append((len(old), len(new)))

        reader = threading.Thread(target=poll)
        reader.start()
        try:
            pipeline.run(["big"], run_id="r1")
            write("G")
            pipeline.run(["big"], run_id="r2")
        finally:
            stop.set()
            reader.join()
        # an answer after the runs: the new version, whole
        poll_once = client.get("/search", params={"q": "n", "book": "big", "limit": 1000}).json()
        assert {h["title"][0] for h in poll_once} == {"G"} and len(poll_once) >= files
    assert len(answers) > 1 and set(answers) <= {(0, 0), (files, 0), (0, files)}, set(answers)


@NEEDS_GIT
@pytest.mark.integration  # git processes
def test_lineage_of_a_git_book_never_shows_its_urls_token(tmp_path, monkeypatch):
    """Fault: a git book declared with a token in its URL (``https://oauth2:<token>@host/``,
    GitLab's way) had it answered in every lineage (``file_path``, ``source.location``), to
    any client of the service. The URL is rewritten to a local repository by git's own
    ``insteadOf`` (no network), as a credential helper or a proxy would serve it."""
    from fastapi.testclient import TestClient

    from rag_pipeline.config import load_settings
    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline.ingest.pipeline import IngestPipeline
    from rag_pipeline.serve.app import create_app
    from rag_pipeline_tests.gitbooks import GitRepo, paragraphs, write_sources

    repo = GitRepo(tmp_path / "handbook")
    repo.commit("pages", {"docs/page.md": paragraphs("Page")})
    url = "https://oauth2:glpat-s3cret@gitlab.example/team/handbook.git"
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", f"url.{repo.path}.insteadOf")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", url)
    sources = write_sources(
        tmp_path / "sources.yaml", {"handbook": {"git": url, "ref": "main", "path": "docs"}}
    )
    (tmp_path / "books").mkdir()
    settings = load_settings(
        data_dir=tmp_path / "books",
        sources=sources,
        qdrant_path=str(tmp_path / "q"),
        embedder="hash",
        cache_dir=tmp_path / "cache",
    )
    recipe = make_recipe(HashEmbedder())
    IngestPipeline.from_settings(settings, recipe).run(["handbook"], run_id="r1")
    with TestClient(create_app(settings, recipe, cache_size=0)) as client:
        hit = client.get("/search", params={"q": "page", "book": "handbook"}).json()[0]
        info = _lineage(client, hit)
    assert info["file_path"] == "https://***@gitlab.example/team/handbook.git@main:docs/page.md"
    assert info["source"]["location"] == "https://***@gitlab.example/team/handbook.git"
    assert info["commit"]["sha"] == repo.head() and info["file_changed_since_indexed"] is False
    assert "s3cret" not in json.dumps(info)


def test_byte_identical_books_in_one_collection_keep_their_own_points(tmp_path):
    """Two books of the same files, on qdrant-client's local store (one collection for every
    book, as a server: a point id shared by two books would be one point, the second
    book's write taking the first's): every id is its book's alone, each book answers its
    own, and an id asked of the twin is 404 (found fine: point ids are of the book)."""
    from fastapi.testclient import TestClient

    from rag_pipeline.config import load_settings
    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline.ingest.pipeline import IngestPipeline
    from rag_pipeline.serve.app import create_app

    data_dir = write_two_file_books(tmp_path, ("twin",))
    shutil.copytree(data_dir / "twin", data_dir / "twin-2")
    settings = load_settings(
        data_dir=data_dir,
        qdrant_path=str(tmp_path / "q"),
        qdrant_embedded="client",
        embedder="hash",
        cache_dir=tmp_path,
    )
    recipe = make_recipe(HashEmbedder())
    IngestPipeline.from_settings(settings, recipe).run(["twin", "twin-2"], run_id="r1")
    with TestClient(create_app(settings, recipe, cache_size=0)) as client:
        found = {
            book: client.get("/search", params={"q": "nodes", "book": book, "limit": 50}).json()
            for book in ("twin", "twin-2")
        }
        assert [h["text"] for h in found["twin"]] == [h["text"] for h in found["twin-2"]]
        ids = {book: {h["id"] for h in hits} for book, hits in found.items()}
        assert ids["twin"] and not ids["twin"] & ids["twin-2"]
        for book, other in (("twin", "twin-2"), ("twin-2", "twin")):
            assert {h["book_id"] for h in found[book]} == {book}
            hit = found[book][0]
            assert client.get(f"/lineage/{hit['id']}", params={"book": other}).status_code == 404
            document = client.get(f"/document/{hit['parent_doc_id']}", params={"book": other})
            assert document.status_code == 404


def test_a_busy_book_is_503_naming_neither_its_holder_nor_the_stores_path(tmp_path):
    """Fault: a 503 of a book still busy past the busy wait gave the client the store's
    folder and its holder: pid, host, command line and what it was doing, which names the
    other books of its run (``live mode, books 'alpha', 'hidden-book'``). Now the client
    reads what was busy and what to do; the log keeps who held it."""
    from fastapi.testclient import TestClient

    from rag_pipeline.config import load_settings
    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline.schema import COLLECTION_SCHEMA, book_filter
    from rag_pipeline.serve.app import create_app
    from rag_pipeline.store.edge import EdgeStore
    from rag_pipeline.store.lock import holding_for

    data_dir = write_two_file_books(tmp_path, ("alpha",))
    index_books(data_dir, str(tmp_path / "q"))
    settings = load_settings(
        data_dir=data_dir,
        qdrant_path=str(tmp_path / "q"),
        embedder="hash",
        cache_dir=tmp_path,
        busy_wait_s=0.3,
    )
    holder = EdgeStore("rag_chunks", tmp_path / "q", COLLECTION_SCHEMA)
    try:
        with holding_for("live mode, books 'alpha', 'hidden-book'"):
            holder.count(book_filter("alpha"))  # takes alpha's lock, and keeps it
        app = create_app(settings, make_recipe(HashEmbedder()), cache_size=0)
        with TestClient(app) as client:
            for path, params in (
                ("/search", {"q": "nodes", "mode": "sparse"}),
                (f"/lineage/{uuid.uuid4()}", {}),
            ):
                response = client.get(path, params={**params, "book": "alpha"})
                assert response.status_code == 503, response.text
                detail = response.json()["detail"]
                assert detail.startswith("book 'alpha' is in use by another process"), detail
                assert "RAG_BUSY_WAIT_S" in detail
                for secret in ("hidden-book", str(tmp_path), str(os.getpid()), "pid", "live"):
                    assert secret not in detail, detail
            holder.close()
            assert client.get("/search", params={"q": "nodes", "book": "alpha"}).json()
    finally:
        holder.close()


def test_the_query_cache_tells_no_book_what_another_searched(tmp_path):
    """Fault: one query cache for every book: a text searched in beta was a hit when alpha's
    client searched it (answered without the model, and counted in ``/health``'s
    ``query_cache.hits``), which told alpha's client what beta's had searched. Each book's
    queries are now cached apart."""
    from fastapi.testclient import TestClient

    from rag_pipeline.config import load_settings
    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline.serve.app import create_app

    data_dir = write_two_file_books(tmp_path, ("alpha", "beta"))
    index_books(data_dir, str(tmp_path / "q"))
    settings = load_settings(
        data_dir=data_dir, qdrant_path=str(tmp_path / "q"), embedder="hash", cache_dir=tmp_path
    )
    with TestClient(create_app(settings, make_recipe(HashEmbedder()), cache_size=64)) as client:

        def hits() -> int:
            count: int = client.get("/health").json()["query_cache"]["hits"]
            return count

        secret = "merger plans of the other team"
        for mode in ("dense", "hybrid"):
            beta = client.get("/search", params={"q": secret, "book": "beta", "mode": mode})
            assert beta.status_code == 200
        before = hits()
        for mode in ("dense", "hybrid", "dense"):
            alpha = client.get("/search", params={"q": secret, "book": "alpha", "mode": mode})
            assert alpha.status_code == 200 and {h["book_id"] for h in alpha.json()} == {"alpha"}
        assert hits() == before + 2  # alpha's own repeats: its first search was a miss
        grouped = {"q": secret, "book": "beta", "group_by": "file"}
        assert client.get("/search", params=grouped).status_code == 200
        assert hits() == before + 3  # beta's repeat, its own

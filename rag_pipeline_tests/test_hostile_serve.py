"""Hostile probes of the query service and lineage, in-process (FastAPI's TestClient over the
production app, an embedded store indexed by the production pipeline): odd book ids, odd point
ids, filters that try to widen the scope, wrong types and sizes, unknown routes, a point whose
file is replaced by a link out of its book. Every answer is a 4xx with a reason, never a 500,
and never another book's data."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rag_pipeline_tests.conftest import make_recipe, section, write_two_file_books

BOOK, OTHER = "alpha", "beta"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    from fastapi.testclient import TestClient

    from rag_pipeline.config import load_settings
    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline.ingest.pipeline import IngestPipeline
    from rag_pipeline.serve.app import create_app

    root = tmp_path_factory.mktemp("served")
    data_dir = write_two_file_books(root, (BOOK, OTHER))
    settings = load_settings(
        data_dir=data_dir, qdrant_path=str(root / "q"), embedder="hash", cache_dir=root
    )
    recipe = make_recipe(HashEmbedder())
    IngestPipeline.from_settings(settings, recipe).run([BOOK, OTHER], run_id="r1")
    with TestClient(create_app(settings, recipe, cache_size=0)) as client:
        yield client, data_dir


ODD_BOOKS = [
    "",
    ".",
    "..",
    "../beta",
    "beta/../alpha",
    "alpha\n",
    "alpha\x00",
    "alph\u0430",  # a Cyrillic 'a'
    "b\u00e9ta",
    "x" * 129,
    "alpha beta",
    "*",
    "alpha,beta",
    "%2e%2e",
]


@pytest.mark.parametrize("book", ODD_BOOKS)
def test_an_odd_book_id_is_400_naming_it_never_another_books_data(served, book):
    client, _ = served
    for path in ("/search", f"/lineage/{uuid.uuid4()}", f"/document/{uuid.uuid4()}"):
        response = client.get(path, params={"q": "nodes", "book": book})
        assert response.status_code == 400, (path, book, response.text)
        assert "book" in response.json()["detail"]


def test_a_book_that_does_not_exist_answers_nothing_and_no_error(served):
    client, _ = served
    response = client.get("/search", params={"q": "nodes", "book": "gamma"})
    assert response.status_code == 200 and response.json() == []


@pytest.mark.parametrize(
    "where",
    [
        "book_id=beta",
        "book_id=alpha",
        "tenant=beta",
        "record_type=document",
        "embedding_model=x",
    ],
)
def test_a_filter_cannot_widen_the_scope(served, where):
    client, _ = served
    response = client.get("/search", params={"q": "nodes", "book": BOOK, "where": where})
    if response.status_code == 200:
        assert {h["book_id"] for h in response.json()} <= {BOOK}
    else:
        assert response.status_code == 400, response.text


def test_another_books_document_id_as_a_filter_finds_nothing(served):
    client, _ = served
    hit = client.get("/search", params={"q": "nodes", "book": OTHER, "limit": 1}).json()[0]
    for where in (f"parent_doc_id={hit['parent_doc_id']}", f"source_file={hit['source_file']}"):
        hits = client.get("/search", params={"q": "nodes", "book": BOOK, "where": where}).json()
        assert all(h["book_id"] == BOOK for h in hits)
        assert all(h["parent_doc_id"] != hit["parent_doc_id"] for h in hits)


@pytest.mark.parametrize(
    ("params", "status"),
    [
        ({"limit": 10**30}, 422),
        ({"limit": 1001}, 422),
        ({"limit": "ten"}, 422),
        ({"limit": "1e3"}, 422),
        ({"limit": -1}, 422),
        ({"group_size": 10**9, "group_by": "file"}, 422),
        ({"rrf_k": 10**12}, 422),
        ({"chapter_min": "NaN"}, 422),
        ({"score_threshold": "inf"}, 400),
        ({"hardware_tier": 2**63}, 400),
        ({"lesson": -(2**63) - 1}, 400),
        ({"where": "chapter=" + "9" * 40}, 400),
        ({"where": "=x"}, 400),
        ({"where": "module"}, 400),
        ({"q": ""}, 400),
        ({"q": "\t\n \u3000"}, 400),
        ({"q": "\x00"}, 400),
        ({"q": "\u200b\u200b"}, 400),
    ],
)
def test_wrong_types_and_sizes_are_4xx_with_a_reason(served, params, status):
    client, _ = served
    query = {"q": "nodes", "book": BOOK, **params}
    response = client.get("/search", params=query)
    assert response.status_code == status, (params, response.text)
    assert response.json()["detail"]


def test_a_huge_query_is_answered_or_refused_never_a_500(served):
    client, _ = served
    for mode in ("dense", "sparse", "hybrid"):
        query = " ".join(f"word{i}" for i in range(1500))
        response = client.get("/search", params={"q": query, "book": BOOK, "mode": mode})
        assert response.status_code in (200, 400, 414, 431), response.text


@pytest.mark.parametrize("point", ["0", "x" * 5000, "..%2f..%2fetc", "-1", "{}", "\u00e9"])
def test_malformed_point_ids_are_400(served, point):
    client, _ = served
    for path in ("context", "document", "lineage"):
        response = client.get(f"/{path}/{point}", params={"book": BOOK})
        assert response.status_code in (400, 404), (path, point, response.text)


def test_unknown_routes_and_methods_are_404_and_405(served):
    client, _ = served
    assert client.get("/nothing", params={"book": BOOK}).status_code == 404
    assert client.get("/search/extra", params={"q": "x", "book": BOOK}).status_code == 404
    assert client.post("/search", params={"q": "x", "book": BOOK}, content=b"{").status_code == 405
    assert client.get("/lineage/", params={"book": BOOK}).status_code == 404


def test_lineage_of_a_point_whose_file_became_a_link_out_of_its_book(served):
    client, data_dir = served
    hit = client.get("/search", params={"q": "topics", "book": BOOK, "limit": 1}).json()[0]
    path = data_dir / BOOK / hit["source_file"]
    saved = path.read_bytes()
    path.unlink()
    os.symlink(data_dir / OTHER / hit["source_file"], path)  # into the other book
    try:
        info = client.get(f"/lineage/{hit['id']}", params={"book": BOOK}).json()
        assert info["file_exists"] is False and info["current_file_hash"] is None
        assert "outside its book" in info["file_problem"]
    finally:
        path.unlink()
        path.write_bytes(saved)
    info = client.get(f"/lineage/{hit['id']}", params={"book": BOOK}).json()
    assert info["file_exists"] is True and info["file_changed_since_indexed"] is False


# -- the CLI's human output: names and text of the books are data, never markup -----------

MARKUP_NAMES = ["notes[/x].md", "[bold]loud[/bold].md"]


def test_file_names_and_text_that_look_like_markup_are_printed_as_they_are(tmp_path):
    """A file name, a section title or an error message holding ``[/x]`` (Rich's markup) is
    printed as written by every human-readable command; it was a MarkupError (a crash with a
    traceback, or text silently eaten)."""
    from rag_pipeline_tests.helpers import InProcessCli, index_books

    books = tmp_path / "books"
    (books / BOOK).mkdir(parents=True)
    for name in MARKUP_NAMES:  # "[/x]" in a path: a folder "notes[" holds "x].md"
        (books / BOOK / name).parent.mkdir(parents=True, exist_ok=True)
        (books / BOOK / name).write_text(f"# Intro [/i] {name}\n\n" + section("Nodes [/]"))
    (books / BOOK / "bad[").mkdir()
    (books / BOOK / "bad[/y].md").write_bytes(b"# caf\xe9\n")
    cli = InProcessCli(tmp_path, books)
    index_books(books, cli.env["RAG_QDRANT_PATH"])
    plan = cli("plan", check=False)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "bad[/y].md" in plan.stdout + plan.stderr
    found = cli("search", "nodes intro", "--book", BOOK, "--mode", "sparse")
    shown = " ".join(found.stdout.split())
    for name in MARKUP_NAMES:
        assert name in shown.replace("│ ", "").replace(" │", ""), found.stdout
    assert "Nodes [/]" in shown  # a section title
    hit = cli.json("search", "nodes intro", "--book", BOOK, "--mode", "sparse", "--limit", "1")[0]
    for command in ("lineage", "context", "document"):
        point = hit["parent_doc_id"] if command == "document" else hit["id"]
        done = cli(command, point, "--book", BOOK)
        assert hit["source_file"] in done.stdout.replace("\n", "") or command != "lineage"


@pytest.mark.slow
def test_reads_of_every_endpoint_while_runs_rewrite_and_delete_the_same_book(tmp_path):
    """Threads ask for search, context, document and lineage of one book while runs of it
    (threads of this process: the store's locks conflict between open files) edit, delete and
    add its files: every answer is 200, or 404 for a point a run deleted; never a 500, never a
    stale handle's error."""
    import threading
    import time

    from fastapi.testclient import TestClient

    from rag_pipeline.config import load_settings
    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline.ingest.pipeline import IngestPipeline
    from rag_pipeline.serve.app import create_app

    data_dir = tmp_path / "books"
    folder = data_dir / BOOK
    folder.mkdir(parents=True)
    for i in range(4):
        (folder / f"p{i}.md").write_text(f"# P{i}\n\n" + section("Nodes", seed=str(i)))
    settings = load_settings(
        data_dir=data_dir, qdrant_path=str(tmp_path / "q"), embedder="hash", cache_dir=tmp_path
    )
    recipe = make_recipe(HashEmbedder())
    pipeline = IngestPipeline.from_settings(settings, recipe)
    pipeline.run([BOOK], run_id="r0")
    codes: list[tuple[str, int, str]] = []
    stop = threading.Event()
    with TestClient(create_app(settings, recipe, cache_size=0)) as client:
        hits = client.get("/search", params={"q": "nodes", "book": BOOK, "limit": 20}).json()
        assert hits

        def read(n: int) -> None:
            k = 0
            while not stop.is_set():
                # an id of before the runs, or of the index now
                now = client.get("/search", params={"q": "nodes", "book": BOOK, "limit": 20})
                fresh = now.json() if now.status_code == 200 else []
                hit = (fresh or hits)[(n + k) % len(fresh or hits)] if k % 2 else hits[n]
                k += 1
                for url, params in (
                    ("/search", {"q": f"nodes {k}", "book": BOOK}),
                    (f"/context/{hit['id']}", {"book": BOOK, "prev": 3, "next": 3}),
                    (f"/document/{hit['parent_doc_id']}", {"book": BOOK}),
                    (f"/lineage/{hit['id']}", {"book": BOOK}),
                ):
                    r = client.get(url, params=params)
                    codes.append((url.split("/")[1], r.status_code, r.text[:300]))

        readers = [threading.Thread(target=read, args=(n,)) for n in range(3)]
        for t in readers:
            t.start()
        try:
            for rnd in range(6):
                victim = folder / f"p{(0, 1, 2, 3, 0, 2)[rnd]}.md"
                if rnd % 2:
                    victim.unlink()
                else:
                    victim.write_text(f"# P edited {rnd}\n\n" + section("Edges", seed=str(rnd)))
                (folder / f"new{rnd}.md").write_text("# New\n\n" + section("New", seed=str(rnd)))
                pipeline.run([BOOK], run_id=f"r{rnd + 1}")
                time.sleep(0.2)  # the readers' turn
        finally:
            stop.set()
            for t in readers:
                t.join()
    bad = [c for c in codes if c[1] not in (200, 404)]
    assert not bad, bad[:5]
    assert {c[0] for c in codes if c[1] == 200} == {"search", "context", "document", "lineage"}


@pytest.mark.parametrize(
    "args",
    [
        ["--where", "module=\udcff"],
        ["--module", "x\udcff"],
        ["--proficiency", "\udcff"],
        ["--where", "source_file=\udcffa.md"],
    ],
)
def test_a_filter_argument_that_is_not_utf8_is_exit_2_naming_it(tmp_path, args):
    """A shell passes bytes that are not UTF-8 on (Python keeps them as lone surrogates): such a
    filter is refused naming it (exit 2), never sent to the engine (exit 1 with its internal
    type error)."""
    from rag_pipeline_tests.helpers import InProcessCli, index_books

    books = tmp_path / "books"
    (books / BOOK).mkdir(parents=True)
    (books / BOOK / "a.md").write_text("# A\n\n" + section("Nodes"))
    cli = InProcessCli(tmp_path, books)
    index_books(books, cli.env["RAG_QDRANT_PATH"])
    done = cli("search", "nodes", "--book", BOOK, *args, check=False)
    assert done.returncode == 2, done.stderr
    assert "not valid UTF-8" in done.stderr and "\\xff" in done.stderr


def one_indexed_book(tmp_path: Path) -> tuple[Path, Any, Any, Any]:
    """A data folder of one book (``a.md``), indexed by a run of the pipeline (hash
    embedder): the data folder, the settings, the recipe and the pipeline."""
    from rag_pipeline.config import load_settings
    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline.ingest.pipeline import IngestPipeline

    data_dir = tmp_path / "books"
    (data_dir / BOOK).mkdir(parents=True)
    (data_dir / BOOK / "a.md").write_text("# A\n\n" + section("Nodes"))
    settings = load_settings(
        data_dir=data_dir,
        qdrant_path=str(tmp_path / "q"),
        embedder="hash",
        cache_dir=tmp_path,
        busy_wait_s=3.0,
    )
    recipe = make_recipe(HashEmbedder())
    pipeline = IngestPipeline.from_settings(settings, recipe)
    pipeline.run([BOOK], run_id="r0")
    return data_dir, settings, recipe, pipeline


def test_lineage_asks_the_source_with_the_store_let_go_of(tmp_path, monkeypatch):
    """Lineage asks the book's source about the file (for a git or object-store book, a remote
    that may take seconds, a minute when it is down): a run of the same book that needs the
    store meanwhile gets it. It waited behind the request and failed busy."""
    from fastapi.testclient import TestClient

    from rag_pipeline.serve.app import create_app
    from rag_pipeline.sources.folder import FolderSource

    data_dir, settings, recipe, pipeline = one_indexed_book(tmp_path)
    asked = FolderSource.file_now
    runs: list[Any] = []

    def slow_remote(self: FolderSource, book_id: str, source_file: str) -> Any:
        # a run of the same book while the source is being asked
        (data_dir / BOOK / "b.md").write_text("# B\n\n" + section("Edges"))
        runs.append(pipeline.run([BOOK], run_id="r1")[BOOK].written.documents)
        return asked(self, book_id, source_file)

    with TestClient(create_app(settings, recipe, cache_size=0)) as client:
        hit = client.get("/search", params={"q": "nodes", "book": BOOK, "limit": 1}).json()[0]
        monkeypatch.setattr(FolderSource, "file_now", slow_remote)
        response = client.get(f"/lineage/{hit['id']}", params={"book": BOOK})
    assert response.status_code == 200, response.text
    assert runs == [1]  # b.md written


def test_a_search_embeds_its_query_with_the_store_let_go_of(tmp_path, monkeypatch):
    """The query's embedding (a local model, or an embedding API: seconds, a minute when it
    is down) runs with the store let go of: a run of the same book that needs the store
    meanwhile gets it. It waited behind the request and failed busy (503)."""
    from fastapi.testclient import TestClient

    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline.serve.app import create_app

    data_dir, settings, recipe, pipeline = one_indexed_book(tmp_path)
    embed = HashEmbedder.embed_query
    runs: list[int] = []

    def slow_api(self: HashEmbedder, text: str) -> Any:
        if "marker" in text and not runs:  # a run of the same book while the query embeds
            (data_dir / BOOK / "b.md").write_text("# B\n\n" + section("Edges"))
            runs.append(pipeline.run([BOOK], run_id="r1")[BOOK].written.documents)
        return embed(self, text)

    with TestClient(create_app(settings, recipe, cache_size=0)) as client:
        monkeypatch.setattr(HashEmbedder, "embed_query", slow_api)
        for mode in ("dense", "hybrid"):
            runs.clear()
            query = {"q": f"nodes marker {mode}", "book": BOOK, "mode": mode}
            response = client.get("/search", params=query)
            assert response.status_code == 200, response.text
            assert runs == [1 if mode == "dense" else 0]  # b.md written by the first run
            assert {h["book_id"] for h in response.json()} == {BOOK}


def test_live_modes_report_lines_show_their_style_and_print_the_books_data_as_written():
    """`rag-pipeline watch`'s line per applied book: its own style is markup (a failed book in
    red), the messages it carries (naming files) are data, printed as written (the whole line
    was escaped, so '[red]... failed[/]' showed as text)."""
    import io

    from rich.console import Console

    from rag_pipeline.cli.live import report_lines
    from rag_pipeline.ingest.report import BookResult, IngestReport

    failed = BookResult("b1", "failed", error_messages=["notes[/x].md: bad [bold]x[/bold]"])
    done = BookResult("b2", "modified", error_messages=["[i]odd[/i].md: unreadable"])
    report = IngestReport({"b1": failed, "b2": done}, warnings=["folder [/q] skipped"])
    console = Console(file=io.StringIO(), width=200, color_system=None)
    for line in report_lines(report):
        console.print(line, highlight=False)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "b1 failed: notes[/x].md: bad [bold]x[/bold]" in text, text
    assert "[i]odd[/i].md: unreadable" in text and "folder [/q] skipped" in text, text
    assert "[red]" not in text and "[yellow]" not in text, text

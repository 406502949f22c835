"""Every answer read in several reads is read from one generation of its book
(:func:`rag_pipeline.retrieve.view.read_under_one_view`, README "Recipe changes"): a book
switched to another recipe between the two reads of ``context`` (the chunk, then its
neighbours) or of ``lineage`` (the point, then its document record) used to answer with
fields of both generations; the answer is now read again from the new one. Search, which
followed the rule first, is in ``test_serve.py``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from rag_pipeline.embed.hashing import HashEmbedder
from rag_pipeline.store.edge.store import EdgeStore
from rag_pipeline_tests.conftest import section, store_config
from rag_pipeline_tests.helpers import InProcessCli, cli_env, index_books

BOOK = "b"


def _switched_book(tmp_path: Path) -> tuple[Path, str, str]:
    """Book ``b`` searched with hash-384 (run ``r384``), a hash-256 build (run ``r256``)
    pending beside it (held back by a broken file): (books, store path, a chunk id of
    ``a.md`` with a neighbour on each side)."""
    books = tmp_path / "books"
    (books / BOOK).mkdir(parents=True)
    text = "# A\n\n" + "".join(section(f"Part {i}", paragraphs=4, words=60) for i in range(12))
    (books / BOOK / "a.md").write_text(text)
    broken = books / BOOK / "z.md"
    broken.write_text("# Z\n\n" + section("Zed"))
    qdrant = cli_env(tmp_path, books)["RAG_QDRANT_PATH"]
    index_books(books, qdrant, HashEmbedder(384), run_id="r384")
    broken.write_bytes(b"# broken \x80\x81 not utf-8\n")  # the new build is held back
    index_books(books, qdrant, HashEmbedder(256), run_id="r256")
    from rag_pipeline.schema import COLLECTION_SCHEMA, chunks_of
    from rag_pipeline.store import Match, open_store

    with open_store(store_config(qdrant), COLLECTION_SCHEMA) as store:
        assert store.pending_recipe(BOOK) is not None
        chunks = list(store.scroll(chunks_of(BOOK, Match("source_file", "a.md"))))
    middle = sorted(chunks, key=lambda r: int(r.payload["chunk_index"]))[1]
    return books, qdrant, str(middle.id)


def _switch_before_the_second_read(
    monkeypatch: pytest.MonkeyPatch, qdrant: str
) -> Callable[[], int]:
    """At the second read of the points (``_scroll_page``: a retrieve or a scroll page),
    the reading handle lets go of the book, as it backs off for another request
    (:meth:`LockGroup._shrink`), and an ingest switches the book in: its pending generation
    becomes the searched one. Once; returns how many reads were made."""
    from rag_pipeline.schema import COLLECTION_SCHEMA
    from rag_pipeline.store import open_store

    original = EdgeStore._scroll_page
    reads = 0

    def scroll_page(self: EdgeStore, page: Any) -> Any:
        nonlocal reads
        reads += 1
        if reads == 2:
            self.folder_lock._shrink(0)  # backing off: the books it only read are let go of
            with open_store(store_config(qdrant), COLLECTION_SCHEMA) as ingest:
                assert ingest.switch(BOOK)
        return original(self, page)

    monkeypatch.setattr(EdgeStore, "_scroll_page", scroll_page)
    return lambda: reads


def _one_generation_context(hits: list[dict[str, Any]]) -> None:
    assert len(hits) == 3, hits
    assert {(h["embedding_model"], h["run_id"]) for h in hits} == {("hash-256", "r256")}, hits


def _one_generation_lineage(info: dict[str, Any]) -> None:
    assert (info["embedding_model"], info["run_id"]) == ("hash-256", "r256"), info
    assert info["document_run_id"] == "r256", info


def test_a_switch_between_the_reads_of_context_and_lineage_in_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    books, qdrant, chunk = _switched_book(tmp_path)
    cli = InProcessCli(tmp_path, books)
    reads = _switch_before_the_second_read(monkeypatch, qdrant)
    _one_generation_context(cli.json("context", chunk, "--book", BOOK))
    assert reads() > 2  # read again after the switch
    books, qdrant, chunk = _switched_book(tmp_path / "again")
    cli = InProcessCli(tmp_path / "again", books)
    reads = _switch_before_the_second_read(monkeypatch, qdrant)
    _one_generation_lineage(cli.json("lineage", chunk, "--book", BOOK))
    assert reads() > 2


def test_a_switch_between_the_reads_of_context_and_lineage_in_the_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rag_pipeline.config import load_settings
    from rag_pipeline.serve.app import create_app, query_recipe

    for name, path, check in (
        ("context", "/context/{}", _one_generation_context),
        ("lineage", "/lineage/{}", _one_generation_lineage),
    ):
        books, qdrant, chunk = _switched_book(tmp_path / name)
        settings = load_settings(
            data_dir=books, qdrant_path=qdrant, embedder="hash", cache_dir=tmp_path / name
        )
        with TestClient(create_app(settings, query_recipe(settings)[0], cache_size=0)) as client:
            with monkeypatch.context() as patched:
                reads = _switch_before_the_second_read(patched, qdrant)
                response = client.get(path.format(chunk), params={"book": BOOK})
            assert response.status_code == 200, response.text
            check(response.json())
            assert reads() > 2


def test_a_book_switched_under_every_read_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new generation at every look (an ingest migrating it again and again): the CLI
    exits 1 and the service answers 503, naming the book, after 3 tries."""
    from rag_pipeline.config import load_settings
    from rag_pipeline.retrieve import view
    from rag_pipeline.serve.app import create_app, query_recipe

    books, qdrant, chunk = _switched_book(tmp_path)
    looks = iter(range(1000))
    monkeypatch.setattr(view, "searched_signature", lambda store, book: str(next(looks)))
    refused = "book 'b': it switched to another model 3 times while this lineage read ran"
    done = InProcessCli(tmp_path, books)("lineage", chunk, "--book", BOOK, check=False)
    assert done.returncode == 1 and refused in done.stderr, done
    settings = load_settings(
        data_dir=books, qdrant_path=qdrant, embedder="hash", cache_dir=tmp_path
    )
    with TestClient(create_app(settings, query_recipe(settings)[0], cache_size=0)) as client:
        response = client.get(f"/context/{chunk}", params={"book": BOOK})
    assert response.status_code == 503, response.text
    assert response.json()["detail"].startswith("book 'b': it switched to another model 3 times")

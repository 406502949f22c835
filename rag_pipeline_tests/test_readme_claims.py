"""Claims of the README that a user checks by trying them, each where it once did not hold:
``watch --json``'s first line once the books are in step, the ways the README tells a user to
run a command, and bad model settings named with exit 2 by every command that loads the model."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from rag_pipeline.cli import main
from rag_pipeline_tests.conftest import REPO
from rag_pipeline_tests.helpers import Cli, LiveProcess, assert_no_trace

README = (REPO / "README.md").read_text()


def _write_book(data: Path, book: str) -> None:
    (data / book).mkdir(parents=True)
    (data / book / "a.md").write_text(f"# {book}\n\nThe opening words of {book}.\n")


@pytest.mark.slow
@pytest.mark.integration
def test_watch_json_says_ready_first_when_the_books_are_in_step_and_then_one_line_a_change(
    tmp_path,
):
    """README: ``{"event": "ready", ...}`` once every book is caught up, then an applied
    event per change. The first look at books already indexed applies nothing: it printed an
    applied event with every book "unchanged" before ready (a client reading the first line
    as ready got a report of nothing)."""
    data = tmp_path / "books"
    _write_book(data, "alpha")
    _write_book(data, "beta")
    cli = Cli(tmp_path, data)
    cli("ingest")
    live = LiveProcess(cli)
    try:
        ready = live.next_event("ready", timeout=120)
        assert live.events[0]["event"] == "ready", live.events
        assert ready["books"] == 2
        (data / "beta" / "a.md").write_text("# beta\n\nAn edit of beta.\n")
        report = live.next_event("applied", timeout=60)["report"]
        assert {b: r["status"] for b, r in report["books"].items()} == {"beta": "ingested"}
    finally:
        assert live.stop() == 0, "".join(live.stderr[-30:])


def test_the_dg_commands_the_readme_gives_name_an_absolute_dagster_home():
    """Dagster refuses a relative ``DAGSTER_HOME`` with a traceback ("must be an absolute
    path"): the README's ``dg`` instructions set an absolute one."""
    given = re.findall(r"DAGSTER_HOME=(\S+?)`", README)
    assert given, "the README says which DAGSTER_HOME the dg commands take"
    for value in given:
        assert value.startswith(("/", "$PWD", "$(pwd)", "$HOME")), value


@pytest.fixture
def local_env(tmp_path, data_dir, monkeypatch):
    """The local model configured, an empty store, a data folder with no book."""
    for name in list(os.environ):
        if name.startswith(("RAG_", "OPENAI_")):
            monkeypatch.delenv(name)
    for name, value in {
        "RAG_EMBEDDER": "local",
        "RAG_DATA_DIR": str(data_dir),
        "RAG_QDRANT_PATH": str(tmp_path / "qdrant"),
        "RAG_CACHE_DIR": str(tmp_path / "cache"),
        "DAGSTER_HOME": str(tmp_path / "home"),
    }.items():
        monkeypatch.setenv(name, value)
    return monkeypatch


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    text = result.output + (getattr(result, "stderr", "") or "")
    assert_no_trace(text)
    assert result.exception is None or isinstance(result.exception, SystemExit), text
    return result.exit_code, text


def test_a_cache_folder_the_model_cannot_be_written_to_is_exit_2_naming_it(local_env, tmp_path):
    """README: bad settings exit 2 with a message naming them. A ``RAG_CACHE_DIR`` with a file
    in the way was ``unexpected NotADirectoryError`` (exit 1) from ``search``, and uvicorn's
    traceback from ``serve``."""
    import rag_pipeline.serve

    def never(*args: object, **kwargs: object) -> None:  # the check fails, never hangs
        raise AssertionError("the service started with a model it could not load")

    local_env.setattr(rag_pipeline.serve, "serve", never)
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("")
    local_env.setenv("RAG_CACHE_DIR", str(in_the_way))
    for command in (("search", "robots", "--book", "any"), ("serve", "--port", "1")):
        code, text = _run(*command)
        assert code == 2 and "RAG_CACHE_DIR" in text and str(in_the_way) in text, (command, text)


def test_a_model_folder_that_is_not_one_is_exit_2_naming_the_variable(local_env, tmp_path):
    local_env.setenv("RAG_LOCAL_MODEL_DIR", str(tmp_path))
    code, text = _run("search", "robots", "--book", "any")
    assert code == 2 and "RAG_LOCAL_MODEL_DIR" in text, text


def test_the_service_starts_while_the_embedding_api_is_down_and_answers_503(
    tmp_path, write_book, data_dir
):
    """README: an embedding API that cannot be used is 503 naming it, and a book indexed with
    a model this process makes is searched as ever. The service's start-up embedded a query
    with the configured model: with the API down it never started (uvicorn's traceback)."""
    from fastapi.testclient import TestClient

    from rag_pipeline.config import load_settings
    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline.ingest.pipeline import IngestPipeline
    from rag_pipeline.serve import create_app, query_recipe
    from rag_pipeline_tests.conftest import make_recipe, section

    write_book("b", {"a.md": "# b\n\n" + section("Nodes", seed="b")})
    store = str(tmp_path / "q")
    hashed = load_settings(data_dir=data_dir, qdrant_path=store, embedder="hash")
    IngestPipeline.from_settings(hashed, make_recipe(HashEmbedder())).run(["b"], run_id="r")
    settings = load_settings(
        data_dir=data_dir,
        qdrant_path=store,
        embedder="openai",
        openai_api_key="sk-test",
        openai_base_url="http://127.0.0.1:9/v1",  # nothing listens: connection refused
        openai_max_retries=0,
        cache_dir=tmp_path / "cache",
    )
    with TestClient(create_app(settings, query_recipe(settings)[0], cache_size=0)) as client:
        assert client.get("/health").status_code == 200
        indexed = client.get("/search", params={"q": "nodes", "book": "b"})
        assert indexed.status_code == 200 and indexed.json(), indexed.text
        new = client.get("/search", params={"q": "nodes", "book": "not-indexed"})
        assert new.status_code == 503 and "OpenAI API" in new.json()["detail"], new.text


def test_the_cache_folder_error_is_the_whole_story_for_an_ingests_report(tmp_path):
    """An ingest's failed book reports the deepest cause of its step's error
    (``defs/runner.py``): the error names the setting and chains no ``NotADirectoryError``
    that would be reported instead of it."""
    from rag_pipeline.embed import EmbedError
    from rag_pipeline.embed.local import LocalEmbedder

    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("")
    embedder = LocalEmbedder(cache_dir=in_the_way / "models")
    with pytest.raises(EmbedError, match="RAG_CACHE_DIR") as raised:
        embedder.embed(["some words"])
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_an_embedding_api_that_cannot_be_reached_is_named_in_an_ingests_report():
    """The README's failed work names the embedder: an ingest's failed book reports the
    deepest cause of its step's error, which was the HTTP library's ``ConnectError:
    [Errno 111] Connection refused`` alone while the API's error chained it."""
    from rag_pipeline.embed.base import EmbedderUnavailableError
    from rag_pipeline.embed.openai import OpenAIEmbedder

    embedder = OpenAIEmbedder("sk-test", base_url="http://127.0.0.1:9/v1", max_retries=0)
    with pytest.raises(EmbedderUnavailableError, match=r"OpenAI API at http://127\.0\.0\.1:9") as e:
        embedder.embed(["some words"])
    assert e.value.__cause__ is None and e.value.__suppress_context__

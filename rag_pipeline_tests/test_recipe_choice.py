"""Which recipe a book is built and searched with (issue 21): the recorded precision wins
over ``auto``, queries are embedded by the book's recorded model, ``plan`` prices a recipe
change, ``eval --compare`` measures one before it is made.

The local model is stood in for by a hashing embedder named as the local model is at each
precision (loading the real one takes seconds); the CPU detection is monkeypatched."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

# imported before any test stands in for rag_pipeline.embed.create_embedder: a first import
# inside such a test would bind the stand-in into serve.app for every later test of the process
import rag_pipeline.serve.app  # noqa: F401
from rag_pipeline.config import load_settings
from rag_pipeline.embed.hashing import HashEmbedder
from rag_pipeline.embed.local import local_model_name
from rag_pipeline.recipes.choice import (
    RecordedModelUnavailableError,
    choose_book_model,
    recorded_recipe,
)
from rag_pipeline_tests.conftest import make_pipeline, make_recipe, section
from rag_pipeline_tests.helpers import InProcessCli, index_books

FP32 = local_model_name(None, "fp32")
INT8 = local_model_name(None, "int8")
BOOK = "ros2-fundamentals"


class FakeLocal(HashEmbedder):
    """Hashing vectors under the local model's name at ``precision``."""

    def __init__(self, precision: str) -> None:
        super().__init__()
        self.model_name = local_model_name(None, precision)


def _config(**settings: Any):  # type: ignore[no-untyped-def]
    return load_settings(**settings).embedding()


@pytest.mark.parametrize(
    ("settings", "recorded", "fast_int8", "purpose", "model", "migration"),
    [
        # a new book: auto follows the CPU
        ({}, None, True, "build", INT8, False),
        ({}, None, False, "build", FP32, False),
        # the upgrade: an fp32 index stays fp32 under auto on a VNNI CPU
        ({}, FP32, True, "build", FP32, False),
        # a pool of mixed CPUs: the int8 book stays int8 on an AVX2-only machine
        ({}, INT8, False, "build", INT8, False),
        # an explicit precision that differs from the record is a migration
        ({"local_precision": "int8"}, FP32, False, "build", INT8, True),
        ({"local_precision": "fp32"}, INT8, True, "build", FP32, True),
        # ... but until it is done, queries are embedded by the recorded model
        ({"local_precision": "int8"}, FP32, True, "search", FP32, False),
        ({"local_precision": "fp32"}, INT8, False, "search", INT8, False),
        # another model recorded: auto does not keep it, the book is embedded again
        ({}, "text-embedding-3-small", True, "build", INT8, True),
        ({"local_model_dir": "/models/bge-small"}, FP32, False, "build", "bge-small", True),
        ({"embedder": "hash"}, "hash-384", True, "build", "hash-384", False),
        ({"embedder": "hash"}, FP32, True, "build", "hash-384", True),
        # a search uses the recorded model wherever this process can produce it: the local
        # model offline, a hash embedder of any dimension, OpenAI with a key
        ({"embedder": "hash"}, FP32, True, "search", FP32, False),
        ({}, "hash-256", True, "search", "hash-256", False),
        (
            {"embedder": "hash", "openai_api_key": "k"},
            "text-embedding-3-small",
            True,
            "search",
            "text-embedding-3-small",
            False,
        ),
    ],
)
def test_the_book_model_decision(settings, recorded, fast_int8, purpose, model, migration):
    choice = choose_book_model(_config(**settings), recorded, fast_int8=fast_int8, purpose=purpose)
    assert (choice.embedding_model, choice.migration) == (model, migration), choice.reason
    assert choice.recorded_model == recorded


@pytest.mark.parametrize(
    ("settings", "recorded"),
    [
        ({}, "text-embedding-3-small"),  # no OpenAI key
        ({"local_model_dir": "/models/bge-small"}, FP32),  # another local model folder
        ({}, "some-other-model"),
    ],
)
def test_a_search_of_a_book_of_a_model_this_process_cannot_produce_is_refused(settings, recorded):
    with pytest.raises(RecordedModelUnavailableError) as caught:
        choose_book_model(
            _config(**settings), recorded, fast_int8=True, purpose="search", book_id="b1"
        )
    message = str(caught.value)
    assert "'b1'" in message and repr(recorded) in message
    assert "rag-pipeline ingest --book b1" in message


def test_the_recorded_recipe_is_the_model_of_the_books_chunks(opened, data_dir, write_book):
    store = opened
    assert recorded_recipe(store, "alpha") is None
    write_book("alpha", {"a.md": "# Alpha\n\n" + section("One")})
    make_pipeline(data_dir, store, make_recipe(FakeLocal("fp32"))).run(["alpha"])
    recorded = recorded_recipe(store, "alpha")
    assert recorded is not None and recorded.embedding_model == FP32 and not recorded.mixed
    assert recorded_recipe(store, "beta") is None


def test_one_process_loads_each_precision_once(monkeypatch):
    from rag_pipeline.recipes.lazy import LazyRecipe

    built: list[str] = []

    def make(config):  # type: ignore[no-untyped-def]
        built.append(config.local_precision)
        return FakeLocal(config.local_precision)

    settings = load_settings()
    monkeypatch.setattr("rag_pipeline.embed.local.cpu_has_fast_int8", lambda: True)
    recipes = LazyRecipe(settings.embedding(), settings.chunking(), make_embedder=make)
    assert built == []  # nothing loaded before it is needed
    assert recipes.get().embedding_model == INT8
    assert recipes.for_model(FP32).embedding_model == FP32
    assert recipes.for_model(INT8) is recipes.get() and recipes.for_model(FP32) is not None
    assert built == ["int8", "fp32"]


@pytest.fixture
def fake_local(monkeypatch):  # type: ignore[no-untyped-def]
    """The local embedder stood in for; the precisions built, in order."""
    built: list[str] = []

    def create(config):  # type: ignore[no-untyped-def]
        assert config.provider == "local" and config.local_precision in ("fp32", "int8")
        built.append(config.local_precision)
        return FakeLocal(config.local_precision)

    monkeypatch.setattr("rag_pipeline.embed.create_embedder", create)
    monkeypatch.delenv("RAG_LOCAL_PRECISION", raising=False)
    return built


def _cpu(monkeypatch, vnni: bool) -> None:
    monkeypatch.setattr("rag_pipeline.embed.local.cpu_has_fast_int8", lambda: vnni)


@pytest.fixture
def fp32_books(sample_books, tmp_path) -> InProcessCli:
    """The sample books indexed at fp32 (as an install before auto was the default did), and
    a CLI on them with the default settings (``auto``) and the local embedder."""
    cli = InProcessCli(tmp_path, sample_books, embedder="local")
    cli.env.pop("RAG_LOCAL_PRECISION", None)
    index_books(sample_books, cli.env["RAG_QDRANT_PATH"], FakeLocal("fp32"))
    return cli


def test_an_upgrade_to_auto_on_a_vnni_cpu_leaves_an_fp32_book_fp32(
    fp32_books, fake_local, monkeypatch, sample_books
):
    _cpu(monkeypatch, vnni=True)
    cli = fp32_books
    plan = cli.json("plan")
    assert {b: p["action"] for b, p in plan["books"].items()} == dict.fromkeys(
        plan["books"], "unchanged"
    )
    assert all(p["embedding_model"] == FP32 for p in plan["books"].values())
    assert all(p["recorded_embedding_model"] == FP32 for p in plan["books"].values())
    assert all(p["recipe_change"] is None for p in plan["books"].values())
    assert plan["recipe_change"]["books_affected"] == 0
    assert plan["embedding_model"] == INT8  # what a new book would get
    assert "recipe change: none" in cli("plan").stdout
    hits = cli.json("search", "publishers and subscribers", "--book", BOOK, "--limit", "3")
    assert hits and all(h["embedding_model"] == FP32 for h in hits)
    assert set(fake_local) == {"fp32"}  # no int8 model was even loaded for the old books
    # the pipeline's run of the book (what the Dagster steps do) embeds nothing
    from rag_pipeline.ingest.pipeline import IngestPipeline

    settings = load_settings(
        embedder="local", qdrant_path=cli.env["RAG_QDRANT_PATH"], data_dir=sample_books
    )
    run = IngestPipeline.from_settings(settings).run([BOOK])[BOOK]
    assert run.inventory.embedding_model == FP32
    assert run.embedded.embedded == 0 and not run.inventory.changes.has_work


@pytest.mark.parametrize(("vnni", "model"), [(True, INT8), (False, FP32)])
def test_a_new_book_under_auto_follows_the_cpu(
    fp32_books, fake_local, monkeypatch, sample_books, vnni, model
):
    _cpu(monkeypatch, vnni=vnni)
    (sample_books / "new-book").mkdir()
    (sample_books / "new-book" / "a.md").write_text("# New\n\n" + section("Fresh"))
    plan = fp32_books.json("plan")
    assert plan["books"]["new-book"]["action"] == "run"
    assert plan["books"]["new-book"]["embedding_model"] == model
    assert plan["books"]["new-book"]["recipe_change"] is None  # new, not a change
    assert plan["books"][BOOK]["embedding_model"] == FP32


def test_an_explicit_precision_is_a_migration_and_the_plan_prices_it(
    fp32_books, fake_local, monkeypatch
):
    _cpu(monkeypatch, vnni=False)
    cli = fp32_books
    cli.env["RAG_LOCAL_PRECISION"] = "int8"
    plan = cli.json("plan")
    books = plan["books"]
    assert all(p["action"] == "run" for p in books.values())
    changes = {b: p["recipe_change"] for b, p in books.items()}
    assert all(c["from"] == FP32 and c["to"] == INT8 for c in changes.values())
    total = plan["recipe_change"]
    assert total["books_affected"] == len(books) and sorted(total["books"]) == sorted(books)
    assert total["chunks_to_embed"] == sum(p["chunks_to_embed"] for p in books.values()) > 0
    assert total["tokens_to_embed"] == sum(c["tokens_to_embed"] for c in changes.values()) > 0
    assert total["cost_usd"] == 0  # the local model costs nothing
    text = cli("plan").stdout
    assert f"{FP32} -> {INT8}" in text and "recipe change in total: 2 books" in text
    # until the migration has run, queries are still embedded at the recorded fp32
    hits = cli.json("search", "publishers and subscribers", "--book", BOOK, "--mode", "dense")
    assert hits and all(h["embedding_model"] == FP32 for h in hits)


def test_a_search_of_a_book_of_another_providers_model_embeds_with_that_model(
    fp32_books, fake_local
):
    cli = fp32_books
    cli.env["RAG_EMBEDDER"] = "hash"  # a change of provider not migrated yet
    assert cli.json("search", "topics", "--book", BOOK, "--json")
    assert fake_local == ["fp32"]  # the query was embedded by the book's model


def test_a_search_of_a_book_of_a_model_this_process_cannot_make_exits_1_naming_it(
    sample_books, tmp_path
):
    cli = InProcessCli(tmp_path, sample_books)  # the hash embedder, no OpenAI key
    openai_like = HashEmbedder(1536)
    openai_like.model_name = "text-embedding-3-small"
    index_books(sample_books, cli.env["RAG_QDRANT_PATH"], openai_like)
    done = cli("search", "topics", "--book", BOOK, check=False)
    assert done.returncode == 1
    assert BOOK in done.stderr and "text-embedding-3-small" in done.stderr
    assert "Traceback" not in done.stderr
    assert cli("search", "topics", "--book", BOOK, "--mode", "sparse").returncode == 0


def test_a_recipe_change_is_priced_at_the_openai_rate():
    from rag_pipeline.embed import usd_per_million_tokens
    from rag_pipeline.ingest.plan import BookPlan, IngestPlan
    from rag_pipeline.ingest.stages import WritePreview

    openai = _config(embedder="openai", openai_model="text-embedding-3-small")
    price = usd_per_million_tokens(openai)
    assert price == 0.02 and usd_per_million_tokens(_config()) == 0.0
    changed = BookPlan("a", "run", embedding_model="text-embedding-3-small", recipe_change=True)
    changed.recorded_model = FP32
    changed.preview = WritePreview(10, 10, 0, 2_000_000, 0)
    same = BookPlan("b", "run", preview=WritePreview(5, 5, 0, 1_000, 0))
    plan = IngestPlan({"a": changed, "b": same})
    assert changed.as_dict(price)["recipe_change"] == {
        "from": FP32,
        "to": "text-embedding-3-small",
        "chunks_to_embed": 10,
        "tokens_to_embed": 2_000_000,
        "cost_usd": 0.04,
    }
    assert same.as_dict(price)["recipe_change"] is None
    assert plan.recipe_change(price) == {
        "books": ["a"],
        "books_affected": 1,
        "chunks_to_embed": 10,
        "tokens_to_embed": 2_000_000,
        "cost_usd": 0.04,
    }


def test_the_service_embeds_each_books_queries_with_its_recorded_model(
    sample_books, tmp_path, fake_local, monkeypatch
):
    from fastapi.testclient import TestClient

    from rag_pipeline.recipes.lazy import LazyRecipe
    from rag_pipeline.serve.app import create_app

    _cpu(monkeypatch, vnni=True)
    qdrant = str(tmp_path / "qdrant")
    index_books(sample_books, qdrant, FakeLocal("fp32"))
    settings = load_settings(embedder="local", qdrant_path=qdrant, data_dir=sample_books)
    app = create_app(settings, LazyRecipe(settings.embedding(), settings.chunking()))
    with TestClient(app) as client:
        assert client.get("/health").json()["embedding_model"] == INT8  # new books' model
        hits = client.get("/search", params={"q": "topics", "book": BOOK}).json()
        assert hits and all(h["embedding_model"] == FP32 for h in hits)
        service = app.state.service
        assert service.read(lambda s: service.book_recipe(s, BOOK)).embedding_model == FP32
    assert fake_local == ["int8", "fp32"]  # the configured model warmed up, fp32 for the book
    hashed = create_app(load_settings(embedder="hash", qdrant_path=qdrant), make_recipe_hash())
    with TestClient(hashed) as client:
        answer = client.get("/search", params={"q": "topics", "book": BOOK})
        assert answer.status_code == 503
        assert BOOK in answer.json()["detail"] and FP32 in answer.json()["detail"]
        sparse = client.get("/search", params={"q": "topics", "book": BOOK, "mode": "sparse"})
        assert sparse.status_code == 200


def make_recipe_hash():  # type: ignore[no-untyped-def]
    return make_recipe(HashEmbedder())


def test_the_service_reads_a_books_model_again_after_its_ttl(sample_books, tmp_path, monkeypatch):
    from rag_pipeline.serve.app import Service

    qdrant = str(tmp_path / "qdrant")
    index_books(sample_books, qdrant)
    service = Service(load_settings(embedder="hash", qdrant_path=qdrant), make_recipe_hash())
    reads: list[str] = []
    real = service.recipes.for_book

    def counted(store, book_id, **kwargs):  # type: ignore[no-untyped-def]
        reads.append(book_id)
        return real(store, book_id, **kwargs)

    monkeypatch.setattr(service.recipes, "for_book", counted)
    try:
        for _ in range(3):
            service.read(lambda s: service.book_recipe(s, BOOK))
        assert reads == [BOOK]  # cached
        service._book_ttl_s = 0.0
        service.read(lambda s: service.book_recipe(s, BOOK))
        assert reads == [BOOK, BOOK]
    finally:
        service.close()


# -- eval --compare ---------------------------------------------------------------------------


@pytest.fixture
def tiny_beir(tmp_path: Path) -> Path:
    folder = tmp_path / "tiny"
    corpus = [
        {"_id": "1", "title": "Robot arms", "text": "Robot arms grasp objects with grippers."},
        {"_id": "2", "title": "Soil", "text": "Clay soil holds water longer than sandy soil."},
        {"_id": "3", "title": "Legged robots", "text": "Bipedal robots balance while walking."},
    ]
    queries = [{"_id": "q1", "text": "grasp objects gripper"}, {"_id": "q2", "text": "clay soil"}]
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text("\n".join(json.dumps(d) for d in corpus))
    (folder / "queries.jsonl").write_text("\n".join(json.dumps(q) for q in queries))
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\t1\t1\nq2\t2\t1\n")
    return folder


def _eval_cli(tmp_path: Path, embedder: str = "hash") -> InProcessCli:
    cli = InProcessCli(tmp_path, tmp_path, embedder=embedder)
    cli.env.pop("RAG_LOCAL_PRECISION", None)
    return cli


def test_eval_compare_reports_current_and_candidate_side_by_side(tiny_beir, tmp_path):
    cli = _eval_cli(tmp_path)
    args = ("eval", "--dataset", str(tiny_beir), "--mode", "sparse", "--mode", "hybrid")
    compared = cli.json(*args, "--compare", "--candidate-target-tokens", "200")
    current, candidate = compared["current"], compared["candidate"]
    assert current["chunk_target_tokens"] == 400 and candidate["chunk_target_tokens"] == 200
    assert current["signature"] != candidate["signature"]
    assert [r["mode"] for r in current["runs"]] == [r["mode"] for r in candidate["runs"]]
    assert [(d["mode"], d["fusion"]) for d in compared["delta"]] == [
        ("sparse", None),
        ("hybrid", "minmax"),
    ]
    for delta, now, then in zip(compared["delta"], current["runs"], candidate["runs"], strict=True):
        assert delta["ndcg@10"] == pytest.approx(then["ndcg@10"] - now["ndcg@10"], abs=1e-5)
    text = cli(*args, "--compare", "--candidate-target-tokens", "200").stdout
    assert "current hash-384 (chunk target 400) -> candidate hash-384 (chunk target 200)" in text
    # the plain eval is what it was: the current recipe's runs only
    assert len(cli.json(*args)["runs"]) == 2


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--compare"], "--compare needs a candidate"),
        (["--candidate-target-tokens", "200"], "need --compare"),
        (["--compare", "--candidate-precision", "int8"], "the local model's"),
        (["--compare", "--candidate-target-tokens", "400"], "is the current recipe"),
        (["--compare", "--candidate-target-tokens", "9999"], "above RAG_CHUNK_MAX_TOKENS"),
    ],
)
def test_eval_compare_refuses_a_candidate_it_cannot_build(tiny_beir, tmp_path, options, message):
    done = _eval_cli(tmp_path)("eval", "--dataset", str(tiny_beir), *options, check=False)
    assert done.returncode == 2 and message in done.stderr, done.stderr


@pytest.mark.slow
def test_eval_compare_of_fp32_and_int8_with_the_real_local_model(tiny_beir, tmp_path):
    cli = _eval_cli(tmp_path, embedder="local")
    cli.env["RAG_LOCAL_PRECISION"] = "fp32"
    compared = cli.json(
        "eval", "--dataset", str(tiny_beir), "--compare", "--candidate-precision", "int8"
    )
    assert compared["current"]["embedding_model"] == FP32
    assert compared["candidate"]["embedding_model"] == INT8
    assert all(r["ndcg@10"] > 0.5 for r in compared["candidate"]["runs"])
    assert abs(compared["delta"][0]["ndcg@10"]) < 0.5


def test_the_service_embeds_a_book_of_another_provider_with_that_providers_model(tmp_path):
    """A service on the local model searching a book still recorded with the hash embedder
    (a change of provider not migrated yet) embeds its queries with the hash model, not
    with a local model built from the hash settings."""
    from rag_pipeline.serve.app import query_recipe

    settings = load_settings(embedder="local", qdrant_path=str(tmp_path / "q"))
    recipes, _ = query_recipe(settings)
    assert recipes.for_model("hash-256").embedding_model == "hash-256"

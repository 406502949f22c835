"""Failure safety: flaky embedding API, unreachable Qdrant, cluster collections, hard kills."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from rag_pipeline.embed import (
    EmbedderUnavailableError,
    EmbeddingAnswerError,
    EmbedError,
    EmbedServiceError,
)
from rag_pipeline.embed.openai import OpenAIEmbedder, RateLimit, RateLimiter
from rag_pipeline.schema import COLLECTION_SCHEMA
from rag_pipeline.schema import book_filter as tenant_filter
from rag_pipeline.store import CollectionSpec, StoreUnavailableError
from rag_pipeline.store.qdrant import QdrantStore
from rag_pipeline_tests.conftest import REPO, hash_settings, step_failure
from rag_pipeline_tests.fakes import BAD_ANSWERS, FakeOpenAI, FakeQdrant, _vector
from rag_pipeline_tests.helpers import assert_no_trace, fresh_cli


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch):
    """The OpenAI client's exponential backoff, 50x shorter: these tests count retries and read
    errors, none of them times the backoff (Retry-After, which some do time, is unchanged)."""
    from rag_pipeline.embed import openai as openai_module

    monkeypatch.setattr(openai_module, "INITIAL_RETRY_DELAY_S", 0.01)


@pytest.fixture
def openai_server():
    with FakeOpenAI() as server:
        yield server


def embedder(server, retries=2, timeout=1.0, **kwargs):
    return OpenAIEmbedder(
        "sk-test", base_url=server.base_url, max_retries=retries, timeout_s=timeout, **kwargs
    )


def test_openai_embeddings_batches_by_count_and_tokens(openai_server):
    emb = embedder(openai_server, batch_size=3, max_batch_tokens=40)
    texts = [f"text number {i} " * (i + 1) for i in range(10)]
    vectors = emb.embed(texts)
    assert vectors.shape == (10, 1536)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    sizes = [len(r["input"]) for r in openai_server.requests]
    assert sum(sizes) == 10 and max(sizes) <= 3
    counts = emb.tokenizer.count(texts)
    for request in openai_server.requests:  # no batch over the token bound (unless one text is)
        batch_tokens = sum(counts[texts.index(t)] for t in request["input"])
        assert batch_tokens <= 40 or len(request["input"]) == 1
    assert emb.tokens_used > 0 and emb.cost_usd(1_000_000) == pytest.approx(0.02)


@pytest.mark.parametrize("failures", [[429], [500, 503], ["hang"]])
def test_transient_openai_failures_are_retried(openai_server, failures):
    openai_server.script.extend(failures)
    openai_server.hang_s = 2.5
    emb = embedder(openai_server, retries=2, timeout=1.0)
    assert emb.embed(["hello"]).shape == (1, 1536)
    assert len(openai_server.requests) == len(failures) + 1


@pytest.mark.parametrize(("status", "words"), [(429, "HTTP 429"), (500, "HTTP 500")])
def test_persistent_openai_failure_names_the_cause_and_the_next_run_works(
    openai_server, status, words
):
    openai_server.script.extend([status] * 3)
    emb = embedder(openai_server, retries=2)
    with pytest.raises(EmbedError) as info:
        emb.embed(["hello"])
    assert words in str(info.value) and "after 2 retries" in str(info.value)
    assert openai_server.base_url in str(info.value)
    assert emb.embed(["hello"]).shape == (1, 1536)  # the service recovered


def test_openai_timeouts_exhausted(openai_server):
    openai_server.script.extend(["hang"] * 2)
    openai_server.hang_s = 1.5
    with pytest.raises(EmbedError, match="timed out after 1 retries"):
        embedder(openai_server, retries=1, timeout=0.5).embed(["x"])


def test_openai_chunk_budget_uses_its_tokenizer(openai_server):
    from rag_pipeline.chunking import ChunkBudget
    from rag_pipeline.config import ChunkingConfig

    emb = embedder(openai_server)
    budget = ChunkBudget.for_tokenizer(ChunkingConfig(), emb.tokenizer)
    assert (budget.target, budget.limit) == (400, 512)  # 8191 tokens allowed; the config rules
    assert emb.tokenizer.count(["Hello world"]) == [2]  # cl100k_base, offline


def expected_vectors(texts):
    """What the fake server answers for each text, in the order of ``texts``."""
    return np.stack([_vector(t, 1536) for t in texts])


def test_openai_requests_run_concurrently_and_results_keep_input_order():
    texts = [f"passage {i} " + "word " * (i * 7 % 23) for i in range(16)]
    with FakeOpenAI(latency_s=0.3) as server:
        emb = embedder(server, timeout=5.0, batch_size=2, concurrency=4)
        started = time.monotonic()
        vectors = emb.embed(texts)
        elapsed = time.monotonic() - started
    assert len(server.requests) == 8
    assert server.max_in_flight == 4  # the server saw four requests overlapping
    assert elapsed < 8 * 0.3 * 0.6  # sequential would take 2.4 s
    np.testing.assert_allclose(vectors, expected_vectors(texts), atol=1e-6)


def test_openai_server_answering_float_lists_works_too():
    """Vectors are asked for as base64 (cheap to decode); a server that ignores that and
    answers lists of floats is understood as well."""
    with FakeOpenAI(floats_only=True) as server:
        vectors = embedder(server).embed(["one", "two"])
    assert server.requests[0]["encoding_format"] == "base64"
    np.testing.assert_allclose(vectors, expected_vectors(["one", "two"]), atol=1e-6)


def test_openai_concurrency_one_is_sequential():
    with FakeOpenAI(latency_s=0.05) as server:
        embedder(server, batch_size=2, concurrency=1).embed([f"t{i}" for i in range(6)])
    assert server.max_in_flight == 1 and len(server.requests) == 3


def test_openai_progress_counts_every_text_once():
    calls = []
    with FakeOpenAI(latency_s=0.05) as server:
        emb = embedder(server, timeout=5.0, batch_size=3, concurrency=3)
        emb.embed([f"t{i}" for i in range(10)], progress=lambda d, t, *tokens: calls.append((d, t)))
    assert [t for _, t in calls] == [10] * 4
    assert [d for d, _ in calls] == sorted(d for d, _ in calls) and calls[-1] == (10, 10)


def test_openai_client_rate_limit_is_never_exceeded():
    """The server allows 3 requests per second and answers 429 beyond; the client limited to
    3 per second never gets one, though 4 requests could be in flight."""
    texts = [f"chunk {i}" for i in range(24)]
    with FakeOpenAI(latency_s=0.05, rate_limit=(3, 1.0)) as server:
        emb = embedder(
            server, timeout=5.0, batch_size=2, concurrency=4, rate_limit=RateLimit(3, None, 1.0)
        )
        started = time.monotonic()
        vectors = emb.embed(texts)
        elapsed = time.monotonic() - started
    assert server.rejected == 0
    assert server.max_in_window(1.0) <= 3
    assert elapsed >= 3.0  # 12 requests at 3 per second: the limit held them back
    np.testing.assert_allclose(vectors, expected_vectors(texts), atol=1e-6)


def test_openai_429_under_concurrency_is_retried():
    """No client limit: the server's 429s (Retry-After: when its window frees) are retried
    and every text still gets its own vector, in order."""
    texts = [f"chunk {i}" for i in range(12)]
    with FakeOpenAI(rate_limit=(2, 1.0)) as server:
        emb = embedder(server, retries=8, timeout=5.0, batch_size=2, concurrency=4)
        vectors = emb.embed(texts)
    assert server.rejected >= 2  # 4 requests arrived at once, 2 allowed
    assert len(server.requests) == 6
    assert server.max_in_window(1.0) <= 2
    np.testing.assert_allclose(vectors, expected_vectors(texts), atol=1e-6)


def test_openai_retry_after_is_honoured():
    """A 429 asking for 1.2 s: the retry waits that long (the backoff alone would be at most
    0.5 s); once it is over, requests go at once."""
    with FakeOpenAI() as server:
        server.script.append((429, 1200))
        emb = embedder(server, retries=2, timeout=5.0, batch_size=1, concurrency=1)
        emb.embed(["first"])
        emb2_started = time.monotonic()
        emb.embed(["second"])  # the pause is over: no wait
        times = [t for t, _ in server.arrivals]
    assert times[1] - times[0] >= 1.2
    assert time.monotonic() - emb2_started < 1.0


def test_openai_failure_under_concurrency_stops_the_call():
    with FakeOpenAI(latency_s=0.05) as server:
        server.script.extend([500] * 100)
        emb = embedder(server, retries=1, timeout=5.0, batch_size=1, concurrency=3)
        with pytest.raises(EmbedError, match="HTTP 500"):
            emb.embed([f"t{i}" for i in range(20)])
        # three in flight, each tried at most twice; no new batch started after the failure
        assert len(server.requests) <= 6
        server.script.clear()
        assert emb.embed(["recovered"]).shape == (1, 1536)


def test_openai_malformed_answer_is_a_named_error_and_the_next_call_works(openai_server):
    openai_server.script.extend(["garbage"] * 3)
    emb = embedder(openai_server, retries=2)
    with pytest.raises(EmbeddingAnswerError, match="malformed embeddings response") as info:
        emb.embed(["one", "two"])
    assert openai_server.base_url in str(info.value) and "<html>" in str(info.value)
    np.testing.assert_allclose(emb.embed(["one"]), expected_vectors(["one"]), atol=1e-6)


#: what the error says of each bad answer (6 inputs; the fake's BAD_ANSWERS)
BAD_ANSWER_MESSAGES = {
    "duplicate_index": "indices that are not one per input (6 embeddings for 6 inputs: "
    "missing 0; repeated 5)",
    "wrong_dim": "vectors of shape (1535,), not (1536,), for 6 of 6 inputs",
    "nan": "returned non-finite values for 2 of 6 inputs",
    "zero": "returned all-zero vectors for 1 of 6 inputs",
    "bad_base64": "returned an undecodable embedding",
    "garbage": "returned a malformed embeddings response",
}


@pytest.mark.parametrize("answer", BAD_ANSWERS)
def test_a_bad_openai_answer_is_retried_then_refused_naming_the_api_and_the_check(
    openai_server, answer
):
    """Before, an answer with index 0 missing and the last index twice was sorted by index
    and accepted: 5 of 6 chunks got the vectors of others. Every answer is checked; a bad one
    is retried (it may be transient), then refused."""
    texts = [f"chunk {i}" for i in range(6)]
    openai_server.script.extend([answer] * 3)
    emb = embedder(openai_server, retries=2)
    with pytest.raises(EmbeddingAnswerError) as info:
        emb.embed(texts)
    message = str(info.value)
    assert message.startswith(f"the API at {openai_server.base_url}/ (text-embedding-3-small)")
    assert BAD_ANSWER_MESSAGES[answer] in message and "after 2 retries" in message, message
    assert len(openai_server.requests) == 3
    openai_server.script.append(answer)  # once only: the retry gets a good answer
    np.testing.assert_allclose(emb.embed(texts), expected_vectors(texts), atol=1e-6)


def test_the_embedders_failures_are_classed_by_whose_fault_they_are(openai_server):
    """Exit 1 / 502-503 for the service's failures, exit 2 for the settings' (cli, serve)."""
    openai_server.script.extend([429, 429])
    with pytest.raises(EmbedderUnavailableError, match="HTTP 429"):
        embedder(openai_server, retries=1).embed(["x"])
    openai_server.script.append("hang")
    openai_server.hang_s = 1.0
    with pytest.raises(EmbedderUnavailableError, match="timed out"):
        embedder(openai_server, retries=0, timeout=0.3).embed(["x"])
    with pytest.raises(EmbedderUnavailableError, match="cannot reach"):
        OpenAIEmbedder(
            "sk-test", base_url=f"http://127.0.0.1:{free_port()}/v1", max_retries=0
        ).embed(["x"])
    openai_server.script.append(422)
    with pytest.raises(EmbedServiceError, match="HTTP 422") as info:
        embedder(openai_server).embed(["x"])
    assert not isinstance(info.value, EmbedderUnavailableError)
    openai_server.script.append(401)  # a wrong API key: the settings' fault
    with pytest.raises(EmbedError, match="HTTP 401") as info:
        embedder(openai_server).embed(["x"])
    assert not isinstance(info.value, EmbedServiceError)


def test_openai_usage_is_summed_over_concurrent_requests():
    texts = [f"word{i} and more words" for i in range(9)]
    with FakeOpenAI(latency_s=0.02) as server:
        emb = embedder(server, timeout=5.0, batch_size=2, concurrency=3)
        emb.embed(texts)
    assert emb.tokens_used == sum(len(t.split()) for t in texts)  # the fake's "tokens"


def test_openai_counting_failure_under_concurrency_is_raised_not_hung(monkeypatch):
    """Batches are cut by a thread of their own; its failure reaches the caller."""
    with FakeOpenAI(latency_s=0.02) as server:
        emb = embedder(server, timeout=5.0, batch_size=1, concurrency=2)
        real_count = emb.tokenizer.count

        def count(texts):
            if any("poison" in t for t in texts):
                raise RuntimeError("tokenizer broke on poison")
            return real_count(texts)

        monkeypatch.setattr(emb.tokenizer, "count", count)
        texts = [f"t{i}" for i in range(300)] + ["poison"]
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="poison"):
            emb.embed(texts)
        assert time.monotonic() - started < 30
        assert len(server.requests) <= 300


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_rate_limiter_counts_each_request_until_a_window_after_its_answer():
    clock = FakeClock()
    limiter = RateLimiter(RateLimit(2, None, 60.0), clock=clock)
    window = 60.0 * 1.01  # period plus its margin
    first, _ = limiter.try_acquire()
    second, _ = limiter.try_acquire()
    assert first and second
    assert limiter.try_acquire() == (None, None)  # both in flight: only a release helps
    clock.now += 0.3  # the answers come back 0.3 s later
    limiter.release(first)
    limiter.release(second)
    slot, wait_s = limiter.try_acquire()
    assert slot is None and wait_s == pytest.approx(window)  # a window after the answer
    clock.now += window
    assert limiter.try_acquire()[0] is not None


def test_rate_limiter_tokens_per_window():
    clock = FakeClock()
    limiter = RateLimiter(RateLimit(None, 100, 60.0), clock=clock)
    a, _ = limiter.try_acquire(60)
    assert a is not None
    assert limiter.try_acquire(50) == (None, None)  # 110 > 100 and the 60 are in flight
    limiter.release(a)
    slot, wait_s = limiter.try_acquire(50)
    assert slot is None and wait_s == pytest.approx(60.6)
    b, _ = limiter.try_acquire(40)  # 60 + 40 fits now
    assert b is not None
    limiter.release(b)
    clock.now += 60.6
    big, _ = limiter.try_acquire(250)  # more than the limit: goes alone, in an empty window
    assert big is not None


def test_rate_limiter_pause_holds_every_request():
    clock = FakeClock()
    limiter = RateLimiter(None, clock=clock)
    assert limiter.try_acquire()[0] is not None
    limiter.pause_for(2.5)
    assert limiter.try_acquire() == (None, pytest.approx(2.5))
    clock.now += 2.5
    assert limiter.try_acquire()[0] is not None


def test_rate_limiter_blocks_threads_until_release():
    limiter = RateLimiter(RateLimit(1, None, 0.2))
    first = limiter.acquire()
    got = []
    waiter = threading.Thread(target=lambda: got.append(limiter.acquire()))
    waiter.start()
    time.sleep(0.3)
    assert got == []  # the first is still in flight
    started = time.monotonic()
    limiter.release(first)
    waiter.join(5)
    assert got and got[0] is not None
    assert time.monotonic() - started >= 0.2  # a window after the release


def test_openai_settings_reach_the_embedder():
    from rag_pipeline.config import load_settings
    from rag_pipeline.embed import create_embedder

    emb = create_embedder(
        load_settings(
            embedder="openai",
            openai_api_key="sk-test",
            openai_concurrency=6,
            openai_requests_per_minute=500,
            openai_tokens_per_minute=50_000,
        ).embedding()
    )
    assert emb.concurrency == 6
    assert emb.rate_limit == RateLimit(500, 50_000, 60.0)
    assert emb.max_batch_tokens == 50_000  # one batch never needs more than a window holds


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_qdrant_server_fails_cleanly_after_retries():
    url = f"http://127.0.0.1:{free_port()}"
    store = QdrantStore("c", COLLECTION_SCHEMA, url=url, retries=3, timeout_s=1)
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError, match="unreachable after 3 attempts") as info:
        store.count(tenant_filter("book"))
    assert url in str(info.value)
    assert time.monotonic() - started >= 0.5  # it backed off between attempts


@pytest.mark.slow
def test_an_unreachable_server_is_said_once_by_the_store_not_by_the_clients_version_check():
    """qdrant-client's start-up check warned "Failed to obtain server version ... Set
    check_compatibility=False" before the store's own error: in a process that uses the store
    that one is filtered, the incompatible-version warning is not (a process of its own: the
    suite's warning filters would hide the difference)."""
    script = (
        "import rag_pipeline.store.qdrant\n"
        "from qdrant_client.common.client_warnings import show_warning\n"
        "show_warning('Failed to obtain server version. Unable to check compatibility.')\n"
        "show_warning('Qdrant client version 1.20.0 is incompatible with server version 0.1.0.')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert "incompatible with server version 0.1.0" in done.stderr, done.stderr
    assert "Failed to obtain server version" not in done.stderr, done.stderr


def test_cluster_collection_gets_shards_replication_and_tenant_index():
    with FakeQdrant() as server:
        store = QdrantStore(
            "books",
            COLLECTION_SCHEMA,
            url=server.url,
            api_key="secret",
            shards=3,
            replication_factor=2,
        )
        store.ensure_collection(CollectionSpec("books", 384))
        created = server.collections["books"]
        assert created["shard_number"] == 3 and created["replication_factor"] == 2
        assert created["write_consistency_factor"] == 2
        assert created["vectors"]["dense"] == {"size": 384, "distance": "Cosine"}
        assert created["sparse_vectors"]["sparse"]["modifier"] == "idf"
        indexes = server.indexes["books"]
        assert indexes["book_id"] == {"type": "keyword", "is_tenant": True}
        assert indexes["chapter"]["type"] == "integer"
        assert "secret" in server.api_keys
        store.ensure_collection(CollectionSpec("books", 384))  # idempotent: nothing re-created


@pytest.mark.integration
def test_ingest_against_an_unreachable_server_names_the_cause(tmp_path, sample_books):
    env = {
        **os.environ,
        "RAG_DATA_DIR": str(sample_books),
        "RAG_EMBEDDER": "hash",
        "RAG_QDRANT_URL": f"http://127.0.0.1:{free_port()}",
        "RAG_QDRANT_RETRIES": "2",
        "DAGSTER_HOME": str(tmp_path / "home"),
    }
    proc = fresh_cli(["ingest"], env, tmp_path, timeout=300)
    assert proc.returncode == 2
    assert "unreachable after 2 attempts" in proc.stderr
    assert_no_trace(proc.stderr)


def test_a_failed_purge_run_prints_no_dagster_stack_trace(
    tmp_path, data_dir, write_book, monkeypatch, capfd
):
    """A purge run that fails is the book's error in the report; Dagster's console prints no
    stack trace of it (nor of the run's failure), while the run's event log keeps the error."""
    import shutil

    from dagster import DagsterInstance

    from rag_pipeline.defs import jobs
    from rag_pipeline_tests.conftest import section
    from rag_pipeline_tests.test_runner import ingest_books

    write_book("alpha", {"a.md": "# Alpha\n\n" + section("One")})
    write_book("beta", {"b.md": "# Beta\n\n" + section("Two", seed="b")})
    settings = hash_settings(data_dir, tmp_path)

    def refuse(book_id: str) -> None:
        raise RuntimeError(f"the store refused to delete {book_id}")

    with DagsterInstance.ephemeral() as instance:
        ingest_books(settings, instance)
        shutil.rmtree(data_dir / "beta")
        monkeypatch.setattr(jobs, "book_filter", refuse)
        capfd.readouterr()
        report = ingest_books(settings, instance)
        beta = report.books["beta"]
        assert beta.status == "failed"
        assert beta.error_messages == [
            "step purge_book_points failed: RuntimeError: the store refused to delete beta"
        ]
        out, err = capfd.readouterr()
        assert_no_trace(out + err)
        failure = next(
            e.dagster_event
            for e in instance.all_logs(beta.run_id)
            if e.dagster_event is not None and e.dagster_event.is_step_failure
        )
        assert failure.step_failure_data.error.stack  # what the UI shows, in full


KILLER = textwrap.dedent("""
    import os, signal, sys
    from rag_pipeline.config import load_settings
    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline.store import VectorStore

    sys.path.insert(0, os.getcwd())
    from rag_pipeline_tests.conftest import make_pipeline, make_recipe

    data_dir, qdrant, engine, kill_after = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    config = load_settings(qdrant_path=qdrant, qdrant_embedded=engine).store()
    real = VectorStore.upsert
    calls = {"n": 0}
    def upsert(self, points):
        calls["n"] += 1
        if calls["n"] > kill_after:
            half = points[: len(points) // 2]
            real(self, half)
            os.kill(os.getpid(), signal.SIGKILL)  # mid-write, no cleanup of any kind
        return real(self, points)
    VectorStore.upsert = upsert
    make_pipeline(data_dir, config, make_recipe(HashEmbedder())).run(["book"], run_id="run")
""")


@pytest.mark.integration
@pytest.mark.parametrize("engine", ["client", "edge"])
def test_kill_9_during_upsert_then_rerun_converges(tmp_path, write_book, data_dir, engine):
    from rag_pipeline.config import load_settings
    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline.ingest.consistency import check_index
    from rag_pipeline.schema import chunks_of
    from rag_pipeline.store import open_store
    from rag_pipeline_tests.conftest import make_pipeline, make_recipe, section, store_config

    files = {
        f"f{i}.md": "".join(section(f"S{j}", 3, 50, seed=f"{i}") for j in range(6))
        for i in range(6)
    }
    write_book("book", files)
    qdrant = str(tmp_path / "q")
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    # first run completes; then edit and kill the second run in the middle of its upserts
    subprocess.run(
        [sys.executable, str(script), str(data_dir), qdrant, engine, "1000"],
        check=True,
        timeout=300,
        cwd=REPO,
    )
    for i in range(3):
        path = data_dir / "book" / f"f{i}.md"
        path.write_text(path.read_text().replace("S2", "S2 edited"))
    os.remove(data_dir / "book" / "f5.md")
    proc = subprocess.run(
        [sys.executable, str(script), str(data_dir), qdrant, engine, "0"], timeout=300, cwd=REPO
    )
    assert proc.returncode == -signal.SIGKILL
    recipe = make_recipe(HashEmbedder())
    config = load_settings(qdrant_path=qdrant, qdrant_embedded=engine).store()
    run = make_pipeline(data_dir, config, recipe).run(["book"], run_id="recovery")["book"]
    assert set(run.inventory.changes.modified) >= {"f0.md", "f1.md", "f2.md"}
    with open_store(config, COLLECTION_SCHEMA) as store:
        report = check_index(store, "book", recipe.dimension)
        assert report.passed, report.problems()
        ids = {r.id for r in store.scroll(chunks_of("book"))}
    clean = make_pipeline(data_dir, store_config(tmp_path / "clean"), recipe)
    expected = clean.run(["book"], run_id="fresh")["book"]
    assert ids == {c.id for c in expected.chunked.chunks}


@pytest.mark.slow
def test_step_retry_policy_rides_out_an_outage_and_a_failed_run_recovers(
    openai_server, tmp_path, sample_books
):
    """Client retries (1) run out, the asset's RetryPolicy retries the step; when the outage
    outlasts both, the run fails naming the cause, and the next run completes."""
    from dagster import DagsterInstance, materialize

    from rag_pipeline.config import load_settings
    from rag_pipeline.defs.assets import ingestion_assets
    from rag_pipeline.defs.location import fixed_resources
    from rag_pipeline.ingest.pipeline import IngestPipeline

    settings = load_settings(
        data_dir=sample_books,
        qdrant_path=str(tmp_path / "q"),
        embedder="openai",
        openai_api_key="sk-test",
        openai_base_url=openai_server.base_url,
        openai_max_retries=1,
        openai_timeout_s=5,
    )
    resources = fixed_resources(IngestPipeline.from_settings(settings))
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("books", ["ros2-fundamentals"])

    openai_server.script.extend([429, 429])  # first step attempt fails, the retry succeeds
    result = materialize(
        ingestion_assets, partition_key="ros2-fundamentals", instance=instance, resources=resources
    )
    assert result.success
    assert result.retry_attempts_for_node("chunk_embeddings") == 1

    (sample_books / "ros2-fundamentals" / "00-intro.md").write_text("# New\n\nFresh text.")
    openai_server.script.extend([500] * 6)  # outlasts 1 client retry x 3 step attempts
    failed = materialize(
        ingestion_assets,
        partition_key="ros2-fundamentals",
        instance=instance,
        resources=resources,
        raise_on_error=False,
    )
    assert not failed.success
    message = step_failure(failed)
    assert "HTTP 500" in message and openai_server.base_url in message

    healed = materialize(
        ingestion_assets, partition_key="ros2-fundamentals", instance=instance, resources=resources
    )
    assert healed.success


@pytest.mark.slow
@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ("duplicate_index", "returned embedding indices that are not one per input"),
        ("nan", "returned non-finite values for 2 of"),
    ],
)
def test_an_ingest_given_bad_vectors_fails_naming_the_check_and_writes_nothing(
    openai_server, tmp_path, sample_books, monkeypatch, answer, message, quick_step_retries
):
    """Before, the duplicate-index answer was ingested (exit 0, 5 of 6 vectors another
    chunk's) and a NaN answer was reported only as "blocking asset check failed:
    vector_dimension". Now the embedding step fails with the answer's error."""
    from click.testing import CliRunner

    from rag_pipeline.cli import main
    from rag_pipeline.config import load_settings
    from rag_pipeline.store import open_store

    for name, value in {
        "RAG_DATA_DIR": str(sample_books),
        "RAG_QDRANT_PATH": str(tmp_path / "q"),
        "RAG_CACHE_DIR": str(tmp_path / "cache"),
        "RAG_EMBEDDER": "openai",
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_BASE_URL": openai_server.base_url,
        "RAG_OPENAI_MAX_RETRIES": "0",
        "DAGSTER_HOME": str(tmp_path / "home"),
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    openai_server.default = answer  # every request, every step attempt
    book = "ros2-fundamentals"
    result = CliRunner().invoke(main, ["ingest", "--book", book, "--json"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)["books"][book]
    assert report["status"] == "failed", report
    assert len(report["error_messages"]) == 1, report
    error = report["error_messages"][0]
    assert "step chunk_embeddings failed" in error and message in error, error
    # the error's class named as every message names one, not with its module's path
    assert "rag_pipeline." not in error and "Error: " in error, error
    assert f"the API at {openai_server.base_url}/" in error and "vector_dimension" not in error
    assert quick_step_retries  # its waits were shortened: the step failed under its policy
    with open_store(load_settings().store(), COLLECTION_SCHEMA) as store:
        assert store.count(tenant_filter(book)) == 0


@pytest.mark.parametrize(
    ("recorded", "cls_name", "shown"),
    [
        (
            "rag_pipeline.sources.base.BookUnavailableError: git: no such repository",
            "BookUnavailableError",
            "BookUnavailableError: git: no such repository",
        ),
        ("ValueError: bad vector", "ValueError", "ValueError: bad vector"),
        # a message that only looks like one keeps every word
        ("see a.b.ValueError: x", "ValueError", "see a.b.ValueError: x"),
        ("other.Error: x", "ValueError", "other.Error: x"),
    ],
)
def test_a_failed_steps_error_names_its_class_without_its_module(recorded, cls_name, shown):
    from rag_pipeline.defs.runner import _without_module

    assert _without_module(recorded, cls_name) == shown

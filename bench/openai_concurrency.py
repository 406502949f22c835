"""OpenAI path: wall time of one embed call at concurrency 1 vs 4, and the client rate limit.

    python bench/openai_concurrency.py [--chunks 10000] [--latency 0.3]

Runs against the fake OpenAI server of the test suite (rag_pipeline_tests/fakes.py), which
answers every request after ``--latency`` seconds and refuses (429) a request that arrives
when its last second already holds the limit of accepted ones. The server runs in a process
of its own (its work is not ours to pay for in a real deployment; in this process it would
compete for the GIL). The texts are 60-180 word passages of the powershell-docs corpus,
batched as the embedder does (256 inputs / 100k tokens per request by default).

Concurrency 1 and 4, alternated over ``--rounds`` rounds (1 4, then 4 1, ...), with a client
limit the server allows (it must not bind at 4); the speed-up is the median of the rounds'
ratios. Then concurrency 4 with a client limit below the rate 4 requests in flight would
reach, to show that it holds. For each: wall time, requests, the most requests the server saw in any
second, 429s. Asserts: concurrency 4 at least 3x faster than 1, no request over the client's
limit (server-side count) and no 429. The limits are per second (RateLimit(period_s=1)) so the
runs take seconds; the settings RAG_OPENAI_REQUESTS_PER_MINUTE / _TOKENS_PER_MINUTE build the
same limiter with a 60 s window. Prints JSON and writes bench/results/openai_concurrency.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import statistics
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "corpora" / "powershell-docs" / "books"
sys.path.insert(0, str(REPO))

from rag_pipeline.embed.openai import OpenAIEmbedder, RateLimit  # noqa: E402
from rag_pipeline_tests.fakes import FakeOpenAI, _vector  # noqa: E402


def passages(count: int) -> list[str]:
    """Passages of 60-180 words cut from the powershell-docs corpus (English prose and code;
    about 200 cl100k tokens on average, as the real chunks), cycled to ``count``."""
    words: list[str] = []
    for path in sorted(CORPUS.rglob("*.md"))[:400]:
        words += path.read_text(errors="replace").split()
        if len(words) > 400_000:
            break
    rng = random.Random(11)
    texts, start = [], 0
    for i in range(count):
        size = rng.randint(60, 180)
        if start + size > len(words):
            start = 0
        texts.append(f"Passage {i}. " + " ".join(words[start : start + size]))
        start += size
    return texts


def serve(conn: Connection, latency: float, limit: int) -> None:
    """The fake server, in a child process: sends its URL, then its counts when told to stop."""
    with FakeOpenAI(latency_s=latency, rate_limit=(limit, 1.0)) as server:
        conn.send(server.base_url)
        conn.recv()
        conn.send(
            {
                "requests": len(server.requests),
                "max_in_flight": server.max_in_flight,
                "max_requests_in_any_1s": server.max_in_window(1.0),
                "max_requests_in_any_60s": server.max_in_window(60.0),
                "rejected_429": server.rejected,
            }
        )


def run(
    texts: list[str], concurrency: int, client_limit: int, server_limit: int, latency: float
) -> dict:
    parent, child = mp.Pipe()
    process = mp.get_context("fork").Process(target=serve, args=(child, latency, server_limit))
    process.start()
    try:
        embedder = OpenAIEmbedder(
            "sk-bench",
            base_url=parent.recv(),
            timeout_s=60.0,
            concurrency=concurrency,
            rate_limit=RateLimit(requests=client_limit, period_s=1.0),
        )
        started = time.perf_counter()
        vectors = embedder.embed(texts)
        seconds = time.perf_counter() - started
        embedder.close()
        parent.send("stop")
        server = parent.recv()
    finally:
        process.join(timeout=10)
    check = random.Random(3).sample(range(len(texts)), 50)
    in_order = all(np.allclose(vectors[i], _vector(texts[i], 1536), atol=1e-6) for i in check)
    return {
        "concurrency": concurrency,
        "client_limit_requests_per_s": client_limit,
        "server_limit_requests_per_s": server_limit,
        "seconds": round(seconds, 2),
        "chunks_per_s": round(len(texts) / seconds),
        **server,
        "vectors_in_input_order": in_order,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=10_000)
    parser.add_argument("--latency", type=float, default=0.3)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    texts = passages(args.chunks)
    tokens = OpenAIEmbedder("sk-bench").tokenizer.count(texts)
    # concurrency 1 and 4 alternated (1 4 4 1 ...): a busy shared machine slows both alike
    pairs: list[dict[int, dict]] = []
    for round_ in range(args.rounds):
        pair = {}
        for concurrency in (1, 4) if round_ % 2 == 0 else (4, 1):
            pair[concurrency] = run(texts, concurrency, 20, 20, args.latency)
        pairs.append(pair)
    ratios = [p[1]["seconds"] / p[4]["seconds"] for p in pairs]
    runs = {
        "concurrency_1": min((p[1] for p in pairs), key=lambda r: r["seconds"]),
        "concurrency_4": min((p[4] for p in pairs), key=lambda r: r["seconds"]),
        "concurrency_4_limited": run(
            texts, 4, client_limit=5, server_limit=5, latency=args.latency
        ),
    }
    speedup = statistics.median(ratios)
    results = {
        "chunks": len(texts),
        "tokens": sum(tokens),
        "latency_s": args.latency,
        "seconds_concurrency_1": [p[1]["seconds"] for p in pairs],
        "seconds_concurrency_4": [p[4]["seconds"] for p in pairs],
        "speedup_per_round": [round(r, 2) for r in ratios],
        "speedup_4_vs_1": round(speedup, 2),
        **runs,
    }
    print(json.dumps(results, indent=2))
    out = REPO / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "openai_concurrency.json").write_text(json.dumps(results, indent=2))
    for name, r in runs.items():
        assert r["vectors_in_input_order"], name
        assert r["rejected_429"] == 0, name
        assert r["max_requests_in_any_1s"] <= r["client_limit_requests_per_s"], name
    assert runs["concurrency_4"]["max_in_flight"] == 4
    assert speedup >= 3.0, f"concurrency 4 is only {speedup:.2f}x faster than 1"


if __name__ == "__main__":
    main()

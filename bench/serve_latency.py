"""Query-service latency over HTTP at >= 50,000 chunks, and an ingest while it serves.

    nice -n 5 python bench/serve_latency.py [--copies 4] [--seconds 60] [--clients 20]
                                            [--model-threads N] [--rebuild] [--skip-ingest]

1. Collection: the PowerShell docs corpus (25 books) is chunked by the project's chunker (the
   MiniLM budget) and copied ``--copies`` times under new book ids (``<book>-<n>``) into a
   Qdrant Edge collection at ``.rag/bench/serve/qdrant`` (kept for re-runs). Payloads and
   sparse vectors are the real ones of the chunk texts; dense vectors are seeded random unit
   vectors: with Edge's plain (exact) index a search scores every chunk of the book whatever
   their values, and embedding 14k chunks takes half an hour on a loaded 2-core machine.
2. ``rag-pipeline serve --cache-size 0`` (every query is embedded: the end-to-end figure),
   hybrid search (min-max fusion), limit 10, one book per request, 20 queries in rotation:
   one client for ``--seconds``, then ``--clients`` concurrent clients for ``--seconds``
   (keep-alive connections). Then the same with the query-embedding cache on (repeated
   queries: the embedding is skipped).
3. Ingest while serving: a small book (Microsoft.PowerShell.Archive plus a new file with a
   unique word) goes through ``rag-pipeline ingest --book`` (Dagster, the real MiniLM model)
   while two clients keep searching; then the service is asked for the unique word.

Prints one JSON object (also written to bench/results/serve-latency.json).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlencode

import numpy as np
from common import save_results
from powershell_queries import QUERIES  # bench/, the script's own folder

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "corpora" / "powershell-docs" / "books"
WORK = REPO / ".rag" / "bench" / "serve"
LIVE_SOURCE = "Microsoft.PowerShell.Archive"
LIVE_BOOK = "bench-live"


def env(data_dir: Path) -> dict[str, str]:
    out = {
        **os.environ,
        "RAG_DATA_DIR": str(data_dir),
        "RAG_QDRANT_PATH": str(WORK / "qdrant"),
        "RAG_QDRANT_EMBEDDED": "edge",
        "RAG_CACHE_DIR": str(REPO / ".rag" / "cache"),
        "RAG_EMBEDDER": "local",
        "DAGSTER_HOME": str(WORK / "dagster_home"),
        "DO_NOT_TRACK": "1",
        "PYTHONWARNINGS": "ignore",
        "PYTHONPATH": str(REPO),
    }
    for var in ("RAG_QDRANT_URL", "RAG_COLLECTION"):
        out.pop(var, None)
    return out


# -- the collection ---------------------------------------------------------------------------


def build(copies: int) -> dict[str, object]:
    """Chunk the corpus once and write ``copies`` copies of every book."""
    from rag_pipeline.config import ChunkingConfig, load_settings
    from rag_pipeline.embed.local import LocalEmbedder
    from rag_pipeline.ingest.index import chunk_payload
    from rag_pipeline.ingest.pipeline import IngestPipeline
    from rag_pipeline.recipes.recipe import IndexRecipe
    from rag_pipeline.schema import COLLECTION_SCHEMA
    from rag_pipeline.store import CollectionSpec, PointRecord
    from rag_pipeline.store.edge import EdgeStore

    shutil.rmtree(WORK / "qdrant", ignore_errors=True)
    embedder = LocalEmbedder(cache_dir=REPO / ".rag" / "cache" / "models")
    recipe = IndexRecipe.build(embedder, ChunkingConfig())
    # the pipeline's own stages chunk the corpus (nothing written: a scratch store in memory)
    scratch = load_settings(data_dir=str(CORPUS), qdrant_path=":memory:", collection="scratch")
    pipeline = IngestPipeline.from_settings(scratch, recipe)
    lineage = recipe.lineage(run_id=None)
    started = time.perf_counter()
    chunks = []
    for book in sorted(p.name for p in CORPUS.iterdir() if p.is_dir()):
        inventory = pipeline.assess([book])[book].inventory
        chunks.extend(pipeline.chunk(pipeline.parse({book: inventory}))[book].chunks)
    chunk_s = time.perf_counter() - started
    sparse = recipe.sparse.encode_documents([c.embed_text for c in chunks])
    rng = np.random.default_rng(7)
    dense = rng.standard_normal((len(chunks), recipe.dimension)).astype(np.float32)
    dense /= np.linalg.norm(dense, axis=1, keepdims=True)

    def copy_id(point_id: str | None, n: int) -> str | None:
        return None if not point_id else str(uuid.uuid5(uuid.NAMESPACE_URL, f"{point_id}/{n}"))

    store = EdgeStore("rag_chunks", WORK / "qdrant", COLLECTION_SCHEMA)
    written_started = time.perf_counter()
    try:
        store.ensure_collection(CollectionSpec("rag_chunks", recipe.dimension))
        for n in range(copies):
            points = []
            for i, chunk in enumerate(chunks):
                payload = chunk_payload(chunk, lineage)
                payload["book_id"] = f"{chunk.book_id}-{n}"
                for key in ("parent_doc_id", "prev_chunk_id", "next_chunk_id"):
                    payload[key] = copy_id(payload[key], n)
                points.append(PointRecord(str(copy_id(chunk.id, n)), payload, dense[i], sparse[i]))
            store.upsert(points)
    finally:
        store.close()
    return {
        "chunks_per_copy": len(chunks),
        "points": len(chunks) * copies,
        "chunk_s": round(chunk_s, 1),
        "upsert_s": round(time.perf_counter() - written_started, 1),
        "books": sorted({c.book_id for c in chunks}),
    }


# -- the service and its clients --------------------------------------------------------------


class Service:
    #: extra ``rag-pipeline serve`` options (--model-threads)
    options: tuple[str, ...] = ()

    def __init__(self, data_dir: Path, cache_size: int) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "rag_pipeline.cli", "serve"),
                *("--port", str(self.port), "--cache-size", str(cache_size)),
                *self.options,
            ],
            env=env(data_dir),
            cwd=WORK,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                status, _ = Client(self.port).get("/health")
                if status == 200:
                    return
            except OSError:
                time.sleep(0.3)
        raise SystemExit("the service did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


class Client:
    """One keep-alive HTTP connection."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

    def get(self, path: str, **params: object) -> tuple[int, object]:
        url = path + ("?" + urlencode(params, doseq=True) if params else "")
        try:
            self.conn.request("GET", url)
            response = self.conn.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException):
            self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
            raise
        return response.status, json.loads(body)


def request_params(i: int, books: list[str], copies: int) -> dict[str, object]:
    return {
        "q": QUERIES[i % len(QUERIES)],
        "book": f"{books[i % len(books)]}-{(i // len(books)) % copies}",
        "limit": 10,
    }


def load(
    port: int, clients: int, seconds: float, books: list[str], copies: int
) -> dict[str, object]:
    """``clients`` closed-loop clients for ``seconds``: latency of every request."""
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds
    counter = iter(range(10**9))

    def run() -> None:
        client = Client(port)
        while time.monotonic() < deadline:
            with lock:
                i = next(counter)
            started = time.perf_counter()
            try:
                status, body = client.get("/search", **request_params(i, books, copies))
                ok = status == 200 and isinstance(body, list)
            except Exception as exc:
                status, ok = -1, False
                body = repr(exc)
            elapsed = time.perf_counter() - started
            with lock:
                latencies.append(elapsed)
                if not ok:
                    errors.append(f"{status}: {str(body)[:200]}")

    threads = [threading.Thread(target=run) for _ in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    return {**summary(latencies), "rps": round(len(latencies) / wall, 1), "errors": len(errors)} | (
        {"first_errors": errors[:3]} if errors else {}
    )


def summary(latencies: list[float]) -> dict[str, object]:
    ms = sorted(v * 1000 for v in latencies)
    if not ms:
        return {"requests": 0}
    return {
        "requests": len(ms),
        "p50_ms": round(statistics.median(ms), 1),
        "p90_ms": round(ms[min(int(len(ms) * 0.90), len(ms) - 1)], 1),
        "p99_ms": round(ms[min(int(len(ms) * 0.99), len(ms) - 1)], 1),
        "max_ms": round(ms[-1], 1),
    }


def warm(port: int, books: list[str], copies: int, n: int = 20) -> None:
    client = Client(port)
    for i in range(n):
        client.get("/search", **request_params(i, books, copies))


# -- ingest while serving ---------------------------------------------------------------------


def ingest_while_serving(books: list[str], copies: int, searchers: int) -> dict[str, object]:
    """``rag-pipeline ingest --book`` of a small book while ``searchers`` clients search."""
    data_dir = WORK / "books"
    shutil.rmtree(data_dir, ignore_errors=True)
    shutil.copytree(CORPUS / LIVE_SOURCE, data_dir / LIVE_BOOK)
    word = f"quokkatron{int(time.time())}"  # new on every run: the ingest always has work
    (data_dir / LIVE_BOOK / "zz-live.md").write_text(
        f"---\ntitle: Live\n---\n## Flux\n\nThe {word} flux capacitor needs exactly 1.21 "
        "gigawatts; this file was written while the query service was serving.\n",
        encoding="utf-8",
    )
    service = Service(data_dir, cache_size=1024)
    try:
        warm(service.port, books, copies)
        done = threading.Event()
        latencies: list[float] = []
        errors: list[int] = []
        lock = threading.Lock()

        def search_until_done(k: int) -> None:
            client, i = Client(service.port), k
            while not done.is_set():
                started = time.perf_counter()
                try:
                    status, _ = client.get("/search", **request_params(i, books, copies))
                except Exception:
                    status = -1
                with lock:
                    latencies.append(time.perf_counter() - started)
                    if status != 200:
                        errors.append(status)
                i += searchers

        threads = [threading.Thread(target=search_until_done, args=(k,)) for k in range(searchers)]
        for t in threads:
            t.start()
        started = time.perf_counter()
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "rag_pipeline.cli", "ingest", "--book", LIVE_BOOK, "--json"],
                env=env(data_dir),
                cwd=WORK,
                capture_output=True,
                text=True,
                timeout=1800,
            )
        finally:
            ingest_s = time.perf_counter() - started
            done.set()
            for t in threads:
                t.join()
        result: dict[str, object] = {"ingest_rc": proc.returncode, "ingest_s": round(ingest_s, 1)}
        try:
            report = json.loads(proc.stdout)["books"][LIVE_BOOK]
            result["ingest_book"] = {k: report.get(k) for k in ("status", "files", "chunks")}
        except (ValueError, KeyError):
            result["ingest_stderr"] = proc.stderr[-2000:]
        result["searches_during_ingest"] = {
            **summary(latencies),
            "errors": len(errors),
            "error_codes": sorted(set(errors)),
        }
        asked = time.perf_counter()
        status, hits = Client(service.port).get(
            "/search", q=f"{word} flux capacitor", book=LIVE_BOOK, limit=3
        )
        top = hits[0] if isinstance(hits, list) and hits else {}
        result["after_ingest"] = {
            "status": status,
            "top_source_file": top.get("source_file"),
            "found_new_text": word in str(top.get("text")),
            "search_ms": round((time.perf_counter() - asked) * 1000, 1),
        }
        _, health = Client(service.port).get("/health")
        assert isinstance(health, dict)
        result["service"] = {k: health[k] for k in ("store_opens", "store_step_asides")}
        return result
    finally:
        service.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--cached-seconds", type=float, default=20)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--rebuild", action="store_true", help="build the collection again")
    parser.add_argument("--skip-ingest", action="store_true")
    parser.add_argument("--build-only", action="store_true", help="build the collection, stop")
    parser.add_argument("--model-threads", type=int, default=None, help="serve --model-threads")
    args = parser.parse_args()
    if args.model_threads:
        Service.options = ("--model-threads", str(args.model_threads))
    WORK.mkdir(parents=True, exist_ok=True)
    meta_file = WORK / "collection.json"
    if args.rebuild or not meta_file.is_file():
        meta = build(args.copies)
        meta_file.write_text(json.dumps(meta))
    meta = json.loads(meta_file.read_text())
    print("collection", json.dumps({k: v for k, v in meta.items() if k != "books"}), flush=True)
    if args.build_only:
        return
    books, copies = meta["books"], args.copies
    results: dict[str, object] = {
        "points": meta["points"],
        "chunks_per_copy": meta["chunks_per_copy"],
        "cpus": os.cpu_count(),
        "load_avg_at_start": os.getloadavg(),
        "model_threads": args.model_threads or os.cpu_count(),
    }
    empty_dir = WORK / "no-books"
    empty_dir.mkdir(exist_ok=True)
    for cache_size, seconds, label in (
        (0, args.seconds, "uncached"),
        (1024, args.cached_seconds, "cached"),
    ):
        service = Service(empty_dir, cache_size)
        try:
            warm(service.port, books, copies, n=len(QUERIES) if cache_size else 20)
            single = load(service.port, 1, seconds, books, copies)
            print(label, "single", json.dumps(single), flush=True)
            many = load(service.port, args.clients, seconds, books, copies)
            print(label, f"{args.clients} clients", json.dumps(many), flush=True)
            results[label] = {"single": single, f"clients_{args.clients}": many}
        finally:
            service.stop()
    if not args.skip_ingest:
        results["ingest_while_serving"] = ingest_while_serving(books, copies, searchers=2)
        print("ingest", json.dumps(results["ingest_while_serving"]), flush=True)
    results["load_avg_at_end"] = os.getloadavg()
    save_results("serve-latency", results)


if __name__ == "__main__":
    main()

"""Filtered search latency on >= 50,000 chunks in both embedded stores.

    python bench/ingest.py             # the real chunks and vectors are copied from its index
    python bench/search_latency.py [--copies 4] [--queries 60]

The indexed corpus (about 14k chunks, 25 books) is copied `--copies` times under new book ids
into a fresh collection of each embedded engine, so every book filter selects a realistic
tenant. Query embedding is timed on its own; search times exclude it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
import uuid
import zlib
from pathlib import Path

import numpy as np
from powershell_queries import QUERIES  # bench/, the script's own folder

from rag_pipeline.config import load_settings
from rag_pipeline.embed.local import LocalEmbedder
from rag_pipeline.retrieve import search
from rag_pipeline.retrieve.filters import SearchFilters
from rag_pipeline.schema import COLLECTION_SCHEMA, chunks_of
from rag_pipeline.sparse import Bm25Encoder
from rag_pipeline.store import CollectionSpec, PointRecord, open_store

REPO = Path(__file__).resolve().parents[1]


def load_source(engine: str) -> list:
    settings = load_settings(
        qdrant_path=str(REPO / ".rag" / "bench" / f"ingest-{engine}" / "qdrant"),
        qdrant_embedded=engine,
    )
    points = []
    with open_store(settings.store(), COLLECTION_SCHEMA) as store:
        for book in store.tenants():
            points.extend(store.scroll(chunks_of(book), with_vectors=True))
    return points


def build(engine: str, source: list, copies: int, workdir: Path):
    folder = workdir / engine
    shutil.rmtree(folder, ignore_errors=True)
    settings = load_settings(qdrant_path=str(folder), qdrant_embedded=engine, collection="latency")
    store = open_store(settings.store(), COLLECTION_SCHEMA)
    store.ensure_collection(CollectionSpec("latency", 384))
    encoder = Bm25Encoder()
    sparse = encoder.encode_documents([p.payload["text"] for p in source])
    started = time.perf_counter()
    for copy in range(copies):
        points = []
        for record, vector in zip(source, sparse, strict=True):
            # the corpus has no chapter metadata: spread files over chapters 1-20 and tiers
            # 1-3, so the filtered case selects a real subset of each book
            spread = zlib.crc32(record.payload["source_file"].encode())
            payload = {
                **record.payload,
                "book_id": f"{record.payload['book_id']}-{copy}",
                "chapter": 1 + spread % 20,
                "hardware_tier": 1 + spread % 3,
            }
            points.append(
                PointRecord(
                    str(uuid.uuid5(uuid.NAMESPACE_URL, f"{record.id}/{copy}")),
                    payload,
                    record.dense,
                    vector,
                )
            )
        store.upsert(points)
    return store, time.perf_counter() - started


def percentiles(values: list[float]) -> dict:
    ms = sorted(v * 1000 for v in values)
    return {
        "p50_ms": round(statistics.median(ms), 2),
        "p95_ms": round(ms[int(len(ms) * 0.95) - 1], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=4)
    parser.add_argument("--queries", type=int, default=60)
    parser.add_argument("--engines", nargs="+", default=["edge", "client"])
    args = parser.parse_args()
    source = load_source("edge" if (REPO / ".rag/bench/ingest-edge").is_dir() else "client")
    books = sorted({p.payload["book_id"] for p in source})
    embedder = LocalEmbedder(cache_dir=REPO / ".rag" / "cache" / "models")
    queries = [QUERIES[i % len(QUERIES)] for i in range(args.queries)]
    embedder.embed_query("warm up")
    t = time.perf_counter()
    vectors = [embedder.embed_query(q) for q in queries]
    embed_times = (time.perf_counter() - t) / len(queries)

    class Fixed:  # the query vectors are computed once, outside the timed region
        model_name, dimension, tokenizer = embedder.model_name, 384, embedder.tokenizer
        current = np.zeros(384, dtype=np.float32)

        def embed_query(self, _text):
            return self.current

    fixed = Fixed()
    results: dict = {
        "points": len(source) * args.copies,
        "query_embed_ms": round(embed_times * 1000, 2),
    }
    workdir = REPO / ".rag" / "bench" / "latency"
    for engine in args.engines:
        store, load_s = build(engine, source, args.copies, workdir)
        out: dict = {
            "upsert_s": round(load_s, 1),
            "upsert_points_per_s": round(len(source) * args.copies / load_s),
        }
        cases = {
            "dense_book": dict(mode="dense"),
            "dense_book_chapter_tier": dict(
                mode="dense", filters=SearchFilters(chapter_min=1, chapter_max=10, hardware_tier=2)
            ),
        }
        if engine != "client":  # qdrant-client local scores sparse vectors in Python: minutes
            cases["hybrid_book"] = dict(mode="hybrid")
        for name, kwargs in cases.items():
            times = []
            for i, (query, vector) in enumerate(zip(queries, vectors, strict=True)):
                fixed.current = vector
                book = f"{books[i % len(books)]}-{i % args.copies}"
                started = time.perf_counter()
                search(store, fixed, query, book, limit=10, **kwargs)  # type: ignore[arg-type]
                times.append(time.perf_counter() - started)
            out[name] = percentiles(times)
        store.close()
        results[engine] = out
        print(engine, json.dumps(out), flush=True)
    print(json.dumps(results, indent=2))
    (REPO / "bench" / "results").mkdir(exist_ok=True)
    (REPO / "bench" / "results" / "search-latency.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

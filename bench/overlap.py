"""Does overlapping the work around the embedder pay on this machine? (issue #13)

    nice -n 5 python bench/overlap.py [--books B ...] [--rounds 2] [--precision fp32]

The same books of the powershell-docs corpus are indexed from scratch into a fresh Qdrant Edge
folder by two schedules of the ingest pipeline's own stages, alternated (serial, overlapped,
then overlapped, serial, ...) so a busy shared machine slows both alike:

* serial: per book, parse and chunk, then embed, then write (what a run does, step by step);
* overlapped: a thread parses and chunks the next books while the model embeds the current
  one, and another thread writes the previous book's points: the model never waits for them.

The inventories (file hashes, the empty index's state) are taken first, outside the timing,
identically for both. Reports the wall of each schedule, the time of each stage in the serial
one, what overlap could hide at most (the stages other than embedding) and what it hid. Prints
JSON and writes bench/results/overlap-<precision>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "corpora" / "powershell-docs" / "books"
BOOKS = [
    "ThreadJob",
    "Microsoft.PowerShell.Host",
    "Microsoft.PowerShell.Archive",
    "PSDiagnostics",
    "overview",
    "Microsoft.PowerShell.Diagnostics",
    "windows-powershell",
    "install",
]


def serial(books, pipeline, inventories) -> dict[str, float]:  # type: ignore[no-untyped-def]
    spent = {"chunk": 0.0, "embed": 0.0, "write": 0.0, "chunks": 0}
    for book in books:
        t0 = time.perf_counter()
        chunked = pipeline.chunk(pipeline.parse({book: inventories[book]}))
        t1 = time.perf_counter()
        embedded = pipeline.embed(chunked)
        t2 = time.perf_counter()
        pipeline.write(chunked, embedded, run_id="bench")
        t3 = time.perf_counter()
        spent["chunk"] += t1 - t0
        spent["embed"] += t2 - t1
        spent["write"] += t3 - t2
        spent["chunks"] += len(chunked[book].chunks)
    return spent


def overlapped(books, pipeline, inventories) -> dict[str, float]:  # type: ignore[no-untyped-def]
    chunked_q: queue.Queue = queue.Queue(maxsize=2)
    written_q: queue.Queue = queue.Queue(maxsize=2)
    errors: list[BaseException] = []

    def chunker() -> None:
        try:
            for book in books:
                chunked_q.put(pipeline.chunk(pipeline.parse({book: inventories[book]})))
        except BaseException as exc:
            errors.append(exc)
        chunked_q.put(None)

    def writer() -> None:
        while (job := written_q.get()) is not None:
            try:
                chunked, embedded = job
                pipeline.write(chunked, embedded, run_id="bench")
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=chunker), threading.Thread(target=writer)]
    for t in threads:
        t.start()
    embed_s = 0.0
    while (chunked := chunked_q.get()) is not None:
        t0 = time.perf_counter()
        embedded = pipeline.embed(chunked)
        embed_s += time.perf_counter() - t0
        written_q.put((chunked, embedded))
    written_q.put(None)
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return {"embed": embed_s}


def main() -> None:
    from rag_pipeline.config import ChunkingConfig, load_settings
    from rag_pipeline.embed.local import LocalEmbedder
    from rag_pipeline.ingest.pipeline import IngestPipeline
    from rag_pipeline.recipes.recipe import IndexRecipe

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--books", nargs="+", default=BOOKS)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "int8"])
    args = parser.parse_args()
    if not CORPUS.is_dir():
        raise SystemExit(f"needs the powershell-docs corpus at {CORPUS}")

    embedder = LocalEmbedder(cache_dir=REPO / ".rag" / "cache" / "models", precision=args.precision)
    recipe = IndexRecipe.build(embedder, ChunkingConfig())
    embedder.embed(["warm up the model"] * 8)
    work = Path(tempfile.mkdtemp(prefix="bench-overlap-"))
    schedules = {"serial": serial, "overlapped": overlapped}
    walls: dict[str, list[float]] = {name: [] for name in schedules}
    stages: list[dict[str, float]] = []
    chunks = 0
    try:
        for round_ in range(args.rounds):
            order = list(schedules) if round_ % 2 == 0 else list(reversed(schedules))
            for name in order:
                folder = work / f"{name}-{round_}"
                settings = load_settings(
                    data_dir=str(CORPUS), qdrant_path=str(folder), collection="bench_overlap"
                )
                pipeline = IngestPipeline.from_settings(settings, recipe)
                try:
                    assessed = pipeline.assess(args.books, force=True)
                    inventories = {b: a.inventory for b, a in assessed.items()}
                    started = time.perf_counter()
                    spent = schedules[name](args.books, pipeline, inventories)
                    walls[name].append(time.perf_counter() - started)
                    if name == "serial":
                        stages.append(spent)
                    chunks = int(spent.get("chunks", chunks))
                finally:
                    shutil.rmtree(folder, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    median = {name: statistics.median(w) for name, w in walls.items()}
    stage_median = {k: statistics.median(s[k] for s in stages) for k in ("chunk", "embed", "write")}
    hideable = stage_median["chunk"] + stage_median["write"]
    results = {
        "books": args.books,
        "chunks": chunks,
        "precision": args.precision,
        "cpus": os.cpu_count(),
        "rounds": args.rounds,
        "wall_s": {name: [round(w, 2) for w in ws] for name, ws in walls.items()},
        "serial_stage_s_median": {k: round(v, 2) for k, v in stage_median.items()},
        "hideable_share_of_serial": round(hideable / median["serial"], 3),
        "overlapped_to_serial": round(median["overlapped"] / median["serial"], 3),
        "hidden_share_of_hideable": round((median["serial"] - median["overlapped"]) / hideable, 2),
    }
    print(json.dumps(results, indent=2))
    out = REPO / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"overlap-{args.precision}.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

"""What a one-file edit costs in books of different sizes, in process (issue 40.4).

    python bench/edit_growth.py --data DIR --qdrant DIR [--books big-book book-0000]
                                [--rounds 3] [--json]

On books already indexed with the hash embedder (``bench/million.py`` leaves some: its
``million-N/books`` and ``million-N/qdrant``), each round appends a section to one file of
each book in turn and runs the pipeline's stages for that book in this process (what a
Dagster run's steps do, its store handles kept from step to step, without Dagster): the CPU
seconds of the run, its wall seconds and
the points the store handed back (every scroll page counted), per book. The same command
with ``PYTHONPATH`` naming another checkout measures that code on the same books.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from scale import EDIT_SECTION


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--qdrant", type=Path, required=True)
    parser.add_argument("--books", nargs="+", default=["big-book", "book-0000"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from rag_pipeline.config import load_settings
    from rag_pipeline.ingest.pipeline import IngestPipeline
    from rag_pipeline.schema import chunks_of
    from rag_pipeline.store import base
    from rag_pipeline.store.edge import EdgeStore
    from rag_pipeline.store.sharing import kept_open

    settings = load_settings(
        data_dir=args.data, qdrant_path=str(args.qdrant), embedder="hash", cache_dir=args.qdrant
    )
    pipeline = IngestPipeline.from_settings(settings)
    read = [0]
    real = EdgeStore._scroll_page

    def counting(self: EdgeStore, page: base.ScrollPage) -> tuple[list[Any], Any]:
        records, offset = real(self, page)
        read[0] += len(records)
        return records, offset

    EdgeStore._scroll_page = counting  # type: ignore[method-assign]
    samples: dict[str, list[dict[str, float]]] = {b: [] for b in args.books}
    points: dict[str, int] = {}
    for r in range(args.rounds):
        for book in args.books:
            edited = sorted((args.data / book).iterdir())[2]
            marker = EDIT_SECTION.replace("scale", f"growth {time.time()}")
            edited.write_text(edited.read_text() + marker)
            read[0] = 0
            cpu, wall = time.process_time(), time.perf_counter()
            with kept_open():  # a run's handles kept from step to step, as its resource has them
                ran = pipeline.run([book], run_id=f"growth-{r}-{book}")[book]
            sample = {
                "cpu_s": round(time.process_time() - cpu, 3),
                "wall_s": round(time.perf_counter() - wall, 3),
                "points_read": read[0],
                "embedded": ran.embedded.embedded,
            }
            samples[book].append(sample)
            print(f"round {r} {book}: {sample}", file=sys.stderr, flush=True)
    with EdgeStore(settings.store().collection, args.qdrant, pipeline_schema()) as store:
        for book in args.books:
            points[book] = store.count(chunks_of(book))
    result = {
        "books": {
            b: {
                "chunk_points": points[b],
                "cpu_s_median": statistics.median(s["cpu_s"] for s in samples[b]),
                "wall_s_median": statistics.median(s["wall_s"] for s in samples[b]),
                "points_read_median": statistics.median(s["points_read"] for s in samples[b]),
                "samples": samples[b],
            }
            for b in args.books
        }
    }
    print(json.dumps(result, indent=2) if args.json else result)


def pipeline_schema() -> Any:
    from rag_pipeline.schema import COLLECTION_SCHEMA

    return COLLECTION_SCHEMA


if __name__ == "__main__":
    main()

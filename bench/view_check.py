"""What one view per answer costs: ``context`` and ``lineage`` read with and without the
check of the book's generation around their reads (``retrieve/view.py``), in one process on
one held Qdrant Edge handle (no HTTP), rounds interleaved.

    python bench/view_check.py [--rounds 20]

The sample books are indexed (hash embedder) into a fresh store under ``/dev/shm``; each
round reads the context and the lineage of 50 chunks of one book both ways.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rag_pipeline.retrieve.lineage import _read_point, read_point  # noqa: E402
from rag_pipeline.retrieve.search import _context, expand_context  # noqa: E402
from rag_pipeline.schema import COLLECTION_SCHEMA, chunks_of  # noqa: E402
from rag_pipeline.store import open_store  # noqa: E402
from rag_pipeline_tests.conftest import store_config  # noqa: E402
from rag_pipeline_tests.helpers import index_books  # noqa: E402

BOOK = "ros2-fundamentals"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    try:
        shutil.copytree(REPO / "data" / "books", root / "books")
        index_books(root / "books", str(root / "q"))
        with open_store(store_config(root / "q"), COLLECTION_SCHEMA) as store:
            ids = [str(r.id) for r in store.scroll(chunks_of(BOOK), fields=[])][:50]
            ways: dict[str, Callable[[str], object]] = {
                "context, unchecked": lambda i: _context(store, BOOK, i, 1, 1),
                "context, one view": lambda i: expand_context(store, BOOK, i),
                "lineage, unchecked": lambda i: _read_point(store, BOOK, i),
                "lineage, one view": lambda i: read_point(store, BOOK, i),
            }
            wall = dict.fromkeys(ways, 0.0)
            cpu = dict.fromkeys(ways, 0.0)
            for _ in range(args.rounds):
                for name, read in ways.items():
                    c0, t0 = time.process_time(), time.perf_counter()
                    for point in ids:
                        read(point)
                    wall[name] += time.perf_counter() - t0
                    cpu[name] += time.process_time() - c0
        answers = args.rounds * len(ids)
        for name in ways:
            print(
                f"{name}: {wall[name] / answers * 1e6:.0f} us wall, "
                f"{cpu[name] / answers * 1e6:.0f} us CPU per answer"
            )
        print(f"load average {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

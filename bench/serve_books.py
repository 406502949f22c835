"""`rag-pipeline serve` over many books under an open-files limit (issue 30, case 3).

    python bench/serve_books.py [--books 5000] [--files-limit 4096] [--work DIR] [--json]

Builds ``--books`` one-file books (hash embedder, indexed in-process by the ingest
pipeline: ``IngestPipeline.run``), starts `rag-pipeline serve` with its open-files limit set to
``--files-limit`` (soft and hard: what a default systemd service or container gets, which the
service cannot raise), then searches every book once, in order, and again in a second pass.
Prints the statuses, latency p50/p99 per pass, the most descriptors the service held (sampled
after every request), its CPU seconds and peak RSS. Before issue 30 the service kept one lock
file per book it ever served and answered 500 for every book past the limit.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def build_books(root: Path, count: int) -> Path:
    sys.path.insert(0, str(REPO))
    from rag_pipeline_tests.helpers import index_books

    books = root / "books"
    for i in range(count):
        book = books / f"book-{i:05d}"
        book.mkdir(parents=True, exist_ok=True)
        (book / "a.md").write_text(f"# Book {i}\n\n## Nodes\n\nNodes and topics of book {i}.\n")
    index_books(books, str(root / "qdrant"))
    return books


def proc_stats(pid: int) -> dict[str, float]:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    with open(f"/proc/{pid}/status") as f:
        peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))
    return {"cpu_s": (int(fields[11]) + int(fields[12])) / tick, "peak_rss_mb": peak / 1024}


def get(url: str) -> tuple[int, float]:
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=120) as response:
            response.read()
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except OSError:
        status = 0  # the connection was refused or reset
    return status, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--books", type=int, default=5000)
    parser.add_argument("--files-limit", type=int, default=4096)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="serve-books-"))
    if (work / "books").exists():
        books = work / "books"
        print(f"reusing {books}", file=sys.stderr)
    else:
        started = time.monotonic()
        books = build_books(work, args.books)
        print(f"built {args.books} books in {time.monotonic() - started:.0f}s", file=sys.stderr)
    env = {
        **os.environ,
        "RAG_DATA_DIR": str(books),
        "RAG_QDRANT_PATH": str(work / "qdrant"),
        "RAG_CACHE_DIR": str(work / "cache"),
        "RAG_EMBEDDER": "hash",
        "DAGSTER_HOME": str(work / "dagster_home"),
    }
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    limit = args.files_limit

    def lower_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    with open(work / "serve.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rag_pipeline.cli", "serve", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=lower_limit,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while get(f"{url}/health")[0] != 200:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"serve did not start: {(work / 'serve.log').read_text()}")
            time.sleep(0.2)
        names = sorted(p.name for p in books.iterdir())
        result: dict[str, Any] = {"books": len(names), "files_limit": limit, "passes": []}
        most_fds = 0
        for _ in range(2):
            statuses: dict[int, int] = {}
            seconds = []
            for name in names:
                status, took = get(f"{url}/search?q=nodes&book={name}")
                statuses[status] = statuses.get(status, 0) + 1
                seconds.append(took)
                most_fds = max(most_fds, len(os.listdir(f"/proc/{proc.pid}/fd")))
            cuts = statistics.quantiles(seconds, n=100)
            result["passes"].append(
                {
                    "statuses": statuses,
                    "p50_ms": round(cuts[49] * 1000, 1),
                    "p99_ms": round(cuts[98] * 1000, 1),
                }
            )
        result["most_open_files"] = most_fds
        result.update(proc_stats(proc.pid))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
        return
    print(f"serve over {result['books']} books, open-files limit {limit}")
    for i, p in enumerate(result["passes"], 1):
        print(f"  pass {i}: statuses {p['statuses']}  p50 {p['p50_ms']} ms  p99 {p['p99_ms']} ms")
    print(
        f"  most open files {result['most_open_files']}, CPU {result['cpu_s']:.1f} s, "
        f"peak RSS {result['peak_rss_mb']:.0f} MB"
    )


if __name__ == "__main__":
    main()

"""A recipe migration of every book while the query service answers searches (issue 21).

    nice -n 5 python bench/migration.py [--corpus ../shared/corpora/powershell-docs/books]
                                        [--max-files N] [--clients 2] [--target-tokens 200]
                                        [--work DIR]

1. ``rag-pipeline ingest --json`` of the corpus (25 books) into a fresh Qdrant Edge folder and
   DAGSTER_HOME, with the hash embedder: what is measured is the pipeline's own cost (parse,
   chunk, write, build beside, switch), not the model's.
2. ``rag-pipeline serve`` on that store, and ``--clients`` keep-alive clients that search every
   book in turn (``/search``, hybrid, limit 10) for as long as step 3 runs.
3. The recipe changes (``RAG_CHUNK_TARGET_TOKENS`` from the default to ``--target-tokens``) and
   ``rag-pipeline ingest --json`` runs again: every book is built beside its old index and
   switched. The switch moment of a book is its ``current.json`` mtime.

Every answer's hits carry ``run_id``; the points of the first ingest and those of the migration
have disjoint run ids (read from the store before and after, with their ``signature``). Prints
the migration's process CPU seconds (user + sys, under ``/usr/bin/time -v``) and wall, the
service's CPU seconds while it ran, queries made, failed queries (not HTTP 200), answers that
mix both recipes, and answers with a hit of the new recipe that came back before that book's
switch (both must be 0). Writes JSON to bench/results/migration.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

from common import save_results, scenario_env
from powershell_queries import QUERIES  # bench/, the script's own folder
from scale import run_cli
from serve_latency import Client

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CORPUS = REPO.parent / "shared" / "corpora" / "powershell-docs" / "books"
COLLECTION = "rag_chunks"
SEARCH_LIMIT = 10

#: run_id -> signature of every point in the store (a fresh process, no store handle kept)
RUN_SIGNATURES = """
import json
from rag_pipeline.config import load_settings
from rag_pipeline.schema import COLLECTION_SCHEMA, RUN_ID, SIGNATURE, book_filter
from rag_pipeline.store import open_store
out = {}
with open_store(load_settings().store(), COLLECTION_SCHEMA) as store:
    for book in store.tenants():
        for r in store.scroll(book_filter(book), fields=[RUN_ID, SIGNATURE]):
            if r.payload.get(RUN_ID):
                out[r.payload[RUN_ID]] = [book, r.payload.get(SIGNATURE)]
print(json.dumps(out))
"""


def bench_env(data: Path, work: Path) -> dict[str, str]:
    out = scenario_env(data, work, RAG_QDRANT_EMBEDDED="edge")
    out.pop("RAG_KEEP_OLD_RECIPE", None)
    for name in [n for n in out if n.startswith("RAG_CHUNK_")]:
        out.pop(name)  # the first ingest uses the default budget
    return out


def copy_books(corpus: Path, root: Path, max_files: int) -> None:
    """Each book with at most ``max_files`` of its Markdown files (sorted), for a shorter run."""
    for book in sorted(p for p in corpus.iterdir() if p.is_dir()):
        files = sorted(p for p in book.rglob("*") if p.suffix in (".md", ".mdx") and p.is_file())
        for f in files[:max_files]:
            target = root / book.name / f.relative_to(book)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(f, target)


def run_signatures(env: dict[str, str], cwd: Path) -> dict[str, list[str]]:
    proc = subprocess.run(
        [sys.executable, "-c", RUN_SIGNATURES], env=env, cwd=cwd, capture_output=True, text=True
    )
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit("reading the store's run ids failed")
    result: dict[str, list[str]] = json.loads(proc.stdout)
    return result


def process_cpu_s(pid: int) -> float:
    """User + sys CPU seconds of a running process (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Service:
    """``rag-pipeline serve`` on the bench's store."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        command = [sys.executable, "-m", "rag_pipeline.cli", "serve", "--port", str(self.port)]
        self.proc = subprocess.Popen(
            command, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if Client(self.port).get("/health")[0] == 200:
                    return
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise SystemExit("the service did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


class Answer(NamedTuple):
    book: str
    started: float  # time.time(): comparable with file mtimes
    ended: float
    status: int
    run_ids: frozenset[str]
    error: str = ""


class Searchers:
    """``clients`` closed-loop clients, each over every book in turn, until stopped."""

    # (a plain class: the bench-script test loads this file without registering it as a
    # module, which dataclasses need)
    def __init__(self, port: int, books: list[str], clients: int) -> None:
        self.port, self.books, self.clients = port, books, clients
        self.answers: list[Answer] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        self.threads = [threading.Thread(target=self._run, args=(k,)) for k in range(self.clients)]
        for t in self.threads:
            t.start()

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()

    def _run(self, k: int) -> None:
        client, i = Client(self.port), k
        while not self.stop.is_set():
            book = self.books[i % len(self.books)]
            query = QUERIES[(i // len(self.books)) % len(QUERIES)]
            started = time.time()
            run_ids: frozenset[str] = frozenset()
            error = ""
            try:
                status, body = client.get("/search", q=query, book=book, limit=SEARCH_LIMIT)
                if status == 200 and isinstance(body, list):
                    run_ids = frozenset(str(h.get("run_id")) for h in body)
                else:
                    error = str(body)[:200]
            except Exception as exc:  # a failed query, counted
                status, error = -1, repr(exc)[:200]
            answer = Answer(book, started, time.time(), status, run_ids, error)
            with self.lock:
                self.answers.append(answer)
            i += self.clients


def switch_times(work: Path, books: list[str]) -> dict[str, float]:
    folder = work / "qdrant" / COLLECTION / "books"
    return {b: (folder / b / "current.json").stat().st_mtime for b in books}


def judge(
    answers: list[Answer],
    old_runs: set[str],
    new_runs: set[str],
    switched: dict[str, float],
) -> dict[str, Any]:
    """What the searches saw: failures, mixes, the new recipe too early."""
    failed = [a for a in answers if a.status != 200]
    mixed = [a for a in answers if a.run_ids & old_runs and a.run_ids & new_runs]
    early = [a for a in answers if a.run_ids & new_runs and a.ended < switched[a.book]]
    unknown = [a for a in answers if a.run_ids - old_runs - new_runs]
    # an answer that started after its book's switch must be of the new recipe
    stale = [a for a in answers if a.started > switched[a.book] and a.run_ids & old_runs]
    ms = sorted((a.ended - a.started) * 1000 for a in answers)
    return {
        "queries": len(answers),
        "failed_queries": len(failed),
        "first_failures": [f"{a.status}: {a.error}" for a in failed[:3]],
        "mixed_answers": len(mixed),
        "new_recipe_before_switch": len(early),
        "old_recipe_after_switch": len(stale),
        "hits_of_unknown_runs": len(unknown),
        "answers_old_recipe": sum(1 for a in answers if a.run_ids and a.run_ids <= old_runs),
        "answers_new_recipe": sum(1 for a in answers if a.run_ids and a.run_ids <= new_runs),
        "answers_empty": sum(1 for a in answers if a.status == 200 and not a.run_ids),
        "latency_p50_ms": round(statistics.median(ms), 1) if ms else None,
        "latency_max_ms": round(ms[-1], 1) if ms else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--max-files", type=int, default=0, help="files per book (0: all)")
    parser.add_argument("--clients", type=int, default=2, help="concurrent search clients")
    parser.add_argument("--target-tokens", type=int, default=200, help="the new chunk budget")
    parser.add_argument("--work", type=Path, default=None, help="default: a temporary folder")
    args = parser.parse_args()
    if not args.corpus.is_dir():
        raise SystemExit(
            f"skipped: {args.corpus} is missing (the shared corpora sit beside the repo)"
        )
    work = (args.work or Path(tempfile.mkdtemp(prefix="rag-migration-"))).resolve()
    shutil.rmtree(work, ignore_errors=True)
    (work / "dagster_home").mkdir(parents=True)
    shutil.copy(REPO / "dagster.yaml", work / "dagster_home" / "dagster.yaml")
    data = args.corpus.resolve()
    if args.max_files:
        data = work / "books"
        copy_books(args.corpus, data, args.max_files)
    env = bench_env(data, work)
    results: dict[str, Any] = {
        "corpus": str(args.corpus),
        "max_files_per_book": args.max_files or None,
        "embedder": "hash",
        "clients": args.clients,
        "cpus": os.cpu_count(),
        "load_avg_at_start": os.getloadavg(),
    }
    try:
        figures, out = run_cli(["ingest", "--json"], env, work)
        report = json.loads(out)["books"]
        books = sorted(report)
        results["first_ingest"] = {
            **figures,
            "books": len(books),
            "files": sum(b["files"] for b in report.values()),
            "chunks": sum(b["chunks"] for b in report.values()),
        }
        print("first ingest", json.dumps(results["first_ingest"]), flush=True)
        before = run_signatures(env, work)
        old_runs = set(before)
        old_signatures = sorted({sig for _, sig in before.values()})

        service = Service(env, work)
        try:
            searchers = Searchers(service.port, books, args.clients)
            serve_cpu_before = process_cpu_s(service.proc.pid)
            searchers.start()
            time.sleep(2)  # some answers before the migration starts, all of the old recipe
            new_env = {**env, "RAG_CHUNK_TARGET_TOKENS": str(args.target_tokens)}
            try:
                figures, out = run_cli(["ingest", "--json"], new_env, work)
            finally:
                time.sleep(2)  # and some after the last switch
                searchers.join()
            serve_cpu = process_cpu_s(service.proc.pid) - serve_cpu_before
            _, body = Client(service.port).get("/health")
            health: dict[str, Any] = body if isinstance(body, dict) else {}
        finally:
            service.stop()
        report = json.loads(out)["books"]
        results["migration"] = {
            **figures,
            "books_run": sum(1 for b in report.values() if b["status"] != "unchanged"),
            "chunks": sum(b["chunks"] for b in report.values()),
            "serve_cpu_s": round(serve_cpu, 2),
            # how often the service stepped aside for the migration's writers
            "serve_health": {k: v for k, v in health.items() if k.startswith("store_")},
        }
        print("migration", json.dumps(results["migration"]), flush=True)
        after = run_signatures(env, work)
        new_runs = set(after)
        results["recipes"] = {
            "old_signatures": old_signatures,
            "new_signatures": sorted({sig for _, sig in after.values()}),
            "books_on_new_recipe": len({book for book, _ in after.values()}),
            "run_ids_shared": len(old_runs & new_runs),
        }
        switched = switch_times(work, books)
        results["switch_window_s"] = round(max(switched.values()) - min(switched.values()), 1)
        results["searches"] = judge(searchers.answers, old_runs, new_runs, switched)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    results["load_avg_at_end"] = os.getloadavg()
    save_results("migration", results)


if __name__ == "__main__":
    main()

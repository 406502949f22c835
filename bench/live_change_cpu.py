"""What one change costs a long-lived process (live mode's path): the CPU seconds of planning and
executing a one-file edit as a recorded Dagster run, work first, on an instance kept open, with
the instance's SQLite connections kept (``kept_sqlite_engines``) and without, interleaved.

    python bench/live_change_cpu.py [--corpus ../shared/corpora/powershell-docs/books]
                                    [--books Microsoft.PowerShell.Core,learn]
                                    [--edits 6] [--rounds 2]

The books are copied into a temp folder with its own store and ``DAGSTER_HOME`` and ingested
once (hash embedder). Then each round starts one process per mode (``kept`` and ``plain``, who
goes first swapping), which edits one file ``--edits`` times, planning and executing each edit
on one open instance; the first edit of a process (its run shard, the model, caches warming)
is left out of the median. Prints every edit's CPU s and the medians as JSON (also
bench/results/live_change_cpu.json).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from change_cost import DEFAULT_CORPUS
from common import save_results, scenario_env
from scale import run_cli

MODES = ("kept", "plain")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--books", default="Microsoft.PowerShell.Core,learn")
    parser.add_argument("--edits", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _edits(args.child, args.books.split(",")[-1], args.edits)
        return
    books = [b for b in args.books.split(",") if b]
    with tempfile.TemporaryDirectory(prefix="live-change-cpu-") as tmp:
        work = Path(tmp)
        for book in books:
            shutil.copytree(args.corpus / book, work / "books" / book)
        env = scenario_env(work / "books", work)
        run_cli(["ingest", "--json"], env, work)
        cpu: dict[str, list[float]] = {m: [] for m in MODES}
        for i in range(args.rounds):
            for mode in MODES if i % 2 == 0 else MODES[::-1]:
                child = ["--child", mode, "--books", args.books, "--edits", str(args.edits)]
                proc = subprocess.run(
                    [sys.executable, __file__, *child],
                    env=env,
                    cwd=work,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                cpu[mode] += json.loads(proc.stdout.splitlines()[-1])[1:]  # less the first
    save_results(
        "live_change_cpu",
        {
            "books": books,
            "edits_per_process": args.edits,
            "cpu_s": cpu,
            "median_cpu_s": {m: round(statistics.median(c), 3) for m, c in cpu.items()},
        },
    )


def _edits(mode: str, book: str, edits: int) -> None:
    """In this process: ``edits`` edits of the book's largest file, each planned and executed
    on one open instance; prints their CPU seconds as a JSON list."""
    import rag_pipeline.defs.instance as instance_module
    from rag_pipeline.cli.app import book_pipeline
    from rag_pipeline.config import load_settings
    from rag_pipeline.defs.runner import execute_plan

    if mode == "plain":  # Dagster's own connection per statement
        instance_module.kept_sqlite_engines = lambda _: contextlib.nullcontext()  # type: ignore[assignment,return-value]
    settings = load_settings()
    pipeline = book_pipeline(settings)
    target = max((settings.data_dir / book).rglob("*.md"), key=lambda p: p.stat().st_size)
    spent = []
    with instance_module.open_home_instance() as instance:
        for i in range(edits):
            with open(target, "a", encoding="utf-8") as fh:
                fh.write(f"\n\nAn edit at {time.time()}, number {i}.\n")
            started = time.process_time()
            with pipeline.store.open() as store:
                plan = pipeline.plan(store, [book])
            report = execute_plan(plan, pipeline, instance, work_first=True)
            spent.append(round(time.process_time() - started, 3))
            if report.books[book].status != "ingested":
                raise SystemExit(f"edit {i}: {report.books[book]}")
    print(json.dumps(spent))


if __name__ == "__main__":
    main()

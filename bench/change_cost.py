"""The fixed cost of one change through `rag-pipeline ingest`, with the default local model:
a one-file edit and a one-file deletion against the no-change run, interleaved.

    python bench/change_cost.py [--corpus ../shared/corpora/powershell-docs/books]
                                [--books Microsoft.PowerShell.Core,learn] [--rounds 5]

The books (253 powershell-docs files by default, about the 251 of issue 29's comparison) are
copied into a temp folder with its own store, cache of Dagster runs and ``DAGSTER_HOME`` (the
model's ONNX cache is the repository's ``.rag/cache``, as ``make run`` leaves it) and ingested
once. Then ``--rounds`` rounds, each: a no-change ``ingest``; a paragraph appended to one file,
``ingest``; that file deleted, ``ingest``; the file put back, ``ingest``. Every command is a
fresh process (what a user's command costs: imports, model load, Dagster's run), measured
under ``/usr/bin/time -v`` (CPU s = user + sys). Prints medians and every sample as JSON (also
bench/results/change_cost.json).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import uuid
from pathlib import Path
from typing import Any

from common import REPO, save_results, scenario_env
from scale import run_cli

DEFAULT_CORPUS = REPO.parent / "shared" / "corpora" / "powershell-docs" / "books"
STEPS = ("no_change", "edit", "delete", "add_back")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--books", default="Microsoft.PowerShell.Core,learn")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--embedder", default="local", choices=["local", "hash"])
    args = parser.parse_args()
    books = [b for b in args.books.split(",") if b]
    missing = [b for b in books if not (args.corpus / b).is_dir()]
    if missing:
        raise SystemExit(f"no book folders {missing} under {args.corpus}")
    with tempfile.TemporaryDirectory(prefix="change-cost-") as tmp:
        work = Path(tmp)
        data = work / "books"
        for book in books:
            shutil.copytree(args.corpus / book, data / book)
        env = scenario_env(data, work, RAG_EMBEDDER=args.embedder)
        env["RAG_CACHE_DIR"] = str(REPO / ".rag" / "cache")  # the model's graph, built once
        files = sorted(p for p in data.rglob("*.md") if p.stat().st_size > 2000)
        file_count = sum(1 for _ in data.rglob("*.md"))
        first, _ = run_cli(["ingest", "--json"], env, work)
        samples: dict[str, list[dict[str, Any]]] = {s: [] for s in STEPS}
        for i in range(args.rounds):
            target = files[(i * 37) % len(files)]
            saved = target.read_bytes()

            def step(name: str) -> None:
                figures, out = run_cli(["ingest", "--json"], env, work)
                report = json.loads(out)
                ran = {b: r for b, r in report["books"].items() if r["status"] != "unchanged"}
                figures["books_run"] = len(ran)
                figures["embedded"] = sum(r["embedded"] for r in ran.values())
                figures["deleted"] = sum(r["deleted"] for r in ran.values())
                samples[name].append(figures)

            step("no_change")
            with open(target, "a", encoding="utf-8") as fh:
                fh.write(f"\n\n## Added {i}\n\nA new paragraph about {uuid.uuid4().hex}.\n")
            step("edit")
            target.unlink()
            step("delete")
            target.write_bytes(saved)
            step("add_back")
    summary = {
        name: {
            "wall_s": round(statistics.median(s["wall_s"] for s in runs), 2),
            "cpu_s": round(statistics.median(s["cpu_s"] for s in runs), 2),
            "rss_mb": round(max(s["rss_mb"] for s in runs)),
        }
        for name, runs in samples.items()
    }
    save_results(
        "change_cost",
        {
            "books": books,
            "files": file_count,
            "embedder": args.embedder,
            "first_ingest": first,
            "medians": summary,
            "samples": samples,
        },
    )
    base = summary["no_change"]["wall_s"]
    for name, figures in summary.items():
        print(
            f"{name:<10} wall {figures['wall_s']:.2f} s (+{figures['wall_s'] - base:.2f} over "
            f"no change), CPU {figures['cpu_s']:.2f} s, peak RSS {figures['rss_mb']} MB"
        )


if __name__ == "__main__":
    main()

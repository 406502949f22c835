"""The fixed cost of one change through `rag-pipeline ingest`, with the default local model:
a one-file edit and a one-file deletion against the no-change run, interleaved.

    python bench/change_cost.py [--corpus ../shared/corpora/powershell-docs/books]
                                [--books Microsoft.PowerShell.Core,learn] [--rounds 5]
                                [--baseline DIR] [--seed DIR]

The books (253 powershell-docs files by default, about the 251 of issue 29's comparison) are
copied into a temp folder with its own store, cache of Dagster runs and ``DAGSTER_HOME`` (the
model's ONNX cache is the repository's ``.rag/cache``, as ``make run`` leaves it) and ingested
once (or, with ``--seed``, a saved first ingest copied). Then ``--rounds`` rounds, each: a
no-change ``ingest``; a paragraph appended to one file, ``plan`` then ``ingest``; that file
deleted, ``ingest``; the file put back, ``ingest``. Every
command is a fresh process (what a user's command costs: imports, model load, Dagster's run),
measured under ``/usr/bin/time -v`` (CPU s = user + sys). Prints medians and every sample as
JSON (also bench/results/change_cost.json).

With ``--baseline DIR`` (another checkout of the repository, e.g. ``git worktree add /tmp/before
<commit>``) every step is also run by that checkout's code, on a copy of the books with its own
store and ``DAGSTER_HOME`` given the same edits: the two alternate within each round (who goes
first swaps every round), so a machine shared with other work loads both alike. Each ``ingest
--json`` that reports its ``phases`` (where its time went: imports, plan, Dagster's import, the
instance, the runs, the collection's refresh) has their medians printed too.

With ``--live``, a third copy (this checkout's code) runs the same steps, interleaved, while
``rag-pipeline watch`` runs on it: each ``ingest`` hands its change to the live process (issue
41.2), which may have applied it already (it follows the folder). Its figures add
``live_cpu_s``, what the live process used during each command.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from common import REPO, save_results, scenario_env
from scale import run_cli

#: the shared corpora beside the checkout (a clone), or beside its worktrees' folder
DEFAULT_CORPUS = next(
    (
        c
        for c in (
            REPO.parent / "shared" / "corpora" / "powershell-docs" / "books",
            REPO.parents[1] / "shared" / "corpora" / "powershell-docs" / "books",
        )
        if c.is_dir()
    ),
    REPO.parent / "shared" / "corpora" / "powershell-docs" / "books",
)
STEPS = ("no_change", "plan_edit", "edit", "delete", "add_back")
#: what ``--seed`` keeps of a first ingest: the books, the store and the Dagster instance
SEEDED = ("books", "qdrant", "dagster_home")


class Setup(NamedTuple):
    """One code version's scenario: its label, books folder and environment."""

    label: str
    data: Path
    env: dict[str, str]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--books", default="Microsoft.PowerShell.Core,learn")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--embedder", default="local", choices=["local", "hash"])
    parser.add_argument(
        "--baseline", type=Path, help="another checkout whose code runs every step too"
    )
    parser.add_argument(
        "--seed",
        type=Path,
        help="a folder holding a first ingest of the same books (books/, qdrant/, "
        "dagster_home/): copied for every version instead of ingesting each one (minutes with "
        "the local model); made from the first version's ingest where it does not exist yet",
    )
    parser.add_argument(
        "--live",
        action="store_true",
        help="also a copy where `rag-pipeline watch` runs (each ingest handed to it)",
    )
    args = parser.parse_args()
    books = [b for b in args.books.split(",") if b]
    missing = [b for b in books if not (args.corpus / b).is_dir()]
    if missing:
        raise SystemExit(f"no book folders {missing} under {args.corpus}")
    versions = [("this", REPO)] + ([("baseline", args.baseline)] if args.baseline else [])
    versions += [("live", REPO)] if args.live else []
    live_pids: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="change-cost-") as tmp, contextlib.ExitStack() as stack:
        setups = []
        seeded = args.seed is not None and args.seed.is_dir()
        for label, code in versions:
            work = Path(tmp) / label
            data = work / "books"
            if seeded:  # mtimes kept (copytree's copy2): the plan finds every file unchanged
                for part in SEEDED:
                    shutil.copytree(args.seed / part, work / part)
            else:
                for book in books:
                    shutil.copytree(args.corpus / book, data / book)
            env = scenario_env(data, work, RAG_EMBEDDER=args.embedder, PYTHONPATH=str(code))
            env["RAG_CACHE_DIR"] = str(REPO / ".rag" / "cache")  # the model's graph, built once
            setups.append(Setup(label, data, env))
        base = setups[0].data
        files = sorted(p.relative_to(base) for p in base.rglob("*.md") if p.stat().st_size > 2000)
        file_count = sum(1 for _ in base.rglob("*.md"))
        first = {}
        for setup in setups:
            first[setup.label] = run_cli(["ingest", "--json"], setup.env, setup.data.parent)[0]
            if args.seed is not None and not args.seed.exists():
                for part in SEEDED:
                    shutil.copytree(setup.data.parent / part, args.seed / part)
        for setup in setups:
            if setup.label == "live":
                live_pids["live"] = stack.enter_context(watching(setup))
        samples: dict[str, dict[str, list[dict[str, Any]]]] = {
            s.label: {step: [] for step in STEPS} for s in setups
        }
        for i in range(args.rounds):
            target = files[(i * 37) % len(files)]
            saved = (base / target).read_bytes()
            order = setups if i % 2 == 0 else setups[::-1]
            paragraph = f"\n\n## Added {i}\n\nA new paragraph about {uuid.uuid4().hex}.\n"

            def step(name: str, order: list[Setup], command: str = "ingest") -> None:
                for setup in order:
                    pid = live_pids.get(setup.label)
                    live_before = process_cpu_s(pid) if pid else 0.0
                    figures, out = run_cli([command, "--json"], setup.env, setup.data.parent)
                    report = json.loads(out)
                    if pid:  # what the live process used meanwhile (its own look included)
                        figures["live_cpu_s"] = round(process_cpu_s(pid) - live_before, 2)
                        handed = command == "plan" or report.get("applied_by")
                        assert handed, "the ingest was not handed to live mode"
                    if command == "plan":  # what it would run: one book
                        ran = [b for b, p in report["books"].items() if p["action"] == "run"]
                        figures["books_run"] = len(ran)
                        figures["phases"] = {}
                        samples[setup.label][name].append(figures)
                        continue
                    ran = {b: r for b, r in report["books"].items() if r["status"] != "unchanged"}
                    figures["books_run"] = len(ran)
                    figures["embedded"] = sum(r["embedded"] for r in ran.values())
                    figures["deleted"] = sum(r["deleted"] for r in ran.values())
                    figures["phases"] = report.get("phases", {})
                    samples[setup.label][name].append(figures)

            step("no_change", order)
            for setup in setups:
                with open(setup.data / target, "a", encoding="utf-8") as fh:
                    fh.write(paragraph)
            step("plan_edit", order, "plan")
            step("edit", order)
            for setup in setups:
                (setup.data / target).unlink()
            step("delete", order)
            for setup in setups:
                (setup.data / target).write_bytes(saved)
            step("add_back", order)
    summary = {label: _medians(runs) for label, runs in samples.items()}
    save_results(
        "change_cost",
        {
            "books": books,
            "files": file_count,
            "embedder": args.embedder,
            "baseline": str(args.baseline) if args.baseline else None,
            "first_ingest": first,
            "medians": summary,
            "samples": samples,
        },
    )
    for label, steps in summary.items():
        base_wall = steps["no_change"]["wall_s"]
        for name, figures in steps.items():
            live = figures.get("live_cpu_s")
            print(
                f"{label:<8} {name:<10} wall {figures['wall_s']:.2f} s "
                f"(+{figures['wall_s'] - base_wall:.2f} over no change), CPU "
                f"{figures['cpu_s']:.2f} s"
                + (f", live process CPU {live:.2f} s" if live is not None else "")
                + f", peak RSS {figures['rss_mb']} MB"
            )
            for phase, p in figures["phases"].items():
                print(
                    f"{'':<20}{phase:<16} {p['wall_s']:6.2f} s wall, CPU {p['cpu_s']:.2f} s at end"
                )


def _medians(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per step: the median wall and CPU seconds, the peak RSS, and each phase's median
    length (wall) and median CPU seconds at its end."""
    out = {}
    for name, figures in runs.items():
        phase_names = [p for p in figures[0]["phases"]] if figures else []
        live = [f["live_cpu_s"] for f in figures if "live_cpu_s" in f]
        out[name] = {
            **({"live_cpu_s": round(statistics.median(live), 2)} if live else {}),
            "wall_s": round(statistics.median(f["wall_s"] for f in figures), 2),
            "cpu_s": round(statistics.median(f["cpu_s"] for f in figures), 2),
            "rss_mb": round(max(f["rss_mb"] for f in figures)),
            "phases": {
                p: {
                    key: round(statistics.median(f["phases"][p][key] for f in figures), 3)
                    for key in ("wall_s", "cpu_s")
                }
                for p in phase_names
                if all(p in f["phases"] for f in figures)
            },
        }
    return out


@contextlib.contextmanager
def watching(setup: Setup) -> Iterator[int]:
    """``rag-pipeline watch`` on the setup's copy, ready, until the block ends: its pid."""
    with open(setup.data.parent / "watch.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rag_pipeline.cli", "watch", "--json"],
            env=setup.env, cwd=setup.data.parent, stdout=subprocess.PIPE, stderr=log, text=True,
        )  # fmt: skip
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if json.loads(line)["event"] == "ready":
                break
        yield proc.pid
    finally:
        proc.terminate()
        proc.wait(60)


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a running process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main()

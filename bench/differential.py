"""The long differential check of incremental ingest (issue 26): seeded random sequences of
file operations, each followed by ``rag-pipeline ingest`` (real processes, the Dagster job);
after each step ``plan`` must say every book is unchanged, and every few steps each book's
point-id set must equal a clean build's. The suite runs a short sequence
(``rag_pipeline_tests/test_differential.py``); this runs the long ones and prints the figures.

    python bench/differential.py --steps 1000 --seeds 1,2,3 [--compare-every 10] [--json]
    python bench/differential.py --live --steps 300 --seeds 21 [--compare-every 10]
    python bench/differential.py --git --steps 200 --seeds 1,2 [--compare-every 10]

``--live``: the changes are applied by a ``rag-pipeline watch`` process instead of an ingest
after each step (:class:`~rag_pipeline_tests.differential.LiveDifferential`: edits timed
against the live run's phases, edits reverted inside one run, kill -9 of the live process);
after each step ``plan`` must say every book is unchanged within a minute.

``--git``: the books are git repositories declared in a sources file, changed by commits
(edits, renames, deletions, additions), force-pushes, uncommitted edits and ``kill -9``
of an ingest (:class:`~rag_pipeline_tests.differential.GitDifferential`); the clean build is
of each ref's tree exported as folder books.

The operations, the checks and what they compare are in
``rag_pipeline_tests/differential.py``. Exit 1 on any divergence, plan disagreement or failed
ingest.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    sys.path.insert(0, str(REPO))  # the sequences live with the suite's helpers
    from rag_pipeline_tests.differential import Differential, GitDifferential, LiveDifferential
    from rag_pipeline_tests.warm import warm_server

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--compare-every", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--verbose", action="store_true", help="print every step")
    parser.add_argument("--live", action="store_true", help="live mode applies the changes")
    parser.add_argument("--git", action="store_true", help="git books changed by commits")
    args = parser.parse_args()
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        root = Path(tempfile.mkdtemp(prefix=f"rag-differential-{seed}-"))
        cpu_before = warm_server().children_cpu_s()  # every command is forked by it
        started = time.perf_counter()
        kind = GitDifferential if args.git else LiveDifferential if args.live else Differential
        differential = kind(root, seed)
        outcome = differential.run(
            args.steps, compare_every=args.compare_every, log=print if args.verbose else None
        )
        live: dict[str, object] = {}
        if isinstance(differential, LiveDifferential):
            settle = sorted(differential.settle_seconds) or [0.0]
            live = {
                "live_killed": differential.killed,
                "phases_missed": differential.phases_missed,
                "settle_p50_s": round(settle[len(settle) // 2], 2),
                "settle_max_s": round(settle[-1], 2),
            }
        cpu = warm_server().children_cpu_s() - cpu_before
        rows.append(
            {
                "seed": seed,
                "steps": outcome.steps,
                "comparisons": outcome.comparisons,
                "divergences": len(outcome.divergences),
                "plan_disagreements": len(outcome.plan_disagreements),
                "failed_ingests": len(outcome.failures),
                "halts_answered": outcome.halts,
                "wall_s": round(time.perf_counter() - started, 1),
                "commands_cpu_s": round(cpu, 1),
                "operations": outcome.operations,
                **live,
                "first_problems": (
                    outcome.divergences + outcome.plan_disagreements + outcome.failures
                )[:5],
            }
        )
        shutil.rmtree(root, ignore_errors=True)
        if not args.json:
            row = rows[-1]
            print(
                f"seed {seed}: {row['steps']} steps, {row['comparisons']} clean builds compared, "
                f"{row['divergences']} divergences, {row['plan_disagreements']} plan "
                f"disagreements, {row['failed_ingests']} failed ingests; {row['wall_s']} s wall, "
                f"{row['commands_cpu_s']} CPU s of the commands",
                flush=True,
            )
            if live:
                print(f"    live: {live}; operations: {row['operations']}", flush=True)
            for problem in row["first_problems"]:
                print(f"    {problem}", flush=True)
    if args.json:
        print(json.dumps(rows, indent=2))
    bad = any(r["divergences"] or r["plan_disagreements"] or r["failed_ingests"] for r in rows)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

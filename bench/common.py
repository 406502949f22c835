"""What the benchmark scripts share: a scenario's environment, a command run for its JSON, and
where results are written (imported by the scripts as ``common``: they run as
``python bench/<script>.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: settings of the developer's environment that would point a scenario at their own store
FOREIGN_SETTINGS = ("RAG_QDRANT_URL", "RAG_COLLECTION")


def scenario_env(data: Path, work: Path, **settings: str) -> dict[str, str]:
    """The environment of one scenario's commands: its books, its own store, cache and
    Dagster home under ``work``, the hash embedder (the pipeline's own cost, not a model's)
    unless ``settings`` say otherwise, and this checkout's code."""
    env = {
        **os.environ,
        "RAG_DATA_DIR": str(data),
        "RAG_QDRANT_PATH": str(work / "qdrant"),
        "RAG_CACHE_DIR": str(work / "cache"),
        "DAGSTER_HOME": str(work / "dagster_home"),
        "RAG_EMBEDDER": "hash",
        "DO_NOT_TRACK": "1",
        "PYTHONWARNINGS": "ignore",
        "PYTHONPATH": str(REPO),
    }
    for name in FOREIGN_SETTINGS:
        env.pop(name, None)
    return {**env, **settings}


def run_json(command: list[str], env: dict[str, str], cwd: Path) -> tuple[Any, float, str]:
    """``command`` run to its end: its JSON on stdout, its wall time and its stderr; a failure
    ends the benchmark with the command's error."""
    started = time.perf_counter()
    proc = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"{' '.join(command[:4])} ... failed with exit {proc.returncode}")
    return json.loads(proc.stdout), wall, proc.stderr


def save_results(name: str, results: Any) -> Path:
    """Print the results and write them to bench/results/<name>.json."""
    print(json.dumps(results, indent=2))
    out = REPO / "bench" / "results" / f"{name}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    return out

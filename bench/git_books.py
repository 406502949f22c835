"""What a git book's change detection costs (issue 39), against the same book as a folder.

    python bench/git_books.py [--files 1000] [--commits 500] [--ticks 20] [--rounds 5]

A repository of ``--files`` Markdown files (about 2 KB each) and ``--commits`` commits (the
first adds every file, each later one edits one file) is declared as a git book; the same
files, as its last commit has them, are a folder book. Measured in this process, CPU s of the
process and of the git processes it started (``getrusage``), medians:

* **no-change tick**: what the books sensor's look at the book costs when nothing changed
  (:func:`~rag_pipeline.sources.scan.scan_books`, warm: the second and later ticks);
* **one-file change**: one paragraph of one file edited (a commit for the git book, a write
  for the folder book), then the sensor's tick that sees it plus the pipeline's run of the
  book (assess, read, parse, chunk, embed with the hash embedder, write; no Dagster) into an
  embedded Qdrant Edge store.

Prints a JSON object (also bench/results/git_books.json).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
_WORDS = [
    "robot",
    "sensor",
    "actuator",
    "planner",
    "lidar",
    "camera",
    "joint",
    "torque",
    "node",
    "topic",
    "frame",
]


def cpu_s() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def measure(fn: Callable[[], Any]) -> tuple[float, float]:
    """(CPU s, wall s) of one call."""
    cpu, wall = cpu_s(), time.perf_counter()
    fn()
    return cpu_s() - cpu, time.perf_counter() - wall


def page(rng: random.Random, title: str) -> str:
    sections = [
        f"## Part {i}\n\n" + " ".join(rng.choice(_WORDS) for _ in range(60)) + ".\n"
        for i in range(5)
    ]
    return f"# {title}\n\n" + "\n".join(sections)


def git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "Bench",
        "GIT_AUTHOR_EMAIL": "bench@example.com",
        "GIT_COMMITTER_NAME": "Bench",
        "GIT_COMMITTER_EMAIL": "bench@example.com",
    }
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, check=True
    )
    return done.stdout


def build_repo(repo: Path, files: int, commits: int, rng: random.Random) -> list[str]:
    repo.mkdir(parents=True)
    git(repo, "init", "--quiet", "--initial-branch=main")
    names = [f"chapter-{i // 50:02d}/page-{i:04d}.md" for i in range(files)]
    for name in names:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(page(rng, name))
    git(repo, "add", "--all")
    git(repo, "commit", "--quiet", "-m", "first")
    for c in range(commits - 1):
        name = rng.choice(names)
        (repo / name).write_text(page(rng, f"{name} v{c}"))
        git(repo, "commit", "--quiet", "-am", f"edit {c}")
    return names


def main() -> None:
    sys.path.insert(0, str(REPO))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--commits", type=int, default=500)
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    from rag_pipeline.cli.app import book_recipes
    from rag_pipeline.config import load_settings
    from rag_pipeline.ingest.pipeline import IngestPipeline
    from rag_pipeline.sources.declared import DeclaredSources
    from rag_pipeline.sources.folder import FolderSource
    from rag_pipeline.sources.scan import clear_scan_cache, scan_books

    rng = random.Random(39)
    work = Path(tempfile.mkdtemp(prefix="git-books-"))
    try:
        repo = work / "repo"
        started = time.perf_counter()
        names = build_repo(repo, args.files, args.commits, rng)
        built_s = time.perf_counter() - started
        data = work / "books"
        shutil.copytree(repo, data / "folder", ignore=shutil.ignore_patterns(".git"))
        sources = work / "sources.yaml"
        sources.write_text(f"books:\n  gitbook: {{git: {repo}, ref: main}}\n")
        settings = load_settings(
            data_dir=data,
            sources=sources,
            qdrant_path=str(work / "qdrant"),
            cache_dir=work / "cache",
            embedder="hash",
        )
        source = settings.source()
        assert isinstance(source, DeclaredSources)
        folder_source = FolderSource(data)
        pipeline = IngestPipeline.from_settings(settings, book_recipes(settings))
        first_cpu, first_wall = measure(lambda: pipeline.run(["gitbook", "folder"]))

        def tick_of(book: str) -> Callable[[], Any]:
            of = source if book == "gitbook" else folder_source
            cursor: dict[str, list[str]] = {}

            def tick() -> None:
                states, _ = scan_books(of, cursor)
                state = states[book]
                cursor[book] = [state.stat_digest, state.content_digest]

            return tick

        results: dict[str, Any] = {
            "files": args.files,
            "commits": args.commits,
            "repo_built_s": round(built_s, 1),
            "first_ingest_both_books_cpu_s": round(first_cpu, 2),
            "first_ingest_both_books_wall_s": round(first_wall, 2),
        }
        for book in ("gitbook", "folder"):
            clear_scan_cache()
            tick = tick_of(book)
            tick()  # cold: lists and hashes what the process has not seen
            samples = [measure(tick) for _ in range(args.ticks)]
            results[f"{book}_no_change_tick_cpu_s"] = round(
                statistics.median(s[0] for s in samples), 4
            )
            results[f"{book}_no_change_tick_wall_s"] = round(
                statistics.median(s[1] for s in samples), 4
            )
        ticks = {b: tick_of(b) for b in ("gitbook", "folder")}
        for tick in ticks.values():
            tick()
        change: dict[str, list[tuple[float, float]]] = {"gitbook": [], "folder": []}
        for r in range(args.rounds):
            name = names[(r * 97) % len(names)]
            for book in ("gitbook", "folder"):
                path = (repo if book == "gitbook" else data / "folder") / name
                text = path.read_text().replace("## Part 2\n\n", f"## Part 2\n\nedited {r} ", 1)
                path.write_text(text)
                if book == "gitbook":
                    git(repo, "commit", "--quiet", "-am", f"bench edit {r}")
                else:
                    time.sleep(0.1)  # past the racy window of the write, as a person's is

                def detect_and_run(book: str = book) -> Any:
                    ticks[book]()
                    return pipeline.run([book])

                change[book].append(measure(detect_and_run))
        for book, samples in change.items():
            results[f"{book}_one_file_change_cpu_s"] = round(
                statistics.median(s[0] for s in samples), 3
            )
            results[f"{book}_one_file_change_wall_s"] = round(
                statistics.median(s[1] for s in samples), 3
            )
        results["samples_cpu_wall_s"] = {
            b: [[round(c, 3), round(w, 3)] for c, w in s] for b, s in change.items()
        }
        print(json.dumps(results, indent=2))
        out = REPO / "bench" / "results"
        out.mkdir(exist_ok=True)
        (out / "git_books.json").write_text(json.dumps(results, indent=2) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

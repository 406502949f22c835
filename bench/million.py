"""A collection of about a million chunk points, end to end through the CLI (hash embedder).

    python bench/million.py [--points 1000000] [--work DIR] [--queries 300] [--json]
                            [--corpus ../shared/corpora/powershell-docs/books] [--reuse]
                            [--purged-points N] [--first-ingest-only]

Builds, from copies of the powershell-docs corpus (each copy ending with its own line, so no
two files are identical, as ``bench/scale.py`` does): one big book of half the points, one
book of a tenth (the book the purge removes: 100,000 points at 1M; ``--purged-points`` sets
another size, e.g. 100,000 at 500k points) and small books of ``--small-book-points`` each
for the rest; then, each step one `rag-pipeline` process under
`/usr/bin/time -v` with ``RAG_EMBEDDER=hash`` (the pipeline's cost, not a model's) and a fresh
store, cache and ``DAGSTER_HOME``:

(a) the first ``ingest`` of every book; (b) a no-change ``ingest``; (c) one file of a small
book with a section appended, then ``ingest``; (c') the same in the big book; (d) the
tenth's folder removed, then ``ingest`` (its purge); (e) ``serve`` answering ``--queries``
hybrid searches one after another, in the big book, then over 16 small books in turn (the
books ``serve`` keeps loaded): p50, p99 and the service's RSS.

``--first-ingest-only`` stops after (a): what a first ingest's peak memory is, at a size.

Prints process CPU seconds (user + sys), wall, peak RSS and the store's size after each step.
``--reuse`` keeps the books and store a previous run left in ``--work`` (their first ingest is
not measured again; the other steps are, the edits appending another section).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: scale.py's helpers

from scale import (
    DEFAULT_CORPUS,
    EDIT_SECTION,
    FIXTURE_CORPUS,
    REPO,
    books_run,
    folder_kb,
    run_cli,
    scenario_env,
    serve_latency,
    source_files,
)

#: chunk points a copied powershell-docs file makes with the hash embedder, over the whole
#: corpus (149,448 chunks of 20,000 copies in bench/scale.py at 1,000 books)
POINTS_PER_FILE = 7.47
BIG_BOOK = "big-book"
PURGED_BOOK = "tenth-book"
#: the books ``serve`` keeps loaded (rag_pipeline.serve.app.SERVED_BOOKS_LOADED): the queries
#: over many books go round these many, so none of them waits for a shard's load
ROUND_BOOKS = 16


def write_book(pool: list[Path], folder: Path, files: int, first: int) -> None:
    """``files`` copies of the corpus's files (from the ``first``-th on) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(first, first + files):
        source = pool[f % len(pool)]
        text = source.read_text(encoding="utf-8", errors="replace").rstrip("\n")
        marker = f"\n\nMillion benchmark copy: {folder.name}, file {f}, from {source.name}.\n"
        (folder / f"f{f:06d}-{source.stem}{source.suffix}").write_text(text + marker)


def layout(points: int, small_points: int, purged_points: int | None = None) -> dict[str, int]:
    """book -> files: half the points in the big book, a tenth (or ``purged_points``) in the
    purged book, the rest in small books of ``small_points``."""
    purged = points // 10 if purged_points is None else purged_points
    files = {BIG_BOOK: round(points / 2 / POINTS_PER_FILE)}
    files[PURGED_BOOK] = round(purged / POINTS_PER_FILE)
    rest = points - points // 2 - purged
    small = max(1, round(rest / small_points))
    for b in range(small):
        files[f"book-{b:04d}"] = max(1, round(rest / small / POINTS_PER_FILE))
    return files


def measure(args: argparse.Namespace, pool: list[Path]) -> dict[str, Any]:
    here: Path = args.work / f"million-{args.points}"
    data, home = here / "books", here / "dagster_home"
    steps: dict[str, Any] = {}
    plan = layout(args.points, args.small_book_points, args.purged_points)
    if not (args.reuse and (here / "qdrant").is_dir()):
        shutil.rmtree(here, ignore_errors=True)
        first = 0
        for book, files in plan.items():
            write_book(pool, data / book, files, first)
            first += files
        shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "dagster.yaml").exists():
        shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    env = scenario_env(here, data, home)

    def store_mb() -> float:
        return round(folder_kb(here / "qdrant") / 1024, 1)

    if not (args.reuse and (here / "qdrant").is_dir()):
        print(f"first ingest of {len(plan)} books, {sum(plan.values())} files", file=sys.stderr)
        figures, out = run_cli(["ingest", "--json"], env, here)
        report = json.loads(out)
        steps["first_ingest"] = {
            **figures,
            "books_run": books_run(report),
            "dagster_runs": len({b["run_id"] for b in report["books"].values() if b["run_id"]}),
            "points": sum(b["points"] for b in report["books"].values()),
            "store_mb": store_mb(),
        }
    if args.first_ingest_only:
        return {"points_asked": args.points, "books": len(plan), "files": plan, "steps": steps}
    figures, out = run_cli(["ingest", "--json"], env, here)
    report = json.loads(out)
    steps["no_change_ingest"] = {**figures, "books_run": books_run(report)}
    steps["points"] = {b: r["points"] for b, r in report["books"].items()}
    steps["points_total"] = sum(steps["points"].values())

    for step, book in (("small_book_edit", "book-0000"), ("big_book_edit", BIG_BOOK)):
        edited = sorted((data / book).iterdir())[1]
        edited.write_text(
            edited.read_text() + EDIT_SECTION.replace("scale", f"million {time.time()}")
        )
        figures, out = run_cli(["ingest", "--json"], env, here)
        report = json.loads(out)
        steps[step] = {
            **figures,
            "books_run": books_run(report),
            "embedded": report["books"][book]["embedded"],
            "file": f"{book}/{edited.name}",
        }

    small_books = sorted(b for b in plan if b.startswith("book-"))[:ROUND_BOOKS]
    steps["serve_big_book"] = serve_latency(env, here, BIG_BOOK, args.queries)
    steps["serve_many_books"] = serve_latency(env, here, small_books, args.queries)

    purged = steps["points"].get(PURGED_BOOK, 0)
    if (data / PURGED_BOOK).is_dir():
        shutil.rmtree(data / PURGED_BOOK)
        figures, out = run_cli(["ingest", "--json"], env, here)
        report = json.loads(out)
        steps["purge_ingest"] = {
            **figures,
            "book": PURGED_BOOK,
            "points_purged": purged,
            "status": report["books"].get(PURGED_BOOK, {}).get("status"),
            "store_mb": store_mb(),
        }
    steps["store_mb"] = store_mb()
    return {"points_asked": args.points, "books": len(plan), "files": plan, "steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--small-book-points", type=int, default=10_000)
    parser.add_argument(
        "--purged-points", type=int, default=None, help="the purged book's size (a tenth)"
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/rag-million"))
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--reuse", action="store_true", help="keep the books and store built")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--first-ingest-only", action="store_true", help="measure the first ingest alone"
    )
    args = parser.parse_args()
    corpus = args.corpus if args.corpus.is_dir() else FIXTURE_CORPUS
    pool = source_files(corpus)
    if not pool:
        raise SystemExit(f"no Markdown files under {corpus}")
    args.work.mkdir(parents=True, exist_ok=True)
    result = measure(args, pool)
    (REPO / "bench" / "results").mkdir(exist_ok=True)
    (REPO / "bench" / "results" / "million.json").write_text(json.dumps(result, indent=2))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for step, figures in result["steps"].items():
            print(f"{step:<20} {json.dumps(figures)}")


if __name__ == "__main__":
    main()

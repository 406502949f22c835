"""Incremental runs on a fully indexed corpus, and a sensor tick over many unchanged files.

    python bench/ingest.py --engine edge   # builds .rag/bench/ingest-edge first
    python bench/incremental.py [--engine client|edge] [--files-for-sensor 5000]

Copies the corpus (so it can be edited) and the index that bench/ingest.py built, then times
`rag-pipeline ingest --json` end to end, as a user runs it, for: no change (median of three,
after one settling re-run); one section of one file rewritten; one file deleted. Then
generates a tree of N small files and times a sensor tick when nothing changed (after one tick
that has seen them).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from common import run_json, save_results

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CORPUS = REPO.parent / "shared" / "corpora" / "powershell-docs" / "books"
EDIT_FILE = "learn/ps101/02-help-system.md"
DELETE_FILE = "learn/ps101/09-functions.md"


def ingest(env: dict, cwd: Path) -> tuple[dict, float]:
    report, wall, _ = run_json(
        [sys.executable, "-m", "rag_pipeline.cli", "ingest", "--json"], env, cwd
    )
    return report, wall


def totals(report: dict) -> dict:
    books = report["books"].values()
    keys = ("embedded", "reused", "deleted", "files_new", "files_modified", "files_deleted")
    return {k: sum(b[k] for b in books) for k in keys} | {
        "runs": sum(1 for b in books if b["status"] != "unchanged")
    }


def section_chunks(env: dict, book: str, source_file: str, heading: str) -> int:
    """Chunks of one section, counted on the index after the edit (what it should cost)."""
    script = f"""
import json
from rag_pipeline.config import load_settings
from rag_pipeline.schema import COLLECTION_SCHEMA, chunks_of
from rag_pipeline.store import Match, open_store
with open_store(load_settings().store(), COLLECTION_SCHEMA) as store:
    records = store.scroll(chunks_of({book!r}, Match("source_file", {source_file!r})),
                           fields=["section_title"])
    print(sum(1 for r in records if {heading!r} in (r.payload.get("section_title") or "")))
"""
    return int(
        subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
        ).stdout
    )


def rewrite_section(path: Path) -> str:
    """Replace the body of the second `## ` section with new prose; returns its heading."""
    text = path.read_text()
    sections = list(re.finditer(r"^## (.+)$", text, flags=re.M))
    heading = sections[1].group(1).strip()
    start = sections[1].end()
    end = sections[2].start() if len(sections) > 2 else len(text)
    body = (
        "\n\nThis section was rewritten for the incremental benchmark. It explains the same "
        "idea in new words, so its chunks change while the rest of the file stays as it "
        "was.\n\n"
    )
    path.write_text(text[:start] + body + text[end:])
    return heading


def sensor_tick(files: int, workdir: Path) -> dict:
    tree = workdir / "sensor-books"
    shutil.rmtree(tree, ignore_errors=True)
    per_book = 250
    for i in range(files):
        book = tree / f"book-{i // per_book:03d}" / f"chapter-{(i % per_book) // 25:02d}"
        book.mkdir(parents=True, exist_ok=True)
        (book / f"page-{i % 25:02d}.md").write_text(f"# Page {i}\n\nSome text of page {i}.\n")
    script = f"""
import json, time
from dagster import DagsterInstance, build_sensor_context
from rag_pipeline.config import load_settings
from rag_pipeline.defs.sensors import build_books_sensor
from rag_pipeline.ingest.pipeline import IngestPipeline
sensor = build_books_sensor()
settings = load_settings(data_dir={str(tree)!r}, qdrant_path=":memory:")
resources = {{"pipeline": IngestPipeline.from_settings(settings)}}
instance = DagsterInstance.ephemeral()
t = time.perf_counter()
first = sensor(build_sensor_context(instance=instance, resources=resources))
cold = time.perf_counter() - t
for r in first.dynamic_partitions_requests:
    instance.add_dynamic_partitions(r.partitions_def_name, list(r.partition_keys))
times = []
for _ in range(5):
    t = time.perf_counter()
    context = build_sensor_context(instance=instance, cursor=first.cursor, resources=resources)
    result = sensor(context)
    times.append(time.perf_counter() - t)
print(json.dumps({{"files": {files}, "books": len(first.run_requests), "cold_tick_s": cold,
                  "warm_tick_s": sorted(times)[len(times) // 2],
                  "warm_result": type(result).__name__, "cursor_bytes": len(first.cursor)}}))
"""
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--engine", choices=["client", "edge"], default="client")
    parser.add_argument("--files-for-sensor", type=int, default=5000)
    args = parser.parse_args()
    source = REPO / ".rag" / "bench" / f"ingest-{args.engine}"
    if not (source / "qdrant").is_dir():
        raise SystemExit(f"run `python bench/ingest.py --engine {args.engine}` first")
    workdir = REPO / ".rag" / "bench" / f"incremental-{args.engine}"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    shutil.copytree(args.corpus, workdir / "books")
    for part in ("qdrant", "cache", "dagster_home"):
        shutil.copytree(source / part, workdir / part)
    env = {
        **os.environ,
        "RAG_DATA_DIR": str(workdir / "books"),
        "RAG_QDRANT_PATH": str(workdir / "qdrant"),
        "RAG_QDRANT_EMBEDDED": args.engine,
        "RAG_CACHE_DIR": str(workdir / "cache"),
        "DAGSTER_HOME": str(workdir / "dagster_home"),
        "RAG_EMBEDDER": "local",
        "DO_NOT_TRACK": "1",
        "PYTHONWARNINGS": "ignore",
    }
    env.pop("RAG_QDRANT_URL", None)
    figures: dict = {"engine": args.engine}

    # The copied index and instance may come from an older build (no partition record yet): the
    # first re-run settles that through Dagster; the steady state is what a user sees after.
    report, wall = ingest(env, workdir)
    figures["first_rerun_after_copy"] = {"wall_s": round(wall, 2), **totals(report)}
    walls = []
    for _ in range(3):
        report, wall = ingest(env, workdir)
        walls.append(round(wall, 2))
    figures["no_change"] = {"wall_s": sorted(walls)[1], "walls_s": walls, **totals(report)}

    book, rel = EDIT_FILE.split("/", 1)
    heading = rewrite_section(workdir / "books" / EDIT_FILE)
    report, wall = ingest(env, workdir)
    figures["one_section_rewritten"] = {
        "wall_s": round(wall, 2),
        "file": EDIT_FILE,
        "section": heading,
        "section_chunks": section_chunks(env, book, rel, heading),
        **totals(report),
    }

    book, rel = DELETE_FILE.split("/", 1)
    os.remove(workdir / "books" / DELETE_FILE)
    report, wall = ingest(env, workdir)
    gone = section_chunks(env, book, rel, "") == 0
    figures["one_file_deleted"] = {
        "wall_s": round(wall, 2),
        "file": DELETE_FILE,
        "points_left_for_file": 0 if gone else "some",
        **totals(report),
    }

    figures["sensor"] = sensor_tick(args.files_for_sensor, workdir)
    save_results(f"incremental-{args.engine}", figures)


if __name__ == "__main__":
    main()

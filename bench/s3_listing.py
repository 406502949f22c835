"""An object-store book with no change: requests and seconds of a re-run (issue 39).

    python bench/s3_listing.py [--objects 1000] [--books 1]

Starts moto's S3 in server mode on 127.0.0.1 (rag_pipeline_tests/s3server.py, which logs every
request), writes OBJECTS small Markdown objects split over BOOKS prefixes, ingests them with
`rag-pipeline ingest --json` (the CLI's whole path, the books declared in a sources file,
RAG_SOURCES, hash embedder), then times three no-change ingests end to end
(wall and the process's CPU) and counts the requests each made (listings, downloads), each
beside a no-change ingest of the same files as book folders (the baseline: the same CLI with
a FolderSource), and times the source's own look at the books (S3Source.scan with the saved
stats: what a plan does per book) in this process.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from common import REPO, run_json, save_results, scenario_env

sys.path.insert(0, str(REPO))  # the suite's S3 server and CLI wrapper

AWS = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def page(i: int) -> str:
    words = " ".join(f"w{i}x{j}" for j in range(120))
    return f"---\ntitle: Runbook {i}\n---\n# Runbook {i}\n\n## Steps\n\n{words}.\n"


def timed(command: list[str], env: dict[str, str], cwd: Path) -> tuple[dict, float, float]:
    """The command's JSON, wall seconds and CPU seconds (user + system of the process)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    report, wall, _ = run_json(command, env, cwd)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return report, wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=1000)
    parser.add_argument("--books", type=int, default=1)
    args = parser.parse_args()

    import os

    os.environ.update(AWS)
    from rag_pipeline_tests.s3server import S3Server

    server = S3Server()
    client = server.client()
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=bucket)
    for i in range(args.objects):
        client.put_object(
            Bucket=bucket, Key=f"book{i % args.books}/r{i:05d}.md", Body=page(i).encode()
        )
    books = {
        f"book{b}": {"s3": f"s3://{bucket}/book{b}/", "endpoint_url": server.url}
        for b in range(args.books)
    }
    with tempfile.TemporaryDirectory(prefix="s3bench-", dir="/dev/shm") as tmp:
        work = Path(tmp)
        config = work / "sources.yaml"
        config.write_text(json.dumps({"books": books}))  # JSON is YAML
        # the baseline: the same files as book folders, their own store (written first:
        # their stats are settled, so trusted, by the time they are ingested)
        folders = work / "books"
        for i in range(args.objects):
            path = folders / f"book{i % args.books}" / f"r{i:05d}.md"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(page(i))
        env = {**scenario_env(work / "no_folder", work / "s3"), **AWS, "RAG_SOURCES": str(config)}
        (work / "no_folder").mkdir(exist_ok=True)
        command = [sys.executable, "-m", "rag_pipeline.cli", "ingest", "--json"]
        first, first_s, _ = run_json(command, env, work)
        assert all(b["status"] == "ingested" for b in first["books"].values()), first
        folder_env = scenario_env(folders, work / "folder")
        folder_command = [sys.executable, "-m", "rag_pipeline.cli", "ingest", "--json"]
        run_json(folder_command, folder_env, work)
        runs, folder_runs = [], []
        for _ in range(3):
            since = len(server.requests)
            report, wall, cpu = timed(command, env, work)
            assert all(b["status"] == "unchanged" for b in report["books"].values()), report
            made = server.requests[since:]
            runs.append(
                {
                    "seconds": round(wall, 3),
                    "cpu_s": round(cpu, 3),
                    "requests": len(made),
                    "listings": sum(r.is_listing for r in made),
                    "downloads": sum(r.is_download for r in made),
                }
            )
            report, wall, cpu = timed(folder_command, folder_env, work)
            assert all(b["status"] == "unchanged" for b in report["books"].values()), report
            folder_runs.append({"seconds": round(wall, 3), "cpu_s": round(cpu, 3)})
        # the look alone, as a plan makes it: one listing page per 1,000 objects, no download
        from rag_pipeline.sources.s3 import S3BookSpec, S3Source

        source = S3Source({b: S3BookSpec.model_validate(s) for b, s in books.items()})
        known = {b: {f.source_file: (f.key, f.sha256) for f in source.scan(b).files} for b in books}
        source.versions(next(iter(books)))  # the client made (its first TLS-less connection)
        since = len(server.requests)
        t0 = time.perf_counter()
        for b in books:
            found = source.scan(b, known[b])
            assert found.hashed == 0
        look_s = time.perf_counter() - t0
        look = server.requests[since:]
    server.close()
    save_results(
        "s3_listing",
        {
            "objects": args.objects,
            "books": args.books,
            "first_ingest_s": round(first_s, 2),
            "no_change_ingest": runs,
            "no_change_ingest_median_s": statistics.median(r["seconds"] for r in runs),
            "no_change_ingest_median_cpu_s": statistics.median(r["cpu_s"] for r in runs),
            "folder_no_change_ingest": folder_runs,
            "folder_no_change_ingest_median_s": statistics.median(
                r["seconds"] for r in folder_runs
            ),
            "folder_no_change_ingest_median_cpu_s": statistics.median(
                r["cpu_s"] for r in folder_runs
            ),
            "look_s": round(look_s, 4),
            "look_requests": len(look),
            "look_downloads": sum(r.is_download for r in look),
        },
    )


if __name__ == "__main__":
    main()

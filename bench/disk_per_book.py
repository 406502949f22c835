"""What a book costs on disk: N tiny books (F small files each) in the store, apparent size
(what a copy that ignores holes writes) and allocated size (blocks) per book.

    python bench/disk_per_book.py [--books 1000] [--files 3] [--work DIR] [--json]
                                  [--reuse] [--copy-dir DIR] [--no-one-shard]

Builds N books of F one-paragraph Markdown files and indexes them in-process with the
pipeline (``IngestPipeline.run``, hash embedder: the store's cost, not the model's) into a
fresh store under DIR (default: a temporary folder in TMPDIR: the figures are those of its
file system). Prints the store's apparent and allocated bytes per book, the bytes ``tar``
writes without and with ``--sparse``, the allocated and apparent size of a ``cp -r`` copy,
and the ingest's CPU seconds. Then, for comparison, the layout Qdrant recommends for many
tenants: the same points in one Edge shard (this store's shard config) with a tenant-keyed
payload index. ``--reuse``: measure again the store an earlier run left in DIR;
``--copy-dir``: where the ``cp -r`` copy goes (a store of 1,000 shards is ~100,000 files:
another file system may have the inodes).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

MIB = 1 << 20
BATCH = 100  # books per pipeline run (a sensor's batch of changed books)


def sizes(folder: Path) -> tuple[int, int, int]:
    """(apparent, allocated) bytes of every file under ``folder``, and its entries (inodes)."""
    apparent = allocated = entries = 0
    for path in folder.rglob("*"):
        info = path.lstat()
        entries += 1
        if path.is_file() and not path.is_symlink():
            apparent += info.st_size
            allocated += info.st_blocks * 512
    return apparent, allocated, entries


def tar_bytes(folder: Path, *options: str) -> int:
    """Bytes ``tar -c`` writes for ``folder``: GNU tar's own total for an archive of
    ``/dev/null`` (it then reads no file: the holes of 1,000 shards are ~137 GB of zeros)."""
    done = subprocess.run(
        ["tar", "--totals", "-c", *options, "-f", "/dev/null", "-C", str(folder), "."],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stderr.split("Total bytes written:")[1].split()[0])


def make_books(root: Path, books: int, files: int) -> list[str]:
    names = [f"tiny-{b:04d}" for b in range(books)]
    for name in names:
        folder = root / name
        folder.mkdir(parents=True)
        for f in range(files):
            (folder / f"{f:02d}-note.md").write_text(
                f"# Note {f} of {name}\n\nA short note: file {f} of book {name}, a few words "
                "about robots and their sensors, so that the book has one chunk per file.\n"
            )
    return names


def copy_figures(store: Path, work: Path) -> dict[str, int]:
    copy = work / f"copy-of-{store.name}"
    shutil.rmtree(copy, ignore_errors=True)
    subprocess.run(["cp", "-r", str(store), str(copy)], check=True)
    copied_apparent, copied_allocated, _ = sizes(copy)
    shutil.rmtree(copy)
    return {
        "tar_bytes": tar_bytes(store),
        "tar_sparse_bytes": tar_bytes(store, "--sparse"),
        "cp_r_allocated": copied_allocated,
        "cp_r_apparent": copied_apparent,
    }


def one_shard(store_path: Path, work: Path, copy_dir: Path) -> dict[str, Any]:
    """The store's points copied into one Edge shard with a tenant-keyed index."""
    import qdrant_edge as qe

    from rag_pipeline.config import load_settings
    from rag_pipeline.schema import BOOK_ID, COLLECTION_SCHEMA
    from rag_pipeline.store import open_store
    from rag_pipeline.store.edge.engine import _shard_config

    settings = load_settings(qdrant_path=str(store_path), qdrant_embedded="edge")
    folder = work / "one-shard"
    with open_store(settings.store(), COLLECTION_SCHEMA) as store:
        dim = store.dense_dimension()
        assert dim is not None
        shard = qe.EdgeShard.create(str(folder), _shard_config(dim))
        shard.update(
            qe.UpdateOperation.create_field_index(
                BOOK_ID, qe.KeywordIndexParams(is_tenant=True, memory=qe.Memory.Cold)
            )
        )
        books = store.tenants()
        points = 0
        for book in books:
            engine = store._reader(book)  # type: ignore[attr-defined]
            records = engine.scroll(qe.ScrollRequest(limit=10_000, with_vector=True))[0]
            shard.update(
                qe.UpdateOperation.upsert_points(
                    [qe.Point(id=r.id, vector=r.vector, payload=r.payload) for r in records]
                )
            )
            points += len(records)
        shard.optimize()
        shard.close()
    apparent, allocated, entries = sizes(folder)
    figures = {"books": len(books), "points": points, "apparent": apparent, "entries": entries}
    figures |= {"allocated": allocated, **copy_figures(folder, copy_dir)}
    shutil.rmtree(folder)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--books", type=int, default=1000)
    parser.add_argument("--files", type=int, default=3)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--no-one-shard", action="store_true", help="skip the comparison")
    parser.add_argument("--reuse", action="store_true", help="measure DIR's store again")
    parser.add_argument("--copy-dir", type=Path, default=None)
    args = parser.parse_args()

    from rag_pipeline.config import load_settings
    from rag_pipeline.ingest.pipeline import IngestPipeline

    work = args.work or Path(tempfile.mkdtemp(prefix="disk-per-book-"))
    work.mkdir(parents=True, exist_ok=True)
    data, store_path = work / "books", work / "qdrant"
    copy_dir = args.copy_dir or work
    cpu = wall = 0.0
    failed: list[str] = []
    if not (args.reuse and store_path.is_dir()):
        for old in (data, store_path, work / "cache"):
            shutil.rmtree(old, ignore_errors=True)
        names = make_books(data, args.books, args.files)
        settings = load_settings(
            data_dir=str(data),
            qdrant_path=str(store_path),
            embedder="hash",
            cache_dir=str(work / "cache"),
            qdrant_embedded="edge",
        )
        pipeline = IngestPipeline.from_settings(settings)
        cpu, wall = time.process_time(), time.perf_counter()
        for start in range(0, len(names), BATCH):
            runs = pipeline.run(names[start : start + BATCH], run_id=f"bench-{start}")
            failed += [b for b, r in runs.items() if r.outcome.result.status != "ingested"]
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    apparent, allocated, entries = sizes(store_path)
    figures: dict[str, Any] = {
        "books": len(list((store_path / "rag_chunks" / "books").iterdir())),
        "files_per_book": args.files,
        "failed": failed,
        "file_system": subprocess.run(
            ["stat", "-f", "-c", "%T", str(work)], capture_output=True, text=True
        ).stdout.strip(),
        "ingest_cpu_s": round(cpu, 1),
        "ingest_wall_s": round(wall, 1),
        "apparent": apparent,
        "allocated": allocated,
        "entries": entries,
        **copy_figures(store_path, copy_dir),
    }
    if not args.no_one_shard:
        cpu = time.process_time()
        figures["one_shard"] = one_shard(store_path, work, copy_dir)
        figures["one_shard"]["cpu_s"] = round(time.process_time() - cpu, 1)
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print_figures(figures)
    if args.work is None:
        shutil.rmtree(work)


def print_figures(figures: dict[str, Any]) -> None:
    def per_book(name: str, values: dict[str, Any]) -> None:
        books = values["books"]
        print(
            f"  {name}: {values[name] / MIB:,.1f} MiB, {values[name] / books / MIB:.3f} MiB a book"
        )

    print(
        f"{figures['books']} books of {figures['files_per_book']} files on "
        f"{figures['file_system']}: ingest {figures['ingest_cpu_s']} CPU s "
        f"({figures['ingest_wall_s']} s wall), failed: {figures['failed'] or 'none'}"
    )
    for layout, values in (("shard per book", figures), ("one shard", figures.get("one_shard"))):
        if values is None:
            continue
        print(f"{layout}:")
        for name in ("apparent", "allocated", "tar_bytes", "tar_sparse_bytes", "cp_r_allocated"):
            per_book(name, values)
        print(
            f"  entries (inodes): {values['entries']:,}, "
            f"{values['entries'] / values['books']:.0f} a book"
        )
    print(os.linesep.join(["", json.dumps(figures)]))


if __name__ == "__main__":
    main()

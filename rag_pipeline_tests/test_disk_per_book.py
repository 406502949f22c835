"""Issue 40.1: what a book costs on disk. A small book's shard no longer carries 64 MiB of
preallocated write-ahead log, the free space a write or a load asks for follows what it
writes, so a small disk holds many small books, and a full one still fails a write by name
with nothing lost."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rag_pipeline.store.errors import StoreResourceError
from rag_pipeline_tests.helpers import fill_disk, small_ext4

MIB = 1 << 20


def _tiny_books(root: Path, names: list[str], files: int = 3) -> Path:
    for name in names:
        (root / name).mkdir(parents=True)
        for f in range(files):
            (root / name / f"{f}-note.md").write_text(
                f"# Note {f}\n\nFile {f} of {name}: a few words about robots and sensors.\n"
            )
    return root


def _ingest(books: Path, qdrant: Path, names: list[str]) -> dict[str, object]:
    """What a Dagster run of ``names`` does, in-process: each book's report."""
    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline_tests.conftest import make_pipeline, make_recipe, store_config

    pipeline = make_pipeline(books, store_config(qdrant), make_recipe(HashEmbedder()))
    return {b: run.outcome.result for b, run in pipeline.run(names, run_id="disk").items()}


def _points(qdrant: Path, names: list[str]) -> dict[str, int]:
    from rag_pipeline.schema import COLLECTION_SCHEMA, chunks_of
    from rag_pipeline.store import open_store
    from rag_pipeline_tests.conftest import store_config

    with open_store(store_config(qdrant), COLLECTION_SCHEMA) as store:
        return {b: len(list(store.scroll(chunks_of(b), fields=["text"]))) for b in names}


def _apparent(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def test_a_new_shard_has_a_small_write_ahead_log_and_an_old_one_still_opens(tmp_path):
    """A new book's shard names 1 MiB WAL segments in its Edge config (Edge's default, kept
    by shards made before, is 32 MiB, two of them made ahead: 64 MiB in every book); a shard
    made the old way is read and written as before."""
    import qdrant_edge as qe

    from rag_pipeline.store.edge import engine

    books = _tiny_books(tmp_path / "books", ["new", "old"])
    qdrant = tmp_path / "qdrant"
    results = _ingest(books, qdrant, ["new"])
    assert results["new"].status == "ingested", results
    (shard,) = (qdrant / "rag_chunks" / "books" / "new").glob("g*")
    config = json.loads((shard / "edge_config.json").read_text())
    assert config["wal_options"]["segment_capacity"] == engine.WAL_SEGMENT_BYTES
    assert _apparent(shard / "wal") <= 4 * MIB, sorted((shard / "wal").iterdir())

    original = engine._small_wal
    try:  # the old way: Edge's defaults, no wal_options in the config
        engine._small_wal = lambda folder, shard: shard.close()  # type: ignore[assignment]
        assert _ingest(books, qdrant, ["old"])["old"].status == "ingested"
    finally:
        engine._small_wal = original
    (old,) = (qdrant / "rag_chunks" / "books" / "old").glob("g*")
    assert "wal_options" not in json.loads((old / "edge_config.json").read_text())
    (books / "old" / "3-note.md").write_text("# More\n\nA fourth note about actuators.\n")
    assert _ingest(books, qdrant, ["old"])["old"].status == "ingested"
    assert _points(qdrant, ["new", "old"]) == {"new": 3, "old": 4}
    assert qe.EdgeShard.load(str(old)).count(qe.CountRequest()) > 0


@pytest.mark.slow
def test_a_64_mib_disk_holds_fifty_tiny_books_and_a_full_one_loses_none(tmp_path):
    """On a 64 MiB ext4 file system, 50 books of 3 small files are ingested (each takes about
    0.25 MB and 115 inodes there: 141 fit; the write used to ask for 64 MiB free, so not even
    the first one was); with the disk then full, the run of one more book stops with the
    named error and the 50 stay whole; once space is freed, it is ingested."""
    names = [f"tiny-{n:02d}" for n in range(51)]
    books = _tiny_books(tmp_path / "books", names)
    with small_ext4(tmp_path / "disk", "64M") as disk:
        qdrant = disk / "qdrant"
        results = _ingest(books, qdrant, names[:50])
        failed = {b: r.error_messages for b, r in results.items() if r.status != "ingested"}
        assert not failed, failed
        filler = fill_disk(disk, 1 * MIB)
        with pytest.raises(StoreResourceError, match="no space left on the device"):
            _ingest(books, qdrant, names[50:])  # a limit of the machine: the run stops
        filler.unlink()
        assert _points(qdrant, names[:50]) == dict.fromkeys(names[:50], 3)
        assert _ingest(books, qdrant, names[50:])[names[50]].status == "ingested"
        shutil.rmtree(qdrant)


#: a new book ingested in a fresh process with the disk filled to ``leave`` MiB free
_NEW_BOOK_ON_A_FULL_DISK = """
import json, os, shutil, sys
from pathlib import Path
from rag_pipeline.store.errors import StoreResourceError
from rag_pipeline_tests.test_disk_per_book import _ingest, _points
books, qdrant, book, leave = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], float(sys.argv[4])
disk = qdrant.parent
with open(disk / "filler", "wb") as f:
    os.posix_fallocate(f.fileno(), 0, shutil.disk_usage(disk).free - int(leave * 2**20))
try:
    print(_ingest(books, qdrant, [book])[book].status)
except StoreResourceError as exc:
    print(exc)
finally:
    (disk / "filler").unlink()
print(json.dumps(_points(qdrant, ["first", book])))
"""


@pytest.mark.slow
@pytest.mark.parametrize("leave_mib", [13, 18, 30])
def test_a_nearly_full_tmpfs_never_kills_a_write(tmp_path, leave_mib):
    """Qdrant Edge writes through memory maps, and on tmpfs even reading a hole of one takes
    a page: a write the disk cannot hold is a SIGBUS (exit 135, no message) unless the free
    space checked before covers it. With 13, 18 or 30 MiB left (around each smaller check:
    a new shard, its points, its optimization, a book's load), a new book is ingested or
    refused by name, and the book written before stays whole."""
    from rag_pipeline_tests.conftest import REPO
    from rag_pipeline_tests.helpers import small_tmpfs

    books = _tiny_books(tmp_path / "books", ["first", "second"])
    with small_tmpfs(tmp_path / "disk", "96m") as disk:
        qdrant = disk / "qdrant"
        assert _ingest(books, qdrant, ["first"])["first"].status == "ingested"
        arguments = [str(books), str(qdrant), "second", str(leave_mib)]
        done = subprocess.run(
            [sys.executable, "-c", _NEW_BOOK_ON_A_FULL_DISK, *arguments],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=120,
        )
        assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
        status, points = done.stdout.strip().splitlines()[-2:]
        assert status == "ingested" or "no space left on the device" in status, done.stdout
        expected = {"first": 3, "second": 3 if status == "ingested" else 0}
        assert json.loads(points) == expected, done.stdout

"""A damaged store is said so, never served: what is damaged, and the command that rebuilds.

A book's Qdrant Edge shard (its current generation folder) is damaged the ways a disk or a
careless hand does it (its config file deleted, its vectors overwritten, its segment files
emptied), then used through the real CLI.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from rag_pipeline_tests.conftest import REPO
from rag_pipeline_tests.helpers import Cli, Server, assert_no_trace

pytestmark = pytest.mark.integration
BOOK = "ros2-fundamentals"


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    root = tmp_path_factory.mktemp("damage")
    shutil.copytree(REPO / "data" / "books", root / "books")
    cli = Cli(root, root / "books")
    cli("ingest")
    return root


@pytest.fixture
def cli(indexed, tmp_path):
    for part in ("books", "qdrant", "dagster_home"):
        shutil.copytree(indexed / part, tmp_path / part)
    return Cli(tmp_path, tmp_path / "books")


def folder(cli) -> Path:
    return Path(cli.env["RAG_QDRANT_PATH"]) / "rag_chunks"


def shard(cli) -> Path:
    """The book's current generation: one Edge shard folder."""
    book = folder(cli) / "books" / BOOK
    return book / json.loads((book / "current.json").read_text())["generation"]


def no_traceback(proc) -> None:
    assert_no_trace(proc.stderr + proc.stdout)


def search(cli, mode: str = "hybrid"):
    return cli("search", "nodes and topics", "--book", BOOK, "--mode", mode, "--json", check=False)


def assert_rebuild_heals(cli) -> None:
    rebuilt = cli("ingest", "--rebuild", "--json", check=False)
    no_traceback(rebuilt)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "rebuilt" in rebuilt.stderr and "moved to" in rebuilt.stderr
    books = json.loads(rebuilt.stdout)["books"]
    assert {b["status"] for b in books.values()} == {"ingested"}
    assert all(b["points"] == b["chunks"] > 0 for b in books.values())
    healed = search(cli)
    assert healed.returncode == 0 and json.loads(healed.stdout)
    assert list(folder(cli).parent.glob("rag_chunks.set-aside-*"))  # kept for inspection


def assert_named(proc) -> None:
    """A reader of a damaged book exits 1 naming the book and both ways out."""
    no_traceback(proc)
    assert proc.returncode == 1, proc.stderr
    assert f"book {BOOK!r}" in proc.stderr and "rag-pipeline ingest --rebuild" in proc.stderr
    assert f"rag-pipeline ingest --book {BOOK}" in proc.stderr


def test_a_lost_config_file_is_named_and_rebuild_heals_it(cli):
    (shard(cli) / "edge_config.json").unlink()
    assert_named(search(cli))
    plan = cli.json("plan")["books"]
    assert plan[BOOK]["action"] == "run" and "damaged" in plan[BOOK]["reasons"][0]
    assert_rebuild_heals(cli)


def test_emptied_segment_files_are_named_and_the_next_ingest_heals_them(cli):
    for path in (shard(cli) / "segments").rglob("*"):
        if path.is_file():
            path.write_bytes(b"")
    assert_named(search(cli))
    report = cli.json("ingest")["books"]
    assert report[BOOK]["status"] == "ingested" and report[BOOK]["points"] > 0
    assert any("damaged" in r for r in report[BOOK]["reasons"])
    healed = search(cli)
    assert healed.returncode == 0 and json.loads(healed.stdout)
    assert {b["action"] for b in cli.json("plan")["books"].values()} == {"unchanged"}


def test_overwritten_vectors_are_never_served_and_the_next_ingest_repairs_them(cli):
    for path in (shard(cli) / "segments").rglob("vector_storage-dense/vectors/chunk_*.mmap"):
        path.write_bytes(os.urandom(path.stat().st_size))
    proc = search(cli, "dense")
    no_traceback(proc)
    assert proc.returncode == 2 and "damaged" in proc.stderr
    hybrid = search(cli)
    assert hybrid.returncode == 2 and "damaged" in hybrid.stderr  # not hidden behind fusion
    plan = cli.json("plan")["books"]
    assert plan[BOOK]["action"] == "run" and "damaged" in plan[BOOK]["reasons"][0]
    report = cli.json("ingest")["books"]
    assert report[BOOK]["status"] == "ingested" and report[BOOK]["reused"] == 0
    healed = search(cli, "dense")
    assert healed.returncode == 0 and -1.0 <= json.loads(healed.stdout)[0]["score"] <= 1.0


@pytest.mark.slow
def test_a_book_being_repaired_is_refused_as_damaged_never_answered_empty(cli):
    """Issue 43: while the next ingest rebuilds a damaged book, the service and CLI searches
    polled all along answer "damaged" (503, exit 1) or, once the rebuild is checked, hits:
    never an empty answer (the book was removed first, and read as holding nothing)."""
    (shard(cli) / "edge_config.json").unlink()
    cli.env["RAG_BUSY_WAIT_S"] = "30"
    server = Server(cli)
    served: list[tuple[int, int, str]] = []  # (status, hits, detail)
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            answer = server.get("/search", q="nodes and topics", book=BOOK)
            body = answer.json()
            hits = len(body) if answer.status_code == 200 else 0
            served.append((answer.status_code, hits, "" if hits else str(body)))
            time.sleep(0.05)

    poller = threading.Thread(target=poll)
    try:
        assert server.get("/search", q="nodes", book=BOOK).status_code == 503
        poller.start()
        ingest = cli.start("ingest", "--json")
        searched: list[tuple[int, str, str]] = []  # (exit code, stdout, stderr)
        while ingest.poll() is None:
            proc = search(cli)
            searched.append((proc.returncode, proc.stdout, proc.stderr))
        stdout, stderr = ingest.communicate()
        time.sleep(0.3)
    finally:
        stop.set()
        if poller.is_alive():
            poller.join(timeout=120)
        server.stop()
    assert ingest.returncode == 0, stderr[-3000:]
    assert any("damaged" in r for r in json.loads(stdout)["books"][BOOK]["reasons"])
    assert served and searched
    refused = f"rag-pipeline ingest --book {BOOK}"  # what BookDamagedError says to do
    for status, hits, detail in served:
        assert (status == 503 and refused in detail) or (status == 200 and hits), (status, detail)
    assert served[-1][0] == 200  # the rebuild, once checked, is served
    for code, out, err in searched:
        assert_no_trace(out + err)
        assert (code == 1 and refused in err) or (code == 0 and json.loads(out)), (code, out, err)
    healed = search(cli)
    assert healed.returncode == 0 and json.loads(healed.stdout)
    assert not (folder(cli) / "books" / BOOK / "damaged.json").exists()

"""The index always equals the books, and no cache is believed without being checked
(issue 26): each case drives ``rag-pipeline`` as a user does (real processes, the Dagster job).

* a file's recorded stat stands for its bytes only while every field a change moves matches
  (git's rules: :mod:`rag_pipeline.sources.filekeys`);
* a book's summary, its pointers and the collection's layout are used only while they agree
  with the shards they describe and name the book they are used for; damage is said, never
  answered as "nothing found", and the next ingest repairs it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from rag_pipeline.config import load_settings
from rag_pipeline.ingest.overview import describe_collection
from rag_pipeline.models import document_id
from rag_pipeline.schema import COLLECTION_SCHEMA
from rag_pipeline.store import open_store
from rag_pipeline_tests.differential import point_sets
from rag_pipeline_tests.helpers import Cli, as_nobody_or_skip, assert_no_trace

pytestmark = pytest.mark.integration

FOX = "# One\n\nThe quick brown fox jumps over the lazy dog.\n"
EMU = "# One\n\nThe quick brown cat jumps over the lazy emu.\n"  # the same size
ZEBRA = "# Two\n\nSecond file about zebras and their stripes.\n"
OWL = "# Three\n\nA book about owls.\n"


@pytest.fixture
def world(tmp_path: Path) -> Cli:
    """Two small books ingested once by the CLI (hash embedder)."""
    books = tmp_path / "books"
    (books / "b1").mkdir(parents=True)
    (books / "b2").mkdir()
    (books / "b1" / "a.md").write_text(FOX)
    (books / "b1" / "z.md").write_text(ZEBRA)
    (books / "b2" / "c.md").write_text(OWL)
    cli = Cli(tmp_path, books)
    Path(cli.env["DAGSTER_HOME"]).mkdir()
    settled()
    cli("ingest", "--json")
    return cli


def settled() -> None:
    """Past the racy window of what was just written (as a person's next command is)."""
    time.sleep(0.1)


def data(cli: Cli) -> Path:
    return Path(cli.env["RAG_DATA_DIR"])


def book_folder(cli: Cli, book: str) -> Path:
    return Path(cli.env["RAG_QDRANT_PATH"]) / "rag_chunks" / "books" / book


def generation(cli: Cli, book: str) -> Path:
    folder = book_folder(cli, book)
    return folder / json.loads((folder / "current.json").read_text())["generation"]


def hits(cli: Cli, query: str, book: str) -> list[str]:
    found = cli.json("search", query, "--book", book, "--mode", "sparse")
    return [h["source_file"] for h in found]


def ingest(cli: Cli) -> dict[str, dict]:
    return cli.json("ingest")["books"]


def plan_actions(cli: Cli) -> dict[str, str]:
    return {b: p["action"] for b, p in cli.json("plan")["books"].items()}


def test_a_same_size_edit_with_its_old_mtime_put_back_is_indexed(world):
    """The reproduction of issue 26: as rsync -t, cp -p, tar and unzip leave a file."""
    path = data(world) / "b1" / "a.md"
    before = path.stat()
    path.write_text(EMU)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    settled()
    assert path.stat().st_size == before.st_size and path.stat().st_mtime_ns == before.st_mtime_ns
    report = ingest(world)
    assert report["b1"]["status"] == "ingested" and report["b1"]["files_modified"] == 1
    assert hits(world, "emu", "b1") == ["a.md"]
    assert plan_actions(world) == {"b1": "unchanged", "b2": "unchanged"}


def test_two_files_of_one_size_and_time_that_swap_names_are_seen(world):
    book = data(world) / "b1"
    (book / "x.md").write_text("# Xray\n\nalpha words here.\n")
    (book / "y.md").write_text("# Yank\n\nbravo words here.\n")
    then = time.time() - 3600
    for name in ("x.md", "y.md"):
        os.utime(book / name, (then, then))
    settled()
    ingest(world)
    (book / "x.md").rename(book / "t.md")
    (book / "y.md").rename(book / "x.md")
    (book / "t.md").rename(book / "y.md")
    settled()
    assert plan_actions(world)["b1"] == "run"
    assert ingest(world)["b1"]["files_modified"] == 2
    assert hits(world, "alpha", "b1") == ["y.md"] and hits(world, "bravo", "b1") == ["x.md"]


def test_a_touch_or_the_same_bytes_rewritten_runs_nothing(world):
    path = data(world) / "b1" / "a.md"
    os.utime(path, None)
    (data(world) / "b1" / "z.md").write_text(ZEBRA)
    settled()
    assert {r["status"] for r in ingest(world).values()} == {"unchanged"}


def test_a_lost_layout_is_rebuilt_from_the_shards(world):
    (Path(world.env["RAG_QDRANT_PATH"]) / "rag_chunks" / "layout.json").unlink()
    assert hits(world, "fox", "b1") == ["a.md"]  # not "has nothing indexed"
    assert plan_actions(world) == {"b1": "unchanged", "b2": "unchanged"}


@pytest.mark.parametrize(
    "damage", ["segment files removed", "segment files emptied", "current.json lost"]
)
def test_a_damaged_shard_is_named_never_answered_as_empty_and_the_next_ingest_repairs_it(
    world, damage
):
    segments = generation(world, "b1") / "segments"
    if damage == "current.json lost":
        (book_folder(world, "b1") / "current.json").unlink()
    for path in sorted(segments.rglob("*"), reverse=True):
        if damage == "current.json lost":
            break
        if damage == "segment files removed":
            if path.is_file():
                path.unlink()
            else:
                path.rmdir()
        elif path.is_file():
            path.write_bytes(b"")
    failed = world("search", "fox", "--book", "b1", "--json", check=False)
    assert failed.returncode == 1, failed.stdout
    assert "book 'b1'" in failed.stderr and "rag-pipeline ingest" in failed.stderr
    assert_no_trace(failed.stderr)
    document = world("document", document_id("b1", "a.md"), "--book", "b1", check=False)
    assert document.returncode == 1 and "book 'b1'" in document.stderr
    assert hits(world, "owls", "b2") == ["c.md"]  # another book is served as ever
    settings = load_settings(qdrant_path=world.env["RAG_QDRANT_PATH"])
    with open_store(settings.store(), COLLECTION_SCHEMA) as store:
        look = describe_collection(store, ["b1", "b2"])  # the collection page's table
    state = {b.book_id: b.state for b in look.books}
    assert state["b1"].startswith("damaged") and state["b2"] == "ok"
    report = ingest(world)
    assert report["b1"]["status"] == "ingested"
    assert any("damaged" in r for r in report["b1"]["reasons"])
    assert hits(world, "fox", "b1") == ["a.md"]
    assert plan_actions(world) == {"b1": "unchanged", "b2": "unchanged"}


def test_a_book_folder_of_the_store_copied_under_another_id_is_damage_not_unchanged(world):
    (data(world) / "b3").mkdir()
    (data(world) / "b3" / "d.md").write_text("# Four\n\nOf penguins.\n")
    settled()
    ingest(world)
    shutil.rmtree(book_folder(world, "b3"))
    shutil.copytree(book_folder(world, "b2"), book_folder(world, "b3"))
    failed = world("search", "penguins", "--book", "b3", "--json", check=False)
    assert failed.returncode == 1 and "book 'b3'" in failed.stderr
    assert plan_actions(world)["b3"] == "run"
    assert ingest(world)["b3"]["status"] == "ingested"
    assert hits(world, "penguins", "b3") == ["d.md"]
    assert point_sets(Path(world.env["RAG_QDRANT_PATH"]))["b3"]  # b2's points are not kept


def test_a_summary_edited_by_other_hands_is_not_believed(world):
    path = data(world) / "b1" / "a.md"
    path.write_text(EMU)
    summary_file = book_folder(world, "b1") / "summary.json"
    summary = json.loads(summary_file.read_text())
    summary["data"]["records"]["a.md"][0] = hashlib.sha256(EMU.encode()).hexdigest()
    summary_file.write_text(json.dumps(summary))
    settled()
    assert ingest(world)["b1"]["files_modified"] == 1
    assert hits(world, "emu", "b1") == ["a.md"]


@pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/usr/bin/setpriv").exists(),
    reason="needs root and setpriv to run the CLI as another user (root reads any file)",
)
def test_a_file_made_unreadable_is_reported_by_every_ingest():
    """chmod 000 moves only the file's ctime and mode: it is read again, and reported."""
    root = Path(tempfile.mkdtemp(prefix="rag-nobody-"))  # a folder nobody can reach
    os.chmod(root, 0o755)
    books = root / "books"
    (books / "b1").mkdir(parents=True)
    (books / "b1" / "a.md").write_text(FOX)
    (books / "b1" / "z.md").write_text(ZEBRA)
    for path in [root, *root.rglob("*")]:
        os.chown(path, 65534, 65534, follow_symlinks=False)
    cli = Cli(root, books)
    prefix = as_nobody_or_skip()

    def as_nobody(*args: str) -> dict:
        done = cli.as_user(prefix, *args, "--json")
        assert_no_trace(done.stderr)
        return json.loads(done.stdout)["books"]["b1"]

    settled()
    assert as_nobody("ingest")["status"] == "ingested"
    settled()
    os.chmod(books / "b1" / "z.md", 0)
    try:
        for _ in range(2):
            result = as_nobody("ingest")
            assert result["files_unreadable"] == 1, result
            assert any("z.md" in m and "denied" in m for m in result["error_messages"])
            assert result["points"] == 2 and result["files_deleted"] == 0
        planned = as_nobody("plan")
        assert planned["action"] == "unchanged" and planned["files_unreadable"] == 1
    finally:
        os.chmod(books / "b1" / "z.md", 0o644)
        shutil.rmtree(root, ignore_errors=True)


def test_the_service_answers_503_naming_a_damaged_book_and_serves_the_others(world):
    from fastapi.testclient import TestClient

    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline.serve.app import create_app
    from rag_pipeline_tests.conftest import make_recipe

    settings = load_settings(
        data_dir=data(world),
        qdrant_path=world.env["RAG_QDRANT_PATH"],
        embedder="hash",
        cache_dir=world.env["RAG_CACHE_DIR"],
    )
    for path in (generation(world, "b1") / "segments").rglob("*"):
        if path.is_file():
            path.write_bytes(b"")
    with TestClient(create_app(settings, make_recipe(HashEmbedder()), cache_size=0)) as client:
        damaged = client.get("/search", params={"q": "fox", "book": "b1", "mode": "sparse"})
        assert damaged.status_code == 503 and "book 'b1'" in damaged.json()["detail"]
        assert "rag-pipeline ingest" in damaged.json()["detail"]
        other = client.get("/search", params={"q": "owls", "book": "b2", "mode": "sparse"})
        assert other.status_code == 200 and other.json()


def test_the_service_answers_503_naming_a_limit_of_the_machine(world, monkeypatch):
    """A disk too full to load a book's shard, and descriptors run out where the store's own
    calls do not wrap the error: both 503 naming the limit, never 500 nor "damaged"."""
    import shutil as shutil_module

    from fastapi.testclient import TestClient

    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline.serve.app import create_app
    from rag_pipeline.store.edge import engine as edge
    from rag_pipeline.store.lock import FolderLock
    from rag_pipeline_tests.conftest import make_recipe

    settings = load_settings(
        data_dir=data(world),
        qdrant_path=world.env["RAG_QDRANT_PATH"],
        embedder="hash",
        cache_dir=world.env["RAG_CACHE_DIR"],
    )
    params = {"q": "fox", "book": "b1", "mode": "sparse"}
    with TestClient(create_app(settings, make_recipe(HashEmbedder()), cache_size=0)) as client:
        usage = shutil_module.disk_usage(world.env["RAG_QDRANT_PATH"])
        full = usage._replace(free=edge.LOAD_SPACE_BYTES - 1)
        monkeypatch.setattr(edge.shutil, "disk_usage", lambda _: full)
        answer = client.get("/search", params=params)
        assert answer.status_code == 503, answer.text
        assert "no space left on the device" in answer.json()["detail"]
        assert "damaged" not in answer.json()["detail"]
        monkeypatch.undo()

        def no_descriptors(self, wait_s, notify=None):  # type: ignore[no-untyped-def]
            raise OSError(24, "Too many open files")

        client.app.state.service.holder.close()  # the next request opens the store again
        monkeypatch.setattr(FolderLock, "try_acquire", lambda self: False)
        monkeypatch.setattr(FolderLock, "acquire", no_descriptors)
        answer = client.get("/search", params=params)
        assert answer.status_code == 503, answer.text
        assert "EMFILE" in answer.json()["detail"]
        monkeypatch.undo()
        assert client.get("/search", params=params).status_code == 200


@pytest.mark.parametrize(
    ("error", "named"),
    [
        (RuntimeError("Service runtime error: Too many open files (os error 24)"), "EMFILE"),
        (OSError(28, "No space left on device"), "ENOSPC"),
        (RuntimeError("mmap failed: Cannot allocate memory (os error 12)"), "max_map_count"),
        (RuntimeError("failed to load segment: range 0..4 is out of bounds"), None),
        # issue 43: Qdrant Edge's WAL error carries Rust's Debug form of the os error
        (
            RuntimeError(
                "Service runtime error: failed to open WAL /s/wal: Can't init WAL: Custom { kind: "
                "TooManyOpenFiles, error: Error { kind: OpenFile, source: Os { code: 24, kind: "
                'TooManyOpenFiles, message: "Too many open files" }, path: "/s/wal/open-2" } }'
            ),
            "EMFILE",
        ),
        (RuntimeError('Os { code: 23, kind: Uncategorized, message: "..." }'), "ENFILE"),
        (RuntimeError('Os { code: 122, kind: QuotaExceeded, message: "..." }'), "EDQUOT"),
        (RuntimeError("write failed: No space left on device"), "ENOSPC"),  # no number
        (RuntimeError("mmap: Too many open files in system"), "ENFILE"),
        (RuntimeError("cannot open segment: Too many open files"), "EMFILE"),
        (OSError(12, "Cannot allocate memory"), "ENOMEM"),
        (RuntimeError('Os { code: 2, kind: NotFound, message: "No such file" }'), None),
    ],
)
def test_a_limit_of_the_machine_is_told_from_damage(error, named):
    from rag_pipeline.store.errors import resource_limit

    found = resource_limit(error)
    assert (found is None) if named is None else (found is not None and named in found)


#: run in its own process: a search of b1 with 0, 1, 2, ... descriptors left under a lowered
#: open-files limit (soft and hard, so the store cannot raise it): each answer as JSON
_SEARCH_OUT_OF_DESCRIPTORS = r"""
import json, os, resource, sys, traceback
from click.testing import CliRunner
from rag_pipeline.cli import main

resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
args = ["search", "fox", "--book", "b1", "--mode", "sparse", "--json"]
runner = CliRunner()
assert runner.invoke(main, args).exit_code == 0  # every import done with descriptors to spare
answers = []
for free in range(8):
    held = []
    try:
        while True:
            held.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    for fd in held[len(held) - free :]:
        os.close(fd)
    del held[len(held) - free :]
    try:
        result = runner.invoke(main, args)
    finally:
        for fd in held:
            os.close(fd)
    escaped = result.exception is not None and not isinstance(result.exception, SystemExit)
    trace = traceback.format_exception(result.exception) if escaped else []
    said = result.stderr + "".join(trace)
    answers.append([free, result.exit_code, result.stdout, said])
print(json.dumps(answers))
"""


def test_descriptors_running_out_anywhere_in_a_search_are_named_never_damage(world):
    """Issue 43: a real search process whose open-files limit is met at each step in turn (the
    store's lock, ``current.json``, the shard's config, its WAL): every failure exits 1 naming
    the limit, never "damaged ... ingest --rebuild" (the WAL's error carries Rust's
    ``Os { code: 24 }``, and a pointer that could not be read was called unreadable), nor a
    traceback (the error's own printing needed a descriptor)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _SEARCH_OUT_OF_DESCRIPTORS],
        env=world.env,
        cwd=world.cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answers = json.loads(done.stdout)
    failed = [said for _, code, _, said in answers if code != 0]
    for free, code, out, said in answers:
        assert_no_trace(out + said)
        assert "damaged" not in said and "--rebuild" not in said, (free, said)
        named = code == 1 and "(EMFILE)" in said
        assert (code == 0 and json.loads(out)) or named, (free, code, said)
    assert answers[-1][1] == 0 and failed
    assert any("current.json" in said for said in failed), failed  # the pointer's read
    assert any("WAL" in said for said in failed), failed  # the engine's open of its WAL


def test_a_limit_hit_while_a_run_reads_its_book_never_discards_it(world, monkeypatch):
    """Too many open files while a shard loads is the machine's limit, not damage: the run
    fails, naming the limit, and the book's index is left as it was."""
    import qdrant_edge

    from rag_pipeline.store import StoreResourceError

    before = point_sets(Path(world.env["RAG_QDRANT_PATH"]))
    settings = load_settings(
        data_dir=data(world),
        qdrant_path=world.env["RAG_QDRANT_PATH"],
        embedder="hash",
        cache_dir=world.env["RAG_CACHE_DIR"],
    )
    (book_folder(world, "b1") / "summary.json").unlink()  # the book's shard must be loaded

    def exhausted(path: str) -> None:
        raise RuntimeError(f"Service runtime error: {path}: Too many open files (os error 24)")

    monkeypatch.setattr(qdrant_edge.EdgeShard, "load", staticmethod(exhausted))
    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline.ingest.pipeline import IngestPipeline
    from rag_pipeline_tests.conftest import make_recipe

    recipe = make_recipe(HashEmbedder())
    with pytest.raises(StoreResourceError, match="open-files limit"):
        IngestPipeline.from_settings(settings, recipe).run(["b1"])
    monkeypatch.undo()
    assert point_sets(Path(world.env["RAG_QDRANT_PATH"])) == before

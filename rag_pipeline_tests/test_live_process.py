"""Live mode as a user drives it: a real ``rag-pipeline watch`` process, real files, ``serve``
and the CLI searching; each change a recorded Dagster run whose id its points carry; a
``kill -9`` of the live process mid-change caught up by its next start and by the books
sensor; a burst of edits coalesced into few runs; the index equal to a clean build after
each scenario."""

from __future__ import annotations

import json
import random
import shutil
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from rag_pipeline_tests.conftest import REPO
from rag_pipeline_tests.crashpoint import LIVE_POINTS
from rag_pipeline_tests.differential import clean_point_sets, diverging, point_sets
from rag_pipeline_tests.helpers import Cli, LiveProcess, Server

pytestmark = [pytest.mark.slow, pytest.mark.integration]

BOOK = "ros2-fundamentals"
FILE = "01-chapter-1-ros2-fundamentals/03-nodes-communication.md"


def _books(root: Path) -> Path:
    books = root / "books"
    shutil.copytree(REPO / "data" / "books", books)
    return books


def _word() -> str:
    return "zq" + uuid.uuid4().hex[:10]


def _found(server: Server, word: str, book: str = BOOK, timeout: float = 30) -> dict[str, Any]:
    """The first hit holding ``word`` through ``serve``, polled every 0.1 s."""
    deadline = time.monotonic() + timeout
    while True:
        answer = server.get("/search", q=word, book=book, mode="sparse", limit=3)
        if answer.status_code == 200:
            for hit in answer.json():
                if word in hit["text"]:
                    return dict(hit)
        if time.monotonic() > deadline:
            raise AssertionError(f"{word!r} not found in {book} within {timeout}s")
        time.sleep(0.1)


def _gone(server: Server, word: str, book: str = BOOK, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        answer = server.get("/search", q=word, book=book, mode="sparse", limit=3)
        if answer.status_code == 404 or not any(word in h["text"] for h in answer.json()):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{word!r} still found in {book} after {timeout}s")
        time.sleep(0.1)


def _settled(cli: Cli, timeout: float = 60) -> dict[str, Any]:
    """``plan --json`` once it says every book is unchanged."""
    deadline = time.monotonic() + timeout
    while True:
        plan = json.loads(cli("plan", "--json").stdout)
        busy = {b: p["reasons"] for b, p in plan["books"].items() if p["action"] != "unchanged"}
        if not busy:
            return dict(plan)
        if time.monotonic() > deadline:
            raise AssertionError(f"still to apply after {timeout}s: {busy}")
        time.sleep(0.25)


def _equal_to_a_clean_build(cli: Cli, root: Path) -> None:
    data = Path(cli.env["RAG_DATA_DIR"])
    clean, problem = clean_point_sets(data, root / "clean")
    assert not problem, problem
    assert not diverging(point_sets(Path(cli.env["RAG_QDRANT_PATH"])), clean)


def _run(cli: Cli, run_id: str, record: bool = False) -> Any:
    """The Dagster run ``run_id`` as the instance in the CLI's DAGSTER_HOME records it (its
    run record with ``record``)."""
    import os

    from dagster import DagsterInstance

    before = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = cli.env["DAGSTER_HOME"]
    try:
        with DagsterInstance.get() as instance:
            if record:
                return instance.get_run_record_by_id(run_id)
            return instance.get_run_by_id(run_id)
    finally:
        if before is None:
            os.environ.pop("DAGSTER_HOME", None)
        else:
            os.environ["DAGSTER_HOME"] = before


def test_each_kind_of_change_is_found_through_serve_with_its_live_run(tmp_path):
    from rag_pipeline.defs.live import LIVE_TRIGGER
    from rag_pipeline.defs.runs import TRIGGER_TAG

    data = _books(tmp_path)
    cli = Cli(tmp_path, data)
    live = LiveProcess(cli)
    server = None
    try:
        live.next_event("ready", timeout=180)  # its first look ingested both books
        assert sorted(live.applied_books()) == ["humanoid-robotics-ros2", BOOK]
        server = Server(cli)
        seconds = {}

        word = _word()  # an edit
        saved = time.monotonic()
        with open(data / BOOK / FILE, "a", encoding="utf-8") as fh:
            fh.write(f"\n\nThe {word} marker closes this lesson.\n")
        hit = _found(server, word)
        seconds["edit"] = time.monotonic() - saved
        lineage = server.get("/lineage/" + hit["id"], book=BOOK).json()
        run = _run(cli, lineage["run_id"])
        assert run is not None and run.tags[TRIGGER_TAG] == LIVE_TRIGGER
        assert lineage["source_file"] == FILE

        new = _word()  # a new file
        saved = time.monotonic()
        (data / BOOK / "99-new.md").write_text(f"# New\n\nA {new} paragraph.\n")
        assert _found(server, new)["source_file"] == "99-new.md"
        seconds["add"] = time.monotonic() - saved

        saved = time.monotonic()  # a rename: the same text under its new name
        (data / BOOK / "99-new.md").rename(data / BOOK / "98-renamed.md")
        deadline = time.monotonic() + 30
        while _found(server, new)["source_file"] != "98-renamed.md":
            assert time.monotonic() < deadline, "the rename was not applied"
            time.sleep(0.1)
        seconds["rename"] = time.monotonic() - saved

        saved = time.monotonic()  # a deletion
        (data / BOOK / "98-renamed.md").unlink()
        _gone(server, new)
        seconds["delete"] = time.monotonic() - saved

        book_word = _word()  # a book added, then removed
        saved = time.monotonic()
        (data / "new-book").mkdir()
        (data / "new-book" / "intro.md").write_text(f"# Intro\n\nThe {book_word} book.\n")
        _found(server, book_word, book="new-book")
        seconds["book added"] = time.monotonic() - saved
        saved = time.monotonic()
        shutil.rmtree(data / "new-book")
        _gone(server, book_word, book="new-book")
        seconds["book removed"] = time.monotonic() - saved
        print({k: round(v, 2) for k, v in seconds.items()})
        assert max(seconds.values()) < 20, seconds  # about a second on a quiet machine
    finally:
        if server is not None:
            server.stop()
        assert live.stop() == 0, "".join(live.stderr[-20:])
    assert not live.applied_books("failed")
    _settled(cli)
    _equal_to_a_clean_build(cli, tmp_path)


def _point_runs(cli: Cli) -> dict[str, set[str]]:
    """run id -> the texts of the points that carry it, over the whole store."""
    from rag_pipeline.config import load_settings
    from rag_pipeline.schema import COLLECTION_SCHEMA, RUN_ID, book_filter
    from rag_pipeline.store import open_store

    settings = load_settings(qdrant_path=cli.env["RAG_QDRANT_PATH"])
    runs: dict[str, set[str]] = {}
    with open_store(settings.store(), COLLECTION_SCHEMA) as store:
        for book in store.tenants():
            for record in store.scroll(book_filter(book), fields=[RUN_ID, "text"]):
                run_id = str(record.payload.get(RUN_ID))
                runs.setdefault(run_id, set()).add(str(record.payload.get("text", "")))
    return runs


def _job_runs(cli: Cli) -> dict[str, Any]:
    """run id -> run, for the runs the UI lists under the ingest job (the job's Runs view
    and the Timeline: its name and the code location's repository tag)."""
    import os

    from dagster import DagsterInstance, RunsFilter

    before = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = cli.env["DAGSTER_HOME"]
    try:
        with DagsterInstance.get() as instance:
            listed = RunsFilter(
                job_name="ingest_books", tags={".dagster/repository": "__repository__@rag_pipeline"}
            )
            return {r.run_id: r for r in instance.get_runs(listed)}
    finally:
        if before is None:
            os.environ.pop("DAGSTER_HOME", None)
        else:
            os.environ["DAGSTER_HOME"] = before


@pytest.mark.parametrize("point", LIVE_POINTS)
def test_kill_9_between_a_live_runs_write_and_its_record_leaves_every_point_a_listed_run(
    tmp_path, point
):
    """Live mode writes an edit's points (under its run's id) before the run's events: a
    ``kill -9`` right after the write, while the steps record it, or at the run's success
    event leaves points whose run the UI lists; the next start marks that run failed (under
    ``make ui`` run monitoring does too), applies what was left, and the index equals a clean
    build."""
    from dagster import DagsterRunStatus

    from rag_pipeline_tests.crashpoint import MARKER

    data = _books(tmp_path)
    cli = Cli(tmp_path, data)
    live = LiveProcess(cli, crash_at=point)
    live.next_event("ready", timeout=180)
    with open(data / BOOK / FILE, "a", encoding="utf-8") as fh:
        fh.write(f"\n\nThe {MARKER} paragraph closes this lesson.\n")
    assert live.proc.wait(timeout=120) == -signal.SIGKILL, "".join(live.stderr[-20:])
    live.kill()
    marked = {r for r, texts in _point_runs(cli).items() if any(MARKER in t for t in texts)}
    assert len(marked) == 1, marked  # written, under one run's id, before the run ended
    (killed,) = marked
    assert _job_runs(cli)[killed].status in (
        DagsterRunStatus.NOT_STARTED,  # recorded first: nothing of it executed yet
        DagsterRunStatus.STARTED,
    )

    again = LiveProcess(cli)  # the next start reaps the run and applies the book again
    try:
        again.next_event("ready", timeout=180)
    finally:
        assert again.stop() == 0, "".join(again.stderr[-20:])
    listed = _job_runs(cli)
    for run_id in _point_runs(cli):
        assert run_id in listed, f"points carry run {run_id}, which the job's runs lack"
        assert listed[run_id].is_finished, (run_id, listed[run_id].status)
    assert listed[killed].status == DagsterRunStatus.FAILURE
    _settled(cli)
    _equal_to_a_clean_build(cli, tmp_path)


def _edit_many(data: Path, rng: random.Random, files: list[Path]) -> None:
    for path in files:
        path.write_text(f"# {path.stem}\n\n" + " ".join(_word() for _ in range(rng.randint(5, 80))))


def test_kill_9_mid_change_is_caught_up_by_the_next_start_and_by_the_sensor(tmp_path):
    """The live process is killed while it applies a change: the sensor of the same home,
    ticked then, requests the books it was applying; the next start catches up alone."""
    from dagster import DagsterInstance, SensorResult, build_sensor_context

    from rag_pipeline.config import load_settings
    from rag_pipeline.defs.partitions import BOOKS_PARTITIONS_NAME
    from rag_pipeline.defs.runs import books_of_run
    from rag_pipeline.defs.sensors import build_books_sensor
    from rag_pipeline.ingest.pipeline import IngestPipeline

    data = _books(tmp_path)
    cli = Cli(tmp_path, data)
    rng = random.Random(7)
    live = LiveProcess(cli)
    live.next_event("ready", timeout=180)
    state = Path(cli.env["DAGSTER_HOME"]) / ".rag-live.json"
    _edit_many(data, rng, sorted((data / BOOK).rglob("*.md")))  # every file of the book
    deadline = time.monotonic() + 30
    while json.loads(state.read_text())["books"].get(BOOK) != ["applying", ""]:
        assert time.monotonic() < deadline, "the change was never taken in hand"
        time.sleep(0.005)
    time.sleep(rng.uniform(0.0, 0.2))  # somewhere in its run
    live.kill()
    left = json.loads(state.read_text())
    assert left["books"][BOOK] == ["applying", ""], left  # what a taker-over must run

    import os

    os.environ["DAGSTER_HOME"] = cli.env["DAGSTER_HOME"]
    try:
        settings = load_settings(
            data_dir=str(data), qdrant_path=cli.env["RAG_QDRANT_PATH"], embedder="hash"
        )
        with DagsterInstance.get() as instance:
            sensor = build_books_sensor(interval_s=1, watch=False)
            context = build_sensor_context(
                instance=instance,
                resources={"pipeline": IngestPipeline.from_settings(settings)},
            )
            result = sensor(context)
            order = instance.get_dynamic_partitions(BOOKS_PARTITIONS_NAME)
    finally:
        os.environ.pop("DAGSTER_HOME", None)
    assert isinstance(result, SensorResult)
    requested = [
        b
        for r in result.run_requests
        if r.job_name == "ingest_books"
        for b in ([r.partition_key] if r.partition_key else books_of_run(r.tags, order))
    ]
    assert requested == [BOOK]  # the book in doubt, not the one the live process applied

    again = LiveProcess(cli)  # the next start catches up on its own
    try:
        again.next_event("ready", timeout=180)
        # the book in doubt is run again, unless the killed run had written all of it (the
        # edit is then in the index under that run's id, which the start marks failed); the
        # other book, applied before the kill, is not run
        assert again.applied_books() in ([BOOK], []), again.events
        assert again.applied_books("failed") == []
    finally:
        assert again.stop() == 0
    listed = _job_runs(cli)
    for run_id in _point_runs(cli):
        assert run_id in listed, f"points carry run {run_id}, which the job's runs lack"
        assert listed[run_id].is_finished, (run_id, listed[run_id].status)
    _settled(cli)
    _equal_to_a_clean_build(cli, tmp_path)


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGINT"])
def test_a_stop_signal_during_a_run_stops_after_that_change_and_the_run_succeeds(
    tmp_path, signal_name
):
    """SIGTERM (a service manager, the test harness) or Ctrl-C arriving while a change's
    Dagster run embeds: that run finishes and succeeds, then the process exits 0. (Dagster's
    in-process execution took the signal for the run from the main thread: the run failed as
    interrupted and the process never stopped.)"""
    from dagster import DagsterRunStatus

    from rag_pipeline_tests.signalpoint import MARKER

    data = _books(tmp_path)
    cli = Cli(tmp_path, data)
    live = LiveProcess(cli, signal_in_run=signal_name)
    try:
        live.next_event("ready", timeout=180)
        with open(data / BOOK / FILE, "a", encoding="utf-8") as fh:
            fh.write(f"\n\nThe {MARKER} closes this lesson.\n")
        applied = live.next_event("applied", timeout=60)
        code = live.proc.wait(timeout=30)  # stops after the change in hand, by itself
    finally:
        live.stop()
    assert code == 0, "".join(live.stderr[-30:])
    book = applied["report"]["books"][BOOK]
    assert book["status"] == "ingested", book
    run = _run(cli, book["run_id"])
    assert run is not None and run.status == DagsterRunStatus.SUCCESS
    assert "stopping after the changes in hand" in "".join(live.stderr)
    plan = _settled(cli, timeout=5)  # the edit is in the index
    assert plan["books"][BOOK]["action"] == "unchanged"


def test_a_burst_of_100_edits_across_5_books_is_all_indexed_in_few_runs(tmp_path):
    data = tmp_path / "books"
    rng = random.Random(11)
    paths = [data / f"book-{b}" / f"f{f}.md" for b in range(5) for f in range(4)]
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {path.stem}\n\nfirst words")
    cli = Cli(tmp_path, data)
    live = LiveProcess(cli)
    try:
        live.next_event("ready", timeout=180)
        live.drain()
        before = len(live.applied_books())
        started = time.monotonic()
        for i in range(100):  # 100 edits in 10 s
            path = rng.choice(paths)
            path.write_text(f"# {path.stem}\n\nedit {i}: " + " ".join(_word() for _ in range(20)))
            time.sleep(max(0.0, started + (i + 1) * 0.1 - time.monotonic()))
        _settled(cli)
    finally:
        assert live.stop() == 0
    runs: dict[str, int] = {}
    for book in live.applied_books()[before:]:
        runs[book] = runs.get(book, 0) + 1
    print(f"runs per book during the burst: {runs}")
    assert set(runs) == {f"book-{b}" for b in range(5)}
    assert max(runs.values()) <= 10, runs
    assert not live.applied_books("failed")
    _equal_to_a_clean_build(cli, tmp_path)


def _small_books(root: Path, books: int = 1, files: int = 3) -> Path:
    data = root / "books"
    for b in range(books):
        for f in range(files):
            path = data / f"book-{b}" / f"f{f}.md"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"# Part {b}.{f}\n\nThe opening words of part {b}.{f}.\n")
    return data


def _search_words(cli: Cli, book: str, word: str) -> list[str]:
    hits = json.loads(cli("search", word, "--book", book, "--mode", "sparse", "--json").stdout)
    return [h["text"] for h in hits if word in h["text"]]


def test_an_edit_saved_as_a_live_run_starts_and_reverted_after_it_read_is_applied(tmp_path):
    """Issue 43.1: a file that reads A when live mode looks, is saved as B as the run starts
    and put back to A after the run read it. The run indexed B; live mode must not record A
    as applied (it did: search served B for good, plan said run, and the books sensor
    adopted the belief). Held at the run's phases (rag_pipeline_tests/phasepoint.py)."""
    from rag_pipeline_tests.phasepoint import Phases

    data = _small_books(tmp_path)
    cli = Cli(tmp_path, data)
    phases = Phases(tmp_path / "phases")
    live = LiveProcess(cli, phases=phases.folder)
    path = data / "book-0" / "f1.md"
    a_word, b_word = _word(), _word()
    a_text = f"# Part A\n\nThe {a_word} version.\n"
    try:
        live.next_event("ready", timeout=120)
        phases.arm("scan", "read")
        path.write_text(a_text)  # A: what the look sees
        phases.wait("scan")
        path.write_text(f"# Part B\n\nThe {b_word} version.\n")  # B: saved as the run starts
        phases.go("scan")
        phases.wait("read")  # the run read B
        path.write_text(a_text)  # A again: the look's digests as they were
        phases.go("read")
        live.next_event("applied", timeout=60)
        plan = _settled(cli, timeout=20)  # applied again at once (was: never)
        assert plan["books"]["book-0"]["action"] == "unchanged"
    finally:
        assert live.stop() == 0, "".join(live.stderr[-20:])
    assert _search_words(cli, "book-0", a_word) and not _search_words(cli, "book-0", b_word)
    state = json.loads((Path(cli.env["DAGSTER_HOME"]) / ".rag-live.json").read_text())
    assert state["books"]["book-0"] != ["applying", ""]  # in step when it stopped
    _equal_to_a_clean_build(cli, tmp_path)


def test_a_data_folder_replaced_under_live_mode_is_watched_again(tmp_path):
    """Issue 44.4: RAG_DATA_DIR moved away and a copy put in its place (a deploy's swap, a
    restore): the inotify watch stayed on the old folder and every later edit waited for the
    once-a-minute look. The new folder is watched: an edit is applied within seconds."""
    data = _small_books(tmp_path)
    cli = Cli(tmp_path, data)
    live = LiveProcess(cli)
    try:
        live.next_event("ready", timeout=120)
        data.rename(tmp_path / "books.old")
        shutil.copytree(tmp_path / "books.old", data)
        time.sleep(0.5)  # the swap is done; a person edits in the new folder
        word = _word()
        saved = time.monotonic()
        (data / "book-0" / "f0.md").write_text(f"# Part\n\nThe {word} edit.\n")
        deadline = saved + 15  # about a second; the idle look of a minute is far off
        while not _search_words(cli, "book-0", word):
            assert time.monotonic() < deadline, "the edit in the new folder was not applied"
            time.sleep(0.2)
        print(f"applied {time.monotonic() - saved:.2f}s after the save")
    finally:
        assert live.stop() == 0, "".join(live.stderr[-20:])


def test_a_stop_during_the_first_catch_up_stops_after_the_batch_in_hand(tmp_path):
    """Issue 44.5: SIGTERM while the first look catches up with many books (batches of 2
    here, shared by live mode's two workers) stops after the batches in hand: no run starts
    after the signal, the rest is left to the next start (or the books sensor), which
    applies it."""
    from rag_pipeline_tests.phasepoint import Phases

    data = _small_books(tmp_path, books=8, files=1)
    cli = Cli(tmp_path, data)
    cli.env["RAG_BATCH_BOOKS"] = "2"
    phases = Phases(tmp_path / "phases")
    phases.arm("write")  # the first batch's run holds after its write
    live = LiveProcess(cli, phases=phases.folder)
    try:
        phases.wait("write")
        signalled = time.time()
        live.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)  # the signal is taken in the main thread
        phases.go("write")
        code = live.proc.wait(timeout=30)
    finally:
        live.stop()
    assert code == 0, "".join(live.stderr[-30:])
    reports = [e["report"]["books"] for e in live.events if e["event"] == "applied"]
    ran = sorted(b for r in reports for b, x in r.items() if x["status"] == "ingested")
    left = sorted({f"book-{b}" for b in range(8)} - set(ran))
    assert ran and left and len(ran) % 2 == 0, reports  # whole batches, then it stopped
    run_ids = [x["run_id"] for r in reports for x in r.values() if x["status"] == "ingested"]
    for run_id in run_ids:  # none created after the signal
        assert _run(cli, run_id, record=True).create_timestamp.timestamp() < signalled
    state = json.loads((Path(cli.env["DAGSTER_HOME"]) / ".rag-live.json").read_text())
    assert all(state["books"][b] == ["applying", ""] for b in left)  # the sensor's to run
    again = LiveProcess(cli)
    try:
        again.next_event("ready", timeout=120)
        assert sorted(again.applied_books()) == left
    finally:
        assert again.stop() == 0
    _equal_to_a_clean_build(cli, tmp_path)

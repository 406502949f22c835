"""Live mode applies changes of different books side by side (issue 40.2), through a real
``rag-pipeline watch`` process: a small book's edit saved while a big book's first ingest is
under way is searchable before that ingest ends; two runs of one book never overlap (their
start and end times as the Dagster instance records them)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from rag_pipeline_tests.helpers import Cli, LiveProcess

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _word() -> str:
    return "zq" + uuid.uuid4().hex[:10]


def _write_book(data: Path, book: str, files: int, words: str = "") -> None:
    for f in range(files):
        path = data / book / f"f{f:03d}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# Part {book} {f}\n\nThe opening words of part {f}. {words}\n")


def _search_words(cli: Cli, book: str, word: str) -> list[str]:
    hits = json.loads(cli("search", word, "--book", book, "--mode", "sparse", "--json").stdout)
    return [h["text"] for h in hits if word in h["text"]]


def _book_runs(cli: Cli, book: str) -> list[Any]:
    """The ingest runs of ``book`` (alone or in a batch) the instance records, oldest first."""
    from dagster import DagsterInstance, RunsFilter

    from rag_pipeline.defs.runs import BOOK_TAG

    before = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = cli.env["DAGSTER_HOME"]
    try:
        with DagsterInstance.get() as instance:
            records = instance.get_run_records(RunsFilter(tags={BOOK_TAG: book}))
            return sorted(records, key=_begun)
    finally:
        if before is None:
            os.environ.pop("DAGSTER_HOME", None)
        else:
            os.environ["DAGSTER_HOME"] = before


def test_a_small_books_edit_is_searchable_during_a_big_books_first_ingest(tmp_path):
    """The big book's first ingest is held after it read its files (as a long embedding
    would hold it); the small book's edit saved meanwhile is applied and searchable before
    it ends. The big book, edited again during its run, is applied once more after it: its
    runs never overlap, and its latest content is what is indexed."""
    from rag_pipeline_tests.phasepoint import Phases

    data = tmp_path / "books"
    _write_book(data, "small", 3)
    cli = Cli(tmp_path, data)
    phases = Phases(tmp_path / "phases")
    live = LiveProcess(cli, phases=phases.folder)
    try:
        live.next_event("ready", timeout=120)
        phases.arm("read")
        _write_book(data, "big", 60)  # its first ingest: held after it read its files
        phases.wait("read")
        big_edit, small_edit = _word(), _word()
        (data / "big" / "f000.md").write_text(f"# Part big 0\n\nThe {big_edit} edit.\n")
        saved = time.monotonic()
        (data / "small" / "f001.md").write_text(f"# Part small 1\n\nThe {small_edit} edit.\n")
        report = live.next_event("applied", timeout=30)["report"]["books"]
        assert report["small"]["status"] == "ingested", report
        applied_after = time.monotonic() - saved
        assert _search_words(cli, "small", small_edit)  # searchable, the big one still held
        assert not live.applied_books() or "big" not in live.applied_books()
        phases.go("read")
        deadline = time.monotonic() + 60
        while not _search_words(cli, "big", big_edit):  # its edit, applied after its run
            assert time.monotonic() < deadline, "".join(live.stderr[-20:])
            time.sleep(0.5)
    finally:
        assert live.stop() == 0, "".join(live.stderr[-30:])
    print(f"the small book's edit applied {applied_after:.2f}s after its save")
    assert live.applied_books().count("big") == 2  # the first ingest, then its edit
    big, small = _book_runs(cli, "big"), _book_runs(cli, "small")
    assert len(big) == 2 and all(r.end_time for r in big), big
    # a live run's work starts when it is recorded (its points are written before its steps
    # execute): the runs of one book, one after the other
    assert big[0].end_time <= _begun(big[1])
    during = small[-1]
    assert _begun(big[0]) < _begun(during) and during.end_time < big[0].end_time


def _begun(record: Any) -> float:
    """When a live run's work began: its creation (its stages run before it starts)."""
    return float(record.create_timestamp.timestamp())


def test_ingest_hands_its_change_to_the_live_process_and_runs_it_itself_without_one(tmp_path):
    """Issue 41.2: where live mode runs, ``rag-pipeline ingest`` asks it to apply the books
    and prints its report (the same ``--json``, with ``applied_by``): the run is live mode's.
    Once the live process is gone (stopped, or killed: its socket left behind), the CLI runs
    the change itself."""
    import signal

    from rag_pipeline.defs.live import LIVE_TRIGGER
    from rag_pipeline.defs.runs import TRIGGER_TAG

    data = tmp_path / "books"
    _write_book(data, "alpha", 3)
    _write_book(data, "beta", 2)
    cli = Cli(tmp_path, data)
    live = LiveProcess(cli)
    try:
        live.next_event("ready", timeout=120)
        word = _word()
        (data / "alpha" / "f001.md").write_text(f"# Part alpha 1\n\nThe {word} edit.\n")
        done = json.loads(cli("ingest", "--json").stdout)
        assert done["applied_by"] == f"live mode (pid {live.proc.pid})", done
        assert list(done["phases"]) == ["imports", "live", "report"]  # no plan of its own
        assert set(done["books"]) == {"alpha", "beta"}  # every book, as an ingest reports
        alpha = done["books"]["alpha"]
        # live mode may have seen the edit first (its own look, within a second): then the
        # run the CLI asked for finds it applied
        assert alpha["status"] in ("ingested", "unchanged"), alpha
        assert done["books"]["beta"]["status"] == "unchanged"
        assert _search_words(cli, "alpha", word)  # in the index when the CLI returns
        runs = {r.dagster_run.run_id: r for r in _book_runs(cli, "alpha")}
        assert all(r.dagster_run.tags[TRIGGER_TAG] == LIVE_TRIGGER for r in list(runs.values())[1:])
        named = json.loads(cli("ingest", "--book", "beta", "--json").stdout)
        assert list(named["books"]) == ["beta"] and "applied_by" in named
        assert named["books"]["beta"]["status"] == "unchanged"
        text = cli("ingest", "--book", "beta")
        assert "applied by live mode" in text.stderr and "beta" in text.stdout
        imports = subprocess.run(  # a fresh process: what it imports to hand its books over
            [sys.executable, "-X", "importtime", "-m", "rag_pipeline.cli", "ingest", "--json"],
            env=cli.env,
            cwd=cli.cwd,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert "applied_by" in json.loads(imports.stdout)
        assert not re.search(r"\|\s+dagster(\.|\s*$)", imports.stderr, re.MULTILINE)
    finally:
        assert live.stop() == 0, "".join(live.stderr[-30:])
    word = _word()
    (data / "beta" / "f000.md").write_text(f"# Part beta 0\n\nThe {word} edit.\n")
    alone = json.loads(cli("ingest", "--json").stdout)
    assert "applied_by" not in alone and alone["books"]["beta"]["status"] == "ingested"
    killed = LiveProcess(cli)
    try:
        killed.next_event("ready", timeout=120)
        os.killpg(killed.proc.pid, signal.SIGKILL)
        killed.proc.wait(10)
    finally:
        killed.stop()
    word = _word()
    (data / "alpha" / "f000.md").write_text(f"# Part alpha 0\n\nThe {word} edit.\n")
    alone = json.loads(cli("ingest", "--json").stdout)
    assert "applied_by" not in alone and alone["books"]["alpha"]["status"] == "ingested"
    assert _search_words(cli, "alpha", word)


def test_under_make_ui_a_small_books_edit_is_applied_while_a_big_book_ingests(tmp_path):
    """The same through ``make ui`` (``dg dev`` and live mode beside it, as a person starts
    it): with a big book's first ingest in flight (``.rag-live.json`` says it is applying),
    a small book's edit is applied (its run writes its points before its events: searchable
    then) while the big book is still applying; the big ingest ends after that."""
    from rag_pipeline_tests.test_make_ui import STOP_S, MakeUi

    data = tmp_path / "books"
    _write_book(data, "small", 2)
    ui = MakeUi(tmp_path / "ui", data)
    cli = Cli(tmp_path / "ui", data)  # its store and home
    state = ui.home / ".rag-live.json"
    try:
        ui.start()
        ui.wait_up()
        filler = " ".join(f"word{i}" for i in range(300))
        _write_book(data, "big", 3000, filler)  # a first ingest of about 20 s
        deadline = time.monotonic() + 60
        while json.loads(state.read_text())["books"].get("big") != ["applying", ""]:
            assert time.monotonic() < deadline, ui.log()
            time.sleep(0.1)
        word = _word()
        (data / "small" / "f001.md").write_text(f"# Part small 1\n\nThe {word} edit.\n")
        while ui.log().count("small ingested") < 2:  # its run wrote its points
            assert time.monotonic() < deadline, ui.log()
            time.sleep(0.1)
        big_then = json.loads(state.read_text())["books"]["big"]
        assert big_then == ["applying", ""], "the big ingest ended first: make it bigger"
        assert _search_words(cli, "small", word)
        while "big ingested" not in ui.log():  # it goes on, and ends
            assert time.monotonic() < deadline + 120, ui.log()
            time.sleep(0.5)
        os.killpg(ui.proc.pid, 15)  # type: ignore[union-attr]
        ui.wait_gone(STOP_S)
    finally:
        ui.kill()
    log = ui.log()
    assert log.rindex("small ingested") < log.index("big ingested"), log  # the edit first

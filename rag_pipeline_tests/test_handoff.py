"""``rag-pipeline ingest`` handing its books to a running live process
(rag_pipeline/ingest/handoff.py, LiveLoop.request): the socket's protocol, the settings key,
the answers that make the CLI run the change itself, and the loop's side of a request."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rag_pipeline.config import Settings
from rag_pipeline.ingest.handoff import HANDOFF_SOCKET, HandOffServer, ask_live, settings_key
from rag_pipeline.ingest.live import LiveLoop, LiveTiming
from rag_pipeline.ingest.report import BookResult, IngestReport
from rag_pipeline.sources import watch
from rag_pipeline.sources.folder import FolderSource
from rag_pipeline.sources.scan import clear_scan_cache
from rag_pipeline_tests.test_live import HoldingApplier, _until, running


def _report(books: list[str] | None) -> IngestReport:
    names = books or ["alpha", "beta"]
    return IngestReport(
        {b: BookResult(b, "ingested", files=2, embedded=3, run_id="r-" + b) for b in names},
        ["bad folder"],
        ["a note"],
        1.25,
    )


def _serve(home: Path, key: str, apply: Callable[..., IngestReport | None]) -> HandOffServer:
    server = HandOffServer(home, key, apply)
    server.start()
    return server


def test_the_report_comes_back_as_the_live_process_made_it(tmp_path):
    asked: list[list[str] | None] = []

    def apply(books, beat):
        asked.append(books)
        return _report(books)

    server = _serve(tmp_path, "k", apply)
    try:
        handed = ask_live(tmp_path, ["alpha"], "k")
        assert handed is not None and handed.applied_by == f"live mode (pid {os.getpid()})"
        assert handed.report.as_dict() == _report(["alpha"]).as_dict()
        every = ask_live(tmp_path, None, "k")
        assert every is not None and sorted(every.report.books) == ["alpha", "beta"]
        assert asked == [["alpha"], None]
        assert ask_live(tmp_path, ["alpha"], "other settings") is None  # refused
        assert asked == [["alpha"], None]
    finally:
        server.close()
    assert not (tmp_path / HANDOFF_SOCKET).exists()
    assert ask_live(tmp_path, ["alpha"], "k") is None  # no live process


def test_a_stopping_silent_or_dead_live_process_leaves_the_change_to_the_cli(tmp_path):
    server = _serve(tmp_path, "k", lambda books, beat: None)  # stopping: not applied
    try:
        assert ask_live(tmp_path, ["alpha"], "k") is None
    finally:
        server.close()

    waits: list[list[str]] = []

    def slow(books, beat):
        beat(["alpha"])
        time.sleep(1.0)
        return _report(books)

    server = _serve(tmp_path, "k", slow)
    try:  # heartbeats heard; a process silent past silent_s is given up
        assert ask_live(tmp_path, ["alpha"], "k", on_wait=waits.append) is not None
        assert waits == [["alpha"]]
        started = time.monotonic()
        assert ask_live(tmp_path, ["alpha"], "k", silent_s=0.3) is None
        assert time.monotonic() - started < 1.0
    finally:
        server.close()

    # killed: its socket file is left, nobody listens
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(tmp_path / HANDOFF_SOCKET))
    stale.close()
    started = time.monotonic()
    assert ask_live(tmp_path, ["alpha"], "k") is None
    assert time.monotonic() - started < 0.5
    server = _serve(tmp_path, "k", lambda books, beat: _report(books))  # replaces it
    try:
        assert ask_live(tmp_path, ["alpha"], "k") is not None
    finally:
        server.close()


def test_a_dagster_home_whose_socket_path_is_too_long_for_sun_path(tmp_path):
    home = tmp_path / ("h" * 60) / ("o" * 60)
    home.mkdir(parents=True)
    assert len(str(home / HANDOFF_SOCKET)) > 108
    server = _serve(home, "k", lambda books, beat: _report(books))
    try:
        handed = ask_live(home, ["alpha"], "k")
        assert handed is not None and list(handed.report.books) == ["alpha"]
    finally:
        server.close()


def test_the_settings_key_says_which_books_and_index(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    base = Settings(data_dir="books", qdrant_path=str(tmp_path / "q"))
    same = Settings(data_dir=str(tmp_path / "books"), qdrant_path=str(tmp_path / "q"))
    assert settings_key(base) == settings_key(same)  # a relative path, resolved
    tuned = base.model_copy(update={"live_workers": 4, "busy_wait_s": 1.0})
    assert settings_key(tuned) == settings_key(base)  # not what an ingest writes
    for change in ({"data_dir": "other"}, {"collection": "c2"}, {"chunk_target_tokens": 100}):
        assert settings_key(base.model_copy(update=change)) != settings_key(base), change


@pytest.fixture
def two_books(data_dir, write_book):
    clear_scan_cache()
    write_book("alpha", {"a.md": "# A\n\none"})
    write_book("beta", {"b.md": "# B\n\none"})
    yield data_dir
    stale = watch._watchers.pop(os.path.abspath(data_dir), None)
    if stale is not None:
        stale.stop()


def test_a_request_is_answered_by_a_call_that_applies_what_the_files_hold(two_books):
    """A book whose call in flight applies the content the files hold when the request
    comes answers it with that call; one changed since that call's look is applied once more
    after it (that call read the files before the change the CLI is about); a request for
    every book takes every book, changed or not; stopping refuses the requests left."""
    applier = HoldingApplier(hold=set())
    live = LiveLoop(FolderSource(two_books), applier, timing=LiveTiming(debounce_s=0.05))
    with running(live, two_books):
        for edited_again, calls in ((False, 1), (True, 2)):
            first = len(applier.calls)
            applier.hold = {"alpha"}
            applier.held.clear()
            applier.release.clear()
            (two_books / "alpha" / "a.md").write_text(f"# A\n\nedit {edited_again}")
            assert applier.held.wait(5)
            if edited_again:
                (two_books / "alpha" / "a.md").write_text("# A\n\nedited again")
            ticket = live.request(["alpha"])
            time.sleep(0.3)
            assert not ticket.done.is_set() and ticket.waiting == ["alpha"]
            applier.hold = set()
            applier.release.set()
            assert ticket.done.wait(5) and not ticket.refused
            assert applier.calls[first:] == [["alpha"]] * calls
            assert ticket.resolved == ["alpha"] and len(ticket.outcomes) == 1
        every = live.request(None)
        assert every.done.wait(5)
        assert every.resolved == ["alpha", "beta"]
        assert sorted(b for o in every.outcomes for b in o) == ["alpha", "beta"]
        import shutil

        shutil.rmtree(two_books / "beta")  # gone: every book's request waits for its purge
        gone = live.request(None)
        assert gone.done.wait(5) and gone.resolved == ["alpha", "beta"]
        assert "beta" not in live.known
    (two_books / "beta").mkdir()
    (two_books / "beta" / "b.md").write_text("# B\n\nback")

    # stopping: the call in hand ends; a request still queued is refused (the CLI runs it)
    applier = HoldingApplier(hold={"beta"})
    live = LiveLoop(FolderSource(two_books), applier, timing=LiveTiming(debounce_s=0.05))
    stop = threading.Event()
    thread = threading.Thread(target=live.run, args=(stop,), daemon=True)
    thread.start()
    try:
        assert applier.held.wait(5)  # the first look's beta
        riding = live.request(["beta"])  # to be answered by the call in flight, but:
        _until(lambda: bool(riding.resolved))  # taken by a look
        (two_books / "beta" / "b.md").write_text("# B\n\nedited")
        late = live.request(["beta"])  # changed since: queued after it (and the call in
        # flight, written during, is in doubt: it answers neither)
        time.sleep(0.3)
        stop.set()
    finally:
        applier.release.set()
        thread.join(5)
    assert not thread.is_alive()
    assert riding.done.is_set() and riding.refused
    assert late.done.is_set() and late.refused
    refused = live.request(["alpha"])  # after the loop ended
    assert refused.done.is_set() and refused.refused

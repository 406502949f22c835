"""Hostile probes of live mode's loop (rag_pipeline/ingest/live.py), without Dagster."""

from __future__ import annotations

import shutil
import threading

import pytest

from rag_pipeline.ingest.live import LiveLoop
from rag_pipeline.ingest.report import IngestReport
from rag_pipeline.sources.scan import clear_scan_cache
from rag_pipeline_tests.test_live import Applier, NoWatchSource, _until


def test_an_emptied_data_folder_purges_no_book(data_dir, write_book, tmp_path):
    """The data folder unmounted or emptied under a running live process (every book folder
    gone at once) purges nothing, as ``ingest`` and the books sensor refuse to (README:
    "never every book at once"); one book removed is still purged."""
    clear_scan_cache()
    write_book("alpha", {"a.md": "# A\n\none"})
    write_book("beta", {"b.md": "# B\n\ntwo"})
    applier = Applier()
    notes: list[str] = []
    live = LiveLoop(NoWatchSource(data_dir), applier, notify=notes.append)
    live.look()
    assert applier.calls == [["alpha", "beta"]]
    aside = tmp_path / "aside"
    aside.mkdir()
    for book in ("alpha", "beta"):
        shutil.move(data_dir / book, aside / book)
    live.look()
    assert applier.calls == [["alpha", "beta"]], "every book purged at once"
    asked = live.request(None)  # a handed ingest: refused, the CLI says why itself
    live.look()
    assert asked.done.is_set() and "refusing to purge all 2" in asked.refused
    assert applier.calls == [["alpha", "beta"]]
    assert len(notes) == 1 and "refusing to purge all 2" in notes[0]  # said once
    shutil.move(aside / "alpha", data_dir / "alpha")  # back: one removed is purged
    live.look()
    assert applier.calls[1:] == [["beta"]]


def test_a_request_for_every_book_of_a_folder_without_books_says_the_folders_refused(
    data_dir, write_book
):
    """What an ingest of no book reports: the folders refused as books (a handed ingest
    printed none)."""
    from rag_pipeline.defs.live import handed_report

    clear_scan_cache()
    write_book("bad name", {"a.md": "# A\n\none"})
    live = LiveLoop(NoWatchSource(data_dir), Applier())
    asked: list[IngestReport | None] = []
    thread = threading.Thread(target=lambda: asked.append(handed_report(live, None, print)))
    thread.start()
    _until(lambda: bool(live._requests))
    live.look()
    thread.join(5)
    (report,) = asked
    assert report is not None and report.books == {}
    assert len(report.rejected) == 1 and "bad name" in report.rejected[0]


@pytest.mark.parametrize("value", ["0", "-1", "x", "99999999", "1.5", ""])
def test_a_bad_worker_count_is_a_setting_error_naming_it(value, monkeypatch, tmp_path):
    """``watch`` exits 2 naming RAG_LIVE_WORKERS before it loads anything."""
    from click.testing import CliRunner

    from rag_pipeline.cli import main

    monkeypatch.setenv("RAG_LIVE_WORKERS", value)
    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    result = CliRunner().invoke(main, ["watch"])
    assert result.exit_code == 2, result.output
    assert "RAG_LIVE_WORKERS" in result.output and "Traceback" not in result.output

"""Hostile probes of live mode's loop (rag_pipeline/ingest/live.py), without Dagster."""

from __future__ import annotations

import contextlib
import random
import shutil
import threading
import time
from collections.abc import Mapping

import pytest

from rag_pipeline.ingest.live import LiveLoop, LiveTicket, LiveTiming
from rag_pipeline.ingest.report import IngestReport
from rag_pipeline.sources.folder import FolderSource
from rag_pipeline.sources.scan import clear_scan_cache
from rag_pipeline_tests.conftest import settle_files
from rag_pipeline_tests.test_live import Applier, HoldingApplier, NoWatchSource, _until, running


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


class RandomApplier(HoldingApplier):
    """Calls that take a random moment and fail now and then, recording what each read."""

    def __init__(self, seed: int) -> None:
        super().__init__(hold=set())
        self.random = random.Random(seed)
        self.last_read: dict[str, str | None] = {}

    def __call__(self, books: list[str]) -> Mapping[str, bool]:
        assert self.data_dir is not None
        failing = {b for b in books if self.random.random() < 0.15}
        time.sleep(self.random.uniform(0, 0.03))
        for book in books:  # what the run read, as a run reads it: after its look
            folder = self.data_dir / book
            try:
                read = (folder / "a.md").read_text() if folder.exists() else None
            except FileNotFoundError:
                read = None
            if book not in failing:
                self.last_read[book] = read
        time.sleep(self.random.uniform(0, 0.03))
        super().__call__(books)  # the overlap check (its answer reads a shared fail set)
        return {b: b not in failing for b in books}


def test_under_random_edits_requests_and_failures_a_books_calls_never_overlap(data_dir):
    """Edits, removals, re-creations and requests of five books from three threads while
    three workers apply them, a sixth of the calls failing: no book is ever in two calls at
    once (HoldingApplier asserts it), every request is answered, and once the writers stop
    every book's last applied read is what its folder holds."""
    books = [f"b{i}" for i in range(5)]
    for book in books:
        (data_dir / book).mkdir()
        (data_dir / book / "a.md").write_text(f"# {book}\n\nstart")
    clear_scan_cache()
    applier = RandomApplier(seed=7)
    applier.data_dir = data_dir
    live = LiveLoop(
        FolderSource(data_dir),
        applier,
        timing=LiveTiming(debounce_s=0.02, retry_after_s=0.05, retry_max_s=0.1),
        workers=3,
    )
    tickets: list[LiveTicket] = []
    with running(live, data_dir):

        def writer(seed: int) -> None:
            rng = random.Random(seed)
            for step in range(40):
                book = rng.choice(books)
                folder = data_dir / book
                what = rng.random()
                if what < 0.1 and folder.exists():
                    shutil.rmtree(folder, ignore_errors=True)
                elif what < 0.2:
                    tickets.append(live.request(rng.choice([None, [book]])))
                else:
                    with contextlib.suppress(FileNotFoundError):  # another writer's rmtree
                        folder.mkdir(exist_ok=True)
                        (folder / "a.md").write_text(f"# {book}\n\n{seed} {step}")
                time.sleep(rng.uniform(0, 0.02))

        writers = [threading.Thread(target=writer, args=(n,)) for n in range(3)]
        for thread in writers:
            thread.start()
        for thread in writers:
            thread.join(30)
        for book in books:  # none gone at the end: a purge of every book is refused
            (data_dir / book).mkdir(exist_ok=True)
            (data_dir / book / "a.md").write_text(f"# {book}\n\nfinal")
        settle_files()
        final = live.request(None)
        assert final.done.wait(20) and not final.refused, final.refused
        assert all(t.done.wait(20) for t in tickets)
        # a call that failed is tried again after its back-off
        _until(lambda: not live.in_hand and not live._failed, timeout=20)
    for book in books:
        assert applier.last_read[book] == f"# {book}\n\nfinal", book


def test_the_index_decides_what_a_start_purges_and_ends_a_halt(data_dir, write_book, tmp_path):
    """The loop asks the index (``indexed``): a book indexed and removed while no live
    process ran is purged by the first look (a store that cannot be read then is asked again
    at the next look, and nothing is applied before: a wrong data folder applied first would
    make the indexed books look removed once the index is read); after a halt (every applied
    book gone at once), books an operator purged with ``ingest --book`` are forgotten, and a
    new book is applied, not refused for books no index holds any more."""
    clear_scan_cache()
    write_book("alpha", {"a.md": "# A\n\none"})
    held = {"alpha", "gone"}
    readable = [False]
    notes: list[str] = []

    def indexed() -> set[str]:
        if not readable[0]:
            raise RuntimeError("store busy")
        return set(held)

    applier = Applier()
    live = LiveLoop(NoWatchSource(data_dir), applier, notify=notes.append, indexed=indexed)
    live.look()  # nothing applied before the index is known (the halt compares with it)
    assert applier.calls == [] and notes == [
        "the indexed books could not be read: RuntimeError: store busy"
    ]
    readable[0] = True
    live.look()
    # applied, and purged, once the index could be read
    assert sorted(b for call in applier.calls for b in call) == ["alpha", "gone"]
    applier.calls.clear()
    held.discard("gone")

    (data_dir / "alpha").rename(tmp_path / "alpha")  # every applied book gone: halt
    live.look()
    assert applier.calls == []
    held.clear()  # the operator's `ingest --book alpha` purged it (live refused)
    write_book("beta", {"b.md": "# B\n\none"})
    live.look()
    assert applier.calls == [["beta"]], notes


def test_a_wrong_data_folder_met_while_the_index_is_unreadable_purges_nothing(data_dir, write_book):
    """A live process started on the wrong data folder (books x, y) while the index (books a,
    b) could not be read: nothing is applied until the index is known, and then the folder
    holding none of the indexed books halts the loop; a and b are never purged (applying x
    and y first made a and b look removed once the index was read)."""
    clear_scan_cache()
    write_book("x", {"a.md": "# X\n\none"})
    write_book("y", {"a.md": "# Y\n\none"})
    readable = [False]
    notes: list[str] = []

    def indexed() -> set[str]:
        if not readable[0]:
            raise RuntimeError("store busy")
        return {"a", "b"}

    applier = Applier()
    live = LiveLoop(NoWatchSource(data_dir), applier, notify=notes.append, indexed=indexed)
    live.look()
    readable[0] = True
    live.look()
    live.look()
    assert applier.calls == [], (applier.calls, notes)
    assert any("none of" in n or "halt" in n.lower() for n in notes[1:]), notes

"""Hostile probes of what a user starts first and of what a hang, a ``kill -9`` or a race
leaves behind: the hand-off of ``rag-pipeline ingest`` to a live process that hangs, live
mode halted on a data folder without its books, and what ``watch``'s ready line counts."""

from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rag_pipeline.defs.partition_marker import write_partitions_marker
from rag_pipeline.ingest import handoff
from rag_pipeline.ingest.handoff import HANDOFF_SOCKET, ask_live
from rag_pipeline.ingest.live import LiveLoop, LiveTiming
from rag_pipeline.sources.scan import clear_scan_cache
from rag_pipeline.sources.watch import RESCAN_EVERY_S
from rag_pipeline_tests.conftest import REPO
from rag_pipeline_tests.helpers import InProcessCli, cli_env, index_books
from rag_pipeline_tests.test_live import Applier, HoldingApplier, NoWatchSource, running

ACCEPTED = b'{"accepted": true, "by": "live mode (pid 4242)"}\n'


def _beating(home: Path, cpu_step: float, report_after: int | None = None) -> threading.Event:
    """A live process at ``home`` that accepts a request, then sends a heartbeat every
    20 ms naming the same book, its CPU time growing by ``cpu_step`` a beat, and after
    ``report_after`` beats a report (None: never). Set the event returned to stop it."""
    stop = threading.Event()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(home / HANDOFF_SOCKET))
    sock.listen(1)

    def serve() -> None:
        conn, _ = sock.accept()
        conn.recv(65536)
        conn.sendall(ACCEPTED)
        beats = 0
        try:
            while not stop.is_set():
                if report_after is not None and beats >= report_after:
                    report = {"books": {}, "rejected_folders": [], "warnings": []}
                    line = {"report": report, "applied_by": "live mode (pid 4242)"}
                    conn.sendall(json.dumps(line).encode() + b"\n")
                    break
                beat = {"waiting": ["alpha"], "cpu_s": 1.0 + beats * cpu_step}
                conn.sendall(json.dumps(beat).encode() + b"\n")
                beats += 1
                time.sleep(0.02)
        except OSError:
            pass  # the CLI gave up and closed
        finally:
            conn.close()
            sock.close()

    threading.Thread(target=serve, daemon=True).start()
    return stop


# Fault (a) of this session: a live process hung in a run while its hand-off thread went on
# sending heartbeats kept a handed `rag-pipeline ingest` waiting forever (the heartbeats said
# nothing of progress). Now they carry the process's CPU time: no progress for STALLED_S
# and the CLI says so, naming the process, and runs the change itself.
def test_heartbeats_without_progress_end_the_wait_naming_the_live_process(tmp_path):
    stop = _beating(tmp_path, cpu_step=0.0)
    notes: list[str] = []
    started = time.monotonic()
    try:
        handed = ask_live(tmp_path, ["alpha"], "k", stalled_s=0.5, notify=notes.append)
    finally:
        stop.set()
    assert handed is None
    assert time.monotonic() - started < 5
    assert len(notes) == 1 and "live mode (pid 4242)" in notes[0], notes
    assert "alpha" in notes[0] and "running the change here" in notes[0]


def test_heartbeats_of_a_process_at_work_keep_the_wait(tmp_path):
    """A run that embeds uses CPU: its heartbeats are progress, whatever the books waited for
    (the same one for 1.2 s here, past ``stalled_s``), and its report is taken."""
    stop = _beating(tmp_path, cpu_step=0.5, report_after=60)
    notes: list[str] = []
    try:
        handed = ask_live(tmp_path, ["alpha"], "k", stalled_s=0.5, notify=notes.append)
    finally:
        stop.set()
    assert handed is not None and handed.applied_by == "live mode (pid 4242)"
    assert notes == []


def test_a_handed_ingest_whose_live_process_hangs_runs_itself_and_says_why(
    tmp_path, data_dir, write_book, monkeypatch
):
    """The whole command: ``ingest --json`` ends, its report is its own (the book indexed
    already: unchanged, no Dagster loaded), and its warnings say which live process hung."""
    write_book("alpha", {"a.md": "# A\n\none two three"})
    cli = InProcessCli(tmp_path, data_dir)
    index_books(data_dir, cli.env["RAG_QDRANT_PATH"])
    home = Path(cli.env["DAGSTER_HOME"])
    home.mkdir()
    write_partitions_marker(home, ["alpha"])
    monkeypatch.setattr(handoff, "STALLED_S", 0.5)
    stop = _beating(home, cpu_step=0.0)
    try:
        done = cli("ingest", "--json")
    finally:
        stop.set()
    report = json.loads(done.stdout)
    assert "applied_by" not in report
    assert report["books"]["alpha"]["status"] == "unchanged"
    assert any("live mode (pid 4242)" in w and "hung" in w for w in report["warnings"]), report
    assert "live mode (pid 4242)" in done.stderr


@pytest.mark.parametrize("beat", [{"waiting": ["alpha"]}, {"waiting": ["alpha"], "cpu_s": "x"}])
def test_heartbeats_of_an_older_live_process_without_cpu_time_still_end(tmp_path, beat):
    """A live process that reports no CPU time (another version) is judged by the books it
    waits for alone."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(tmp_path / HANDOFF_SOCKET))
    sock.listen(1)
    stop = threading.Event()

    def serve() -> None:
        conn, _ = sock.accept()
        conn.recv(65536)
        conn.sendall(b'{"accepted": true}\n')
        try:
            while not stop.is_set():
                conn.sendall(json.dumps(beat).encode() + b"\n")
                time.sleep(0.02)
        except OSError:
            pass
        finally:
            conn.close()
            sock.close()

    threading.Thread(target=serve, daemon=True).start()
    notes: list[str] = []
    try:
        assert ask_live(tmp_path, None, "k", stalled_s=0.3, notify=notes.append) is None
    finally:
        stop.set()
    assert len(notes) == 1 and "the live process" in notes[0]


# Fault (b): a live process halted (its data folder holds none of the indexed books) opened
# the store at every idle look (every 5 s) to list the indexed books. Now a halting look
# reuses what the first one read, until the folder's books change or a minute passed.
def test_a_halted_loop_does_not_open_the_store_at_every_look(data_dir, write_book, tmp_path):
    clear_scan_cache()
    write_book("stray", {"a.md": "# S\n\none"})
    reads: list[float] = []

    def indexed() -> set[str]:
        reads.append(time.monotonic())
        return {"alpha", "beta"}

    applier = Applier()
    notes: list[str] = []
    live = LiveLoop(NoWatchSource(data_dir), applier, notify=notes.append, indexed=indexed)
    now = 1000.0
    for step in range(5):  # idle looks, 5 s apart
        live.look(now=now + 5 * step)
    assert applier.calls == [] and len(notes) == 1, notes  # halted, said once
    assert len(reads) == 1, f"the store opened at {len(reads)} of 5 idle looks"
    write_book("other", {"a.md": "# O\n\none"})  # the folder's books changed: asked again
    live.look(now=now + 30)
    live.look(now=now + 35)
    assert len(reads) == 2
    live.look(now=now + 30 + RESCAN_EVERY_S)  # and once a minute
    assert len(reads) == 3
    assert applier.calls == []


def test_a_halt_ended_by_an_operators_purge_is_met_within_a_minute(data_dir, write_book):
    """The purge of the books gone (``ingest --book``, refused by live mode and run by the
    CLI) changes the index, not the folder: the halted loop meets it at its next reading
    and applies the folder's books."""
    clear_scan_cache()
    write_book("stray", {"a.md": "# S\n\none"})
    held = {"alpha"}
    applier = Applier()
    live = LiveLoop(NoWatchSource(data_dir), applier, indexed=lambda: set(held))
    live.look(now=1000.0)
    held.clear()
    live.look(now=1005.0)
    assert applier.calls == []
    live.look(now=1000.0 + RESCAN_EVERY_S + 1)
    assert applier.calls == [["stray"]]


# Fault (c): `watch --json`'s ready line counted the books the index holds (seeded into the
# loop) as "books in step", also those whose folder is gone and that a halt keeps; README:
# books = the data folder's books in step with the index.
def test_the_ready_line_counts_the_folders_books_in_step(data_dir, write_book, tmp_path):
    from rag_pipeline.cli.live import ready_event

    clear_scan_cache()
    held = {"alpha", "beta", "gamma"}
    applier = Applier()
    live = LiveLoop(NoWatchSource(data_dir), applier, indexed=lambda: set(held))
    live.look()  # the data folder is empty: a halt, nothing in step
    assert ready_event(live, data_dir) == {"event": "ready", "books": 0, "data_dir": str(data_dir)}
    write_book("alpha", {"a.md": "# A\n\none"})
    write_book("beta", {"a.md": "# B\n\none"})
    write_book("delta", {"a.md": "# D\n\none"})
    applier.fail = {"delta"}
    live.look()  # gamma purged, alpha and beta applied, delta failed
    assert ready_event(live, data_dir)["books"] == 2


def _make_env(**extra: str) -> dict[str, str]:
    """The environment of a make the suite starts (without a `make test` around it)."""
    env = {**os.environ, **extra}
    for name in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL"):
        env.pop(name, None)
    return env


# Fault: two makes at once from a fresh clone (`make run` in two terminals, `make run` beside
# `make ui`) ran pip into one venv at the same moment; one failed with pip's traceback
# (TypeError in req_uninstall, measured). Now the install holds an flock and the make that
# waited finds the venv installed.
@pytest.mark.integration
@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_an_install_waits_for_the_one_in_progress_and_then_installs_nothing(tmp_path):
    venv = tmp_path / "venv"
    venv.mkdir()
    held = os.open(venv / ".install.lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(held, fcntl.LOCK_EX)  # another make's install in progress
    proc = subprocess.Popen(
        ["make", "--no-print-directory", "install", f"VENV={venv}"],
        cwd=REPO,
        env=_make_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        first = proc.stdout.readline() if ready else ""
        assert "waiting for the install that another make runs" in first, first
        (venv / ".installed").touch()  # the other install ends
        os.close(held)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out
    assert "installing" not in out and not (venv / "bin").exists(), out


# Fault: `make run` on a data folder without books went on after `books --first` failed and
# searched book '' ("--book is required"): the message that named the empty folder was
# followed by one about an option the user never gave. Now it stops there (exit 2), and the
# message says what a book folder is.
@pytest.mark.integration
@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_run_on_an_empty_data_folder_stops_naming_it(tmp_path, data_dir):
    home = tmp_path / "home"
    env = _make_env(**{**cli_env(tmp_path, data_dir), "DAGSTER_HOME": str(home)})
    home.mkdir()
    write_partitions_marker(home, [])  # no book, no partition: the ingest loads no Dagster
    done = subprocess.run(
        ["make", "--no-print-directory", "run", f"DAGSTER_HOME={home}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    assert f"no book folders under {data_dir} (RAG_DATA_DIR)" in done.stderr, done.stderr
    assert f"{data_dir}/<book_id>/*.md" in done.stderr
    assert "Sample search" not in done.stdout and "--book is required" not in done.stderr


# Fault: `watch` with RAG_QDRANT_PATH at a file (a setting to fix: `ingest` exits 2 naming
# it) said "ready: 0 books in step" and ran on forever applying nothing: the loop took the
# store's refusal for a store busy at the start, asked again at every look. Now a store
# path that cannot hold the store ends the loop with that error (exit 2 from the CLI).
def test_a_store_path_that_cannot_hold_the_store_stops_live_mode(data_dir, write_book, tmp_path):
    from rag_pipeline.defs.live import _indexed_books
    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline.store.errors import StorePathError
    from rag_pipeline_tests.conftest import make_pipeline, make_recipe, store_config

    clear_scan_cache()
    write_book("alpha", {"a.md": "# A\n\none"})
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("")
    pipeline = make_pipeline(data_dir, store_config(in_the_way), make_recipe(HashEmbedder()))
    applier = Applier()
    live = LiveLoop(NoWatchSource(data_dir), applier, indexed=lambda: _indexed_books(pipeline))
    with pytest.raises(StorePathError, match=r"RAG_QDRANT_PATH=.*a-file.*is a file"):
        live.look()
    assert applier.calls == []


def test_a_handed_ingest_ends_when_the_live_run_of_its_book_hangs(
    data_dir, write_book, tmp_path, monkeypatch
):
    """Fault (a) on the live process's own path (loop, hand-off server, heartbeats): the run
    of the handed book hangs in its worker while the looking thread goes on looking; the
    heartbeats carry the workers' CPU time, which does not move, and the CLI gives up naming
    the process. Before, they carried nothing of the kind and it waited forever."""
    from rag_pipeline.defs import live as defs_live
    from rag_pipeline.defs.live import handed_report
    from rag_pipeline.ingest.handoff import HandOffServer

    monkeypatch.setattr(defs_live, "HEARTBEAT_S", 0.05)
    clear_scan_cache()
    write_book("alpha", {"a.md": "# A\n\none"})
    applier = HoldingApplier(set())
    live = LiveLoop(
        NoWatchSource(data_dir), applier, timing=LiveTiming(idle_look_s=0.02), workers=2
    )
    home = tmp_path / "home"
    home.mkdir()
    with running(live, data_dir):
        applier.hold = {"alpha"}  # its next run hangs
        server = HandOffServer(
            home,
            "k",
            lambda books, beat: handed_report(live, books, beat),
            work_cpu_s=live.work_cpu_s,
        )
        server.start()
        notes: list[str] = []
        try:
            started = time.monotonic()
            assert ask_live(home, ["alpha"], "k", stalled_s=0.6, notify=notes.append) is None
            assert time.monotonic() - started < 10
        finally:
            applier.release.set()
            server.close()
    assert applier.held.is_set()
    assert len(notes) == 1 and f"live mode (pid {os.getpid()})" in notes[0], notes


def test_the_workers_cpu_time_counts_what_their_runs_do_not_the_looks(data_dir, write_book):
    """The heartbeats' progress measure: a call of ``apply`` that computes moves it (its
    worker's thread clock); a loop looking every 10 ms with idle workers does not."""
    clear_scan_cache()
    write_book("alpha", {"a.md": "# A\n\none"})
    busy = threading.Event()

    def computing(books: list[str]) -> dict[str, bool]:
        if busy.is_set():
            started = time.thread_time()
            while time.thread_time() - started < 0.3:
                pass
        return dict.fromkeys(books, True)

    live = LiveLoop(NoWatchSource(data_dir), computing, timing=LiveTiming(idle_look_s=0.01))
    with running(live, data_dir):
        idle = live.work_cpu_s()
        time.sleep(0.5)  # about 50 looks
        assert live.work_cpu_s() - idle < 0.05
        busy.set()
        asked = live.request(["alpha"])
        assert asked.done.wait(10)
        assert live.work_cpu_s() - idle >= 0.25


# Fault: a second `make ui` on the same Dagster home (two terminals, a service and a person)
# ran a second Dagster daemon on the instance: both terminals filled with "Another ... daemon
# is still sending heartbeats" errors, and its dg dev stayed up with its webserver dead (port
# in use). Now the recipe holds $DAGSTER_HOME/.rag-ui.lock for dg dev's life (the process it
# execs keeps it), and a second one exits 2 at once, naming the first, starting nothing.
@pytest.mark.integration
@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_a_second_make_ui_on_one_home_exits_2_naming_the_first(tmp_path, data_dir):
    home = tmp_path / "home"
    home.mkdir()
    env = _make_env(**{**cli_env(tmp_path, data_dir), "DAGSTER_HOME": str(home)})
    lock_py = subprocess.run(
        [
            "make",
            "-s",
            "--no-print-directory",
            "--eval",
            'lock-py: ; @echo "$$UI_LOCK_PY"',
            "lock-py",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    lock = home / ".rag-ui.lock"
    # the holding side: the lock is kept by the command it execs (dg dev's, in the recipe)
    holder = subprocess.Popen([sys.executable, "-c", lock_py, str(lock), "/bin/sleep", "30"])
    try:
        deadline = time.monotonic() + 10
        while "pid" not in (lock.read_text() if lock.exists() else ""):
            assert time.monotonic() < deadline, "the lock was never taken"
            time.sleep(0.05)
        assert lock.read_text().startswith(f"pid {holder.pid}, since ")
        started = time.monotonic()
        done = subprocess.run(
            ["make", "--no-print-directory", "ui", f"DAGSTER_HOME={home}"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        holder.kill()
        holder.wait()
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"make ui already runs on this Dagster home ({home}): pid {holder.pid}" in done.stderr
    assert "Dagster UI" not in done.stdout and not (home / "history").exists()
    assert time.monotonic() - started < 20


@pytest.mark.integration
def test_watch_json_writes_a_data_folder_whose_name_is_not_utf8(tmp_path):
    """``watch --json`` printed its events with ``json.dumps`` of its own: a data folder whose
    name holds a byte that is not UTF-8 (Python's lone surrogate) failed its ``ready`` line
    with UnicodeEncodeError. Its events now go through the one JSON writer (json_text)."""
    from rag_pipeline_tests.helpers import Cli, LiveProcess

    data = tmp_path / "books-\udcff"
    (data / "alpha").mkdir(parents=True)
    (data / "alpha" / "a.md").write_text("# A\n\none alpha\n")
    live = LiveProcess(Cli(tmp_path, data))
    try:
        ready = live.next_event("ready", timeout=120)
        assert ready["data_dir"] == str(data) and ready["books"] == 1, ready
    finally:
        live.stop()

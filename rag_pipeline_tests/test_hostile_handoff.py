"""Hostile probes of ``rag-pipeline ingest`` handed to a running live process
(rag_pipeline/ingest/handoff.py): the handed report keeps the CLI's contract (the same books,
statuses, file errors and exit status as the CLI running the change itself), and a live
process that cannot answer (stopped with SIGSTOP, a stale or foreign file at the socket's
path) leaves the change to the CLI."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from rag_pipeline.ingest.handoff import HANDOFF_SOCKET, HandOffServer, ask_live
from rag_pipeline_tests.helpers import Cli, LiveProcess

#: per book, the fields of ``ingest --json`` that say what the index holds and what is wrong
#: (the work fields, embedded/reused/deleted, seconds, run_id, depend on who ran it when)
SAME = ("status", "files", "errors", "chunks", "points", "files_unreadable", "error_messages")


def _books(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {b: {k: r[k] for k in SAME} for b, r in report["books"].items()}


def _write(data: Path, book: str, files: dict[str, str | bytes]) -> None:
    for name, content in files.items():
        path = data / book / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


@pytest.mark.slow
@pytest.mark.integration
def test_a_handed_ingest_reports_what_the_cli_would(tmp_path):
    """One live process, several probes: a book removed while no live process ran is purged
    (the CLI's ingest purges it); a bad file is reported by the handed ingest as by the CLI's
    own; a named book that does not exist exits 1 as ``missing``; two CLIs handing off at
    once both get their report; a live process stopped by SIGSTOP leaves the change to the
    CLI within seconds."""
    data = tmp_path / "books"
    _write(data, "alpha", {"a.md": "# A\n\none alpha", "bad.md": b"\x00\x01\x02" * 200})
    _write(data, "beta", {"b.md": "# B\n\none beta"})
    _write(data, "gamma", {"c.md": "# C\n\none gamma"})
    _write(data, "bad name", {"d.md": "# D\n\na folder refused as a book"})
    cli = Cli(tmp_path, data)
    cli("ingest", "--json")
    import shutil

    shutil.rmtree(data / "gamma")  # removed while no live process runs
    live = LiveProcess(cli)
    try:
        live.next_event("ready", timeout=120)
        planned = json.loads(cli("plan", "--json").stdout)["books"]
        assert "gamma" not in planned, "a book removed before the start stays indexed"
        handed = json.loads(cli("ingest", "--json").stdout)
        assert "applied_by" in handed
        named = json.loads(cli("ingest", "--book", "beta", "--json").stdout)
        assert "applied_by" in named

        missing = cli("ingest", "--book", "nosuch", "--json", check=False)
        assert missing.returncode == 1, missing.stderr
        assert json.loads(missing.stdout)["books"]["nosuch"]["status"] == "missing"

        answers: list[Any] = []

        def one() -> None:
            answers.append(cli("ingest", "--json", check=False))

        both = [threading.Thread(target=one) for _ in range(2)]
        for thread in both:
            thread.start()
        for thread in both:
            thread.join(120)
        assert [a.returncode for a in answers] == [0, 0], [a.stderr for a in answers]
        assert all("applied_by" in json.loads(a.stdout) for a in answers)

        os.kill(live.proc.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            alone = cli("ingest", "--json", timeout=120)
            took = time.monotonic() - started
        finally:
            os.kill(live.proc.pid, signal.SIGCONT)
        assert "applied_by" not in json.loads(alone.stdout)
        assert took < 20, f"a stopped live process held the CLI {took:.1f}s"
    finally:
        assert live.stop() == 0, "".join(live.stderr[-30:])
    local = json.loads(cli("ingest", "--json").stdout)
    assert "applied_by" not in local
    assert _books(handed) == _books(local)
    local_named = json.loads(cli("ingest", "--book", "beta", "--json").stdout)
    assert _books(named) == _books(local_named)
    for mine, theirs in ((handed, local), (named, local_named)):
        for field in ("rejected_folders", "warnings"):
            assert mine[field] == theirs[field], (field, mine[field], theirs[field])
    assert local["books"]["alpha"]["error_messages"], local  # the bad file, named


def test_a_file_that_is_not_a_socket_at_the_path_is_no_live_process(tmp_path):
    """A regular file, a folder, or a socket nobody listens on at the socket's path: the
    CLI runs the change itself at once."""
    path = tmp_path / HANDOFF_SOCKET
    path.write_text("not a socket")
    assert ask_live(tmp_path, None, "k") is None
    path.unlink()
    path.mkdir()
    assert ask_live(tmp_path, None, "k") is None
    path.rmdir()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()
    os.chmod(path, 0)  # another user's: no permission to connect
    started = time.monotonic()
    assert ask_live(tmp_path, None, "k") is None
    assert time.monotonic() - started < 0.5


def _answering(home: Path, *answers: bytes) -> threading.Thread:
    """A listener at the socket's path that accepts one request and sends ``answers``
    (another version of the live process, or something else on that path)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(home / HANDOFF_SOCKET))
    sock.listen(1)

    def serve() -> None:
        conn, _ = sock.accept()
        conn.recv(65536)
        for answer in answers:
            conn.sendall(answer)
        conn.close()
        sock.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


ACCEPTED = b'{"accepted": true}\n'


@pytest.mark.parametrize(
    "answers",
    [
        (ACCEPTED, b'{"report": {"books": {"a": {}}}, "applied_by": "x"}\n'),  # no status
        (ACCEPTED, b'{"report": {"nothing": 1}, "applied_by": "x"}\n'),
        (ACCEPTED, b'{"report": "a string", "applied_by": "x"}\n'),
        (ACCEPTED, b'{"report": {"books": {"a": {"status": "ingested"}}}}\n'),  # by whom?
        (ACCEPTED, b'{"waiting": 5}\n'),
        (ACCEPTED, b'{"report": {"books": []}, "applied_by": "x"}\n'),
        (ACCEPTED, b"\xff\xfe not json\n"),
        (b"[1, 2]\n",),
        (b'{"accepted": true',),  # cut off
    ],
)
def test_a_broken_or_foreign_answer_leaves_the_change_to_the_cli(tmp_path, answers):
    """A live process of another version, or anything else listening at the path: whatever
    it answers, the CLI runs the change itself (no traceback, no report it made up)."""
    thread = _answering(tmp_path, *answers)
    assert ask_live(tmp_path, None, "k", accept_s=2, silent_s=2) is None
    thread.join(5)


def test_a_request_whose_books_are_not_a_list_is_refused(tmp_path):
    """``{"books": "alpha"}`` is not the books a, l, p, h, a."""
    asked: list[object] = []
    server = HandOffServer(tmp_path, "k", lambda books, beat: asked.append(books))
    server.start()
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(str(tmp_path / HANDOFF_SOCKET))
        conn.sendall(b'{"books": "alpha", "key": "k"}\n')
        conn.settimeout(5)
        answer = json.loads(conn.recv(65536).split(b"\n")[0])
        conn.close()
    finally:
        server.close()
    assert "refused" in answer and asked == []


@pytest.mark.integration  # a process of the user nobody
def test_a_deep_home_its_owner_may_enter_but_not_list(request):
    """A Dagster home whose socket path is past sun_path's 108 bytes, in a folder of mode
    0300 (write and enter, no listing): the live process still listens and the CLI still
    reaches it (as an ordinary user: root reads any folder)."""
    import shutil
    import subprocess
    import sys
    import tempfile

    from rag_pipeline_tests.helpers import as_nobody_or_skip

    nobody = as_nobody_or_skip()
    top = Path(tempfile.mkdtemp(prefix="rag-deep-", dir="/tmp"))  # pytest's folders are 0700
    request.addfinalizer(lambda: shutil.rmtree(top, ignore_errors=True))
    home = top / ("h" * 70) / ("o" * 50)
    home.mkdir(parents=True)
    for folder in (top, home.parent):
        os.chmod(folder, 0o755)
    os.chown(home, 65534, 65534)
    os.chmod(home, 0o300)
    script = (
        "import sys; from pathlib import Path\n"
        "from rag_pipeline.ingest.handoff import HandOffServer, ask_live\n"
        "from rag_pipeline.ingest.report import IngestReport\n"
        "home = Path(sys.argv[1])\n"
        "server = HandOffServer(home, 'k', lambda books, beat: IngestReport({}))\n"
        "server.start()\n"
        "print(ask_live(home, None, 'k') is not None)\n"
        "server.close()\n"
    )
    done = subprocess.run(
        [*nobody, sys.executable, "-c", script, str(home)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    assert done.stdout.strip() == "True", done.stderr[-2000:]

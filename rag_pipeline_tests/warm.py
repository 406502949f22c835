"""`rag-pipeline` commands as real processes, without paying Python's and Dagster's imports
each time: children forked from one warm interpreter.

    python -m rag_pipeline_tests.warm    (started by :class:`WarmServer`, spoken to on stdin)

The server imports the CLI, Dagster, the stores and the crash points, then does nothing but
fork. Each command is a child with its own pid, environment, working folder, stdout and
stderr files, locks and SQLite connections, which runs ``rag-pipeline ARGS`` and exits (or
is killed) as a process started from scratch would: only the imports are done already. What
a child cannot show (the installed entry point, a fresh interpreter's imports, a fresh hash
seed, PYTHON* variables other than PYTHONWARNINGS) is left to the few tests that start
``python -m rag_pipeline.cli`` themselves.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

#: imported once by the server; the rest of what a command imports is imported by each child
PRELOAD = (
    "dagster",
    "sqlalchemy",
    "alembic",
    "dagster._core.storage.runs.sqlite.sqlite_run_storage",
    "dagster._core.storage.event_log.sqlite.sqlite_event_log",
    "dagster._core.storage.schedules.sqlite.sqlite_schedule_storage",
    "rag_pipeline.cli",
    "rag_pipeline.defs.location",
    "rag_pipeline.defs.runner",
    "rag_pipeline.resources",
    "rag_pipeline.ingest.plan",
    "rag_pipeline.retrieve",
    "rag_pipeline.store.edge",
    "rag_pipeline.store.qdrant",
    "rag_pipeline.embed.hashing",
    "rag_pipeline_tests.crashpoint",
)


#: a "point" that is no crash point: ``s3-books:PATH`` runs the command over the object-store
#: books declared in the JSON file PATH (rag_pipeline_tests/s3cli.py)
S3_BOOKS = "s3-books:"


# -- the server (in its own process) --------------------------------------------------------


def _exit_code(exc: SystemExit) -> int:
    """The status ``sys.exit(code)`` gives a process (a message is printed, then 1)."""
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    print(exc.code, file=sys.stderr)
    return 1


def _run_command(args: list[str], point: str | None) -> int:
    """``rag-pipeline ARGS`` in this (forked) process, ended as the interpreter ends one."""
    from rag_pipeline.cli import main
    from rag_pipeline_tests import crashpoint

    if point and point.startswith(S3_BOOKS):  # the object-store books of a file (s3cli.py)
        from rag_pipeline_tests import s3cli

        s3cli.install(point.removeprefix(S3_BOOKS))
    elif point:
        crashpoint.install(point)
    try:
        main(args, prog_name="rag-pipeline")
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    atexit._run_exitfuncs()  # what interpreter shutdown runs (logging.shutdown among them)
    return code


def _child(request: dict[str, Any]) -> None:
    """Become the command: its descriptors, environment and folder, then run it; never return."""
    code = 1
    try:
        stdin = os.open(os.devnull, os.O_RDONLY)
        os.dup2(stdin, 0)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
            os.close(target)
        os.close(stdin)
        _read_warning_options(request["env"].get("PYTHONWARNINGS", ""))
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        sys.argv = ["rag-pipeline", *request["args"]]
        code = _run_command(request["args"], request.get("point"))
    except BaseException:  # the harness's own failure: shown on the command's stderr
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _read_warning_options(options: str) -> None:
    """PYTHONWARNINGS, which an interpreter reads at its start, as the command's own."""
    import warnings

    if options == os.environ.get("PYTHONWARNINGS", ""):
        return
    warnings.resetwarnings()
    for option in filter(None, options.split(",")):
        warnings._setoption(option)  # type: ignore[attr-defined]  # what -W and the variable use


def _poll(pid: int) -> int | None:
    done, status = os.waitpid(pid, os.WNOHANG)
    return None if done == 0 else os.waitstatus_to_exitcode(status)


def serve() -> None:
    """Import everything once, then answer one JSON request per stdin line: ``start`` forks a
    command (its pid), ``poll`` says whether it ended (its return code, ``-N`` for signal N)."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    replies = sys.stdout
    replies.write(json.dumps({"ready": os.getpid()}) + "\n")
    replies.flush()
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "start":
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(request)
            reply: dict[str, Any] = {"pid": pid}
        else:
            reply = {"returncode": _poll(request["pid"])}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


# -- the client (in the test process) --------------------------------------------------------


class WarmProcess:
    """A command forked by the server: the part of ``subprocess.Popen`` the tests use."""

    def __init__(self, server: WarmServer, pid: int, stdout: Path, stderr: Path) -> None:
        self._server, self.pid = server, pid
        self._stdout, self._stderr = stdout, stderr
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.ask(op="poll", pid=self.pid)["returncode"]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(["rag-pipeline"], timeout or 0)
            time.sleep(0.02)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, 9)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.wait()
            raise
        stdout = self._stdout.read_text(encoding="utf-8", errors="replace")
        stderr = self._stderr.read_text(encoding="utf-8", errors="replace")
        return stdout, stderr


class WarmServer:
    """The warm interpreter (a subprocess of the test process), started on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._outputs = Path(tempfile.mkdtemp(prefix="rag-warm-"))
        self._count = 0
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "rag_pipeline_tests.warm"],
            env={**os.environ, "PYTHONPATH": path},
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._read()

    def children_cpu_s(self) -> float:
        """CPU seconds (user + system) of the commands it forked that have ended."""
        fields = Path(f"/proc/{self._proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")

    def _read(self) -> dict[str, Any]:
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the warm server exited ({self._proc.wait()})")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def ask(self, **request: Any) -> dict[str, Any]:
        with self._lock:
            assert self._proc.stdin is not None
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.flush()
            return self._read()

    def start(
        self, args: list[str], env: dict[str, str], cwd: Path, point: str | None = None
    ) -> WarmProcess:
        """``rag-pipeline ARGS`` as a child (killed with SIGKILL at crash point ``point``)."""
        with self._lock:
            self._count += 1
            n = self._count
        stdout, stderr = self._outputs / f"{n}.out", self._outputs / f"{n}.err"
        reply = self.ask(
            op="start",
            args=args,
            env=env,
            cwd=str(cwd),
            point=point,
            stdout=str(stdout),
            stderr=str(stderr),
        )
        return WarmProcess(self, reply["pid"], stdout, stderr)

    def run(
        self,
        args: list[str],
        env: dict[str, str],
        cwd: Path,
        point: str | None = None,
        timeout: float = 600,
    ) -> subprocess.CompletedProcess[str]:
        proc = self.start(args, env, cwd, point)
        stdout, stderr = proc.communicate(timeout)
        return subprocess.CompletedProcess(["rag-pipeline", *args], proc.wait(), stdout, stderr)

    def close(self) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        shutil.rmtree(self._outputs, ignore_errors=True)


_server: WarmServer | None = None


def warm_server() -> WarmServer:
    """The session's warm server (one per test process, closed when it exits)."""
    global _server
    if _server is None:
        _server = WarmServer()
        atexit.register(_server.close)
    return _server


if __name__ == "__main__":
    serve()

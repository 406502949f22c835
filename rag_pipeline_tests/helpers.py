"""The `rag-pipeline` command as the tests run it: :class:`Cli` in real processes (forked from
the warm interpreter of ``warm.py``, or started from scratch), :class:`InProcessCli` in the
test process itself (click's CliRunner: no subprocess, for the fast suite)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import requests
from click.testing import CliRunner

from rag_pipeline_tests.warm import REPO, warm_server

#: settings of the developer's environment that would point a test at their store
FOREIGN_SETTINGS = ("RAG_QDRANT_URL", "RAG_COLLECTION", "RAG_QDRANT_EMBEDDED")


def cli_env(tmp_path: Path, data_dir: Path, embedder: str = "hash") -> dict[str, str]:
    """The environment of a CLI whose store, cache and Dagster home live under ``tmp_path``."""
    env = {
        **os.environ,
        "RAG_DATA_DIR": str(data_dir),
        "RAG_QDRANT_PATH": str(tmp_path / "qdrant"),
        "RAG_CACHE_DIR": str(tmp_path / "cache"),
        "RAG_EMBEDDER": embedder,
        "DAGSTER_HOME": str(tmp_path / "dagster_home"),
        "DO_NOT_TRACK": "1",
    }
    for var in FOREIGN_SETTINGS:
        env.pop(var, None)
    return env


def index_books(
    books: Path, qdrant_path: str, embedder: Any = None, run_id: str = "direct"
) -> None:
    """Every book under ``books`` indexed by the pipeline without Dagster (no run, no
    process) into the embedded store at ``qdrant_path``, by ``embedder`` (default: hashing)."""
    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline_tests.conftest import make_pipeline, make_recipe, store_config

    recipe = make_recipe(embedder or HashEmbedder())
    pipeline = make_pipeline(books, store_config(qdrant_path), recipe)
    pipeline.run(sorted(p.name for p in books.iterdir() if p.is_dir()), run_id=run_id)


def index_sample_books(root: Path, embedder: Any = None) -> Path:
    """The sample books copied to ``root/books`` and indexed directly into the store that a
    CLI of ``root`` reads (see :func:`index_books`); the books folder."""
    import shutil

    books = root / "books"
    shutil.copytree(REPO / "data" / "books", books)
    index_books(books, cli_env(root, books)["RAG_QDRANT_PATH"], embedder)
    return books


def fresh_cli(
    args: list[str], env: dict[str, str], cwd: Path, *, timeout: float = 600, **options: Any
) -> subprocess.CompletedProcess[str]:
    """``python -m rag_pipeline.cli ARGS`` started from scratch (what only a fresh process
    shows: its imports, a bad setting at start, limits set before it runs), unchecked."""
    return subprocess.run(
        [sys.executable, "-m", "rag_pipeline.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        **options,
    )


#: what runs a command as the unprivileged user ``nobody`` (root reads any file)
AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def as_nobody_or_skip() -> list[str]:
    """:data:`AS_NOBODY`, once ``nobody`` is seen to run this checkout's interpreter and
    package; else the test is skipped with the reason (a checkout under a folder only its
    owner can read, as a fresh clone in a private home is: nobody cannot even start its
    Python there)."""
    import pytest

    probe = subprocess.run(
        [*AS_NOBODY, sys.executable, "-c", "import rag_pipeline.cli"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )
    if probe.returncode != 0:
        said = (probe.stderr.strip().splitlines() or ["no message"])[-1]
        pytest.skip(
            f"the user nobody cannot run this checkout's Python ({sys.executable}) and package "
            f"(a folder above it is readable by its owner only?): {said}"
        )
    return AS_NOBODY


class Cli:
    """``rag-pipeline`` in a real process per command. By default the process is forked from
    the warm interpreter (the same process semantics without the imports, see warm.py);
    ``fresh=True`` starts ``python -m rag_pipeline.cli`` from scratch."""

    def __init__(
        self, tmp_path: Path, data_dir: Path, embedder: str = "hash", *, fresh: bool = False
    ) -> None:
        self.env = cli_env(tmp_path, data_dir, embedder)
        self.cwd = tmp_path
        self.fresh = fresh

    def start(self, *args: str, point: str | None = None) -> Any:
        """The command started (a ``Popen`` or its warm twin), killed at crash point ``point``."""
        if self.fresh:
            env = self.env
            if point is not None:
                command = [sys.executable, "-m", "rag_pipeline_tests.crashpoint", point, *args]
                env = {**env, "PYTHONPATH": str(REPO)}  # the crash points' module
            else:
                command = [sys.executable, "-m", "rag_pipeline.cli", *args]
            return subprocess.Popen(
                command,
                env=env,
                cwd=self.cwd,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        return warm_server().start(list(args), self.env, self.cwd, point)

    def __call__(
        self, *args: str, check: bool = True, point: str | None = None, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        proc = self.start(*args, point=point)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        done = subprocess.CompletedProcess(["rag-pipeline", *args], proc.returncode, stdout, stderr)
        if check and done.returncode != 0:
            raise AssertionError(f"exit {done.returncode}\n{done.stdout}\n{done.stderr}")
        return done

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "--json").stdout)

    def as_user(self, prefix: list[str], *args: str) -> subprocess.CompletedProcess[str]:
        """The command run through ``prefix`` (e.g. setpriv as another user), unchecked."""
        return subprocess.run(
            [*prefix, sys.executable, "-m", "rag_pipeline.cli", *args],
            env={**self.env, "HOME": str(self.cwd)},
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=600,
        )


class InProcessCli(Cli):
    """The same commands in the test process (CliRunner, the environment and working folder
    set for the call): exit codes and output as a process gives them, no subprocess."""

    def __call__(
        self, *args: str, check: bool = True, point: str | None = None, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        from rag_pipeline.cli import main

        assert point is None, "crash points kill the process: use Cli"
        unset: dict[str, str | None] = {k: None for k in os.environ if k not in self.env}
        before = Path.cwd()
        os.chdir(self.cwd)
        try:
            result = CliRunner().invoke(main, list(args), env={**unset, **self.env})
        finally:
            os.chdir(before)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise AssertionError(f"{args}: escaped {result.exception!r}\n{result.output}")
        done = subprocess.CompletedProcess(
            ["rag-pipeline", *args], result.exit_code, result.stdout, result.stderr
        )
        if check and done.returncode != 0:
            raise AssertionError(f"exit {done.returncode}\n{done.stdout}\n{done.stderr}")
        return done

    def start(self, *args: str, point: str | None = None) -> Any:
        raise TypeError("an in-process command cannot be started in the background: use Cli")


class Server:
    """``rag-pipeline serve`` in its own process; ``files_limit`` lowers its open-files limit
    (soft and hard: the service cannot raise it back)."""

    def __init__(
        self, cli: Cli, *, files_limit: int | None = None, entry: Sequence[str] = ()
    ) -> None:
        """``entry``: a test module (and its arguments) that runs the CLI, in place of
        ``rag_pipeline.cli`` (a fault injection: see switchpoint.py)."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        # a file, not a pipe: nobody drains a pipe while the service runs, and a full one
        # would block its logging
        self.log_path = Path(cli.cwd) / f"serve-{self.port}.log"
        with open(self.log_path, "w") as log:
            module = entry or ["rag_pipeline.cli"]
            self.proc = subprocess.Popen(
                [sys.executable, "-m", *module, "serve", "--port", str(self.port)],
                # a test module is found from the repository
                env={**cli.env, "PYTHONPATH": str(REPO)} if entry else cli.env,
                cwd=cli.cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=None if files_limit is None else lambda: _limit_files(files_limit),
            )
        deadline = time.monotonic() + 120
        while True:
            try:
                if requests.get(f"{self.url}/health", timeout=5).ok:
                    return
            except requests.ConnectionError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"the service did not start:\n{self.log_path.read_text()}")
            time.sleep(0.2)

    def get(self, path: str, **params: object) -> requests.Response:
        return requests.get(f"{self.url}{path}", params=params, timeout=120)  # type: ignore[arg-type]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _limit_files(limit: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))


class LiveProcess:
    """``rag-pipeline watch --json`` in its own process (started from scratch, as a user
    starts it): its JSON events as they come, its stderr kept."""

    def __init__(
        self,
        cli: Cli,
        signal_in_run: str | None = None,
        phases: Path | None = None,
        crash_at: str | None = None,
    ) -> None:
        """``signal_in_run`` (e.g. "SIGTERM"): the process sends itself that signal from
        inside the run that embeds :data:`~rag_pipeline_tests.signalpoint.MARKER`.
        ``phases``: the folder through which a test holds it at a phase of a live run
        (:mod:`rag_pipeline_tests.phasepoint`). ``crash_at``: a live point of
        :mod:`rag_pipeline_tests.crashpoint` where the run of its marker kills it."""
        import queue

        self.cli = cli
        self.events: list[dict[str, Any]] = []
        self._new: queue.Queue[dict[str, Any]] = queue.Queue()
        self.stderr: list[str] = []
        entry, env = ["rag_pipeline.cli"], cli.env
        if signal_in_run is not None:
            entry = ["rag_pipeline_tests.signalpoint", signal_in_run]
            env = {**env, "PYTHONPATH": str(REPO)}  # the signal point's module
        elif phases is not None:
            entry = ["rag_pipeline_tests.phasepoint", str(phases)]
            env = {**env, "PYTHONPATH": str(REPO)}
        elif crash_at is not None:
            entry = ["rag_pipeline_tests.crashpoint", crash_at]
            env = {**env, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", *entry, "watch", "--json"],
            env=env,
            cwd=cli.cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its group: what kill() ends, as a service manager does
        )
        self._threads = [
            threading.Thread(target=self._read_events, daemon=True),
            threading.Thread(target=self._read_stderr, daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _read_events(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            event = json.loads(line)
            event["at"] = time.monotonic()
            self.events.append(event)
            self._new.put(event)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        self.stderr.extend(self.proc.stderr)

    def next_event(self, kind: str, timeout: float = 60) -> dict[str, Any]:
        """The next event of ``kind`` ("ready", "applied"), waiting up to ``timeout``."""
        import queue

        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                event = self._new.get(timeout=max(left, 0.01))
            except queue.Empty:
                raise AssertionError(
                    f"no {kind!r} event in {timeout}s (exit {self.proc.poll()}):\n"
                    + "".join(self.stderr[-30:])
                ) from None
            if event["event"] == kind:
                return event

    def applied_books(self, status: str = "ingested") -> list[str]:
        """Every book of every applied event with ``status``, in order (one per run of it)."""
        return [
            book
            for e in self.events
            if e["event"] == "applied"
            for book, r in e["report"]["books"].items()
            if r["status"] == status
        ]

    def drain(self) -> None:
        """Forget the events seen so far (the next :meth:`next_event` waits for a new one)."""
        import queue

        while True:
            try:
                self._new.get_nowait()
            except queue.Empty:
                return

    def stop(self) -> int:
        """SIGTERM: it stops after the change in hand; its exit status."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            code = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            print(f"the live process did not stop within 60 s of SIGTERM:\n{self._stack()}")
            self.proc.kill()
            code = self.proc.wait()
        self._close()
        if code != 0:  # shown with the failure: what it was doing
            print("".join(self.stderr[-40:]))
        return code

    def _stack(self) -> str:
        """The live process's Python stacks (py-spy, where installed), for a failure's report."""
        spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which(
            "py-spy"
        )
        if spy is None:
            return "(py-spy is not installed: no stacks)"
        dump = [spy, "dump", "--pid", str(self.proc.pid)]
        done = subprocess.run(dump, capture_output=True, text=True, timeout=60, check=False)
        return done.stdout + done.stderr

    def _close(self) -> None:
        for thread in self._threads:
            thread.join(timeout=5)
        if any(thread.is_alive() for thread in self._threads):
            # a child of the process still holds its pipes open: closing one under a reader
            # blocked in read() would wait on that reader forever
            return
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()

    def kill(self) -> None:
        """``kill -9`` of the process and its group (the `tail` Dagster starts to mirror a
        step's compute log, and its orphan watcher, would otherwise outlive it holding its
        pipes when the kill falls between the two starts)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._close()


#: what a traceback leaves in text: Python's header, Dagster's serialized error, a frame
TRACE_MARKS = re.compile(r'Traceback \(most recent call last\)|Stack Trace:|File "[^"]*", line \d+')


def assert_no_trace(text: str) -> None:
    """No Python traceback, no Dagster ``Stack Trace:`` block, no ``File "...", line N`` frame."""
    found = TRACE_MARKS.search(text)
    assert found is None, f"{found.group(0)!r} in:\n{text}"


@contextmanager
def small_tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``mount -o size=``) mounted at ``mount`` for the block: a small
    disk a test can fill. Needs root: the test is skipped otherwise, saying so."""
    import pytest

    mount.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"mounting a small tmpfs needs root: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@contextmanager
def small_ext4(mount: Path, size: str) -> Iterator[Path]:
    """An ext4 file system of ``size`` (``truncate -s``) in an image beside ``mount``, loop-mounted
    there for the block: a small disk that, unlike tmpfs, keeps a sparse file's holes
    unallocated. Needs root and a loop device: the test is skipped otherwise, saying so."""
    import pytest

    image = mount.with_name(mount.name + ".img")
    mount.mkdir(parents=True, exist_ok=True)
    subprocess.run(["truncate", "-s", size, str(image)], check=True)
    made = subprocess.run(["mkfs.ext4", "-q", str(image)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"mkfs.ext4 is needed for a small ext4 disk: {made.stderr.strip()}")
    done = subprocess.run(
        ["mount", "-o", "loop", str(image), str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"loop-mounting a small ext4 needs root: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
        image.unlink(missing_ok=True)


def fill_disk(disk: Path, leave: int) -> Path:
    """A file that takes the disk's free space but ``leave`` bytes."""
    filler = disk / "filler"
    with open(filler, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, shutil.disk_usage(disk).free - leave)
    return filler


@contextmanager
def parse_rules_of_version_1() -> Iterator[None]:
    """Files parsed as version 1 of the parse rules parsed them: ``slides.md`` (a leading
    ``---`` rule followed by prose, accepted since version 2) refused as bad frontmatter."""
    from rag_pipeline.ingest import parse
    from rag_pipeline.models import FileError

    current_rules = parse.parse_document

    def older_rules(book_id: str, source_file: str, *args: Any, **kwargs: Any) -> Any:
        if source_file == "slides.md":
            return FileError(book_id, source_file, "parse", "frontmatter is not a mapping")
        return current_rules(book_id, source_file, *args, **kwargs)

    parse.parse_document = older_rules  # type: ignore[assignment]
    try:
        yield
    finally:
        parse.parse_document = current_rules

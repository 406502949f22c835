"""The `rag-pipeline` command as the tests run it: :class:`Cli` in real processes (forked from
the warm interpreter of ``warm.py``, or started from scratch), :class:`InProcessCli` in the
test process itself (click's CliRunner: no subprocess, for the fast suite)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

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


#: what a traceback leaves in text: Python's header, Dagster's serialized error, a frame
TRACE_MARKS = re.compile(r'Traceback \(most recent call last\)|Stack Trace:|File "[^"]*", line \d+')


def assert_no_trace(text: str) -> None:
    """No Python traceback, no Dagster ``Stack Trace:`` block, no ``File "...", line N`` frame."""
    found = TRACE_MARKS.search(text)
    assert found is None, f"{found.group(0)!r} in:\n{text}"

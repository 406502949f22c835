"""The ``rag-pipeline`` command group and what every command shares: settings read once, the
store and the pipeline built from them, output (``--json`` and tables), and the exit codes."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn

import click
from rich.console import Console
from rich.markup import escape

from rag_pipeline import __version__
from rag_pipeline.config import DagsterStateError, Settings, SettingsError, load_settings
from rag_pipeline.json_text import json_text

if TYPE_CHECKING:
    from rag_pipeline.ingest.pipeline import IngestPipeline
    from rag_pipeline.recipes.lazy import LazyRecipe
    from rag_pipeline.store import VectorStore

#: exit code when stdout's reader goes away early (128 + SIGPIPE, as a shell reports it)
SIGPIPE_EXIT = 141


def _reader_gone() -> NoReturn:
    """stdout's reader exited early (``| head``): stop quietly with 141 (128 + SIGPIPE, what a
    shell reports for a command killed by it). stdout goes to /dev/null so that Python's final
    flush does not complain."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # a stdout without a descriptor (tests)
        pass
    sys.exit(SIGPIPE_EXIT)


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """stdout's reader is gone: stop as :func:`_reader_gone` says (rich would exit 1).
        stderr's: its messages are lost, the work goes on."""
        self.quiet = True
        if not self.stderr:
            _reader_gone()


# Piped output keeps full tables instead of wrapping at 80 columns.
out = _Console(width=None if sys.stdout.isatty() else 160)

err = _Console(stderr=True, width=None if sys.stderr.isatty() else 160)


def _end_process(done: SystemExit) -> NoReturn:
    """End the process as ``raise done`` would, less the interpreter's teardown: what
    ``atexit`` holds runs (logging's flush, temporary folders), the standard streams are
    flushed, then the process exits with the status ``done`` says. Freeing every object of
    every module one by one is most of what a Dagster run leaves to do (0.5-0.6 CPU s of
    ``ingest``'s 3, docs/benchmarks.md); every file and store is closed by then (``with``
    blocks), and every SQLite commit is on disk. Another thread still working (not a daemon)
    gets the ordinary exit, which waits for it."""
    import atexit
    import threading

    others = [t for t in threading.enumerate() if t is not threading.current_thread()]
    if threading.current_thread() is not threading.main_thread() or any(
        not t.daemon for t in others
    ):
        raise done
    code = done.code
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)  # what the interpreter does with sys.exit("message")
        code = 1
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
    except BrokenPipeError:  # stdout's reader is gone: as _reader_gone says
        code = SIGPIPE_EXIT
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
    os._exit(code or 0)


def shown(value: object) -> str:
    """``value`` (a file name, a section title, a message naming them: data) as printed through
    Rich's markup: as it is written, never read as style tags (``notes[/x].md`` was a
    MarkupError, ``[bold]x[/bold].md`` printed as ``x.md``)."""
    return escape(str(value))


def fail(message: str, code: int = 2) -> NoReturn:
    try:
        err.print(
            f"[bold red]error:[/] {shown(message)}",
            highlight=False,
            markup=True,
            emoji=False,
            soft_wrap=True,
        )
    except OSError:  # rich imports parts of itself on first use: no descriptor left for them
        sys.stderr.write(f"error: {message}\n")
    sys.exit(code)


def emit_json(data: Any) -> None:
    click.echo(json_text(data, indent=2))


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors that are the input's or the environment's fault: exit 2 with their message
    (unless one of :func:`_failed_work_errors`)."""
    from rag_pipeline.embed import EmbedError
    from rag_pipeline.models import InvalidBookIdError
    from rag_pipeline.sources.base import SourceUnavailableError
    from rag_pipeline.store import StoreError

    return (SettingsError, InvalidBookIdError, SourceUnavailableError, StoreError, EmbedError)


def _failed_work_errors() -> tuple[type[BaseException], ...]:
    """Failed work with a clear message of its own: exit 1, no traceback. Checked first: an
    embedding service's failure (timeout, 429, a bad answer) is an EmbedError, but not the
    settings' fault as a missing API key is."""
    from rag_pipeline.embed import EmbedServiceError
    from rag_pipeline.store import BookDamagedError, StoreResourceError

    # a book's damaged index (its next ingest rebuilds it), a limit of the machine (open
    # files, memory, disk space): what is asked cannot be answered now
    return (DagsterStateError, EmbedServiceError, BookDamagedError, StoreResourceError)


class _Commands(click.Group):
    """Turns every exception into a message and an exit code, never a traceback. Run as the
    process's command, it ends the process without Python's teardown (:func:`_end_process`)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The ``rag-pipeline`` process (its entry point, ``python -m``): the command, then
        the end of the process. click's test runner calls :meth:`main`, not this; nor does
        a caller that asks for the command's result (``standalone_mode=False``)."""
        if kwargs.get("standalone_mode", True) is False:
            return self.main(*args, **kwargs)
        try:
            self.main(*args, **kwargs)
        except SystemExit as exc:
            _end_process(exc)
        _end_process(SystemExit(0))

    def invoke(self, ctx: click.Context) -> Any:
        try:
            result = super().invoke(ctx)
            sys.stdout.flush()  # a reader gone early is seen here, not at exit
            return result
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit):
            raise
        except KeyboardInterrupt:
            fail("interrupted", 130)
        except BrokenPipeError:
            _reader_gone()
        except Exception as exc:
            if isinstance(exc, _failed_work_errors()):
                fail(str(exc), 1)
            from rag_pipeline.store.errors import resource_limit

            limit = resource_limit(exc) if isinstance(exc, OSError) else None
            if limit is not None:  # a limit of the machine met outside the store's own calls
                fail(f"{limit}: {exc}", 1)
            if isinstance(exc, _user_errors()):
                fail(str(exc), 2)
            if ctx.obj and ctx.obj.get("verbose"):
                traceback.print_exc()
            fail(f"unexpected {type(exc).__name__}: {exc} (run with -v for the traceback)", 1)


def _settings() -> Settings:
    return load_settings()


@contextmanager
def opened_store(settings: Settings) -> Iterator[VectorStore]:
    """The configured store, for the time of one read (an embedded folder is locked while
    open: a busy one is waited for up to RAG_BUSY_WAIT_S). One that holds nothing yet is read
    as an empty store, never created by a read (:func:`~rag_pipeline.store.holds_nothing`)."""
    from rag_pipeline.schema import COLLECTION_SCHEMA
    from rag_pipeline.store import holds_nothing, open_empty_store, open_store
    from rag_pipeline.store.sharing import shared_store, store_key

    config = settings.store()
    if holds_nothing(config):
        empty = open_empty_store(config, COLLECTION_SCHEMA)
        try:
            yield empty
        finally:
            empty.close()
        return
    with shared_store(store_key(config), lambda: open_store(config, COLLECTION_SCHEMA)) as store:
        yield store


def book_recipes(settings: Settings) -> LazyRecipe:
    """The recipes of the configured settings, one per book as its record decides
    (:func:`rag_pipeline.recipes.choice.choose_book_model`), each model loaded on first use."""
    from rag_pipeline.recipes.lazy import LazyRecipe

    return LazyRecipe(settings.embedding(), settings.chunking())


def book_pipeline(settings: Settings) -> IngestPipeline:
    """The one ingest pipeline, as the settings describe it (every run goes through it)."""
    from rag_pipeline.ingest.pipeline import IngestPipeline

    return IngestPipeline.from_settings(settings, book_recipes(settings))


_LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"


class _TracelessFormatter(logging.Formatter):
    """A log record without -v: its message and the one line of its exception, never a
    traceback, a stack, or the ``Stack Trace:`` block Dagster writes into failure messages."""

    _TRACE_STARTS = ("\nStack Trace:", "\nTraceback (most recent call last):")

    def __init__(self) -> None:
        super().__init__(_LOG_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        for start in self._TRACE_STARTS:
            message = message.split(start, 1)[0]
        message = message.rstrip()
        error = record.exc_info[1] if record.exc_info else None
        if error is not None:
            message += f" ({type(error).__name__}: {error})"
        bare = logging.makeLogRecord(
            {**record.__dict__, "msg": message, "args": (), "exc_info": None}
        )
        bare.exc_text = bare.stack_info = None
        return super().format(bare)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rag-pipeline")
@click.option("-v", "--verbose", is_flag=True, help="log progress to stderr")
@click.pass_context
def main(ctx: click.Context, verbose: bool) -> None:
    """Markdown books -> Dagster assets -> Qdrant; tenant-safe retrieval on top."""
    ctx.obj = {"verbose": verbose}
    stderr = logging.StreamHandler(sys.stderr)
    stderr.setFormatter(logging.Formatter(_LOG_FORMAT) if verbose else _TracelessFormatter())
    # INFO also lets Dagster's console print the errors of runs in full (defs/runner.py)
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[stderr])
    # progress of long steps (embedding) is worth seeing without -v
    logging.getLogger("rag_pipeline.progress").setLevel(logging.INFO)

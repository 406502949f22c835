"""Open the Dagster instance in ``DAGSTER_HOME`` safely from several processes at once.

A fresh SQLite ``DAGSTER_HOME`` creates its tables when the instance is first opened, and two
processes doing that together race (``table jobs already exists``: Dagster retries this for its
event log, not for its run or schedule storage). Our own processes take turns with an ``flock``
on ``<home>/.rag-instance.lock`` while they open it (released by the kernel if one dies);
processes that do not take it (``dagster dev`` starting at the same moment) are retried.
``make ui`` creates the instance (:func:`prepare_home_instance`) before it starts ``dg dev``
and live mode, which otherwise create and stamp the same databases together: Dagster's own
processes take no lock, and a race between two stamps can leave a database with two alembic
heads, unusable from then on.

A bad ``dagster.yaml`` is a setting error naming the file; a damaged SQLite database under
``DAGSTER_HOME`` (unreadable, or with a schema version Dagster cannot read: two alembic heads,
at open or later, while runs write) is a :class:`DagsterStateError` naming the file and how to
recover, never a bare ``sqlite3.DatabaseError`` or alembic ``CommandError``; a full one is a
:class:`DagsterHomeFullError` naming the folder and the space left (:func:`home_full`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

from dagster import DagsterInstance, DagsterInvalidConfigError

from rag_pipeline.config import DagsterStateError, SettingsError
from rag_pipeline.defs._dagster_private import dagster_instance_config, kept_sqlite_engines
from rag_pipeline.defs.migration_scripts import keep_migration_scripts
from rag_pipeline.defs.partition_marker import PARTITIONS_MARKER

__all__ = ["DagsterHomeFullError", "home_full", "open_home_instance", "prepare_home_instance"]

#: another process creating or stamping the schema at the same moment
_RACE = re.compile(
    r"already exists|database is locked|UNIQUE constraint failed: alembic_version", re.IGNORECASE
)
_ATTEMPTS = 5


@contextlib.contextmanager
def _opening_turn(home: Path) -> Iterator[None]:
    fd = os.open(home / ".rag-instance.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held for the seconds the schema takes, at most
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _get_instance() -> DagsterInstance:
    for attempt in range(_ATTEMPTS):
        try:
            return DagsterInstance.get()
        except Exception as exc:  # sqlalchemy's OperationalError, without importing sqlalchemy
            if attempt == _ATTEMPTS - 1 or not _RACE.search(str(exc)):
                raise
            time.sleep(0.2 * (attempt + 1))  # another process is creating the schema
    raise AssertionError("unreachable")


@contextlib.contextmanager
def open_home_instance() -> Iterator[DagsterInstance]:
    """The instance in ``DAGSTER_HOME`` (which must be set), opened in turn with other
    rag-pipeline processes, its SQLite connections kept open while it is (see
    :func:`~rag_pipeline.defs._dagster_private.kept_sqlite_engines`); disposed of on exit.
    A bad ``dagster.yaml`` raises :class:`SettingsError`, a damaged database (then or inside
    the block) :class:`DagsterStateError`, both naming the file and what to do."""
    home = Path(os.environ["DAGSTER_HOME"])
    _check_config(home)
    # its storages check their schema revisions, and a run's first event its new shard's:
    # alembic's migration scripts read once for all of them
    keep_migration_scripts()
    try:
        with _opening_turn(home):
            try:
                instance = _get_instance()
            except Exception as exc:
                if _is_config_error(exc):
                    raise _config_error(home, exc) from None
                raise
        # its SQLite databases' connections kept while it is open: a run's events cost half
        with instance, kept_sqlite_engines(instance):
            yield instance
    except Exception as exc:
        if _is_damaged_database(exc):
            raise _damaged(home, exc) from None
        full = home_full(home, exc)
        if full is not None:
            raise full from None
        raise


def prepare_home_instance() -> None:
    """Create (or check) the instance in ``DAGSTER_HOME``: its run, event log and schedule
    databases created and stamped, in turn with other rag-pipeline processes. What ``make ui``
    runs before it starts ``dg dev`` and live mode."""
    with open_home_instance() as instance:
        # each storage read once (runs, event log, schedules): a schema Dagster cannot read
        # fails here, before any server starts on it
        instance.get_runs(limit=1)
        instance.get_dynamic_partitions("books")
        instance.all_instigator_state()


_CONFIG_FILE = "dagster.yaml"
#: failures of the configured classes to load (a module or class dagster.yaml names)
_CLASS_LOAD = re.compile(r"configurable class|couldn't import module", re.IGNORECASE)
#: SQLite's words for a file that is not, or no longer, a sound database
_DAMAGED = re.compile(r"not a database|malformed|file is encrypted", re.IGNORECASE)
#: the version table of a database, which alembic (Dagster's migrations) reads at every open
_VERSION_TABLE = "alembic_version"


def _check_config(home: Path) -> None:
    """Parse and validate ``dagster.yaml`` as Dagster will (cheap: no storage opened)."""
    try:
        dagster_instance_config(str(home))
    except Exception as exc:
        raise _config_error(home, exc) from None


def _is_config_error(exc: BaseException) -> bool:
    return isinstance(exc, DagsterInvalidConfigError) or bool(_CLASS_LOAD.search(str(exc)))


def _config_error(home: Path, exc: BaseException) -> SettingsError:
    detail = " ".join(str(exc).split()).rstrip(".")
    return SettingsError(
        f"DAGSTER_HOME={str(home)!r}: {home / _CONFIG_FILE} is not a valid Dagster instance "
        f"configuration: {detail[:600]}. Fix it, or move it aside (the next command writes the "
        "default one)."
    )


def _is_damaged_database(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if _is_version_error(seen):
            return True
        if isinstance(seen, sqlite3.DatabaseError) and _DAMAGED.search(str(seen)):
            return True
        orig = getattr(seen, "orig", None)  # sqlalchemy's DBAPIError wraps the driver's error
        if isinstance(orig, sqlite3.DatabaseError) and _DAMAGED.search(str(orig)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _is_version_error(exc: BaseException) -> bool:
    """alembic's ``CommandError`` (not imported: a dependency of Dagster's, not ours): the
    schema version of a database cannot be read, e.g. "Version table 'alembic_version' has
    more than one head present" after two processes stamped a new database together."""
    return type(exc).__name__ == "CommandError" and type(exc).__module__.startswith("alembic")


def _damaged(home: Path, exc: BaseException) -> DagsterStateError:
    files = _damaged_files(home)
    which = ", ".join(str(f) for f in files) if files else f"a database under {home}"
    # the top folder holding each damaged file (history/, schedules/): what to move aside
    folders = sorted({home / f.relative_to(home).parts[0] for f in files}) or [home / "history"]
    # schedules/ holds the sensors' state and ticks; history/ (and any other) the runs
    lost = (
        "the sensors start with a new state"
        if all(f.name == "schedules" for f in folders)
        else "the next ingest starts a new run history"
    )
    return DagsterStateError(
        f"the Dagster instance in DAGSTER_HOME={str(home)!r} is damaged: {which}: "
        f"{_driver_message(exc)}. Move {' and '.join(str(f) for f in folders)} aside and delete "
        f"{home / PARTITIONS_MARKER}; {lost} (the index is not affected)."
    )


def _damaged_files(home: Path) -> list[Path]:
    """The SQLite files under the home that SQLite cannot read, or whose alembic version table
    holds more than one version (only looked for on failure)."""
    found = []
    for path in sorted(home.glob("**/*.db")):
        try:
            with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
                tables = {row[0] for row in db.execute("select name from sqlite_master")}
                if _VERSION_TABLE in tables:
                    (versions,) = db.execute(f"select count(*) from {_VERSION_TABLE}").fetchone()
                    if versions > 1:
                        found.append(path)
        except sqlite3.DatabaseError as exc:
            if _DAMAGED.search(str(exc)):
                found.append(path)
    return found


def _driver_message(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None)
    first = str(orig if orig is not None else exc).splitlines()[0]
    return first.split("; please use get_current_heads()")[0]  # alembic's advice to programmers


class DagsterHomeFullError(DagsterStateError):
    """The file system of ``DAGSTER_HOME`` is full: Dagster cannot record runs (nothing is
    damaged; the index is not affected)."""


#: SQLite's words for a write the disk refused: "database or disk is full" (SQLITE_FULL);
#: "disk I/O error" (SQLITE_IOERR) is what some refused writes say (a new file's first pages)
_FULL = re.compile(r"disk is full", re.IGNORECASE)
_IO_ERROR = re.compile(r"disk I/O error", re.IGNORECASE)
#: free space under which an I/O error of the instance's database is taken for a full disk
NEARLY_FULL_BYTES = 16 << 20


def home_full(home: Path, exc: BaseException) -> DagsterHomeFullError | None:
    """The error naming a full ``DAGSTER_HOME`` (and the space left on its file system) when
    ``exc`` or one of its causes is a write the disk refused there; else None."""
    try:
        free: int | None = shutil.disk_usage(home).free
    except OSError:
        free = None
    said = None
    seen: BaseException | None = exc
    while seen is not None and said is None:
        for error in (seen, getattr(seen, "orig", None)):  # sqlalchemy wraps the driver's
            if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
                said = str(error)
            elif isinstance(error, sqlite3.DatabaseError):
                text = str(error)
                low = free is not None and free < NEARLY_FULL_BYTES
                if _FULL.search(text) or (_IO_ERROR.search(text) and low):
                    said = text.splitlines()[0]
        seen = seen.__cause__ or seen.__context__
    if said is None:
        return None
    space = "an unknown amount" if free is None else f"{free / 2**10:.0f} KiB"
    return DagsterHomeFullError(
        f"the Dagster instance's folder DAGSTER_HOME={str(home)!r} is full ({said}): "
        f"{space} free on its file system. Free space there (or point DAGSTER_HOME at a larger "
        "disk) and run it again; the index is not affected, and a run this left unfinished is "
        "marked failed by the next ingest."
    )

"""Open the Dagster instance in ``DAGSTER_HOME`` safely from several processes at once.

A fresh SQLite ``DAGSTER_HOME`` creates its tables when the instance is first opened, and two
processes doing that together race (``table jobs already exists``: Dagster retries this for its
event log, not for its run or schedule storage). Our own processes take turns with an ``flock``
on ``<home>/.rag-instance.lock`` while they open it (released by the kernel if one dies);
processes that do not take it (``dagster dev`` starting at the same moment) are retried.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

from dagster import DagsterInstance

__all__ = ["open_home_instance"]

_RACE = re.compile(r"already exists|database is locked", re.IGNORECASE)
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
    rag-pipeline processes; disposed of on exit."""
    home = Path(os.environ["DAGSTER_HOME"])
    with _opening_turn(home):
        instance = _get_instance()
    with instance:
        yield instance

"""Dagster's migration scripts read once per process, not once per run.

Dagster's SQLite event log keeps each run's events in a database of its own: the run's first
event creates it and checks and stamps its schema revision with alembic, and alembic reads
every migration script of the package again each time it is asked (``ScriptDirectory.
from_config``: about 180 Python files, twice per run). A long-lived process (live mode) paid
that for every edit, on its critical path, before the edit's points could be written (issue
41.1: about half of a run's recording CPU). The scripts are files of the installed package:
they do not change while the process runs, so one :class:`~alembic.script.ScriptDirectory`
per script location is kept.
"""

from __future__ import annotations

import threading
from typing import Any

from alembic.config import Config
from alembic.script import ScriptDirectory

__all__ = ["keep_migration_scripts"]

_lock = threading.Lock()
_kept: dict[tuple[str | None, ...], ScriptDirectory] = {}
_installed = False


def keep_migration_scripts() -> None:
    """From now on this process reads each migration script folder once (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        read = ScriptDirectory.from_config.__func__  # type: ignore[attr-defined]

        def from_config(cls: type[ScriptDirectory], config: Config) -> Any:
            key = (
                config.get_main_option("script_location"),
                config.get_main_option("version_locations"),
                config.get_main_option("file_template"),
            )
            with _lock:
                script = _kept.get(key)
            if script is None:
                script = read(cls, config)
                with _lock:
                    script = _kept.setdefault(key, script)
            return script

        ScriptDirectory.from_config = classmethod(from_config)  # type: ignore[assignment, method-assign]
        _installed = True

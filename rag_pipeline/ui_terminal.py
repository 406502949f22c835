"""What `make ui` shows in its terminal: warnings, errors, and one line per run start and end.

``dg dev --log-level warning`` quiets the webserver and the daemon, but each run worker logs
to the same terminal through its own console logger, at DEBUG unless the run's config says
otherwise (a run launched from the UI says nothing): a line per event, and every line of a
multi-line message. This filter, between ``dg dev`` and the terminal, keeps a log record only
at WARNING or above (with its continuation lines: a traceback, a list), every line this
project writes for a run (:data:`RUN_LINE_PREFIX`), and any other output that is not a log
record. Run as ``dg dev ... 2>&1 | python -m rag_pipeline.ui_terminal``.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Iterator
from typing import TextIO

__all__ = ["RUN_LINE_PREFIX", "keep_lines", "main"]

#: the start of every line the project's runs write to the terminal (see defs.location)
RUN_LINE_PREFIX = "[rag_pipeline]"
#: the head of a record of Dagster's console format: ``2026-12-05 07:00:00 +0000 - dagster -
#: DEBUG - ...`` (colours, if any, around the level)
_RECORD = re.compile(
    r"^(?:\x1b\[[0-9;]*m)?\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4}(?:\x1b\[[0-9;]*m)?"
    r" - [\w.]+ - (?:\x1b\[[0-9;]*m)?(?P<level>[A-Z]+)"
)
_SHOWN_LEVELS = {"WARNING", "ERROR", "CRITICAL", "FATAL"}


def keep_lines(lines: Iterable[str]) -> Iterator[str]:
    """The lines worth a person's terminal, in order."""
    keeping = True  # output before any record (a startup error) is shown
    for line in lines:
        if line.startswith(RUN_LINE_PREFIX):
            keeping = True
            yield line
            continue
        record = _RECORD.match(line)
        if record is not None:
            keeping = record["level"] in _SHOWN_LEVELS
        if keeping:
            yield line


def main(stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout) -> None:
    try:
        for line in keep_lines(stdin):
            stdout.write(line)
            stdout.flush()
    except KeyboardInterrupt:  # Ctrl-C reaches the whole pipeline: dg dev shuts down itself
        pass


if __name__ == "__main__":
    main()

"""Run ``rag-pipeline`` and hold it at a named phase of live mode until the test says go
(fault injection for tests: a change timed against the run's phases).

    python -m rag_pipeline_tests.phasepoint DIR [rag-pipeline arguments...]

The phases: ``scan`` (a live look has just scanned the books, before anything runs), ``read``
(the run has read and parsed the changed files), ``write`` (the run has written the points
and document records). A phase holds only when armed: the test creates ``DIR/arm-PHASE``;
the process, on reaching the phase, removes it, creates ``DIR/at-PHASE`` and waits (at most
60 s) for ``DIR/go-PHASE``, which it removes before going on. Nothing in the product knows
about this: the phases are patches installed before the CLI runs.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PHASES = ("scan", "read", "write")


class Phases:
    """The test's side: arm a phase, wait until the process holds there, let it go on."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def arm(self, *phases: str) -> None:
        for phase in phases:
            (self.folder / f"arm-{phase}").touch()

    def wait(self, phase: str, timeout: float = 60.0) -> None:
        at = self.folder / f"at-{phase}"
        deadline = time.monotonic() + timeout
        while not at.exists():
            if time.monotonic() > deadline:
                raise AssertionError(f"live mode never reached its {phase} phase")
            time.sleep(0.005)
        at.unlink()

    def go(self, phase: str) -> None:
        (self.folder / f"go-{phase}").touch()


def _hold(folder: Path, phase: str) -> None:
    arm = folder / f"arm-{phase}"
    if not arm.exists():
        return
    arm.unlink()
    (folder / f"at-{phase}").touch()
    go = folder / f"go-{phase}"
    deadline = time.monotonic() + 60
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    go.unlink(missing_ok=True)


def _after(folder: Path, phase: str, module: Any, name: str) -> None:
    real: Callable[..., Any] = getattr(module, name)

    def patched(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        _hold(folder, phase)
        return result

    setattr(module, name, patched)


def install(folder: Path) -> None:
    from rag_pipeline.ingest import live, pipeline

    _after(folder, "scan", live, "scan_books")
    _after(folder, "read", pipeline.IngestPipeline, "parse")
    _after(folder, "write", pipeline.IngestPipeline, "write")


if __name__ == "__main__":
    install(Path(sys.argv[1]))
    from rag_pipeline.cli import main

    main(sys.argv[2:], prog_name="rag-pipeline")

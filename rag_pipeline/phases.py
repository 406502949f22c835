"""Where a command's time went: the wall and CPU seconds at the end of each of its phases,
counted from the process's start (what ``rag-pipeline ingest --json`` reports as ``phases``,
and ``bench/change_cost.py`` breaks a change's cost down by)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

__all__ = ["Phases", "process_age_s"]


def process_age_s() -> float:
    """Wall seconds since this process started (Linux's ``/proc``; elsewhere 0.0: the
    phases then count from the first mark's caller)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            # the command's name (field 2) may hold spaces: the fields after its ")"
            started_ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime", encoding="ascii") as fh:
            uptime_s = float(fh.read().split()[0])
        return max(0.0, uptime_s - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


@dataclass
class Phases:
    """The phases of one command, in order: name -> (wall s, CPU s) at its end, since the
    process started. A phase marked again keeps its first end (a rebuild's second ingest)."""

    _origin: float = field(default_factory=lambda: time.perf_counter() - process_age_s())
    marks: dict[str, tuple[float, float]] = field(default_factory=dict)

    def mark(self, name: str) -> None:
        """The phase ``name`` ends now."""
        if name not in self.marks:
            self.marks[name] = (time.perf_counter() - self._origin, time.process_time())

    def as_dict(self) -> dict[str, dict[str, float]]:
        """name -> ``{"at_s", "cpu_s"}`` (since the start) and ``{"wall_s"}`` (the phase's own
        length: since the previous phase's end)."""
        out: dict[str, dict[str, float]] = {}
        before = 0.0
        for name, (at, cpu) in self.marks.items():
            out[name] = {
                "at_s": round(at, 3),
                "wall_s": round(at - before, 3),
                "cpu_s": round(cpu, 3),
            }
            before = at
        return out

"""Progress of a long step as log lines: done/total, rate and time left, at a sane interval."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["ProgressLog"]


class ProgressLog:
    """Call it with ``(done, total)``; it logs at most every ``every_s`` seconds (and at the
    end) a line such as ``embedding: 320/1200 chunks, 24.1 chunks/s, about 36s left``."""

    def __init__(
        self,
        what: str,
        log: Callable[[str], None],
        *,
        unit: str = "chunks",
        every_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what = what
        self.unit = unit
        self.every_s = every_s
        self._log = log
        self._clock = clock
        self._started = clock()
        self._last = self._started

    def __call__(self, done: int, total: int) -> None:
        now = self._clock()
        if done < total and now - self._last < self.every_s:
            return
        self._last = now
        self._log(self.line(done, total, now - self._started))

    def line(self, done: int, total: int, elapsed: float) -> str:
        rate = done / elapsed if elapsed > 0 else 0.0
        text = f"{self.what}: {done}/{total} {self.unit}, {rate:.1f} {self.unit}/s"
        if done < total and rate > 0:
            text += f", about {_duration((total - done) / rate)} left"
        elif done >= total:
            text += f", done in {_duration(elapsed)}"
        return text


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 90:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"

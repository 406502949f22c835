"""Progress of a long step as log lines: done/total, rate and time left, at a sane interval."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

__all__ = ["ProgressLog"]

#: how fast the rate estimate follows a change of speed (seconds of past work that count)
RATE_TAU_S = 30.0


class ProgressLog:
    """Call it with ``(done, total)`` and, when the work is weighed in tokens, ``(tokens_done,
    tokens_total)``; it logs at most every ``every_s`` seconds (and at the end) a line such as
    ``embedding: 320/1200 chunks, 24.1 chunks/s, about 36s left``.

    Time left is the work left divided by a rate smoothed over about ``RATE_TAU_S`` seconds,
    in tokens when they are given: texts are embedded shortest first, so a rate in chunks
    would promise the long tail at the speed of the short head (3x too optimistic on a
    926-chunk book)."""

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
        self._seen = (self._started, 0.0)  # (time, work done) at the previous call
        self._rate: float | None = None  # smoothed work per second

    def __call__(
        self, done: int, total: int, tokens_done: int | None = None, tokens_total: int | None = None
    ) -> None:
        now = self._clock()
        work, work_total = (done, total) if tokens_done is None else (tokens_done, tokens_total)
        self._update_rate(now, float(work))
        if done < total and now - self._last < self.every_s:
            return
        self._last = now
        left = None
        if done < total and self._rate:
            left = (float(work_total or 0) - work) / self._rate
        self._log(self.line(done, total, now - self._started, left))

    def _update_rate(self, now: float, work: float) -> None:
        then, before = self._seen
        elapsed = now - then
        if elapsed <= 0:
            return
        instant = (work - before) / elapsed
        if self._rate is None:
            self._rate = instant
        else:  # exponential smoothing by time: a long interval weighs more
            weight = 1.0 - math.exp(-elapsed / RATE_TAU_S)
            self._rate += weight * (instant - self._rate)
        self._seen = (now, work)

    def line(self, done: int, total: int, elapsed: float, left: float | None = None) -> str:
        rate = done / elapsed if elapsed > 0 else 0.0
        text = f"{self.what}: {done}/{total} {self.unit}, {rate:.1f} {self.unit}/s"
        if done < total and left is not None and left >= 0:
            text += f", about {_duration(left)} left"
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

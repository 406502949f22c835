"""Run ``rag-pipeline`` with Dagster's step retries waiting a hundredth of their policy's delay
(for tests whose step fails on every attempt: the retries still happen, the 20 s of sleep
between them prove nothing).

    python -m rag_pipeline_tests.quickretry LOG [rag-pipeline arguments...]

Each delay a policy is asked for is appended to the file LOG, one a line (Dagster asks on every
failed attempt of a step that has a policy, the last included), so that a test can check that
the retries were in its path. Nothing in the product knows about this; the suite's
``quick_step_retries`` fixture does the same in the test process.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

#: a retry waits this fraction of what its policy asks
FRACTION = 0.01


def shortened(real: Callable[[Any, int], float], asked: Callable[[float], None]) -> Any:
    """``RetryPolicy.calculate_delay`` (``real``) shortened to :data:`FRACTION`, each delay
    asked of it passed to ``asked`` first."""

    def calculate_delay(policy: Any, attempt_num: int) -> float:
        delay = float(real(policy, attempt_num))
        asked(delay)
        return delay * FRACTION

    return calculate_delay


def install(log: str) -> None:
    from dagster import RetryPolicy

    def record(delay: float) -> None:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"{delay}\n")

    RetryPolicy.calculate_delay = shortened(RetryPolicy.calculate_delay, record)  # type: ignore[method-assign]


if __name__ == "__main__":
    install(sys.argv[1])
    from rag_pipeline.cli import main

    main(sys.argv[2:], prog_name="rag-pipeline")

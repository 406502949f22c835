"""The local run launcher, with a health check so run monitoring can find dead run workers.

Dagster's ``DefaultRunLauncher`` starts each run in a subprocess but cannot tell whether that
process is still alive, so under ``dagster dev`` a run worker killed by ``kill -9`` or the OOM
killer stays STARTED forever and keeps its pool slots. This launcher answers the daemon's run
monitoring (enabled in ``dagster.yaml``) from the run's recorded process: a dead worker's run is
marked failed, its slots are freed after ``free_slots_after_run_end_seconds``, and
``run_retries`` launches it again.
"""

from __future__ import annotations

from typing import Any

from dagster import DagsterRun, DefaultRunLauncher

from rag_pipeline.defs._dagster_private import CheckRunHealthResult, WorkerStatus
from rag_pipeline.defs.reaper import run_worker, worker_alive

__all__ = ["LocalRunLauncher"]


class LocalRunLauncher(DefaultRunLauncher):
    """``DefaultRunLauncher`` plus a worker health check for run monitoring."""

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        worker = run_worker(self._instance, run)
        if worker is None:
            # no process recorded (run monitoring treats anything but RUNNING as a failure):
            # the start timeout and the maximum runtime still cover such a run
            return CheckRunHealthResult(WorkerStatus.RUNNING, "no worker process recorded")
        record = self._instance.get_run_record_by_id(run.run_id)
        started = record.start_time if record is not None else None
        if worker_alive(worker, started):
            return CheckRunHealthResult(WorkerStatus.RUNNING)
        return CheckRunHealthResult(
            WorkerStatus.FAILED, f"the run worker process ({worker}) no longer exists"
        )

    @classmethod
    def from_config_value(cls, inst_data: Any, config_value: Any) -> LocalRunLauncher:
        return cls(inst_data=inst_data)

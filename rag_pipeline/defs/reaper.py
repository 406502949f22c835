"""Runs whose process died: found, marked failed, their pool slots freed.

A run whose process is killed (``kill -9``, the OOM killer, a power cut) stays STARTED in
Dagster's run storage and keeps the pool slots its steps claimed: every later run waiting for
those slots would wait forever. Each run records which process runs it, either as tags (runs the
CLI executes in process: :func:`process_tags`) or as Dagster's own "Started process for run
(pid: N)" engine event (runs a launcher started). A run is dead when that process no longer
exists, or when a process that started after the run has taken over its pid. A run the CLI
created in process but could not start (its process failed in between: a full
``DAGSTER_HOME``) stays NOT_STARTED, which nothing else moves: it is reaped the same way.

:func:`reap_dead_runs` is called by the CLI before it starts runs; the daemon does the same
through the health check of :class:`rag_pipeline.defs.launcher.LocalRunLauncher`
under run monitoring.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from dagster import DagsterEventType, DagsterInstance, DagsterRun, DagsterRunStatus, RunsFilter

from rag_pipeline.defs.runs import HIDDEN_TAG_PREFIX, PARENT_RUN_TAG

__all__ = [
    "HOST_TAG",
    "PID_TAG",
    "STARTED_TAG",
    "RunWorker",
    "free_slots",
    "process_tags",
    "reap_dead_runs",
    "run_worker",
    "worker_alive",
]

#: the process that executes a run, as the run's own tags say it: hidden in the UI (nobody
#: filters runs by them)
PID_TAG = f"{HIDDEN_TAG_PREFIX}rag/pid"
HOST_TAG = f"{HIDDEN_TAG_PREFIX}rag/host"
#: its start time (seconds since the epoch): a reused pid is not the run's process
STARTED_TAG = f"{HIDDEN_TAG_PREFIX}rag/process_started"
#: the same tags as runs recorded before they were hidden have them: still reaped
_OLD_KEYS = {PID_TAG: "rag/pid", HOST_TAG: "rag/host", STARTED_TAG: "rag/process_started"}
_LIVE_STATUSES = [DagsterRunStatus.STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.CANCELING]
#: a run a process executes itself (it has :func:`process_tags`) is created NOT_STARTED and
#: started by that same process at once: one whose process is gone failed in between (a full
#: ``DAGSTER_HOME``) and nothing else would ever start or end it
_CREATED = DagsterRunStatus.NOT_STARTED


@dataclass(frozen=True, slots=True)
class RunWorker:
    """The process that executes a run."""

    pid: int
    host: str | None  # None: launched by a local launcher, so on this host
    started_at: float | None = None  # the process's own start time, when recorded

    def __str__(self) -> str:
        return f"pid {self.pid}" + (f" on {self.host}" if self.host else "")


def process_tags() -> dict[str, str]:
    """Tags naming this process as the one that executes a run."""
    started = process_started_at(os.getpid())
    tags = {PID_TAG: str(os.getpid()), HOST_TAG: socket.gethostname()}
    if started is not None:
        tags[STARTED_TAG] = f"{started:.2f}"
    return tags


def run_worker(instance: DagsterInstance, run: DagsterRun) -> RunWorker | None:
    """Which process executes ``run``, if it said so."""
    tags = _process_tags_of(run)
    if PID_TAG in tags:
        try:
            started = float(tags[STARTED_TAG]) if STARTED_TAG in tags else None
            return RunWorker(int(tags[PID_TAG]), tags.get(HOST_TAG), started)
        except ValueError:
            return None
    records = instance.get_records_for_run(
        run.run_id, of_type=DagsterEventType.ENGINE_EVENT, limit=20
    ).records
    for record in records:
        event = record.event_log_entry.dagster_event
        data = event.engine_event_data if event is not None else None
        pid = data.metadata.get("pid") if data is not None and data.metadata else None
        if pid is not None and "Started process for run" in (record.event_log_entry.message or ""):
            try:
                return RunWorker(int(str(pid.value)), None)
            except ValueError:
                return None
    return None


def _process_tags_of(run: DagsterRun) -> dict[str, str]:
    """The run's process tags, under their current keys, read from either key; none on a
    re-execution (the tags it copied name its parent's process; a launcher's run worker
    executes it)."""
    if PARENT_RUN_TAG in run.tags:
        return {}
    return {
        key: value
        for key, old in _OLD_KEYS.items()
        if (value := run.tags.get(key, run.tags.get(old))) is not None
    }


def worker_alive(worker: RunWorker, run_started_at: float | None) -> bool:
    """Whether the run's process still exists (and is the same process, not a reused pid)."""
    try:
        os.kill(worker.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    if _is_zombie(worker.pid):
        return False
    started = process_started_at(worker.pid)
    if started is None:
        return True
    if worker.started_at is not None:
        return abs(started - worker.started_at) < 2.0
    # a process that started after the run began cannot be the run's worker
    return run_started_at is None or started <= run_started_at + 2.0


def reap_dead_runs(
    instance: DagsterInstance, *, log: Callable[[str], None] | None = None
) -> list[str]:
    """Mark failed every run of this host whose process died, and free its pool slots."""
    host = socket.gethostname()
    reaped = []
    for record in instance.get_run_records(RunsFilter(statuses=[*_LIVE_STATUSES, _CREATED])):
        run = record.dagster_run
        if run.status == _CREATED and (PID_TAG not in run.tags or run.parent_run_id):
            # a run to be launched (the UI's, a launcher's; a re-execution copies the tags of
            # the run it re-executes): not ours to end
            continue
        worker = run_worker(instance, run)
        if worker is None or (worker.host is not None and worker.host != host):
            continue
        started = record.start_time or (record.create_timestamp.timestamp())
        if worker_alive(worker, started):
            continue
        message = (
            f"The process that ran this run ({worker}) died without finishing it (killed or "
            "crashed); marked failed so that its pool slots are freed and later runs start."
            if run.status != _CREATED
            else f"The process that created this run ({worker}) ended before it could start it "
            "(a full DAGSTER_HOME, say); marked failed: nothing else would ever start it."
        )
        instance.report_run_failed(run, message)
        free_slots(instance, run.run_id)
        reaped.append(run.run_id)
        if log:
            log(f"run {run.run_id} of {run.job_name}: {message}")
    return reaped


def free_slots(instance: DagsterInstance, run_id: str) -> None:
    """Free the pool slots a run still holds."""
    storage = instance.event_log_storage
    if storage.supports_global_concurrency_limits:
        storage.free_concurrency_slots_for_run(run_id)


def process_started_at(pid: int) -> float | None:
    """When a process started (seconds since the epoch), from /proc; None elsewhere."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        ticks = int(fields[19])  # field 22 of the whole line: starttime, in clock ticks
        return _boot_time() + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


_boot: list[float] = []


def _boot_time() -> float:
    if not _boot:
        with open("/proc/stat", "rb") as fh:
            for line in fh:
                if line.startswith(b"btime"):
                    _boot.append(float(line.split()[1]))
                    break
            else:
                _boot.append(time.time() - time.monotonic())
    return _boot[0]

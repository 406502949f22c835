"""Every name taken from Dagster's private modules (``dagster._*``), in one place.

Each is used because no public API serves (checked against ``dir(dagster)`` for the pinned
release); a Dagster upgrade that moves one breaks this module alone. A test fails on any other
``dagster._`` import in ``rag_pipeline/``. The one private attribute used is here too
(:func:`add_partition_metadata`).
"""

import contextlib
import threading
import types
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from dagster import (
    AssetExecutionContext,
    DagsterInstance,
    DagsterRun,
    ExecuteInProcessResult,
    JobDefinition,
)

# the materialization a check evaluated: AssetCheckEvaluation takes it (a run of several
# partitions records each book's check as an evaluation of its own partition)
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)

# an existing run executed in this process, its outputs captured (execute_in_process creates
# its run itself, with no origin and the snapshot of a copy of the job: neither can be passed
# to it); the same calls as its own
from dagster._core.definitions.job_base import InMemoryJob

# the repository a Definitions object makes (GraphQL's repositoryName; no public constant)
from dagster._core.definitions.repository_definition.valid_definitions import (
    SINGLETON_REPOSITORY_NAME,
)

# the latest check result of one partition: get_asset_check_execution_history filters by it
from dagster._core.event_api import PartitionKeyFilter

# with InMemoryJob: the calls execute_in_process makes, which execute_created_run repeats
from dagster._core.execution.api import (
    ExecuteRunWithPlanIterable,
    create_execution_plan,
    job_execution_iterator,
)
from dagster._core.execution.context_creation_job import (
    PlanOrchestrationContextManager,
    orchestration_context_event_generator,
)
from dagster._core.execution.execute_in_process import merge_run_tags

# the plan a created run executes (create_execution_plan's result; only typed here)
from dagster._core.execution.plan.plan import ExecutionPlan

# validates dagster.yaml without opening its storages: DagsterInstance.get() would create them
from dagster._core.instance.config import dagster_instance_config

# a run worker's health for run monitoring: RunLauncher.check_run_worker_health must return it
from dagster._core.launcher import CheckRunHealthResult, WorkerStatus

# the origin of a run of the code location's job (what a sensor's or the UI's run carries):
# DagsterInstance.create_run_for_job takes it, no public constructor makes it
from dagster._core.remote_origin import (
    ManagedGrpcPythonEnvCodeLocationOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
)

# the states of a check execution record: the history's status filter and what a record says
from dagster._core.storage.asset_check_execution_record import (
    COMPLETED_ASSET_CHECK_EXECUTION_RECORD_STATUSES,
    AssetCheckExecutionRecordStatus,
)

# the SQLite storages of a home instance, whose connections kept_sqlite_engines reuses
from dagster._core.storage.event_log.sqlite.sqlite_event_log import (
    INDEX_SHARD_NAME,
    SqliteEventLogStorage,
)
from dagster._core.storage.runs.sqlite.sqlite_run_storage import SqliteRunStorage
from dagster._core.storage.schedules.sqlite.sqlite_schedule_storage import SqliteScheduleStorage
from dagster._core.storage.sqlite import SQLITE_BUSY_TIMEOUT_SECONDS
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from sqlalchemy import Connection, Engine, create_engine, event

from rag_pipeline.defs.migration_scripts import keep_migration_scripts


def add_partition_metadata(
    context: AssetExecutionContext, partition_key: str, metadata: Mapping[str, Any]
) -> None:
    """``metadata`` on the materialization of the step's asset for ``partition_key``: what
    ``context.add_asset_metadata(metadata, partition_key=...)`` records, without its check
    that the key is one of the run's (it loads every key of the dynamic partitions at each
    call: a batch's step would load them once per book). The caller passes only keys of
    ``context.partition_keys``."""
    step = context.op_execution_context._step_execution_context
    step._metadata_accumulator = step._metadata_accumulator.with_additional_asset_metadata(
        asset_key=context.assets_def.key, metadata=metadata, partition_key=partition_key
    )


def without_output_capture(instance: DagsterInstance) -> None:
    """Runs this instance executes in this process no longer capture its stdout and stderr.
    Dagster captures them for a run's whole execution by pointing the process's descriptors
    1 and 2 at the run's log file (``dup2``), and back at the end: two runs executing at once
    in threads (live mode) left them pointing at the first run's file, and the process's own
    output went there. The project's steps log through Dagster's logger, not print."""
    from dagster._core.storage.noop_compute_log_manager import NoOpComputeLogManager

    manager = NoOpComputeLogManager()
    manager.register_instance(instance)
    instance._compute_log_manager = manager


def location_job_origin(location: str, module: str, attribute: str, job: str) -> RemoteJobOrigin:
    """The origin of a run of ``job`` of the code location ``location`` (the Python module
    ``module``'s ``attribute``, as workspace.yaml loads it): the same origin a run the sensor
    or the UI launches carries, so the run lists under the job and can be re-executed."""
    target = LoadableTargetOrigin(module_name=module, attribute=attribute)
    code_location = ManagedGrpcPythonEnvCodeLocationOrigin(target, location)
    return RemoteJobOrigin(RemoteRepositoryOrigin(code_location, SINGLETON_REPOSITORY_NAME), job)


@dataclass(frozen=True)
class LocationRun:
    """A run recorded (NOT_STARTED) as a run of the code location's job, to be executed in
    this process by :func:`execute_created_run`."""

    job_def: JobDefinition
    job: InMemoryJob
    plan: ExecutionPlan
    run: DagsterRun
    run_config: Mapping[str, Any]


def create_location_run(
    job_def: JobDefinition,
    origin: RemoteJobOrigin,
    *,
    instance: DagsterInstance,
    run_id: str,
    run_config: Mapping[str, Any],
    tags: Mapping[str, str],
    partition_key: str | None = None,
) -> LocationRun:
    """Record a run of ``job_def`` as a run of the code location's job: with ``origin``, and
    the job's own snapshot (the one the code location serves; execute_in_process records that
    of a copy with its executor and IO manager swapped). Nothing executes yet."""
    keep_migration_scripts()  # the run's event shard is created below: its schema checked
    job = InMemoryJob(job_def)
    plan = create_execution_plan(
        job,
        run_config=run_config,
        instance_ref=instance.get_ref() if instance.is_persistent else None,
    )
    run = instance.create_run_for_job(
        job_def=job_def,
        execution_plan=plan,
        run_id=run_id,
        run_config=run_config,
        tags=merge_run_tags(job_def, partition_key, tags, None, instance, run_config),
        remote_job_origin=origin,
    )
    return LocationRun(job_def, job, plan, run, run_config)


def execute_created_run(created: LocationRun, instance: DagsterInstance) -> ExecuteInProcessResult:
    """What ``job_def.execute_in_process(...)`` does, for a run :func:`create_location_run`
    recorded. The job must run in process (its executor and IO manager keep everything in
    this process) and bind every resource. Failures are reported, not raised."""
    output_capture: dict[Any, Any] = {}
    events = list(
        ExecuteRunWithPlanIterable(
            execution_plan=created.plan,
            iterator=job_execution_iterator,
            execution_context_manager=PlanOrchestrationContextManager(
                context_event_generator=orchestration_context_event_generator,
                job=created.job,
                execution_plan=created.plan,
                dagster_run=created.run,
                instance=instance,
                run_config=created.run_config,
                executor_defs=None,
                output_capture=output_capture,
                raise_on_error=False,
            ),
        )
    )
    return ExecuteInProcessResult(
        event_list=events,
        dagster_run=instance.get_run_by_id(created.run.run_id) or created.run,
        output_capture=output_capture,
        job_def=created.job_def,
    )


#: database files whose engine :func:`kept_sqlite_engines` keeps at once: the runs, index and
#: schedules databases and the shards of the last runs (a long-lived process runs many)
KEPT_ENGINES = 6


class _Engines:
    """One SQLAlchemy engine per SQLite file, the least recently used disposed past
    :data:`KEPT_ENGINES`; ``created`` counts the engines made (what a test counts)."""

    def __init__(self) -> None:
        self._engines: OrderedDict[str, Engine] = OrderedDict()
        self._lock = threading.Lock()
        self.created = 0

    def get(self, conn_string: str, connect_args: Mapping[str, Any]) -> Engine:
        with self._lock:
            engine = self._engines.get(conn_string)
            if engine is not None:
                self._engines.move_to_end(conn_string)
                return engine
            # a file database gets SQLAlchemy's QueuePool: its sqlite3 connections are kept
            # between statements (and shared between threads, as SQLAlchemy allows for files)
            engine = create_engine(conn_string, connect_args=dict(connect_args))
            event.listen(engine, "connect", _write_ahead_without_fsync_per_commit)
            self._engines[conn_string] = engine
            self.created += 1
            while len(self._engines) > KEPT_ENGINES:
                # a connection checked out of it stays usable until it is returned
                self._engines.popitem(last=False)[1].dispose()
            return engine

    def dispose(self) -> None:
        with self._lock:
            for engine in self._engines.values():
                engine.dispose()
            self._engines.clear()


#: the settings of every SQLite connection :func:`kept_sqlite_engines` opens (see
#: :func:`_write_ahead_without_fsync_per_commit`)
SQLITE_CONNECTION_PRAGMAS = ("PRAGMA journal_mode=WAL", "PRAGMA synchronous=NORMAL")


def _write_ahead_without_fsync_per_commit(dbapi_connection: Any, _record: Any) -> None:
    """Dagster puts every database of a SQLite home in WAL mode (a run's new shard right
    after its tables are created) and leaves SQLite's default ``synchronous=FULL``: each
    commit waits for an ``fsync`` of the log, 3-12 ms on this VM's shared disk, about a
    hundred times for a one-book run (its events, the index's rows, the run's updates), and
    a new shard's twenty ``CREATE`` statements, before its WAL mode, each a journal's
    fsyncs. With WAL set first and ``synchronous=NORMAL`` a commit no longer waits: what a
    ``kill -9`` of the process leaves is unchanged (every commit is in the log file, which
    the next opener reads), and the database stays sound after a power loss or an OS crash,
    which may lose its last commits (SQLite's documented trade); the fsync happens at each
    checkpoint."""
    cursor = dbapi_connection.cursor()
    try:
        for pragma in SQLITE_CONNECTION_PRAGMAS:
            cursor.execute(pragma)
    finally:
        cursor.close()


@contextlib.contextmanager
def kept_sqlite_engines(instance: DagsterInstance) -> Iterator[_Engines]:
    """While the block runs, the instance's SQLite storages (runs, event log with its run
    shards, schedules) reuse one engine per database file and its connections. Dagster's
    SQLite storages create an engine, open a connection and dispose of both for every
    statement, and once more to ask whether a table exists (before most partition and check
    queries): a one-book run's 61 events made 324 engines, half the CPU of writing them.
    Every write is still its own committed transaction, as before, so what other processes
    read and what a ``kill -9`` leaves are the same. Other storages (PostgreSQL) keep their
    own pools: nothing is changed for them. The engines are disposed of when the block ends."""
    engines = _Engines()
    patched: list[tuple[object, str]] = []
    events = instance.event_log_storage
    if isinstance(events, SqliteEventLogStorage):
        events._connect = types.MethodType(_event_log_connect(engines), events)  # type: ignore[method-assign]
        events.has_table = types.MethodType(_has_table(engines), events)  # type: ignore[method-assign]
        patched += [(events, "_connect"), (events, "has_table")]
    for storage in (instance.run_storage, instance.schedule_storage):
        if isinstance(storage, SqliteRunStorage | SqliteScheduleStorage):
            storage.connect = types.MethodType(_storage_connect(engines), storage)  # type: ignore[method-assign]
            patched.append((storage, "connect"))
    try:
        yield engines
    finally:
        for patched_storage, name in patched:
            delattr(patched_storage, name)  # the class's own method again
        engines.dispose()


def _event_log_connect(engines: _Engines) -> Any:
    """``SqliteEventLogStorage._connect`` with the file's kept engine: the same lock, the
    same first-use schema check of each shard, the same transaction per connection."""

    @contextlib.contextmanager
    def connect(self: SqliteEventLogStorage, shard: str) -> Iterator[Connection]:
        with self._db_lock:
            engine = engines.get(
                self.conn_string_for_shard(shard), {"timeout": SQLITE_BUSY_TIMEOUT_SECONDS}
            )
            if shard not in self._initialized_dbs:
                self._initdb(engine)
                self._initialized_dbs.add(shard)
            with engine.connect() as conn, conn.begin():
                yield conn

    return connect


def _has_table(engines: _Engines) -> Any:
    """``SqliteEventLogStorage.has_table`` on the index's kept engine, a table found
    remembered (Dagster's migrations add tables, never drop them)."""
    found: set[str] = set()

    def has_table(self: SqliteEventLogStorage, table_name: str) -> bool:
        if table_name in found:
            return True
        engine = engines.get(
            self.conn_string_for_shard(INDEX_SHARD_NAME), {"timeout": SQLITE_BUSY_TIMEOUT_SECONDS}
        )
        with engine.connect() as conn:
            present = bool(engine.dialect.has_table(conn, table_name))
        if present:
            found.add(table_name)
        return present

    return has_table


def _storage_connect(engines: _Engines) -> Any:
    """``SqliteRunStorage.connect`` (and the schedule storage's, the same code) with the
    file's kept engine: one transaction per connection, as theirs."""

    @contextlib.contextmanager
    def connect(self: SqliteRunStorage | SqliteScheduleStorage) -> Iterator[Connection]:
        engine = engines.get(self._conn_string, {})
        with engine.connect() as conn, conn.begin():
            yield conn

    return connect


__all__ = [
    "COMPLETED_ASSET_CHECK_EXECUTION_RECORD_STATUSES",
    "KEPT_ENGINES",
    "SQLITE_CONNECTION_PRAGMAS",
    "AssetCheckEvaluationTargetMaterializationData",
    "AssetCheckExecutionRecordStatus",
    "CheckRunHealthResult",
    "LocationRun",
    "PartitionKeyFilter",
    "RemoteJobOrigin",
    "WorkerStatus",
    "add_partition_metadata",
    "create_location_run",
    "dagster_instance_config",
    "execute_created_run",
    "kept_sqlite_engines",
    "location_job_origin",
    "without_output_capture",
]

"""Every name taken from Dagster's private modules (``dagster._*``), in one place.

Each is used because no public API serves (checked against ``dir(dagster)`` for the pinned
release); a Dagster upgrade that moves one breaks this module alone. A test fails on any other
``dagster._`` import in ``rag_pipeline/``.
"""

# the materialization a check evaluated: AssetCheckEvaluation takes it (a run of several
# partitions records each book's check as an evaluation of its own partition)
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)

# the latest check result of one partition: get_asset_check_execution_history filters by it
from dagster._core.event_api import PartitionKeyFilter

# validates dagster.yaml without opening its storages: DagsterInstance.get() would create them
from dagster._core.instance.config import dagster_instance_config

# a run worker's health for run monitoring: RunLauncher.check_run_worker_health must return it
from dagster._core.launcher import CheckRunHealthResult, WorkerStatus

# the states of a check execution record: the history's status filter and what a record says
from dagster._core.storage.asset_check_execution_record import (
    COMPLETED_ASSET_CHECK_EXECUTION_RECORD_STATUSES,
    AssetCheckExecutionRecordStatus,
)

__all__ = [
    "COMPLETED_ASSET_CHECK_EXECUTION_RECORD_STATUSES",
    "AssetCheckEvaluationTargetMaterializationData",
    "AssetCheckExecutionRecordStatus",
    "CheckRunHealthResult",
    "PartitionKeyFilter",
    "WorkerStatus",
    "dagster_instance_config",
]

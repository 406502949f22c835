"""Every name taken from Dagster's private modules (``dagster._*``), in one place.

Each is used because no public API serves (checked against ``dir(dagster)`` for the pinned
release); a Dagster upgrade that moves one breaks this module alone. A test fails on any other
``dagster._`` import in ``rag_pipeline/``. The one private attribute used is here too
(:func:`add_partition_metadata`).
"""

from collections.abc import Mapping
from typing import Any

from dagster import AssetExecutionContext

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


__all__ = [
    "COMPLETED_ASSET_CHECK_EXECUTION_RECORD_STATUSES",
    "AssetCheckEvaluationTargetMaterializationData",
    "AssetCheckExecutionRecordStatus",
    "CheckRunHealthResult",
    "PartitionKeyFilter",
    "WorkerStatus",
    "add_partition_metadata",
    "dagster_instance_config",
]

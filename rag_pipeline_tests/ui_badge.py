"""The check badge of an asset graph node as the Dagster UI (1.13) draws it, computed from the
webserver's GraphQL answer: what a person sees on ``documents`` without a browser."""

from __future__ import annotations

from typing import Any

__all__ = ["CHECKS", "node_badge", "ui_check_status"]

#: a check's latest result and its per-partition statuses: what the asset graph node reads
CHECKS = """query Check($path: [String!]!) { assetNodeOrError(assetKey: {path: $path}) {
 ... on AssetNode { assetChecksOrError { ... on AssetChecks { checks { name
  executionForLatestMaterialization { status evaluation { severity } }
  partitionStatuses { ... on AssetCheckDefaultPartitionStatuses { succeededPartitions
   failedPartitions inProgressPartitions skippedPartitions executionFailedPartitions }
  } } } } } } }"""


def ui_check_status(check: dict[str, Any]) -> str:
    """The UI's status of one check (ui-core's asset-checks util, 1.13): a partitioned check
    with a failed partition is WARN or ERROR by the severity of its newest record's evaluation
    (none while planned: ERROR), else in progress, skipped, succeeded or not evaluated."""
    latest = check["executionForLatestMaterialization"] or {}
    warn = (latest.get("evaluation") or {}).get("severity") == "WARN"
    parts = check["partitionStatuses"] or {}
    if not any(parts.values()):
        status = latest.get("status")
        if status is None:
            return "NOT_EVALUATED"
        return ("WARN" if warn else "ERROR") if status in ("FAILED", "EXECUTION_FAILED") else status
    if parts["failedPartitions"] or parts["executionFailedPartitions"]:
        return "WARN" if warn else "ERROR"
    for key, status in (
        ("inProgressPartitions", "IN_PROGRESS"),
        ("skippedPartitions", "SKIPPED"),
        ("succeededPartitions", "SUCCEEDED"),
    ):
        if parts[key]:
            return status
    return "NOT_EVALUATED"


def node_badge(checks: list[dict[str, Any]]) -> str:
    """The node's badge as the asset graph draws it: an icon (red ✕ for any ERROR, yellow ⚠
    for any WARN, a dot for skipped, else a green ✓) and "N / M Passed"."""
    statuses = [ui_check_status(c) for c in checks]
    icon = (
        "red ✕"
        if "ERROR" in statuses
        else "yellow ⚠"
        if "WARN" in statuses
        else "dot"
        if "SKIPPED" in statuses
        else "green ✓"
    )
    return f"{icon} {statuses.count('SUCCEEDED')} / {len(statuses)} Passed"

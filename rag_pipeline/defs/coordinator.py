"""The run coordinator ``dagster.yaml`` names: Dagster's run queue, plus the parse_errors
check restated as each run that plans it is submitted.

A run launched from the UI (Materialize, a backfill) plans every check of the assets it
selects, parse_errors included. From that moment until the run's documents step evaluates the
book again (the queue, the run worker's start, the assessment: minutes for a big book), the
check's newest record is "planned" with no severity, and Dagster OSS's asset graph draws that
as a red ✕ "0 / 1 Passed" on ``documents`` while any book warns, or a green ✓ beside "0 / 1
Passed" while none does. Restating each of the run's books against its latest documents
materialization (what executing the check on its own does) right after the run is created
keeps the badge on what is known: yellow while a book has broken files, green otherwise. The
run still evaluates its new materialization as before.
"""

from __future__ import annotations

import logging

from dagster import (
    DagsterEvent,
    DagsterEventType,
    DagsterInstance,
    DagsterRun,
    QueuedRunCoordinator,
    SubmitRunContext,
)

from rag_pipeline.defs.parse_check import parse_errors_again
from rag_pipeline.defs.partitions import BOOKS_PARTITIONS_NAME
from rag_pipeline.defs.runs import RANGE_START_TAG, books_of_run

__all__ = ["BookRunCoordinator", "restate_planned_checks"]

logger = logging.getLogger(__name__)


def restate_planned_checks(run: DagsterRun, instance: DagsterInstance) -> int:
    """Restate parse_errors for the books of ``run`` when the run plans it; the count."""
    from rag_pipeline.defs.assets import PARSE_ERRORS  # the definitions, once a process

    if PARSE_ERRORS not in (run.asset_check_selection or ()):
        return 0
    tags = run.tags
    order = (
        instance.get_dynamic_partitions(BOOKS_PARTITIONS_NAME) if RANGE_START_TAG in tags else []
    )
    count = 0
    for evaluation in parse_errors_again(instance, PARSE_ERRORS, books_of_run(tags, order)):
        # recorded in the run, it is the result of the row the run planned (a runless one
        # would be older than that row, and Dagster keeps one runless row per partition)
        event = DagsterEvent(
            event_type_value=DagsterEventType.ASSET_CHECK_EVALUATION.value,
            job_name=run.job_name,
            event_specific_data=evaluation,
            message=f"parse_errors of {evaluation.partition} restated from its latest "
            "documents materialization as the run was submitted",
        )
        instance.report_dagster_event(event, run_id=run.run_id)
        count += 1
    return count


class BookRunCoordinator(QueuedRunCoordinator):
    """``QueuedRunCoordinator`` that restates the checks a submitted run plans."""

    def submit_run(self, context: SubmitRunContext) -> DagsterRun:
        try:
            restate_planned_checks(context.dagster_run, self._instance)
        except Exception:  # the badge is cosmetic: never refuse a run for it
            logger.warning(
                "could not restate parse_errors for run %s",
                context.dagster_run.run_id,
                exc_info=True,
            )
        return super().submit_run(context)

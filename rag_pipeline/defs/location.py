"""The code location's definitions, bound to resources built by the caller.

:func:`build_defs` binds the assets, jobs and sensor to resources built elsewhere
(``rag_pipeline.definitions`` from the environment, the CLI from the settings it already has).
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from dagster import (
    BackfillPolicy,
    BetaWarning,
    DagsterEventType,
    Definitions,
    InitResourceContext,
    ResourceDefinition,
    in_process_executor,
)

from rag_pipeline.config import DEFAULT_SENSOR_INTERVAL_S, BatchConfig
from rag_pipeline.defs.assets import (
    NO_RUN_CONFIG,
    chunk_embeddings,
    ingestion_assets,
    ingestion_checks,
)
from rag_pipeline.defs.collection import collection_job, collection_sensor, qdrant_collection
from rag_pipeline.defs.io import run_memory_io_manager
from rag_pipeline.defs.jobs import ingest_books_job, purge_book_job
from rag_pipeline.defs.runs import run_ended_line, run_started_line
from rag_pipeline.embed.registry import kind_of
from rag_pipeline.ingest.pipeline import IngestPipeline
from rag_pipeline.store.lock import holding_for
from rag_pipeline.store.sharing import kept_open

__all__ = [
    "LOCATION_ATTRIBUTE",
    "LOCATION_MODULE",
    "LOCATION_NAME",
    "build_defs",
    "fixed_resources",
]

#: the code location, as workspace.yaml (``make ui``) and pyproject's [tool.dg] load it: the
#: CLI's and live mode's runs are recorded as runs of its jobs
LOCATION_NAME = "rag_pipeline"
LOCATION_MODULE = "rag_pipeline.definitions"
LOCATION_ATTRIBUTE = "defs"

# Definitions re-creates every sensor that targets a job and passes its (empty) owners list
# along, which Dagster itself reports as use of a beta parameter: not ours to act on.
warnings.filterwarnings(
    "ignore",
    message=r"Parameter `owners` of initializer `SensorDefinition.__init__`",
    category=BetaWarning,
)


#: what a run config entry for a resource is told to do instead
DEPLOYMENT_SETTINGS = (
    "A deployment setting: set it in the environment (RAG_* variables, see the README), "
    "not in run config; a run may only ask to force a rebuild"
)


def _kept_for_the_run(pipeline: IngestPipeline, announce: bool) -> ResourceDefinition:
    """The pipeline, whose store handles a run keeps open from step to step (a book's shard
    is loaded once per run, not once per step) until another process waits for them, and
    closes when the run ends; no run config (the Launchpad refuses any entry: a hard-coded
    resource would accept and ignore anything). ``announce``: write a line to the terminal
    when the run starts and when it ends (a run worker under ``make ui``)."""

    def for_the_run(context: InitResourceContext) -> Iterator[IngestPipeline]:
        run = context.run
        what = f"Dagster run {run.run_id} ({run.job_name})" if run else "a Dagster run"
        started = time.monotonic()
        if announce and run:
            say(run_started_line(run.run_id, run.job_name, run.tags))
        try:
            with kept_open(), holding_for(what):
                yield pipeline
        finally:
            if announce and run:
                failed = (
                    context.instance.get_records_for_run(
                        run.run_id, of_type=DagsterEventType.STEP_FAILURE, limit=1
                    ).records
                    if context.instance
                    else []
                )
                say(run_ended_line(run.run_id, time.monotonic() - started, failed=bool(failed)))

    return ResourceDefinition(
        resource_fn=for_the_run,
        config_schema=NO_RUN_CONFIG,
        description=f"{pipeline.description}. {DEPLOYMENT_SETTINGS}",
    )


def fixed_resources(pipeline: IngestPipeline, *, announce: bool = False) -> dict[str, Any]:
    """The resources, bound so that no run can override them from its run config: the
    pipeline every step calls a stage of, and the IO manager that keeps their outputs in
    the run's memory. ``announce``: each run writes a line to the terminal when it starts
    and ends (the code location's run workers; not the CLI's runs, which report
    themselves)."""
    return {
        "io_manager": run_memory_io_manager,
        "pipeline": _kept_for_the_run(pipeline, announce),
    }


def say(line: str) -> None:
    """One line on the terminal of the process tree (stderr: never a command's output)."""
    print(line, file=sys.stderr, flush=True)


def build_defs(
    resources: Mapping[str, Any],
    *,
    embedder: str = "local",
    sensors: bool = False,
    sensor_interval_s: int = DEFAULT_SENSOR_INTERVAL_S,
    batching: BatchConfig | None = None,
) -> Definitions:
    """The code location's definitions, with its sensors when ``sensors`` (they watch the
    ``pipeline`` resource's source). ``batching``: how many books one run takes, for the
    sensor and for backfills."""
    from rag_pipeline.defs.sensors import build_books_sensor

    batching = batching or BatchConfig()
    watching = (
        [build_books_sensor(interval_s=sensor_interval_s, batching=batching), collection_sensor]
        if sensors
        else []
    )
    kind = kind_of(embedder).ui_kind  # what the UI shows as the embedding step's kind
    # a backfill of many books runs them in batches (one range of partitions per run), as the
    # sensor and the CLI do
    policy = BackfillPolicy.multi_run(batching.max_books)
    assets = [
        (
            a.map_asset_specs(lambda spec: spec.replace_attributes(kinds={kind}))
            if a.key == chunk_embeddings.key
            else a
        ).with_attributes(backfill_policy=policy)
        for a in ingestion_assets
    ]
    return Definitions(
        # One process per run: steps share the store handle and the loaded model, and a run
        # launched from the UI starts in seconds instead of one code load per step.
        executor=in_process_executor,
        assets=[*assets, qdrant_collection],
        asset_checks=ingestion_checks,
        jobs=[ingest_books_job, purge_book_job, collection_job],
        sensors=watching,
        resources=dict(resources),
    )

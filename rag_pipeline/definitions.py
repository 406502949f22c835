"""The Dagster code location: assets, jobs, sensors and checks bound to resources from env vars.

Environment (all optional): see the README's configuration table. Settings are read once,
here; a bad setting fails the code location's load with a message naming the variable.
"""

from __future__ import annotations

from dagster import Definitions

from rag_pipeline.config import Settings, load_settings
from rag_pipeline.defs.location import build_defs, fixed_resources
from rag_pipeline.ingest.pipeline import IngestPipeline

__all__ = ["build_definitions", "defs"]


def build_definitions(settings: Settings | None = None) -> Definitions:
    settings = settings or load_settings()
    # its runs are launched by the daemon: each says on the terminal when it starts and ends
    resources = fixed_resources(IngestPipeline.from_settings(settings), announce=True)
    return build_defs(
        resources,
        embedder=settings.embedder,
        sensors=True,
        sensor_interval_s=settings.sensor_interval_s,
        batching=settings.batching(),
    )


defs = build_definitions()

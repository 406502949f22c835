"""The Dagster code location: assets, jobs, sensors and checks bound to resources from env vars.

Environment (all optional): RAG_DATA_DIR, RAG_QDRANT_PATH, RAG_QDRANT_URL, RAG_QDRANT_API_KEY,
RAG_QDRANT_EMBEDDED, RAG_COLLECTION, RAG_EMBEDDER (local|openai|hash), RAG_LOCAL_MODEL_DIR,
OPENAI_API_KEY, OPENAI_BASE_URL, RAG_CHUNK_*, RAG_SENSOR_INTERVAL_S (see README).
"""

from __future__ import annotations

import os

from dagster import Definitions, EnvVar, in_process_executor

from rag_pipeline.config import ChunkingConfig, Settings, load_settings
from rag_pipeline.defs.assets import ingestion_assets
from rag_pipeline.defs.io import BookPartitionIOManager
from rag_pipeline.defs.jobs import ingest_books_job, purge_book_job
from rag_pipeline.defs.sensors import build_books_sensor, sensor_interval_s
from rag_pipeline.resources import BookSourceResource, EmbedderResource, QdrantStoreResource

__all__ = ["build_definitions", "defs"]


def _secret(name: str, present: bool) -> EnvVar | None:
    # EnvVar keeps the secret out of run configs and the UI; it must only be used when set.
    return EnvVar(name) if present else None


def build_resources(settings: Settings, chunking: ChunkingConfig) -> dict[str, object]:
    return {
        "io_manager": BookPartitionIOManager(),
        "books": BookSourceResource(
            data_dir=str(settings.data_dir),
            path_patterns=list(settings.path_patterns),
            max_file_bytes=settings.max_file_bytes,
            default_hardware_tier=settings.default_hardware_tier,
            chunk_target_tokens=chunking.target_tokens,
            chunk_max_tokens=chunking.max_tokens,
            chunk_min_tokens=chunking.min_tokens,
            chunk_overlap=chunking.overlap,
        ),
        "qdrant": QdrantStoreResource(
            collection=settings.collection,
            path=settings.qdrant_path,
            url=settings.qdrant_url,
            api_key=_secret("RAG_QDRANT_API_KEY", settings.qdrant_api_key is not None),
            embedded=settings.qdrant_embedded,
            busy_wait_s=settings.busy_wait_s,
        ),
        "embedder": EmbedderResource(
            provider=settings.embedder,
            local_model_dir=str(settings.local_model_dir) if settings.local_model_dir else None,
            cache_dir=str(settings.cache_dir),
            batch_size=settings.embed_batch_size,
            openai_api_key=_secret(
                "OPENAI_API_KEY" if os.environ.get("OPENAI_API_KEY") else "RAG_OPENAI_API_KEY",
                settings.openai_api_key is not None,
            ),
            openai_model=settings.openai_model,
            openai_base_url=settings.openai_base_url,
            openai_max_retries=settings.openai_max_retries,
            openai_timeout_s=settings.openai_timeout_s,
        ),
    }


def build_definitions(
    settings: Settings | None = None, chunking: ChunkingConfig | None = None
) -> Definitions:
    settings = settings or load_settings()
    return Definitions(
        # One process per run: steps share the store handle and the loaded model, and a run
        # launched from the UI starts in seconds instead of one code load per step.
        executor=in_process_executor,
        assets=ingestion_assets,
        jobs=[ingest_books_job, purge_book_job],
        sensors=[build_books_sensor(settings.data_dir, interval_s=sensor_interval_s())],
        resources=build_resources(settings, chunking or ChunkingConfig()),
    )


defs = build_definitions()

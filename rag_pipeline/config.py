"""Settings read from the environment (``RAG_*``, ``OPENAI_*``); no dagster import here."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = [
    "DEFAULT_PATH_PATTERNS",
    "ChunkingConfig",
    "Settings",
    "SourceConfig",
    "ensure_dagster_home",
    "load_settings",
]

# Regexes with named groups ``module``, ``chapter``, ``lesson`` matched against a file's path
# relative to its book folder. Every pattern is tried; the first match wins per field.
DEFAULT_PATH_PATTERNS: tuple[str, ...] = (
    r"(?:^|/)(?P<module>module-\d+[^/]*)/",
    r"(?:^|/)chapter-(?P<chapter>\d+)[^/]*/",
    r"(?:^|/)\d+-chapter-(?P<chapter>\d+)[^/]*/",
    r"(?:^|/)ch(?:apter-)?(?P<chapter>\d+)-[^/]*\.mdx?$",
    r"(?:^|/)(?:page|lesson)-(?P<lesson>\d+)[^/]*\.mdx?$",
    r"(?:^|/)week-\d+-lesson-(?P<lesson>\d+)[^/]*\.mdx?$",
    r"(?:^|/)\d+-lesson-(?P<lesson>\d+)[^/]*\.mdx?$",
    r"chapter-\d+[^/]*/(?P<lesson>\d+)-[^/]*\.mdx?$",
)


class ChunkingConfig(BaseSettings):
    """Token budget of the chunker (counted with the embedder's own tokenizer)."""

    model_config = SettingsConfigDict(env_prefix="RAG_CHUNK_", frozen=True)

    target_tokens: int = Field(400, ge=16)
    max_tokens: int = Field(512, ge=16)
    min_tokens: int = Field(100, ge=0)
    overlap: float = Field(0.15, ge=0.0, lt=0.5)


@dataclass(frozen=True, slots=True)
class SourceConfig:
    """Where books are and how their files are read."""

    data_dir: Path
    path_patterns: tuple[str, ...] = DEFAULT_PATH_PATTERNS
    max_file_bytes: int = 10 * 1024 * 1024
    default_hardware_tier: int | None = 1


class Settings(BaseSettings):
    """Everything the pipeline, the CLI and the Dagster definitions read from the environment."""

    model_config = SettingsConfigDict(
        env_prefix="RAG_", frozen=True, extra="ignore", populate_by_name=True
    )

    data_dir: Path = Path("data/books")
    qdrant_path: str = ".rag/qdrant"
    qdrant_url: str | None = None
    qdrant_api_key: SecretStr | None = None
    # collection layout on a server / cluster (ignored by the embedded stores)
    qdrant_shards: int | None = Field(None, ge=1)
    qdrant_replication_factor: int | None = Field(None, ge=1)
    qdrant_timeout_s: float = Field(30.0, gt=0)
    qdrant_retries: int = Field(4, ge=1)
    # Engine for the embedded folder: "edge" (Qdrant Edge: payload indexes, fast filtered and
    # sparse search) or "client" (qdrant-client local mode: brute force in Python). Measured
    # in docs/benchmarks.md.
    qdrant_embedded: Literal["client", "edge"] = "edge"
    collection: str = "rag_chunks"
    cache_dir: Path = Path(".rag/cache")
    embedder: Literal["local", "openai", "hash"] = "local"
    local_model_dir: Path | None = None
    embed_batch_size: int = Field(32, ge=1)
    openai_api_key: SecretStr | None = Field(
        None, validation_alias=AliasChoices("OPENAI_API_KEY", "RAG_OPENAI_API_KEY")
    )
    openai_base_url: str | None = Field(
        None, validation_alias=AliasChoices("OPENAI_BASE_URL", "RAG_OPENAI_BASE_URL")
    )
    openai_model: str = "text-embedding-3-small"
    openai_timeout_s: float = Field(30.0, gt=0)
    openai_max_retries: int = Field(5, ge=0)
    max_file_bytes: int = Field(10 * 1024 * 1024, ge=1)
    # how long a command waits for an embedded store that another process holds
    busy_wait_s: float = Field(30.0, ge=0)
    path_patterns: tuple[str, ...] = DEFAULT_PATH_PATTERNS
    default_hardware_tier: int = 1
    # Local model precision: fp32, int8 (ONNX Runtime dynamic quantization, its own
    # embedding_model name) or auto (int8 on CPUs with VNNI/AMX int8 instructions). See
    # docs/benchmarks.md for the speed and quality of each.
    local_precision: Literal["fp32", "int8", "auto"] = "fp32"
    # OpenAI: requests in flight at once within one embed call, and optional client-side
    # limits (none when unset) that no request goes over, in any 60-second window.
    openai_concurrency: int = Field(4, ge=1)
    openai_requests_per_minute: int | None = Field(None, ge=1)
    openai_tokens_per_minute: int | None = Field(None, ge=1)

    def source(self) -> SourceConfig:
        return SourceConfig(
            Path(self.data_dir),
            tuple(self.path_patterns),
            self.max_file_bytes,
            self.default_hardware_tier,
        )

    @field_validator("path_patterns", mode="before")
    @classmethod
    def _patterns_from_json(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(json.loads(value))
        return value

    @field_validator("qdrant_url", mode="before")
    @classmethod
    def _empty_url_is_none(cls, value: object) -> object:
        return value or None


def load_settings(**overrides: object) -> Settings:
    """Read settings from the environment, with explicit overrides winning."""
    return Settings(**overrides)  # type: ignore[arg-type]


def ensure_dagster_home(default: Path | str = ".dagster_home") -> Path:
    """``DAGSTER_HOME`` (set to ``./.dagster_home`` when unset), with a dagster.yaml in it:
    the project's own when run from the repository, else telemetry off."""
    home = Path(os.environ.get("DAGSTER_HOME") or Path(default).resolve())
    home.mkdir(parents=True, exist_ok=True)
    os.environ["DAGSTER_HOME"] = str(home)
    config = home / "dagster.yaml"
    if not config.exists():
        project_yaml = Path("dagster.yaml")
        config.write_text(
            project_yaml.read_text() if project_yaml.is_file() else "telemetry:\n  enabled: false\n"
        )
    return home

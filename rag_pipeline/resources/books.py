"""Dagster resource describing where the books are and how they are read and cut."""

from __future__ import annotations

from pathlib import Path

from dagster import ConfigurableResource
from pydantic import Field

from rag_pipeline.config import DEFAULT_PATH_PATTERNS, ChunkingConfig, SourceConfig

__all__ = ["BookSourceResource"]


class BookSourceResource(ConfigurableResource):
    """The books folder (one sub-folder per book) and the chunking budget."""

    data_dir: str = Field("data/books", description="folder holding one folder per book")
    path_patterns: list[str] = Field(
        list(DEFAULT_PATH_PATTERNS), description="regexes with module/chapter/lesson groups"
    )
    max_file_bytes: int = Field(10 * 1024 * 1024, description="larger files are refused")
    default_hardware_tier: int = Field(1, description="tier of documents that state none")
    chunk_target_tokens: int = 400
    chunk_max_tokens: int = 512
    chunk_min_tokens: int = 100
    chunk_overlap: float = 0.15

    def source(self) -> SourceConfig:
        return SourceConfig(
            Path(self.data_dir),
            tuple(self.path_patterns),
            self.max_file_bytes,
            self.default_hardware_tier,
        )

    def chunking(self) -> ChunkingConfig:
        return ChunkingConfig(
            target_tokens=self.chunk_target_tokens,
            max_tokens=self.chunk_max_tokens,
            min_tokens=self.chunk_min_tokens,
            overlap=self.chunk_overlap,
        )

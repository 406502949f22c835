"""Where the books are and how their files are read."""

from __future__ import annotations

from pathlib import Path

from dagster import ConfigurableResource
from pydantic import Field

from rag_pipeline.config import Settings, SourceConfig

__all__ = ["BooksResource"]


# Dagster types ConfigurableResource as generic in its own value type, but subclasses are
# declared unparametrized (as its docs do): a parametrized base changes its pydantic model.
class BooksResource(ConfigurableResource):  # type: ignore[type-arg]
    """The books folder (one sub-folder per book) and how its files are read."""

    data_dir: str = Field(description="folder holding one folder per book (RAG_DATA_DIR)")
    path_patterns: list[str] = Field(description="regexes with module/chapter/lesson groups")
    max_file_bytes: int = Field(description="larger files are refused (RAG_MAX_FILE_BYTES)")
    default_hardware_tier: int = Field(description="tier of documents that state none")

    @classmethod
    def from_settings(cls, settings: Settings) -> BooksResource:
        source = settings.source()
        return cls(
            data_dir=str(source.data_dir),
            path_patterns=list(source.path_patterns),
            max_file_bytes=source.max_file_bytes,
            default_hardware_tier=settings.default_hardware_tier,
        )

    def source(self) -> SourceConfig:
        return SourceConfig(
            Path(self.data_dir),
            tuple(self.path_patterns),
            self.max_file_bytes,
            self.default_hardware_tier,
        )

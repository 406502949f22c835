"""Spies that pin the one path: every run's stages are the pipeline's, and no point of a book
is written or deleted outside the pipeline's write stage (used by the Dagster and CLI tests)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

#: the stages of the one pipeline, in their order
STAGES = ("assess", "parse", "chunk", "embed", "write")
#: the store calls that change a book's points
WRITES = ("upsert", "delete_ids", "delete_where")


@dataclass
class Spies:
    stages: list[str] = field(default_factory=list)
    writes: int = 0
    #: store writes made while no pipeline write stage ran (what must never happen)
    outside: list[str] = field(default_factory=list)
    _inside: threading.local = field(default_factory=threading.local)


@contextmanager
def pipeline_spies() -> Iterator[Spies]:
    """Record the pipeline stages called and every store write, and whether it was made
    inside the pipeline's write stage (the stages' own reads are not writes)."""
    from rag_pipeline.ingest.pipeline import IngestPipeline
    from rag_pipeline.store import VectorStore

    spies = Spies()
    monkeypatch = pytest.MonkeyPatch()
    for name in STAGES:
        real = getattr(IngestPipeline, name)

        def stage(self: Any, *args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            spies.stages.append(_name)
            depth = getattr(spies._inside, "depth", 0)
            spies._inside.depth = depth + (_name == "write")
            try:
                return _real(self, *args, **kw)
            finally:
                spies._inside.depth = depth

        monkeypatch.setattr(IngestPipeline, name, stage)
    for name in WRITES:
        real = getattr(VectorStore, name)

        def write(self: Any, *args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            spies.writes += 1
            if not getattr(spies._inside, "depth", 0):
                spies.outside.append(_name)
            return _real(self, *args, **kw)

        monkeypatch.setattr(VectorStore, name, write)
    try:
        yield spies
    finally:
        monkeypatch.undo()

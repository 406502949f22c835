"""Run ``rag-pipeline`` and kill it with SIGKILL at a named point (fault injection for tests).

    python -m rag_pipeline_tests.crashpoint POINT [rag-pipeline arguments...]

Nothing in the product knows about this: the points are patches installed before the CLI runs,
each of which ends the process the way ``kill -9`` or the OOM killer would, with no cleanup.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Any

POINTS = (
    "plan",  # deciding what to do, before Dagster is loaded
    "runner",  # Dagster loaded, no run created yet
    "source_files",  # each asset step of a run
    "documents",
    "chunks",
    "embed-batch",  # in the middle of embedding
    "upsert",  # half of a batch of chunk points written
    "commit",  # chunks written, document records not yet
    "delete",  # deleting the points the new ones replace
    "event",  # while Dagster writes the run's events
    "purge",  # deleting a removed book's points
)
#: live mode's (``watch``), in the run of a chunk holding MARKER, after its points' write
LIVE_POINTS = (
    "written",  # the points written under the run's id, the run recorded but not started
    "recording",  # the run's steps recording what was done (its write step)
    "recorded",  # every step recorded, the run's success event being written
)
#: the word that makes a live run die at a live point (the first catch-up runs on)
MARKER = "crashmarkerword"


def die() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def kill_in(module: Any, name: str, when: Callable[..., bool] = lambda *a, **k: True) -> None:
    real = getattr(module, name)

    def patched(*args: Any, **kwargs: Any) -> Any:
        if when(*args, **kwargs):
            die()
        return real(*args, **kwargs)

    setattr(module, name, patched)


def install(point: str) -> None:
    from rag_pipeline.defs import jobs, runner
    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline.ingest import pipeline, plan
    from rag_pipeline.store.base import VectorStore

    functions: dict[str, tuple[Any, str]] = {  # point -> where the process dies: a call of
        "plan": (plan, "plan_book"),
        "runner": (runner, "reap_dead_runs"),
        "source_files": (pipeline, "take_inventory"),
        "documents": (pipeline, "parse_book"),
        "chunks": (pipeline, "chunk_book"),
        "embed-batch": (HashEmbedder, "_embed_batch"),
        "purge": (jobs, "book_filter"),
    }
    if point in functions:
        kill_in(*functions[point])
    elif point in ("upsert", "commit"):
        real_upsert = VectorStore.upsert

        def upsert(self: VectorStore, points: Any) -> int:
            records = any(p.payload.get("record_type") == "document" for p in points)
            if point == "commit" and records:
                die()
            if point == "upsert" and not records and points:
                real_upsert(self, points[: len(points) // 2])
                die()
            return real_upsert(self, points)

        VectorStore.upsert = upsert  # type: ignore[method-assign]
    elif point == "delete":
        kill_in(VectorStore, "delete_ids", lambda self, where, ids: bool(ids))
    elif point == "event":
        from dagster import DagsterInstance

        calls = {"n": 0}

        def nth(*args: Any, **kwargs: Any) -> bool:
            calls["n"] += 1
            return calls["n"] == 25

        kill_in(DagsterInstance, "handle_new_event", nth)
    elif point in LIVE_POINTS:
        _install_live(point)
    else:
        raise SystemExit(f"unknown point {point!r}; known: {', '.join(POINTS + LIVE_POINTS)}")


def _install_live(point: str) -> None:
    """The points of a live run done work first (its points written before its events)."""
    import contextlib

    from dagster import DagsterEventType, DagsterInstance

    from rag_pipeline.ingest.pipeline import IngestPipeline, PreparedRun

    marked = {"run": False}

    def has_marker(prepared: PreparedRun) -> bool:
        chunked = prepared.outputs.get("chunk") or {}
        return any(MARKER in c.text for book in chunked.values() for c in book.chunks)

    real_replaying = IngestPipeline.replaying

    @contextlib.contextmanager
    def replaying(self: IngestPipeline, prepared: PreparedRun) -> Any:
        if prepared.written and has_marker(prepared):
            if point == "written":
                die()
            marked["run"] = True
        with real_replaying(self, prepared):
            yield

    IngestPipeline.replaying = replaying  # type: ignore[method-assign]
    if point == "recording":
        kill_in(IngestPipeline, "write", lambda *a, **k: marked["run"])
    else:

        def success(self: DagsterInstance, event: Any, **kwargs: Any) -> bool:
            kind = event.dagster_event.event_type if event.dagster_event else None
            return bool(marked["run"] and kind == DagsterEventType.RUN_SUCCESS)

        kill_in(DagsterInstance, "handle_new_event", success)


if __name__ == "__main__":
    install(sys.argv[1])
    from rag_pipeline.cli import main

    main(sys.argv[2:], prog_name="rag-pipeline")

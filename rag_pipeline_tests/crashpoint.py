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
    else:
        raise SystemExit(f"unknown point {point!r}; known: {', '.join(POINTS)}")


if __name__ == "__main__":
    install(sys.argv[1])
    from rag_pipeline.cli import main

    main(sys.argv[2:], prog_name="rag-pipeline")

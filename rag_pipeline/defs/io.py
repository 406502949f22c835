"""IO manager: what one step hands the next stays in the run's memory; nothing is written.

Qdrant holds the index. The parsed documents, chunks and vectors a step passes on are only
the run's working state, so they are kept in the run's process (the code location runs each
run in one process, see :mod:`rag_pipeline.defs.location`) and dropped with it: none of it is
written under ``$DAGSTER_HOME``. A step can only read what an earlier step of the same run
produced, so run retries re-run every step: ingest runs carry
``dagster/retry_strategy=ALL_STEPS`` (:data:`rag_pipeline.defs.runs.RETRY_ALL_STEPS`, on the
job's tags, and added by the first step to runs launched from the asset graph), which is cheap
because the stages are idempotent (vectors already in the index are reused). A step retried by
its ``RetryPolicy`` runs again in the same process and finds its inputs.
"""

from typing import Any

from dagster import (
    DagsterInvariantViolationError,
    InitResourceContext,
    InMemoryIOManager,
    InputContext,
    OutputContext,
    io_manager,
)

__all__ = ["READ_ONCE", "RunMemory", "run_memory_io_manager"]


#: outputs whose one reader has no retry policy (the chunks step reads the parsed documents):
#: let go once read, so a run does not hold its book's text until it ends (issue 40.4: a
#: first ingest's peak memory); the outputs the retried steps read stay for their retries
READ_ONCE = frozenset({"documents"})


class RunMemory(InMemoryIOManager):
    """Dagster's in-memory IO manager (``mem_io_manager``'s), one per run, whose miss says
    what happened: an input asked of a run that did not produce it (a step re-executed from
    failure, an asset materialized without the ones upstream of it). The outputs of
    :data:`READ_ONCE` are let go once read."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # Dagster's is not annotated

    def load_input(self, context: InputContext) -> Any:
        upstream = context.upstream_output
        if upstream is None:  # an input with no upstream step: nothing this run could hold
            raise DagsterInvariantViolationError(f"input {context.name!r} has no upstream step")
        if tuple(context.get_identifier()) not in self.values:
            raise DagsterInvariantViolationError(_not_in_this_run(context, upstream))
        value = super().load_input(context)
        if upstream.has_asset_key and upstream.asset_key.path[-1] in READ_ONCE:
            del self.values[tuple(context.get_identifier())]
        return value


def _not_in_this_run(context: InputContext, upstream: OutputContext) -> str:
    what = upstream.asset_key.to_user_string() if upstream.has_asset_key else upstream.step_key
    book = f" of book {context.asset_partition_key!r}" if context.has_asset_partitions else ""
    return (
        f"{what}{book} was not produced by this run: step outputs live only in the memory of "
        "the run that produced them (nothing is stored between runs; the index is in Qdrant). "
        "Materialize the whole ingestion group for the book (job ingest_books), or re-execute "
        "the run with all steps, not from failure."
    )


@io_manager(
    config_schema={},  # takes no run config: the Launchpad refuses any entry under it
    description="Keeps each step's output in the run's memory; writes nothing.",
)
def run_memory_io_manager(_: InitResourceContext) -> RunMemory:
    """A fresh :class:`RunMemory` for each run (runs executed one after another in one
    process, as the CLI does, never see each other's outputs)."""
    return RunMemory()

"""What a step of a run of several books records for each book: its metadata and its checks.

A run materializes one book partition, or a range of them (a batch: see
:mod:`rag_pipeline.ingest.batches`). Either way every book gets a materialization of its own,
with its own metadata (``context.add_asset_metadata(..., partition_key=book)``), and each of
its checks an evaluation of its own partition: ``AssetCheckResult`` cannot name a partition
(in a run of several it would be recorded for none), so the evaluations are built here, each
pointing at the book's materialization this run just recorded. A failed blocking check of any
book still fails the step, as Dagster's blocking checks do: the rest of the run's books are not
published either, and the run's books are then run one by one (the CLI at once, the sensor on
its next tick), which gives each its exact outcome.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetKey,
    AssetRecordsFilter,
    DagsterInstance,
    Failure,
    Output,
)

from rag_pipeline.defs._dagster_private import (
    AssetCheckEvaluationTargetMaterializationData,
    add_partition_metadata,
)
from rag_pipeline.models import InvalidBookIdError, validate_book_id

__all__ = [
    "BookCheck",
    "Materialized",
    "check_books",
    "latest_materializations",
    "record_book",
    "run_books",
]


def run_books(context: AssetExecutionContext) -> list[str]:
    """The books this run materializes, in partition order (one, or a batch). A partition
    key that is not a valid book id (one added by hand in the UI: the sensor adds only
    valid ones) fails the run at once, saying why, before any stage reads or writes."""
    books = list(context.partition_keys)
    refused = []
    for book_id in books:
        try:
            validate_book_id(book_id)
        except InvalidBookIdError as exc:
            refused.append(str(exc))
    if refused:
        raise Failure(
            description="; ".join(refused) + ": not a book this pipeline can ingest "
            "(delete the partition; book folders are added by the sensor)",
            allow_retries=False,
        )
    return books


def record_book(context: AssetExecutionContext, book_id: str, metadata: Mapping[str, Any]) -> None:
    """``metadata`` on the book's materialization of the step's asset (and no other book's),
    for a book of :func:`run_books`: what ``context.add_asset_metadata(..., partition_key=)``
    records, without its check of the key, which loads every partition key at each call."""
    add_partition_metadata(context, book_id, dict(metadata))


@dataclass(frozen=True)
class BookCheck:
    """One book's result of one check."""

    passed: bool
    metadata: Mapping[str, Any] = field(default_factory=dict)
    severity: AssetCheckSeverity = AssetCheckSeverity.ERROR
    #: what the result means, in words (the check's page shows it beside the result)
    description: str | None = None


def check_books(
    context: AssetExecutionContext, check_name: str, results: Mapping[str, BookCheck]
) -> Iterator[Output[None] | AssetCheckEvaluation]:
    """The check's output (a check the asset declares), then one evaluation per book, each
    of the book's partition and of the materialization this run recorded for it. Yield them
    after the asset's output. A check declared apart from the asset (not planned by the run)
    gets its evaluations only."""
    asset_key = context.assets_def.key
    check_key = AssetCheckKey(asset_key, check_name)
    blocking = False
    if check_key in context.assets_def.check_keys:
        blocking = context.assets_def.get_spec_for_check_key(check_key).blocking
        yield Output(
            None, output_name=context.assets_def.get_output_name_for_asset_check_key(check_key)
        )
    recorded = latest_materializations(context.instance, asset_key, list(results))
    run_id = context.run.run_id
    for book_id, result in results.items():
        found = recorded.get(book_id)
        yield AssetCheckEvaluation(
            asset_key=asset_key,
            check_name=check_name,
            passed=result.passed,
            metadata=result.metadata,
            severity=result.severity,
            description=result.description,
            blocking=blocking,
            partition=book_id,
            # the UI marks a check whose target is not the latest materialization as outdated
            target_materialization_data=found.target if found and found.run_id == run_id else None,
        )


@dataclass(frozen=True)
class Materialized:
    """A book's latest materialization of an asset."""

    run_id: str
    metadata: Mapping[str, Any]
    target: AssetCheckEvaluationTargetMaterializationData


def latest_materializations(
    instance: DagsterInstance, asset_key: AssetKey, books: Sequence[str]
) -> dict[str, Materialized]:
    """book -> its latest materialization of ``asset_key``: one query for the whole batch."""
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=asset_key, asset_partitions=list(books)),
        limit=len(books),
    ).records
    out: dict[str, Materialized] = {}
    for record in records:  # newest first: a book's latest is the first seen
        partition = record.partition_key
        materialization = record.asset_materialization
        if partition and partition not in out and materialization is not None:
            out[partition] = Materialized(
                run_id=record.run_id,
                metadata=materialization.metadata,
                target=AssetCheckEvaluationTargetMaterializationData(
                    storage_id=record.storage_id, run_id=record.run_id, timestamp=record.timestamp
                ),
            )
    return out

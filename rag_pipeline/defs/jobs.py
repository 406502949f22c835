"""Jobs: ingest one book (all assets), and purge a removed book's points."""

from typing import Any

from dagster import (
    AssetObservation,
    AssetSelection,
    Config,
    OpExecutionContext,
    ResourceParam,
    define_asset_job,
    job,
    op,
)

from rag_pipeline.defs.assets import (
    INGESTION_GROUP,
    PARSE_ERRORS,
    STORE_POOL,
    ingestion_assets,
    source_files,
)
from rag_pipeline.defs.runs import RETRY_ALL_STEPS, tag_run
from rag_pipeline.ingest.pipeline import IngestPipeline
from rag_pipeline.models import validate_book_id
from rag_pipeline.schema import book_filter

__all__ = [
    "INGEST_JOB_NAME",
    "PURGE_JOB_NAME",
    "ingest_books_job",
    "ingest_run_config",
    "purge_book_job",
    "purge_run_config",
]

#: the assets whose partition a purge empties: every ingestion asset
PURGED_ASSETS = tuple(a.key for a in ingestion_assets)
INGEST_JOB_NAME = "ingest_books"
PURGE_JOB_NAME = "purge_book"

ingest_books_job = define_asset_job(
    INGEST_JOB_NAME,
    # parse_errors is evaluated by the documents step, unplanned (see PARSE_ERRORS)
    selection=AssetSelection.groups(INGESTION_GROUP) - AssetSelection.checks(PARSE_ERRORS),
    description="Ingest one book: files -> documents -> chunks -> embeddings -> Qdrant points.",
    # its steps hand each other their outputs in memory: a retry re-runs them all
    tags=RETRY_ALL_STEPS,
)


def ingest_run_config(*, force: bool = False) -> dict[str, Any]:
    return {"ops": {source_files.op.name: {"config": {"force": force}}}}


class PurgeBookConfig(Config):
    book_id: str


@op(pool=STORE_POOL, description="Delete every point of one book (its folder was removed).")
def purge_book_points(
    context: OpExecutionContext,
    config: PurgeBookConfig,
    pipeline: ResourceParam[IngestPipeline],
) -> int:
    book_id = validate_book_id(config.book_id)
    tag_run(context, [book_id])
    source = pipeline.source
    with pipeline.store.open() as store:
        # Decided when the folder was gone, run later (queued, waiting for the store): if the
        # folder is back by now, its points are what the next ingest run builds on.
        if not source.is_gone(book_id):
            context.log.warning(f"book folder {book_id!r} is back: its points are kept")
            return 0
        if not source.exists():  # unmounted since: not a decision to delete
            context.log.warning(f"the {source.description} is missing: points kept")
            return 0
        # an embedded store removes the book's folder (every generation); a server deletes
        deleted = store.purge(book_filter(book_id))
    context.log.info(f"purged {deleted} points of removed book {book_id!r}")
    # The book's partition of every ingestion asset is now empty: say so on each of them as an
    # observation (a removal, not a new version of the asset: a materialization would read as
    # a green success and front the asset's page as its latest materialization).
    for key in PURGED_ASSETS:
        context.log_event(
            AssetObservation(
                asset_key=key,
                partition=book_id,
                description=f"book {book_id!r} purged: its folder was removed",
                metadata={"purged": True, "points_deleted": deleted, "points_in_book": 0},
            )
        )
    return deleted


@job(name=PURGE_JOB_NAME, description="Remove a deleted book's points from the collection.")
def purge_book_job() -> None:
    purge_book_points()


def purge_run_config(book_id: str) -> dict[str, Any]:
    return {"ops": {purge_book_points.name: {"config": {"book_id": book_id}}}}

"""Jobs: ingest books (all assets, one book partition per run)."""

from dagster import AssetSelection, define_asset_job

from rag_pipeline.defs.assets import INGESTION_GROUP
from rag_pipeline.defs.partitions import book_partitions_def

__all__ = ["INGEST_JOB_NAME", "ingest_books_job"]

INGEST_JOB_NAME = "ingest_books"

ingest_books_job = define_asset_job(
    INGEST_JOB_NAME,
    selection=AssetSelection.groups(INGESTION_GROUP),
    partitions_def=book_partitions_def,
    description="Ingest one book: files -> documents -> chunks -> embeddings -> Qdrant points.",
)

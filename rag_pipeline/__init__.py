"""rag_pipeline: Markdown books -> Dagster assets -> a Qdrant collection, with retrieval."""

__version__ = "0.1.0"

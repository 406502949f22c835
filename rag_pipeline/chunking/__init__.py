"""Chunking: the chunker interface (:class:`~.base.Chunker`) and its Markdown implementation,
the default of every recipe."""

from rag_pipeline.chunking.base import ChunkBudget, Chunker, TooManyBlocks, chunk_id, content_hash
from rag_pipeline.chunking.markdown import DEFAULT_CHUNKER, MarkdownChunker, chunk_document

__all__ = [
    "DEFAULT_CHUNKER",
    "ChunkBudget",
    "Chunker",
    "MarkdownChunker",
    "TooManyBlocks",
    "chunk_document",
    "chunk_id",
    "content_hash",
]

"""Retrieval: tenant-scoped search, context expansion, whole documents, lineage, evaluation.

Every function takes a ``book_id`` and cannot read across books.
"""

from rag_pipeline.retrieve.filters import SearchFilters, parse_equals
from rag_pipeline.retrieve.search import (
    DEFAULT_MODE,
    DEFAULT_RRF_K,
    Hit,
    SearchMode,
    expand_context,
    get_document,
    search,
)

__all__ = [
    "DEFAULT_MODE",
    "DEFAULT_RRF_K",
    "Hit",
    "SearchFilters",
    "SearchMode",
    "expand_context",
    "get_document",
    "parse_equals",
    "search",
]

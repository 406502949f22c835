"""Retrieval: tenant-scoped search, grouped search, context expansion, whole documents,
lineage, evaluation.

Every function takes a ``book_id`` and cannot read across books.
"""

from rag_pipeline.retrieve.filters import SearchFilters, parse_equals
from rag_pipeline.retrieve.search import (
    DEFAULT_FUSION,
    DEFAULT_GROUP_SIZE,
    DEFAULT_MODE,
    DEFAULT_RRF_K,
    FUSIONS,
    GROUP_KEYS,
    GroupBy,
    Hit,
    HitGroup,
    QueryEmbedder,
    SearchMode,
    expand_context,
    get_document,
    group_hits,
    search,
    search_groups,
)

__all__ = [
    "DEFAULT_FUSION",
    "DEFAULT_GROUP_SIZE",
    "DEFAULT_MODE",
    "DEFAULT_RRF_K",
    "FUSIONS",
    "GROUP_KEYS",
    "GroupBy",
    "Hit",
    "HitGroup",
    "QueryEmbedder",
    "SearchFilters",
    "SearchMode",
    "expand_context",
    "get_document",
    "group_hits",
    "parse_equals",
    "search",
    "search_groups",
]

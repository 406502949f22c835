"""Retrieval: tenant-scoped search, grouped search, context expansion, whole documents,
lineage.

Every function takes a ``book_id`` and cannot read across books.
"""

from rag_pipeline.retrieve import filters as _filters
from rag_pipeline.retrieve import search as _search
from rag_pipeline.retrieve.filters import *  # noqa: F403 - re-exported: its __all__ is the API
from rag_pipeline.retrieve.search import *  # noqa: F403 - re-exported: its __all__ is the API

__all__ = [*_filters.__all__, *_search.__all__]

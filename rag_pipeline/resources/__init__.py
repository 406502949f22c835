"""Dagster resources: the book source, the vector store and the index recipe.

Each is a ``ConfigurableResource`` whose fields are filled once from
:class:`~rag_pipeline.config.Settings` by ``definitions.py`` (or handed ready-made by the CLI),
and bound as a fixed resource: settings that define the index are deployment configuration,
never per-run Launchpad config (a run that changed the chunk budget would be undone, silently,
by the next sensor run).
"""

from rag_pipeline.resources.books import BooksResource
from rag_pipeline.resources.recipe import IndexRecipeResource
from rag_pipeline.resources.store import QdrantStoreResource

__all__ = ["BooksResource", "IndexRecipeResource", "QdrantStoreResource"]

"""The resources every run uses, built once from :class:`~rag_pipeline.config.Settings`.

Plain Python objects (Dagster documents them as resources: ``ResourceParam[...]``): the book
source (:class:`~rag_pipeline.config.SourceConfig`), the store opener and the index recipe,
built lazily once. ``defs.location.fixed_resources`` binds them so that no run config can
change them: settings that define the index are deployment configuration, never per-run
Launchpad config (a run that changed the chunk budget would be undone, silently, by the next
sensor run).
"""

from __future__ import annotations

from dataclasses import dataclass

from rag_pipeline.config import Settings, SourceConfig
from rag_pipeline.recipes.lazy import LazyRecipe
from rag_pipeline.recipes.recipe import IndexRecipe
from rag_pipeline.resources.store import StoreOpener

__all__ = ["LazyRecipe", "PipelineResources", "StoreOpener"]


@dataclass(frozen=True)
class PipelineResources:
    """The resources every run of one process shares: books, store, recipe."""

    books: SourceConfig
    qdrant: StoreOpener
    recipe: LazyRecipe

    @classmethod
    def from_settings(
        cls, settings: Settings, recipe: IndexRecipe | LazyRecipe | None = None
    ) -> PipelineResources:
        """The resources for ``settings``; ``recipe`` is every book's recipe, or the recipes
        already in use (their models loaded) of the same settings."""
        if not isinstance(recipe, LazyRecipe):
            recipe = LazyRecipe(settings.embedding(), settings.chunking(), recipe)
        return cls(books=settings.source(), qdrant=StoreOpener(settings.store()), recipe=recipe)

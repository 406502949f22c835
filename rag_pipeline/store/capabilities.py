"""What a store backend may declare beside the core contract (:class:`~.base.VectorStore`).

Every backend implements the core: points written, read, counted, searched, purged, per
tenant. A backend that can do more says so by implementing one of these interfaces, and
callers ask with :func:`catalog_of` / :func:`generations_of` (None: the backend has none):

* :class:`BookCatalog`: a small record per tenant (the pipeline's summary of a book) that
  whole-collection looks and plans read instead of the tenant's points;
* :class:`Generations`: a tenant's index for a new recipe built beside the one searched and
  switched in atomically, per tenant.

Qdrant Edge declares both (one shard per book); a Qdrant server and qdrant-client's local
mode declare neither: they write a recipe change in place, and every look reads the points.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from rag_pipeline.store.base import VectorStore

__all__ = [
    "BookCatalog",
    "Generations",
    "catalog_of",
    "generations_of",
    "saved_summary",
    "searched_recipe",
]


class BookCatalog(ABC):
    """A record kept per tenant, which the store vouches for until the tenant's next write
    (and, where the store can tell, until its data is changed by other hands)."""

    @abstractmethod
    def summaries(self) -> dict[str, dict[str, Any]]:
        """Every tenant's saved record that is still valid (see :meth:`summary`)."""

    @abstractmethod
    def summary(self, tenant: str) -> dict[str, Any] | None:
        """The tenant's saved record while it is still valid (none: absent, stale, damaged,
        or the handle builds the tenant beside), read without opening the tenant's data."""

    @abstractmethod
    def save_summary(self, tenant: str, data: Mapping[str, Any]) -> None:
        """Keep ``data`` as the tenant's record until its next write."""


class Generations(ABC):
    """Tenants whose index for a new recipe is built beside the searched one (a *pending*
    generation) and switched in atomically. A handle made a *builder* by
    :meth:`~.base.VectorStore.ensure_collection` with a recipe tag reads and writes a
    tenant whose searched index has another recipe in its pending generation; every other
    handle reads the searched (*current*) one."""

    @abstractmethod
    def current_recipe(self, tenant: str) -> dict[str, str] | None:
        """The recipe tag the tenant's searched index was built with (None: unknown)."""

    @abstractmethod
    def searched_recipe(self, tenant: str) -> dict[str, str] | None:
        """The recipe tag of the index this handle reads for ``tenant``, fixed for the
        handle's life (a search embeds its query with that generation's model, never one read
        from another)."""

    @abstractmethod
    def adopt_recipe(self, tenant: str, recipe: Mapping[str, str]) -> bool:
        """Record ``recipe`` as the tag of a tenant's searched index that has none (built
        before indexes were tagged), so that a builder of another recipe builds beside it.
        False when there is nothing to tag."""

    @abstractmethod
    def pending_recipe(self, tenant: str) -> dict[str, str] | None:
        """The recipe tag of a generation being built beside the current one (None: none)."""

    def recipes(self, tenant: str) -> tuple[dict[str, str] | None, dict[str, str] | None]:
        """:meth:`current_recipe` and :meth:`pending_recipe` in one look (the collection
        page asks both of every book)."""
        return self.current_recipe(tenant), self.pending_recipe(tenant)

    @abstractmethod
    def switch(self, tenant: str, *, keep_old: bool = False) -> bool:
        """Make the tenant's pending generation the searched one, atomically; the old one is
        removed (or kept, with ``keep_old``). False when nothing was pending."""

    @abstractmethod
    def drop_pending(self, tenant: str) -> bool:
        """Remove the tenant's pending generation (an unfinished build of a recipe no longer
        wanted), and what :meth:`leftovers` names; the searched one stays. False when none
        was pending."""

    def leftovers(self, tenant: str) -> list[str]:
        """What a switch or a drop killed half way left in the tenant's folder, nothing reads
        and only :meth:`drop_pending` (or the tenant's next write) removes ([]: nothing)."""
        return []


def catalog_of(store: VectorStore) -> BookCatalog | None:
    """The store's per-tenant catalog, if its backend keeps one."""
    return store if isinstance(store, BookCatalog) else None


def generations_of(store: VectorStore) -> Generations | None:
    """The store's generations, if its backend builds a recipe beside the searched index."""
    return store if isinstance(store, Generations) else None


def saved_summary(store: VectorStore, tenant: str) -> dict[str, Any] | None:
    """The tenant's saved record while the store vouches for it (None: none kept, or a
    store without a catalog)."""
    catalog = catalog_of(store)
    return None if catalog is None else catalog.summary(tenant)


def searched_recipe(store: VectorStore, tenant: str) -> dict[str, str] | None:
    """The recipe tag of the index ``store`` reads for ``tenant`` (None: a store without
    generations, which records the recipe only in the points)."""
    generations = generations_of(store)
    return None if generations is None else generations.searched_recipe(tenant)

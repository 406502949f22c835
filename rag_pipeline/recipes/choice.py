"""Which embedding model a book is built and searched with, decided in one place.

:func:`choose_book_model` is the rule, a pure function of the settings, what the book records
and the CPU:

- building (plan, ingest, eval): the configured model, except that
  ``RAG_LOCAL_PRECISION=auto`` never changes the precision of a book that already records an
  index of the same local model. An upgrade that makes ``auto`` the default re-embeds no
  book, and machines with different CPUs never give one book two precisions: the recorded
  recipe wins over ``auto``. An explicit ``fp32`` or ``int8`` that differs from the record is
  a migration: the book is embedded again, built beside its searched index and switched
  (see :mod:`rag_pipeline.ingest.migration`).
- searching: a query is embedded by the model the book records, whatever the settings say,
  so that a query vector is never compared with vectors of another model; a recorded model
  this process cannot produce is :class:`RecordedModelUnavailableError`.

What a book records is read by :func:`recorded_recipe` alone (the one function to switch to
the store's own record of a book's recipe when it has one). A search reads it through
:func:`searched_record`: the model of the very index the store handle searches (on a store
with generations, a book's recipe change is built beside and switched atomically).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from rag_pipeline.config import EmbedderConfig
from rag_pipeline.embed import (
    EmbedderUnavailableError,
    config_for_model,
    kind_of,
    missing_for_model,
    model_names,
)
from rag_pipeline.recipes.recipe import IndexRecipe
from rag_pipeline.schema import EMBEDDING_MODEL, SUMMARY_POINTS_BY_MODEL, chunks_of
from rag_pipeline.store import VectorStore
from rag_pipeline.store.capabilities import saved_summary, searched_recipe

__all__ = [
    "BookRecipe",
    "FixedRecipe",
    "ModelChoice",
    "Purpose",
    "RecipeSource",
    "RecordedModelUnavailableError",
    "RecordedRecipe",
    "choose_book_model",
    "most_common",
    "record_for",
    "recorded_recipe",
    "searched_record",
]

#: what a recipe is chosen for: writing a book's index, or embedding a query of the book
Purpose = Literal["build", "search"]


class RecordedModelUnavailableError(EmbedderUnavailableError):
    """A book is indexed with a model this process cannot embed queries with (another
    provider or model): searching it would compare vectors of two models. Failed work (the
    CLI exits 1, the service answers 503), fixed by the settings or by re-indexing the book."""


@dataclass(frozen=True)
class RecordedRecipe:
    """What a book's index records of how it was embedded."""

    #: the model of most of the book's chunks
    embedding_model: str
    #: chunks per recorded model: more than one while a change of model is half done
    models: Mapping[str, int] = field(default_factory=dict)

    @property
    def mixed(self) -> bool:
        return len(self.models) > 1


def most_common(counts: Mapping[str, int]) -> str | None:
    """The value counted most, ties to the first by name (so every process reads the same
    one); None without counts."""
    return min(counts, key=lambda value: (-counts[value], value)) if counts else None


def recorded_models(summary: Mapping[str, Any] | None) -> dict[str, int] | None:
    """Chunk points per embedding model, as the book's catalog entry saved them (None: no
    entry, or one without them)."""
    if summary is None or SUMMARY_POINTS_BY_MODEL not in summary:
        return None
    return {str(k): int(v) for k, v in dict(summary[SUMMARY_POINTS_BY_MODEL]).items()}


def recorded_recipe(store: VectorStore, book_id: str) -> RecordedRecipe | None:
    """The recipe the book's index records (None: nothing indexed). Read here and nowhere
    else: from the book's saved summary while the store vouches for it (no shard opened),
    else from the chunks' ``embedding_model`` (one facet on an indexed keyword field, a
    handful of values per book)."""
    models = recorded_models(saved_summary(store, book_id))
    if models is None:
        models = store.counts_by(chunks_of(book_id), EMBEDDING_MODEL)
    chosen = most_common(models)  # the model of most chunks
    return None if chosen is None else RecordedRecipe(chosen, dict(models))


def searched_record(store: VectorStore, book_id: str) -> RecordedRecipe | None:
    """What a search of the book embeds its query with: the model of the generation this
    handle reads (:meth:`~rag_pipeline.store.capabilities.Generations.searched_recipe`,
    pinned for the handle's life, so the query is never embedded for one index and compared
    with another), else the record."""
    tag = searched_recipe(store, book_id)
    model = tag.get(EMBEDDING_MODEL) if tag else None
    if model:
        return RecordedRecipe(model, {model: 0})
    return recorded_recipe(store, book_id)


def record_for(store: VectorStore, book_id: str, purpose: Purpose) -> RecordedRecipe | None:
    """The record a choice for ``purpose`` reads (see :func:`searched_record`)."""
    return (
        searched_record(store, book_id) if purpose == "search" else recorded_recipe(store, book_id)
    )


@dataclass(frozen=True)
class ModelChoice:
    """The model a book is built or searched with, and why."""

    embedding_model: str
    #: the local precision that produces it (fp32 or int8); None for the other providers
    precision: str | None
    #: the model the book's index records (None: nothing indexed yet)
    recorded_model: str | None
    reason: str

    @property
    def migration(self) -> bool:
        """Building with this choice embeds the book again with another model."""
        return self.recorded_model is not None and self.recorded_model != self.embedding_model


def _configured(config: EmbedderConfig, names: Mapping[str, str | None], fast_int8: bool) -> str:
    """The configured model of a new book (``auto``: int8 on CPUs with fast int8 kernels)."""
    if not kind_of(config).precisions:
        return next(iter(names))
    precision = config.local_precision
    if precision == "auto":
        precision = "int8" if fast_int8 else "fp32"
    return next(name for name, p in names.items() if p == precision)


def choose_book_model(
    config: EmbedderConfig,
    recorded_model: str | None,
    *,
    fast_int8: bool,
    purpose: Purpose = "build",
    book_id: str = "",
) -> ModelChoice:
    """The model the book is built (``purpose="build"``) or searched (``"search"``) with.

    ``recorded_model``: what the book's index records (see :func:`recorded_recipe`);
    ``fast_int8``: the CPU has VNNI/AMX int8 instructions (read only under ``auto``).
    Raises :class:`RecordedModelUnavailableError` for a search of a book recorded with a model
    this configuration cannot produce."""
    names = model_names(config)
    configured = _configured(config, names, fast_int8)
    if recorded_model is None:
        return ModelChoice(configured, names[configured], None, "nothing indexed yet")
    if recorded_model == configured:
        return ModelChoice(configured, names[configured], recorded_model, "as configured")
    if purpose == "search":
        producing = config_for_model(config, recorded_model)
        if producing is not None:  # another precision, or another provider's model
            return ModelChoice(
                recorded_model,
                producing.local_precision if kind_of(producing).precisions else None,
                recorded_model,
                "queries are embedded by the model the book records",
            )
        missing = missing_for_model(config, recorded_model)
        raise RecordedModelUnavailableError(
            f"book {book_id!r} is indexed with {recorded_model!r}, which this process cannot "
            f"embed queries with (RAG_EMBEDDER={config.provider} embeds with "
            f"{' or '.join(map(repr, names))}"
            + (
                f"; {missing}): set it"
                if missing
                else "): set RAG_EMBEDDER (and RAG_OPENAI_MODEL or RAG_LOCAL_MODEL_DIR) to "
                "the book's model"
            )
            + f", or index the book again with `rag-pipeline ingest --book {book_id}`"
        )
    auto = bool(kind_of(config).precisions) and config.local_precision == "auto"
    if auto and recorded_model in names:
        return ModelChoice(
            recorded_model,
            names[recorded_model],
            recorded_model,
            f"the recorded precision ({names[recorded_model]}) wins over auto",
        )
    return ModelChoice(
        configured,
        names[configured],
        recorded_model,
        f"recipe change: {recorded_model} -> {configured} (the book is embedded again)",
    )


@dataclass(frozen=True)
class BookRecipe:
    """The recipe one book is built or searched with, the choice behind it, the record."""

    recipe: IndexRecipe
    choice: ModelChoice
    recorded: RecordedRecipe | None


class RecipeSource(Protocol):
    """Hands out the recipe of each book, and of each embedding model a run meets
    (:class:`rag_pipeline.recipes.lazy.LazyRecipe`; :class:`FixedRecipe`)."""

    def for_book(
        self, store: VectorStore, book_id: str, *, purpose: Purpose = "build"
    ) -> BookRecipe: ...

    def for_model(self, embedding_model: str) -> IndexRecipe: ...

    @property
    def parse_version(self) -> str:
        """The parse rules every book's files are read with (``IndexRecipe.parse_version``),
        known without loading a model."""
        ...


@dataclass(frozen=True)
class FixedRecipe:
    """One recipe for every book (tests, a recipe built by hand): building with it migrates
    a book recorded with another model; searching such a book is refused."""

    recipe: IndexRecipe

    def for_book(
        self, store: VectorStore, book_id: str, *, purpose: Purpose = "build"
    ) -> BookRecipe:
        recorded = record_for(store, book_id, purpose)
        model = self.recipe.embedding_model
        recorded_model = recorded.embedding_model if recorded else None
        if purpose == "search" and recorded_model not in (None, model):
            raise RecordedModelUnavailableError(
                f"book {book_id!r} is indexed with {recorded_model!r}, but this process embeds "
                f"queries with {model!r} only: index the book again with "
                f"`rag-pipeline ingest --book {book_id}`, or serve it with its model"
            )
        reason = "nothing indexed yet" if recorded is None else "the fixed recipe"
        return BookRecipe(self.recipe, ModelChoice(model, None, recorded_model, reason), recorded)

    @property
    def parse_version(self) -> str:
        return self.recipe.parse_version

    def for_model(self, embedding_model: str) -> IndexRecipe:
        """The recipe, for a book built with it ("": a record older than the model names)."""
        if embedding_model not in ("", self.recipe.embedding_model):
            raise EmbedderUnavailableError(
                f"this recipe embeds with {self.recipe.embedding_model!r}, not {embedding_model!r}"
            )
        return self.recipe

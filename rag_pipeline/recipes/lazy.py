"""The index recipes (embedder, chunk budget, sparse encoder) of one process, each built on
first use: loading a model costs seconds a sensor tick or a purge never needs.

One process may need two: under ``RAG_LOCAL_PRECISION=auto`` a book indexed at fp32 stays fp32
while new books get int8 (:func:`rag_pipeline.recipes.choice.choose_book_model`), so recipes are
handed out per embedding model, each model loaded once."""

from __future__ import annotations

import threading
from collections.abc import Callable

from rag_pipeline import embed
from rag_pipeline.config import ChunkingConfig, EmbedderConfig
from rag_pipeline.embed import Embedder, EmbedError, config_for_model, model_names
from rag_pipeline.ingest.parse import PARSE_RULES_VERSION
from rag_pipeline.recipes.choice import (
    BookRecipe,
    FixedRecipe,
    ModelChoice,
    Purpose,
    choose_book_model,
    record_for,
)
from rag_pipeline.recipes.recipe import IndexRecipe, parse_version_of
from rag_pipeline.store import VectorStore

__all__ = ["LazyRecipe"]


def _cpu_has_fast_int8() -> bool:
    from rag_pipeline.embed import local

    return local.cpu_has_fast_int8()


class LazyRecipe:
    """Which embedding model turns a book's chunks into vectors, and the chunk budget it
    reads: the recipe of each book (:meth:`for_book`), of a model (:meth:`for_model`), or of
    a new book (:meth:`get`)."""

    def __init__(
        self,
        embedding: EmbedderConfig,
        chunking: ChunkingConfig,
        recipe: IndexRecipe | None = None,
        *,
        make_embedder: Callable[[EmbedderConfig], Embedder] | None = None,
    ) -> None:
        """``recipe``: one already built, then every book's (as :class:`FixedRecipe`);
        ``make_embedder``: how an embedder is built from its config (default
        :func:`rag_pipeline.embed.create_embedder`)."""
        self.embedding = embedding
        self.chunking = chunking
        self._make_embedder = make_embedder
        self._fixed = FixedRecipe(recipe) if recipe is not None else None
        self._recipes: dict[str, IndexRecipe] = {}
        if recipe is not None:
            self._recipes[recipe.embedding_model] = recipe
        self._fast_int8: bool | None = None
        self._lock = threading.Lock()

    @property
    def fixed(self) -> IndexRecipe | None:
        """The one recipe of every book, when the process was handed one (else None)."""
        return self._fixed.recipe if self._fixed is not None else None

    @property
    def provider(self) -> str:
        return self.embedding.provider

    @property
    def parse_version(self) -> str:
        if self._fixed is not None:
            return self._fixed.parse_version
        return parse_version_of(PARSE_RULES_VERSION, self.chunking.max_blocks)

    @property
    def description(self) -> str:
        return f"{self.provider} embedder, chunk budget {self.chunking.target_tokens}"

    def fast_int8(self) -> bool:
        """Whether ``auto`` means int8 here (read from the CPU once, only under ``auto``)."""
        if not embed.kind_of(self.embedding).precisions or self.embedding.local_precision != "auto":
            return False
        if self._fast_int8 is None:
            self._fast_int8 = _cpu_has_fast_int8()
        return self._fast_int8

    def choose(
        self, recorded_model: str | None, *, purpose: Purpose = "build", book_id: str = ""
    ) -> ModelChoice:
        """The model of a book recording ``recorded_model`` (see ``choose_book_model``)."""
        return choose_book_model(
            self.embedding,
            recorded_model,
            fast_int8=self.fast_int8(),
            purpose=purpose,
            book_id=book_id,
        )

    def get(self) -> IndexRecipe:
        """The recipe of a book with nothing indexed yet: the configured one."""
        if self._fixed is not None:
            return self._fixed.recipe
        return self.for_model(self.choose(None).embedding_model)

    def for_book(
        self, store: VectorStore, book_id: str, *, purpose: Purpose = "build"
    ) -> BookRecipe:
        """The recipe ``book_id`` is built or searched with, as its record decides."""
        if self._fixed is not None:
            return self._fixed.for_book(store, book_id, purpose=purpose)
        recorded = record_for(store, book_id, purpose)
        choice = self.choose(
            recorded.embedding_model if recorded else None, purpose=purpose, book_id=book_id
        )
        return BookRecipe(self.for_model(choice.embedding_model), choice, recorded)

    def for_model(self, embedding_model: str) -> IndexRecipe:
        """The recipe embedding with ``embedding_model``, one of the configured provider's
        (:func:`rag_pipeline.embed.model_names`); its model is loaded once per process. ""
        (an inventory written before runs recorded their model) is :meth:`get`'s."""
        if not embedding_model:
            return self.get()
        with self._lock:
            recipe = self._recipes.get(embedding_model)
            if recipe is None:
                recipe = self._recipes[embedding_model] = self._build(embedding_model)
            return recipe

    def _build(self, embedding_model: str) -> IndexRecipe:
        config = config_for_model(self.embedding, embedding_model)
        if config is None:
            names = model_names(self.embedding)
            raise EmbedError(
                f"RAG_EMBEDDER={self.provider} cannot embed with {embedding_model!r} "
                f"(it embeds with {' or '.join(map(repr, names))})"
            )
        make = self._make_embedder or embed.create_embedder  # looked up now: tests swap it
        recipe = IndexRecipe.build(make(config), self.chunking)
        if recipe.embedding_model != embedding_model:  # a model folder renamed meanwhile
            raise EmbedError(
                f"the {self.provider} embedder built for {embedding_model!r} embeds with "
                f"{recipe.embedding_model!r}"
            )
        return recipe

"""One view of a book for an answer read in several reads (search, context, document,
lineage): the rule every such answer follows.

A book's index is one generation at a time (README "Recipe changes"), but a store handle
may let go of a book between two reads (the query service's handle backs off from a busy
book for another request, see :class:`~rag_pipeline.store.lock.LockGroup`), and an ingest
may switch the book to another recipe's generation meanwhile: the second read would then
answer from the new generation, beside fields of the old one (a chunk's neighbours, a
point's document record). So the generation's recipe signature is read before the first
read and again after the last; an answer read across a switch is read again, at most
:data:`VIEW_TRIES` times, then :class:`BookViewError` (the service's 503)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from rag_pipeline.store import (
    RECIPE_SIGNATURE,
    StoreBusyError,
    StoreError,
    StoreResourceError,
    StoreUnavailableError,
    VectorStore,
)
from rag_pipeline.store.capabilities import searched_recipe

__all__ = ["VIEW_TRIES", "BookViewError", "read_under_one_view", "searched_signature"]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: reads of one answer, each under a view of its book
VIEW_TRIES = 3


class BookViewError(Exception):
    """An answer about a book that could not be read under one view of it (503)."""

    def __init__(self, book: str, problem: str) -> None:
        super().__init__(f"book {book!r}: {problem}")
        self.book = book


def searched_signature(store: VectorStore, book_id: str) -> str | None:
    """The recipe signature of the generation ``store`` reads for the book now (one pointer
    read, taking the book's lock if the handle let go of it; None: a store without
    generations, whose one collection keeps its dimension): what an answer must see unchanged
    from its first read to its last."""
    tag = searched_recipe(store, book_id)
    return tag.get(RECIPE_SIGNATURE) if tag else None


def read_under_one_view(
    store: VectorStore, book_id: str, read: Callable[[str | None], T], *, what: str
) -> T:
    """``read(signature)`` (every read of one answer about ``book_id``, handed the signature
    of the generation it starts under) whose book was not switched from its first read to
    its last: read again when it was, at most :data:`VIEW_TRIES` times (then
    :class:`BookViewError` naming ``what`` was read). A store error under a view that
    changed is such a switch (a read of the new generation with what the old one said),
    read again; under an unchanged view it stands. A busy, unavailable or exhausted store
    was waited for already: it stands."""
    for _ in range(VIEW_TRIES):
        signature = searched_signature(store, book_id)
        try:
            answer = read(signature)
        except (StoreBusyError, StoreUnavailableError, StoreResourceError):
            raise
        except StoreError:
            if searched_signature(store, book_id) == signature:
                raise  # not a switch: the error stands
        else:
            if searched_signature(store, book_id) == signature:
                return answer
        log.info("book %s switched to another recipe during a %s: read again", book_id, what)
    raise BookViewError(
        book_id,
        f"it switched to another model {VIEW_TRIES} times while this {what} ran "
        "(an ingest is migrating it): ask again",
    )

"""Which books share a run: the one rule the CLI and the books sensor follow.

A run costs Dagster a fixed amount (run creation, events, pool claims: about 2 CPU s) whatever
it does, so many books that change together (a first ingest, a new data folder, a chunker or
model change, a backfill) go through runs of several books, and the fixed cost is paid once
per batch. A Dagster run of several partitions covers a *range* of the partitions definition,
in the order its keys were added, so a batch is a run of books that are adjacent in that
order; it is closed at ``max_books`` books or once it holds ``max_files`` files to read (what
a kill in the middle of a batch can cost to redo: its embeddings are written at its end). A
book that changes alone still gets a run of its own, with its own tags.

A batch fails as a whole (a step fails for every book of the run). Unless the failure is the
run's rather than a book's (:func:`split_after`: the embedding service or the store could not
be used, and every book would fail alike), its books are then run one by one, which gives each
its exact outcome: the CLI does so at once, the books sensor on its next tick.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from rag_pipeline.config import BatchConfig
from rag_pipeline.embed import EmbedderUnavailableError, EmbeddingAnswerError, EmbedServiceError
from rag_pipeline.store import StoreBusyError, StorePathError, StoreUnavailableError

__all__ = ["batch_books", "split_after"]


def batch_books(
    books: Sequence[str],
    order: Sequence[str],
    config: BatchConfig,
    files: Mapping[str, int] | None = None,
) -> list[list[str]]:
    """``books`` (those that need a run) cut into batches, in ``order`` (the partition keys
    in the order they were added); each batch is a slice of ``order`` holding only
    ``books``, at most ``config.max_books`` long and with at most ``config.max_files`` files
    (``files``: per book, those its run reads; a book over the budget alone is a batch of
    its own). A book not in ``order`` is a batch of its own."""
    wanted = set(books)
    position = {key: i for i, key in enumerate(order)}
    placed = sorted((position[b], b) for b in wanted if b in position)
    batches: list[list[str]] = []
    current: list[str] = []
    current_files = 0
    previous = -2
    for at, book in placed:
        size = (files or {}).get(book, 0)
        full = (
            len(current) >= config.max_books
            or (current and current_files + size > config.max_files)
            or at != previous + 1
        )
        if current and full:
            batches.append(current)
            current, current_files = [], 0
        current.append(book)
        current_files += size
        previous = at
    if current:
        batches.append(current)
    batches += [[b] for b in books if b not in position]
    return batches


#: errors (by class name, as a failed run records them) that are the run's, not one book's:
#: the embedding service cannot be used, the store is busy, unreachable or unusable (a
#: subclass may be one book's, e.g. a book's recorded model, or one book held by another
#: process on a store that locks each book (``BookBusyError``): not listed, so split)
WHOLE_RUN_FAILURES = frozenset(
    cls.__name__
    for cls in (
        EmbedServiceError,
        EmbedderUnavailableError,
        EmbeddingAnswerError,
        StoreBusyError,
        StoreUnavailableError,
        StorePathError,
    )
)


def split_after(failure: Collection[str]) -> bool:
    """Whether the books of a failed batch are run one by one: unless one of the classes of
    the failure's error and its causes (``failure``) says every book would fail alike."""
    return not WHOLE_RUN_FAILURES & set(failure)

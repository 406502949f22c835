"""What the store layer raises: one module that the contract (base.py) and the folder lock
(lock.py) both import, so neither imports the other."""

__all__ = [
    "BookDamagedError",
    "StoreBusyError",
    "StoreDamagedError",
    "StoreError",
    "StorePathError",
    "StoreUnavailableError",
]


class StoreError(RuntimeError):
    """The vector store refused or failed an operation."""


class StoreBusyError(StoreError):
    """The embedded store's folder is held by another process (a run, the UI, a CLI)."""


class StoreUnavailableError(StoreError):
    """The Qdrant server cannot be reached."""


class StorePathError(StoreError):
    """The embedded store's folder cannot be created or used there (a file in the way, a
    read-only or missing parent): a setting to fix, not a damaged store."""


class StoreDamagedError(StoreError):
    """The store's files or contents are not what this program wrote: never served as-is."""


class BookDamagedError(StoreDamagedError):
    """One book's index is not what this program wrote (its files, or fewer or other points
    than its summary promises): its next ingest rebuilds it; every reader says so."""

    def __init__(self, book: str, problem: str) -> None:
        super().__init__(
            f"book {book!r}: {problem}. Its next `rag-pipeline ingest` rebuilds it from its "
            "files (`rag-pipeline ingest --book "
            f"{book}`; or rebuild the whole store with `rag-pipeline ingest --rebuild`)."
        )
        self.book = book
        self.problem = problem

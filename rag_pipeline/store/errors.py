"""What the store layer raises: one module that the contract (base.py) and the folder lock
(lock.py) both import, so neither imports the other."""

import re

__all__ = [
    "BookBusyError",
    "BookDamagedError",
    "StoreBusyError",
    "StoreDamagedError",
    "StoreError",
    "StorePathError",
    "StoreResourceError",
    "StoreUnavailableError",
    "limit_error",
    "resource_limit",
]


class StoreError(RuntimeError):
    """The vector store refused or failed an operation."""


class StoreBusyError(StoreError):
    """The embedded store's folder is held by another process (a run, the UI, a CLI)."""


class BookBusyError(StoreBusyError):
    """One book of a store that locks each book on its own (Qdrant Edge) is held by another
    process: the other books of a run are not affected."""


class StoreUnavailableError(StoreError):
    """The Qdrant server cannot be reached."""


class StorePathError(StoreError):
    """The embedded store's folder cannot be created or used there (a file in the way, a
    read-only or missing parent): a setting to fix, not a damaged store."""


class StoreResourceError(StoreError):
    """The machine's limit was hit (open files, memory maps, memory, disk space): nothing is
    damaged, and rebuilding would not help; the message names the limit to raise or free."""


#: os error numbers of the machine's limits, as the engine's messages and OSError carry them
_LIMITS = {
    23: "the system's open-file table is full (ENFILE)",
    24: "too many open files (EMFILE): raise the open-files limit (`ulimit -n`)",
    12: "cannot allocate memory (ENOMEM): free memory, or raise vm.max_map_count for memory maps",
    28: "no space left on the device (ENOSPC): free disk space",
    122: "disk quota exceeded (EDQUOT): free space or raise the quota",
}
#: the number as Python (``[Errno 24]``) and Rust write it: ``os error 24`` (Display) and
#: ``Os { code: 24, kind: ..., message: "Too many open files" }`` (Debug, as Qdrant Edge
#: reports a WAL it could not open)
_OS_ERROR = re.compile(r"os error (\d+)|\[Errno (\d+)\]|\bOs \{ code: (\d+)")
#: the C library's words for each limit, for a message that lost the number
_LIMIT_WORDS = {
    "too many open files in system": 23,
    "too many open files": 24,
    "cannot allocate memory": 12,
    "out of memory": 12,
    "no space left on device": 28,
    "disk quota exceeded": 122,
}


def resource_limit(exc: BaseException) -> str | None:
    """What limit of the machine ``exc`` reports (an OSError, or an engine error whose message
    carries the os error number or the C library's words for it), in words; None for
    anything else."""
    codes: list[int] = []
    if isinstance(exc, OSError) and exc.errno is not None:
        codes.append(exc.errno)
    text = str(exc)
    for match in _OS_ERROR.finditer(text):
        codes.append(int(next(g for g in match.groups() if g is not None)))
    lowered = text.lower()
    codes += [code for words, code in _LIMIT_WORDS.items() if words in lowered]
    return next((_LIMITS[c] for c in codes if c in _LIMITS), None)


def limit_error(exc: BaseException, what: str) -> StoreResourceError | None:
    """:class:`StoreResourceError` saying that ``what`` failed on a limit of the machine
    (:func:`resource_limit`), never damage; None when ``exc`` is no such limit."""
    limit = resource_limit(exc)
    return None if limit is None else StoreResourceError(f"{what}: {limit} ({exc})")


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

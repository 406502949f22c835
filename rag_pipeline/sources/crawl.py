"""Find books and their Markdown files on disk, and read them, safely.

A book is a folder directly under the data directory; its id is the folder name, accepted only
when it is a safe identifier (it becomes a Dagster partition key, a payload value and a path
segment). Files are ``*.md`` / ``*.mdx`` anywhere below the book folder.

The book folder is the tenant boundary: a symlink (file or folder) is followed only when it
resolves inside its own book's folder. Every file of a book that is opened by its path (read,
hashed, looked at for why it cannot be read, by a run or by ``lineage``) is opened by
:func:`open_in_book`, which checks that again before opening and on the file actually opened,
so a link re-pointed between the scan and the read is refused too, and nothing outside the book
(nor a device or a FIFO) is ever opened.

Nothing here raises for one bad entry: every problem becomes a :class:`FileError` naming the
path and the reason, and the rest of the book goes on. A path that exists but cannot be read
is *unreadable*, never *deleted*: :func:`path_is_gone` tells the two apart.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
from collections.abc import Iterable, Iterator, Sequence
from functools import lru_cache
from pathlib import Path

from rag_pipeline.models import (
    FileError,
    InvalidBookIdError,
    PathMeta,
    printable,
    validate_book_id,
)
from rag_pipeline.sources.base import (
    BookListing,
    BookVersions,
    FileVersion,
    RefusedPathError,
    SourceReadError,
    SourceUnavailableError,
    too_large,
)
from rag_pipeline.sources.filekeys import file_key

__all__ = [
    "MARKDOWN_SUFFIXES",
    "DataDirError",
    "RefusedPathError",
    "SourceReadError",
    "book_file_path",
    "book_folder_problem",
    "compile_path_patterns",
    "discover_books",
    "extract_path_meta",
    "hash_file",
    "is_book_path",
    "open_in_book",
    "path_is_gone",
    "path_meta",
    "read_source",
    "scan_book",
    "unreadable_reason",
]

MARKDOWN_SUFFIXES = (".md", ".mdx")


def is_book_path(rel: str) -> bool:
    """Whether a path relative to a book (``/``-separated, as a git tree or an object key
    names it) is one of the book's files, by the crawl's rules: Markdown, and no hidden part
    (a part starting with ``.``)."""
    return rel.lower().endswith(MARKDOWN_SUFFIXES) and not any(
        part.startswith(".") for part in rel.split("/")
    )


_GONE = (errno.ENOENT, errno.ENOTDIR)


class DataDirError(SourceUnavailableError):
    """The data folder is missing or unreadable: nothing can be told apart from "every book
    was removed", so nothing is ingested or purged."""


def discover_books(data_dir: Path | str) -> BookListing:
    """List the book folders of ``data_dir`` (sorted); unsafe ones are reported, not used.

    Raises :class:`DataDirError` when the data folder itself is missing or unreadable."""
    root = Path(data_dir)
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError as exc:
        problem = "does not exist or is not a folder" if exc.errno in _GONE else exc.strerror
        raise DataDirError(
            f"data folder {root} {problem} (RAG_DATA_DIR); nothing was ingested or purged"
        ) from None
    root_real = os.path.realpath(root)
    found: dict[str, str] = {}  # book id -> real folder
    links: set[str] = set()
    rejected: list[FileError] = []
    for entry in entries:
        if entry.name.startswith("."):
            continue
        try:
            book_id, real = _book_folder(entry, root_real)
        except _Refused as refused:
            rejected.append(FileError(printable(entry.name), "", "crawl", str(refused)))
            continue
        if book_id is not None:
            found[book_id] = real
            if entry.is_symlink():
                links.add(book_id)
    # Two book folders that are the same folder, or one inside the other, would serve one
    # book's text under another's id: the links among them are refused. Only a link can
    # overlap another book (two plain folders under the data folder are siblings), so only
    # links are compared with the others: a scan costs the books, not their square.
    books: list[str] = []
    for book_id, real in found.items():
        other = (
            next(
                (b for b, r in found.items() if b != book_id and _overlaps(real, r, b, book_id)),
                None,
            )
            if book_id in links
            else None
        )
        if other is not None:
            rejected.append(
                FileError(
                    book_id,
                    "",
                    "crawl",
                    f"book folder is a symlink into book {other!r}'s folder; refused (a book "
                    "folder is the boundary of its book's data)",
                )
            )
        else:
            books.append(book_id)
    return BookListing(tuple(sorted(books)), tuple(sorted(rejected, key=lambda e: e.book_id)))


class _Refused(Exception):
    pass


def _book_folder(entry: os.DirEntry[str], root_real: str) -> tuple[str | None, str]:
    try:
        if not entry.is_dir(follow_symlinks=True):
            return None, ""
    except OSError as exc:
        raise _Refused(f"cannot inspect folder: {exc.strerror}") from None
    try:
        validate_book_id(entry.name)
    except InvalidBookIdError as exc:
        raise _Refused(str(exc)) from None
    if not entry.is_symlink():  # a plain folder of the resolved data folder: no lookup
        return entry.name, os.path.join(root_real, entry.name)
    real = os.path.realpath(entry.path)
    if not _within(real, root_real):
        raise _Refused("book folder is a symlink that points outside the data directory; refused")
    return entry.name, real


def _overlaps(real: str, other_real: str, book: str, other: str) -> bool:
    if real == other_real:
        return book > other  # the same folder twice: keep the first name, refuse the second
    return _within(real, other_real) or _within(other_real, real)


def scan_book(data_dir: Path | str, book_id: str) -> BookVersions:
    """Stat every Markdown file of a book (no reads): each file's version is its full stat
    (:mod:`.filekeys`), its location its path."""
    validate_book_id(book_id)
    book_dir = Path(data_dir) / book_id
    folder = os.path.realpath(book_dir)
    stats: list[FileVersion] = []
    errors: list[FileError] = []
    for rel, path, problem in _walk(str(book_dir), folder):
        if problem is not None:
            errors.append(FileError(book_id, rel, "crawl", problem))
            continue
        try:
            st = os.stat(path)
        except OSError as exc:
            if exc.errno in _GONE:
                continue  # vanished since it was listed: it is gone
            errors.append(FileError(book_id, rel, "crawl", f"cannot stat file: {exc.strerror}"))
            continue
        stats.append(FileVersion(rel, file_key(st), path))
    stats.sort(key=lambda s: s.source_file)
    return BookVersions(book_id, folder, tuple(stats), tuple(errors))


def _walk(book_dir: str, folder: str) -> Iterator[tuple[str, str, str | None]]:
    """Yield (relative path, path, problem or None) for every Markdown file and every entry
    that could not be listed or was refused."""
    # (folder, its path relative to the book folder, its real path: a plain folder's is its
    # parent's plus its name, resolved only for a folder reached through a link)
    stack: list[tuple[str, str, str | None]] = [(book_dir, "", folder)]  # resolved once
    seen: set[str] = set()
    while stack:
        current, rel_dir, real = stack.pop()
        real = real or os.path.realpath(current)
        if real in seen:
            continue
        seen.add(real)
        try:
            entries = sorted(os.scandir(current), key=lambda e: e.name)
        except OSError as exc:
            if exc.errno in _GONE and current != book_dir:
                continue
            yield rel_dir or ".", current, f"cannot list folder: {exc.strerror}"
            continue
        prefix = f"{rel_dir}/" if rel_dir else ""
        for entry in entries:
            name = entry.name
            if name.startswith("."):
                continue
            rel = prefix + name
            try:
                # the common case, told by the listing alone: a plain file or folder with a
                # name that is UTF-8 (what _inspect would say of it, without its calls)
                if not entry.is_symlink() and _valid_utf8(name):
                    if entry.is_file(follow_symlinks=False):
                        if name.lower().endswith(MARKDOWN_SUFFIXES):
                            yield rel, entry.path, None
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        stack.append((entry.path, rel, f"{real}/{name}"))
                        continue
                problem, is_dir = _inspect(entry, rel, folder)
            except Exception as exc:  # one odd entry never stops the scan
                yield _error_name(rel), entry.path, f"cannot inspect: {type(exc).__name__}: {exc}"
                continue
            if is_dir:
                if problem is None:
                    stack.append((entry.path, rel, None))  # a link: resolved when listed
                else:
                    yield _error_name(rel), entry.path, problem
            elif problem is not None:
                yield _error_name(rel), entry.path, problem
            elif name.lower().endswith(MARKDOWN_SUFFIXES):
                yield rel, entry.path, None


def _error_name(rel: str) -> str:
    """The name a crawl error gives an entry: the file's own name (the one its records hold,
    so that one file is one error, matched with its record), escaped only when it is not
    UTF-8 (such a name is never indexed, and could not be written to a payload)."""
    return rel if _valid_utf8(rel) else printable(rel)


def _inspect(entry: os.DirEntry[str], rel: str, folder: str) -> tuple[str | None, bool]:
    """(problem or None, is a folder) for one directory entry."""
    is_link = entry.is_symlink()
    try:
        is_dir = entry.is_dir(follow_symlinks=True)
    except OSError as exc:
        if not entry.name.lower().endswith(MARKDOWN_SUFFIXES):
            return None, False
        if exc.errno == errno.ELOOP:
            return _LOOP, False
        return f"cannot inspect: {exc.strerror}", False
    markdown = entry.name.lower().endswith(MARKDOWN_SUFFIXES)
    if not is_dir and not markdown:
        return None, False
    if is_link:
        target = os.path.realpath(entry.path)
        if not _within(target, folder):
            kind = "symlinked folder" if is_dir else "symlink"
            return f"{kind} points outside its book folder; refused", is_dir
        if not is_dir:
            try:
                mode = os.stat(entry.path).st_mode
            except OSError as exc:
                why = _link_failure(exc) or f"cannot inspect the symlink's target: {exc.strerror}"
                return why, False
            if not stat.S_ISREG(mode):
                return f"not a regular file: a symlink to {_file_kind(mode)}", False
    if not _valid_utf8(entry.name):  # (the folders above were checked when listed)
        return "file name is not valid UTF-8; rename it to ingest it", is_dir
    if not is_dir and not entry.is_file(follow_symlinks=True):
        return f"not a regular file: {_file_kind(entry.stat().st_mode)}", False
    return None, is_dir


_LOOP = "symlink loop (a link that leads back to itself); refused"


def _link_failure(exc: OSError) -> str | None:
    """A failed stat through a symlink in words (a loop, a missing target), or None."""
    if exc.errno == errno.ELOOP:
        return _LOOP
    if exc.errno in _GONE:
        return "broken symlink: its target does not exist"
    return None


def _file_kind(mode: int) -> str:
    """What a path that is not a regular file is, in words."""
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISLNK, "a symlink"),
    )
    return next((name for test, name in kinds if test(mode)), "a special file")


def unreadable_reason(book_dir: Path | str, source_file: str) -> str:
    """Why a known file that is not gone (:func:`path_is_gone`) gave no bytes: a directory or
    a FIFO where the file was, a link the boundary refuses, a permission, or an I/O error; for
    change reports and errors. Looked at through :func:`open_in_book`, as a read is."""
    try:
        path = book_file_path(book_dir, source_file)
        fd, _ = open_in_book(path, os.path.realpath(book_dir))
    except SourceReadError as exc:
        return str(exc)
    os.close(fd)
    return "file exists but could not be read"


def book_folder_problem(data_dir: Path | str, book_id: str) -> str:
    """Why a book folder that exists (it is not gone) is not a usable book, in words that need
    no other list: a file where the folder was, a refused name or link, an unlistable folder."""
    path = Path(data_dir) / book_id
    try:
        link = stat.S_ISLNK(os.lstat(path).st_mode)
        mode = os.stat(path).st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "is a symlink loop"
        if exc.errno in _GONE:
            return "is a broken symlink"
        return f"cannot be inspected: {exc.strerror}"
    if not stat.S_ISDIR(mode):
        what = _file_kind(mode) if not stat.S_ISREG(mode) else "a file"
        return f"is {'a symlink to ' if link else ''}{what}, not a folder"
    try:
        validate_book_id(book_id)
    except InvalidBookIdError as exc:
        return f"is refused: {exc}"
    try:
        with os.scandir(path):
            pass
    except OSError as exc:
        return f"cannot be listed: {exc.strerror}"
    return "is refused (see the refused folders)"


def path_is_gone(book_dir: Path | str, source_file: str) -> bool:
    """True only when the file no longer exists: a path that exists but cannot be read or
    listed (permissions, I/O errors) is not gone, and its indexed chunks must stay. Nor is a
    name the boundary refuses (:func:`book_file_path`), or a file below a folder that now
    leads out of the book (the crawl names that refusal): nothing outside is looked at."""
    try:
        path = book_file_path(book_dir, source_file)
    except RefusedPathError:
        return False
    if not _within(os.path.realpath(os.path.dirname(path)), os.path.realpath(book_dir)):
        return False
    try:
        os.lstat(path)
    except OSError as exc:
        return exc.errno in _GONE
    return False


def book_file_path(book_dir: Path | str, source_file: str) -> str:
    """The path of a book's file named ``source_file`` (its path inside the book folder, as
    the crawl names it); :class:`RefusedPathError` for a name that is not one: absolute, empty,
    or with a ``..`` or ``.`` part (such a name reaches outside the book whatever the links)."""
    parts = source_file.split("/")
    if not source_file or os.path.isabs(source_file) or "\0" in source_file:
        raise RefusedPathError(f"{source_file!r} is not a path inside its book folder; refused")
    if any(part in ("", ".", "..") for part in parts):
        raise RefusedPathError(f"{source_file!r} is not a path inside its book folder; refused")
    return os.path.join(os.fspath(book_dir), source_file)


def open_in_book(path: str, folder: str) -> tuple[int, os.stat_result]:
    """The book boundary: every file of a book opened by a path is opened here (its reads,
    its hashes, the look at why it cannot be read). Returns the open descriptor and its stat.

    Refuses (:class:`RefusedPathError`) a path that resolves outside ``folder`` (the book
    folder's real path: a symlink out, to another book, a ``..``) or that is not a regular
    file (a device, a FIFO, a folder, directly or through a link): both before the path is
    opened, so nothing outside the book and no device is ever opened, and again on the file
    actually opened, so a link re-pointed in between is refused too. A file that cannot be
    opened is a :class:`SourceReadError` naming why."""
    if not _within(os.path.realpath(path), folder):
        if os.path.islink(path):
            raise RefusedPathError("symlink points outside its book folder; refused")
        raise RefusedPathError("leads outside its book folder through a symlinked folder; refused")
    try:
        st = os.stat(path)
    except OSError as exc:
        why = _link_failure(exc) if os.path.islink(path) else None
        raise SourceReadError(exc.errno, why or f"cannot read file: {exc.strerror}") from None
    _require_regular(st.st_mode)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise SourceReadError(exc.errno, f"cannot read file: {exc.strerror}") from None
    try:
        opened = os.fstat(fd)
        _require_regular(opened.st_mode)
        real = _opened_path(fd, path, opened)
        if real is None or not _within(real, folder):
            raise RefusedPathError(
                "resolves outside its book folder when opened (a symlink changed); refused"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd, opened


def _require_regular(mode: int) -> None:
    if stat.S_ISDIR(mode):
        raise RefusedPathError("is a directory, not a file", errno.EISDIR)
    if not stat.S_ISREG(mode):
        raise RefusedPathError(f"not a regular file: {_file_kind(mode)}", errno.EINVAL)


def read_source(path: str, folder: str, max_bytes: int) -> bytes:
    """The bytes of one source file, read once from the file actually opened within the book
    (:func:`open_in_book`); :class:`SourceReadError` also for a file larger than
    ``max_bytes``."""
    fd, st = open_in_book(path, folder)
    try:
        if st.st_size > max_bytes:
            raise SourceReadError(errno.EFBIG, too_large(st.st_size, max_bytes))
        chunks = []
        remaining = max_bytes + 1
        while remaining > 0:
            block = os.read(fd, min(remaining, 1 << 20))
            if not block:
                break
            chunks.append(block)
            remaining -= len(block)
        data = b"".join(chunks)
        if len(data) > max_bytes:  # it grew after the stat
            raise SourceReadError(errno.EFBIG, too_large(len(data), max_bytes))
        return data
    except OSError as exc:
        raise SourceReadError(exc.errno, f"cannot read file: {exc.strerror}") from None
    finally:
        os.close(fd)


def _opened_path(fd: int, path: str, st: os.stat_result) -> str | None:
    """The real path of the file behind ``fd``: exact on Linux (/proc), else the path's
    resolution confirmed by inode."""
    proc = f"/proc/self/fd/{fd}"
    if os.path.islink(proc):
        try:
            return os.readlink(proc)
        except OSError:
            pass
    real = os.path.realpath(path)
    try:
        again = os.stat(real)
    except OSError:
        return None
    return real if (again.st_dev, again.st_ino) == (st.st_dev, st.st_ino) else None


def hash_file(path: str | Path, folder: str, max_bytes: int | None = None) -> str:
    """sha256 of a book's file (opened within ``folder``, :func:`open_in_book`), streamed so
    large files never sit in memory twice; :class:`SourceReadError` when it cannot be, or
    when it is larger than ``max_bytes``: refused by the opened file's size before a byte is
    read (a file growing while it is hashed is refused once past it), as :func:`read_source`
    refuses it."""
    fd, st = open_in_book(os.fspath(path), folder)
    h = hashlib.sha256()
    read = 0
    try:
        if max_bytes is not None and st.st_size > max_bytes:
            raise SourceReadError(errno.EFBIG, too_large(st.st_size, max_bytes))
        for block in iter(lambda: os.read(fd, 1 << 20), b""):
            read += len(block)
            if max_bytes is not None and read > max_bytes:
                raise SourceReadError(errno.EFBIG, too_large(read, max_bytes))
            h.update(block)
    except OSError as exc:
        raise SourceReadError(exc.errno, f"cannot read file: {exc.strerror}") from None
    finally:
        os.close(fd)
    return h.hexdigest()


@lru_cache(maxsize=32)
def compile_path_patterns(patterns: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        except re.error as exc:
            raise ValueError(f"invalid path pattern {pattern!r}: {exc}") from exc
    return tuple(compiled)


def extract_path_meta(source_file: str, patterns: Iterable[re.Pattern[str]]) -> PathMeta:
    """Module / chapter / lesson from the path; the first pattern that matches a field wins."""
    found: dict[str, str] = {}
    for pattern in patterns:
        match = pattern.search(source_file)
        if not match:
            continue
        for name, value in match.groupdict().items():
            if value is not None and name not in found:
                found[name] = value
    return PathMeta(
        module=found.get("module"),
        chapter=_to_int(found.get("chapter")),
        lesson=_to_int(found.get("lesson")),
    )


def path_meta(source_file: str, patterns: Sequence[str]) -> PathMeta:
    return extract_path_meta(source_file, compile_path_patterns(tuple(patterns)))


def _to_int(value: str | None) -> int | None:
    if value is None:
        return None
    digits = re.sub(r"\D", "", value)[:18]  # a 64-bit payload integer
    return int(digits) if digits else None


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _valid_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True

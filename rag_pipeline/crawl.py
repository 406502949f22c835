"""Find books and their Markdown files on disk, safely.

A book is a folder directly under the data directory; its id is the folder name, accepted only
when it is a safe identifier (it becomes a Dagster partition key, a payload value and a path
segment). Files are ``*.md`` / ``*.mdx`` anywhere below the book folder. Symlinks that leave the
data directory are refused, never followed.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from rag_pipeline.config import DEFAULT_PATH_PATTERNS
from rag_pipeline.models import FileError, PathMeta, SourceFile

__all__ = [
    "BOOK_ID_PATTERN",
    "MARKDOWN_SUFFIXES",
    "BookScan",
    "FileStat",
    "InvalidBookIdError",
    "compile_path_patterns",
    "discover_books",
    "discover_files",
    "extract_path_meta",
    "hash_file",
    "scan_book",
    "validate_book_id",
]

BOOK_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MARKDOWN_SUFFIXES = (".md", ".mdx")


class InvalidBookIdError(ValueError):
    """A book id that is not safe to use as a partition key, filter value or path segment."""


def validate_book_id(book_id: str) -> str:
    """Return ``book_id`` if it is a safe id, else raise :class:`InvalidBookIdError`."""
    if not isinstance(book_id, str) or not BOOK_ID_PATTERN.fullmatch(book_id) or ".." in book_id:
        raise InvalidBookIdError(
            f"invalid book id {book_id!r}: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return book_id


@dataclass(frozen=True, slots=True)
class BookScan:
    """Book folders found under the data directory, and the folders refused as unsafe."""

    book_ids: tuple[str, ...]
    rejected: tuple[FileError, ...] = ()


def discover_books(data_dir: Path | str) -> BookScan:
    """List the book folders of ``data_dir`` (sorted); unsafe names are reported, not used."""
    root = Path(data_dir)
    if not root.is_dir():
        return BookScan(())
    books: list[str] = []
    rejected: list[FileError] = []
    with os.scandir(root) as entries:
        for entry in entries:
            if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=True):
                continue
            try:
                validate_book_id(entry.name)
            except InvalidBookIdError as exc:
                rejected.append(FileError(_printable(entry.name), "", "crawl", str(exc)))
                continue
            if entry.is_symlink() and not _is_within(Path(entry.path).resolve(), root.resolve()):
                rejected.append(
                    FileError(
                        entry.name,
                        "",
                        "crawl",
                        "book folder is a symlink that points outside the data directory; refused",
                    )
                )
                continue
            books.append(entry.name)
    return BookScan(tuple(sorted(books)), tuple(sorted(rejected, key=lambda e: e.book_id)))


@dataclass(frozen=True, slots=True)
class FileStat:
    """A Markdown file's identity for change detection, before any byte is read."""

    source_file: str
    path: str
    size: int
    mtime_ns: int


def scan_book(data_dir: Path | str, book_id: str) -> tuple[list[FileStat], list[FileError]]:
    """Stat every Markdown file of a book (no reads); refuse links leaving the data dir."""
    validate_book_id(book_id)
    root = Path(data_dir).resolve()
    book_dir = root / book_id
    stats: list[FileStat] = []
    errors: list[FileError] = []
    seen_dirs: set[str] = set()
    for rel, abs_path, link_target in _walk(book_dir, root, seen_dirs, errors, book_id):
        if link_target is not None and not _is_within(link_target, root):
            errors.append(
                FileError(
                    book_id,
                    rel,
                    "crawl",
                    f"symlink points outside the data directory ({link_target}); refused",
                )
            )
            continue
        try:
            st = os.stat(abs_path)
        except OSError as exc:
            errors.append(FileError(book_id, rel, "crawl", f"cannot stat file: {exc.strerror}"))
            continue
        stats.append(FileStat(rel, abs_path, st.st_size, st.st_mtime_ns))
    stats.sort(key=lambda s: s.source_file)
    return stats, errors


def _walk(
    directory: Path, root: Path, seen_dirs: set[str], errors: list[FileError], book_id: str
) -> Iterator[tuple[str, str, Path | None]]:
    """Yield (relative path, absolute path, symlink target or None) for Markdown files."""
    book_dir = root / book_id
    stack = [directory]
    while stack:
        current = stack.pop()
        real = os.path.realpath(current)
        if real in seen_dirs:
            continue
        seen_dirs.add(real)
        try:
            entries = list(os.scandir(current))
        except OSError as exc:
            rel = _relative(current, book_dir)
            errors.append(FileError(book_id, rel, "crawl", f"cannot list folder: {exc.strerror}"))
            continue
        for entry in entries:
            if entry.name.startswith("."):
                continue
            rel = _relative(Path(entry.path), book_dir)
            is_link = entry.is_symlink()
            target = Path(os.path.realpath(entry.path)) if is_link else None
            if entry.is_dir(follow_symlinks=True):
                if target is not None and not _is_within(target, root):
                    errors.append(
                        FileError(
                            book_id,
                            rel,
                            "crawl",
                            f"symlinked folder points outside the data directory "
                            f"({target}); refused",
                        )
                    )
                    continue
                stack.append(Path(entry.path))
            elif entry.name.lower().endswith(MARKDOWN_SUFFIXES):
                if is_link and not entry.is_file(follow_symlinks=True):
                    errors.append(FileError(book_id, rel, "crawl", "broken symlink"))
                    continue
                yield rel, entry.path, target


def discover_files(
    data_dir: Path | str,
    book_id: str,
    path_patterns: Sequence[str] = DEFAULT_PATH_PATTERNS,
) -> tuple[list[SourceFile], list[FileError]]:
    """Find, hash and describe every Markdown file of one book."""
    stats, errors = scan_book(data_dir, book_id)
    patterns = compile_path_patterns(tuple(path_patterns))
    files: list[SourceFile] = []
    for st in stats:
        try:
            digest = hash_file(st.path)
        except OSError as exc:
            errors.append(
                FileError(book_id, st.source_file, "crawl", f"cannot read file: {exc.strerror}")
            )
            continue
        files.append(
            SourceFile(
                book_id,
                st.source_file,
                st.path,
                st.size,
                st.mtime_ns,
                digest,
                extract_path_meta(st.source_file, patterns),
            )
        )
    return files, errors


def hash_file(path: str | Path) -> str:
    """sha256 of a file's bytes, streamed so large files never sit in memory twice."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
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


def _to_int(value: str | None) -> int | None:
    if value is None:
        return None
    digits = re.sub(r"\D", "", value)
    return int(digits) if digits else None


def _relative(path: Path, book_dir: Path) -> str:
    try:
        return path.relative_to(book_dir).as_posix()
    except ValueError:
        return path.as_posix()


def _is_within(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return True


def _printable(name: str) -> str:
    return name.encode("unicode_escape").decode("ascii")[:200]

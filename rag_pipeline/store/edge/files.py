"""The files of a Qdrant Edge store besides its shards: book folders and their names, the
generation pointers (``current.json``, ``pending.json``), ``layout.json``, and the durable
way each is written (tmp, fsync, rename) or removed (renamed to trash first)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag_pipeline.store import base
from rag_pipeline.store.edge.common import log
from rag_pipeline.store.errors import limit_error

LAYOUT_FILE = "layout.json"

LAYOUT_NAME = "book-shards"

LAYOUT_VERSION = 1

_CONFIG_FILE = "edge_config.json"  # an Edge shard's own config: its presence marks a shard

_CURRENT = "current.json"

_PENDING = "pending.json"

_SUMMARY = "summary.json"

#: a book found damaged and being rebuilt: readers are refused with the damage it names until
#: the rebuild is checked and this file removed (see EdgeStore.discard_damaged)
_DAMAGED = "damaged.json"

#: a generation pointer as read: (its folder name, the whole pointer)
_Pointer = tuple[str, dict[str, Any]]

_TRASH = ".trash-"  # a folder being removed: a dot-name is never a book nor a generation

#: a generation folder's name (see _create_shard)
_GENERATION = re.compile(r"g\d{14}-[0-9a-f]{6}")

_REBUILD = "rag-pipeline ingest --rebuild"

#: what a book folder may be named: the pipeline's book ids (a dot-free start, no '..')
_FOLDER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclass
class _Layout:
    dense_dim: int | None
    payload_indexes: dict[str, str] = field(default_factory=dict)


def _readable(book: str) -> bool:
    """A tenant that can name a book folder (any other holds nothing)."""
    return bool(_FOLDER_NAME.fullmatch(book)) and ".." not in book


def _check_book_name(book: str, *, writing: bool = False) -> None:
    if not _readable(book):
        raise ValueError(
            f"{book[:80]!r} cannot name a book of {'this' if writing else 'the'} store: use "
            "1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )


def _listed_books(books: Path) -> list[str]:
    if not books.is_dir():
        return []
    return sorted(
        p.name
        for p in books.iterdir()
        if _readable(p.name) and ((p / _CURRENT).is_file() or (p / _DAMAGED).is_file())
    )


def _signature(pointer: Mapping[str, Any]) -> str | None:
    recipe = pointer.get("recipe")
    return recipe.get(base.RECIPE_SIGNATURE) if isinstance(recipe, dict) else None


def _read_json(path: Path) -> Any:
    """The JSON in ``path``; None when it is missing or unreadable (the caller says what that
    makes it). A limit of the machine met reading it (no descriptor left, no memory) is
    :class:`~rag_pipeline.store.errors.StoreResourceError`: the file is not damaged."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except OSError as exc:
        limit = limit_error(exc, f"cannot read {path}")
        if limit is not None:
            raise limit from exc
        return None
    except ValueError:
        return None


def _read_damage(book_folder: Path) -> str | None:
    """The damage a book is being rebuilt for (its ``damaged.json``), or None."""
    path = book_folder / _DAMAGED
    if not path.exists():
        return None
    data = _read_json(path)
    problem = data.get("problem") if isinstance(data, dict) else None
    return problem if isinstance(problem, str) else f"{path} says it is damaged"


def _mark_damaged(book_folder: Path, problem: str) -> None:
    """Write the book's ``damaged.json`` (see :data:`_DAMAGED`), durably."""
    _write_json(book_folder / _DAMAGED, {"book": book_folder.name, "problem": problem})


def _read_pointer(path: Path) -> _Pointer | None:
    """(generation folder, the whole pointer) of a book's current.json / pending.json, or
    None; a pointer that is unreadable or names another book (a folder copied) is damage."""
    if not path.exists():
        return None
    data = _read_json(path)
    book = path.parent.name
    generation = data.get("generation") if isinstance(data, dict) else None
    if not isinstance(generation, str) or not _readable(generation):
        raise base.BookDamagedError(book, f"{path} is unreadable")
    named = data.get("book")
    if named is not None and named != book:
        raise base.BookDamagedError(
            book, f"{path} belongs to book {named!r} (a book folder copied under another name?)"
        )
    return generation, data


def _write_json(path: Path, data: Any) -> None:
    """Replace ``path`` atomically and durably (tmp + fsync + rename + folder fsync): a kill
    leaves the old file or the new one, and a leftover tmp file is never read."""
    # json.dumps, not json.dump: dump encodes in Python, 3x slower on a big book's summary
    _write_bytes(path, json.dumps(data, sort_keys=True).encode())


def _write_bytes(path: Path, raw: bytes) -> None:
    """:func:`_write_json` of bytes already encoded."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(raw)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_folder(path.parent)


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _sweep_unnamed_generations(book_folder: Path) -> None:
    """Remove the book's generation folders that neither pointer names (left by a kill
    between a folder's creation and its pointer, or between a switch or a drop and the
    removal): nothing reads them. Called under the book's lock, before a handle's first
    write; kept ``old-*`` folders are not generations any more and stay."""
    if not book_folder.is_dir():
        return
    named = {
        pointer[0]
        for pointer in (
            _read_pointer(book_folder / _CURRENT),
            _read_pointer(book_folder / _PENDING),
        )
        if pointer is not None
    }
    for child in book_folder.iterdir():
        if _GENERATION.fullmatch(child.name) and child.name not in named and child.is_dir():
            log.info("removing %s: a generation no pointer names", child)
            _remove_folder(child)


def _remove_folder(folder: Path) -> None:
    """Rename to a trash name first, then delete: a kill leaves no half folder read as data."""
    if not folder.exists():
        return
    trash = folder.with_name(f"{_TRASH}{folder.name}-{secrets.token_hex(4)}")
    folder.rename(trash)
    shutil.rmtree(trash, ignore_errors=True)
    for left in folder.parent.glob(f"{_TRASH}*"):  # left by a removal that was killed
        shutil.rmtree(left, ignore_errors=True)


def _read_layout(folder: Path) -> _Layout | None:
    path = folder / LAYOUT_FILE
    if not path.exists():
        return None
    data = _read_json(path)
    if not isinstance(data, dict) or data.get("layout") != LAYOUT_NAME:
        raise base.StoreDamagedError(
            f"{path} is unreadable or not a {LAYOUT_NAME} layout: the store is damaged. Rebuild "
            f"it from the books with `{_REBUILD}`."
        )
    if data.get("version") != LAYOUT_VERSION:
        raise base.StoreError(
            f"{path} is layout version {data.get('version')}; this program reads version "
            f"{LAYOUT_VERSION}. Rebuild the store with `{_REBUILD}`."
        )
    dim = data.get("dense_dim")
    return _Layout(int(dim) if dim is not None else None, dict(data.get("payload_indexes") or {}))


def _write_layout(folder: Path, layout: _Layout) -> None:
    _write_json(
        folder / LAYOUT_FILE,
        {
            "layout": LAYOUT_NAME,
            "version": LAYOUT_VERSION,
            "dense_dim": layout.dense_dim,
            "payload_indexes": layout.payload_indexes,
        },
    )

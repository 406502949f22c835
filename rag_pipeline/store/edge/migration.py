"""The single-shard layout of earlier versions, migrated at open into one shard per book
(built beside, at most a few shards open at once, swapped in by renames under the layout lock)."""

from __future__ import annotations

import json
import shutil
import time
from collections import OrderedDict, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import qdrant_edge as qe

from rag_pipeline.store import base
from rag_pipeline.store.edge.common import log
from rag_pipeline.store.edge.engine import (
    SPACE_MARGIN_BYTES,
    _close_shard,
    _create_shard,
    _has_data,
    _index_kinds,
    _load_bytes,
    _settle_shard,
    _write_bytes,
    check_space,
)
from rag_pipeline.store.edge.files import (
    _CONFIG_FILE,
    _CURRENT,
    _REBUILD,
    LAYOUT_FILE,
    _Layout,
    _readable,
    _write_json,
    _write_layout,
)
from rag_pipeline.store.edge.rebuild import _REBUILT, _finish_rebuild, rebuild_root
from rag_pipeline.store.errors import limit_error
from rag_pipeline.store.lock import FolderLock

_MIGRATE_PAGE = 512


def _settle_old_layout(
    root: Path,
    collection: str,
    schema: base.CollectionSchema,
    layout_lock: FolderLock,
    busy_wait_s: float,
    description: str,
) -> None:
    """A collection folder in the single-shard layout (before book shards) is migrated; one
    with segments but no config is damaged. Never read as an empty store. ``layout_lock``:
    the store's (see :func:`~rag_pipeline.store.edge.rebuild.layout_lock`)."""
    folder = root / collection
    if (folder / LAYOUT_FILE).exists():
        return
    if not folder.exists() and (rebuild_root(root, collection) / _REBUILT).exists():
        layout_lock.acquire(busy_wait_s)  # a rebuild's swap killed between its renames
        try:
            _finish_rebuild(root, collection)
        finally:
            layout_lock.release()
    if _interrupted_migration(root, collection):
        # finished under the layout lock: a migration in progress holds it between its two
        # renames, and another opener must not complete its swap for it
        layout_lock.acquire(busy_wait_s)
        try:
            _finish_interrupted_migration(root, collection)
        finally:
            layout_lock.release()
    if (folder / LAYOUT_FILE).exists():
        return
    single = (folder / _CONFIG_FILE).exists()
    if not single:
        if _has_data(folder):
            raise base.StoreDamagedError(
                f"{description} holds segments but no {_CONFIG_FILE}: the store is "
                f"damaged. Rebuild it from the books with `{_REBUILD}`."
            )
        return
    layout_lock.acquire(busy_wait_s)
    try:
        if (folder / _CONFIG_FILE).exists() and not (folder / LAYOUT_FILE).exists():
            migrate_single_shard(root, collection, schema)
    finally:
        layout_lock.release()


def _migrating_name(collection: str) -> str:
    return f".{collection}.migrating"


def _interrupted_migration(root: Path, collection: str) -> bool:
    """A migration killed between its two renames left the new layout complete beside (or
    one in progress is between them)."""
    built = root / _migrating_name(collection)
    return not (root / collection).exists() and (built / LAYOUT_FILE).exists()


def _finish_interrupted_migration(root: Path, collection: str) -> None:
    """The second rename of a killed migration; the caller holds the layout lock."""
    if _interrupted_migration(root, collection):
        (root / _migrating_name(collection)).rename(root / collection)


def migrate_single_shard(root: Path, collection: str, schema: base.CollectionSchema) -> str:
    """Copy every point (both named vectors, payload) of the single-shard folder
    ``root/collection`` into book shards built beside it, then swap them in by renames; the
    old folder is kept as ``<collection>.single-shard-<time>``. The caller holds the layout
    lock. Returns (and logs) what was done."""
    folder = root / collection
    built = root / _migrating_name(collection)
    if built.exists():
        shutil.rmtree(built)  # an unfinished earlier try (no layout.json: never swapped in)
    try:
        old = qe.EdgeShard.load(str(folder))
    except Exception as exc:
        limit = limit_error(exc, f"cannot open the single-shard Qdrant Edge folder {folder}")
        if limit is not None:  # the machine's limit: nothing to rebuild
            raise limit from exc
        raise base.StoreDamagedError(
            f"cannot migrate the single-shard Qdrant Edge folder {folder} ({exc}): rebuild the "
            f"store from the books with `{_REBUILD}`."
        ) from exc
    try:
        config = json.loads((folder / _CONFIG_FILE).read_text())
        dim = int(config["vectors"][base.DENSE_VECTOR]["size"])
        layout = _Layout(dim, _index_kinds(schema))
        generations: dict[str, str] = {}  # book -> its new generation folder's name
        shards: OrderedDict[str, qe.EdgeShard] = OrderedDict()  # open now, LRU first
        copied = skipped = 0
        try:
            for batch in _all_points(old):
                by_book: dict[str, list[Any]] = defaultdict(list)
                for record in batch:
                    book = (record.payload or {}).get(schema.tenant_field)
                    if not isinstance(book, str) or not _readable(book):
                        skipped += 1
                        continue
                    by_book[book].append(
                        qe.Point(id=record.id, vector=record.vector, payload=record.payload)
                    )
                for book, points in by_book.items():
                    shard = _migration_shard(built, book, dim, schema, layout, generations, shards)
                    shard.update(qe.UpdateOperation.upsert_points(points))
                    copied += len(points)
            while shards:  # closed as they go: memory maps and descriptors stay bounded
                _close_shard(shards.popitem(last=False)[1])
            for book, name in generations.items():  # each settled alone, then closed
                generation = built / "books" / book / name
                check_space(built, _load_bytes(generation), f"the migration of book {book!r}")
                shard = qe.EdgeShard.load(str(generation))
                try:
                    _settle_shard(shard, schema, layout, generation)
                finally:
                    _close_shard(shard)
        finally:
            for shard in shards.values():
                _close_shard(shard)
        _write_layout(built, layout)  # last: marks the new layout complete
    except base.StoreError:
        raise
    except Exception as exc:
        limit = limit_error(exc, f"migrating the single-shard Qdrant Edge folder {folder}")
        if limit is not None:  # the copy is redone whole at the next open
            raise limit from exc
        raise base.StoreDamagedError(
            f"migrating the single-shard Qdrant Edge folder {folder} to one shard per book "
            f"failed ({exc}): rebuild the store from the books with `{_REBUILD}`."
        ) from exc
    finally:
        old.close()
    kept = folder.with_name(f"{collection}.single-shard-{time.strftime('%Y%m%d-%H%M%S')}")
    folder.rename(kept)
    built.rename(folder)
    message = (
        f"migrated the single-shard Qdrant Edge store {folder} to one shard per book "
        f"({copied} points of {len(generations)} books"
        + (f", {skipped} points without a book left out" if skipped else "")
        + f"); the old folder is kept as {kept}"
    )
    log.warning(message)
    return message


#: book shards a migration keeps open at once (each maps its files: a migration of thousands of
#: books that kept them all open ran out of memory maps at Linux's default vm.max_map_count)
MIGRATION_OPEN_SHARDS = 8


def _migration_shard(
    built: Path,
    book: str,
    dim: int,
    schema: base.CollectionSchema,
    layout: _Layout,
    generations: dict[str, str],
    shards: OrderedDict[str, qe.EdgeShard],
) -> qe.EdgeShard:
    """The book's new shard in the layout being built: created the first time, loaded again
    when it was closed; at most :data:`MIGRATION_OPEN_SHARDS` are open (least recently used
    closed first)."""
    need = SPACE_MARGIN_BYTES + _write_bytes(_MIGRATE_PAGE, dim)
    check_space(built, need, f"the migration of book {book!r}")
    shard = shards.get(book)
    if shard is None:
        while len(shards) >= MIGRATION_OPEN_SHARDS:  # first: never one more open
            _close_shard(shards.popitem(last=False)[1])
        book_folder = built / "books" / book
        if book in generations:
            check_space(built, _load_bytes(book_folder / generations[book]), f"book {book!r}")
            shard = qe.EdgeShard.load(str(book_folder / generations[book]))
        else:
            name, shard = _create_shard(book_folder, dim, schema, layout)
            generations[book] = name
            _write_json(
                book_folder / _CURRENT,
                {"generation": name, "recipe": None, "dense_dim": dim, "book": book},
            )
        shards[book] = shard
    shards.move_to_end(book)
    return shard


def _all_points(shard: qe.EdgeShard) -> Iterator[list[Any]]:
    offset: Any = None
    while True:
        request = qe.ScrollRequest(
            limit=_MIGRATE_PAGE, offset=offset, with_payload=True, with_vector=True
        )
        records, offset = shard.scroll(request)
        if records:
            yield list(records)
        if offset is None:
            return

"""Qdrant Edge shards themselves: how a book's shard is configured (memory-mapped, int8
quantized, HNSW without payload links), created, loaded (a load that fails is that book's
damage, or a limit of the machine), indexed, optimized and searched, and the free space a
write or a load needs (a full disk under Edge's memory-mapped writes is a SIGBUS: checked
before)."""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import shutil
import stat
import sys
import time
from pathlib import Path
from typing import Any

import qdrant_edge as qe

from rag_pipeline.store import base, native
from rag_pipeline.store.edge.common import log
from rag_pipeline.store.edge.files import _CONFIG_FILE, _CURRENT, _Layout
from rag_pipeline.store.errors import limit_error

EDGE = native.Dialect(
    models=qe,
    range=qe.RangeFloat,
    has_id=lambda ids: qe.HasIdCondition(point_ids=set(ids)),
    point=qe.Point,
)

#: points one engine update carries (a book of a million points is written in batches)
_UPSERT_BATCH = 2_048


def _index_kinds(schema: base.CollectionSchema) -> dict[str, str]:
    """Every payload index, named as the engine reports its kind."""
    kinds = {schema.tenant_field: "keyword"} | dict(schema.payload_indexes)
    return {name: f"PayloadSchemaType.{kind.capitalize()}" for name, kind in kinds.items()}


#: free space a write needs on the store's file system besides its points' bytes. Qdrant
#: Edge writes through memory maps into sparse files: a page the file system cannot give is a
#: SIGBUS that kills the process with no message (seen on a full disk), never an error it
#: could report. So the space a write may take is checked before it: this margin (a new WAL
#: segment's first pages, the summary and pointers) plus what the points take
#: (:func:`_write_bytes`).
SPACE_MARGIN_BYTES = 2 << 20

#: free space a new shard needs besides its payload indexes' (:data:`INDEX_BYTES` each):
#: creating one allocated ~0.3 MB besides them on tmpfs, 60 KB on ext4 (holes stay holes)
NEW_SHARD_BYTES = 2 << 20

#: files and folders a new shard makes (measured: about 115 with a small book's indexes):
#: a file system out of inodes failed its creation with Edge's "IO Error" otherwise
SHARD_INODES = 256

#: free space each payload index a shard gains takes when made, on a file system that fills
#: the holes a memory map touches (:func:`_fills_holes`): its two 1 MiB null flags at once
#: (measured on tmpfs: 2 MiB an index; ext4 leaves them holes). Its 4 MiB map page and
#: 1 MiB tracker are holes that the next load fills there (:func:`_load_bytes`)
INDEX_BYTES = 3 << 20

#: and for each point it indexes (its values in the index's pages), on any file system
INDEX_POINT_BYTES = 256

#: free space a shard's load needs besides the holes its payload index files hold
#: (:func:`_load_bytes`): the flags, trackers and WAL pages a load rewrites
LOAD_SPACE_BYTES = 2 << 20

#: the capacity of a new shard's WAL segments. Edge's default is 32 MiB, and two of them
#: were made ahead: 64 MiB of sparse file in every book's shard, written out in full by any
#: copy that ignores holes. An update larger than this gets a segment of its own size.
WAL_SEGMENT_BYTES = 1 << 20

_INDEX_FOLDER = "payload_index"


def check_space(folder: Path, need: int, what: str, *, inodes: int = 0) -> None:
    """:class:`StoreResourceError` naming the file system when fewer than ``need`` bytes (or
    ``inodes`` files) are free for ``what`` (checked before it starts: nothing is written)."""
    place, free = _free(folder)
    if free < need:
        raise base.StoreResourceError(
            f"no space left on the device (ENOSPC) for {what}: {free / 2**20:.0f} MiB free on "
            f"the file system of {place}, about {need / 2**20:.0f} MiB needed. Free disk space "
            "(or point RAG_QDRANT_PATH at a larger disk) and run it again: nothing indexed was "
            "changed."
        )
    files = os.statvfs(place)
    if inodes and files.f_files and files.f_favail < inodes:  # f_files 0: no inode limit
        raise base.StoreResourceError(
            f"no space left on the device (ENOSPC) for {what}: {files.f_favail} files (inodes) "
            f"free on the file system of {place}, about {inodes} needed. Free some (or point "
            "RAG_QDRANT_PATH at a file system with more inodes) and run it again: nothing "
            "indexed was changed."
        )


def _write_bytes(points: int, dim: int) -> int:
    """A generous bound of what writing ``points`` takes on disk: the vectors and a page of
    payload and sparse vector each, twice (the write-ahead log, then the segment)."""
    return points * (dim * 4 + 4096) * 2


def _load_bytes(folder: Path) -> int:
    """Free space loading the shard in ``folder`` needs: :data:`LOAD_SPACE_BYTES`, and on a
    file system that fills holes (:func:`_fills_holes`) the holes of its payload index files,
    which a load reads through shared memory maps (a small book's first load took ~25 MB on
    tmpfs, nothing on ext4): a full tmpfs would be a SIGBUS."""
    if not _fills_holes(folder):
        return LOAD_SPACE_BYTES
    holes = 0
    for segment in (folder / "segments").glob(f"*/{_INDEX_FOLDER}"):
        for path in segment.rglob("*"):
            try:
                info = path.lstat()
            except OSError:  # removed by an optimizer meanwhile: nothing to load
                continue
            if stat.S_ISREG(info.st_mode):
                holes += max(0, info.st_size - info.st_blocks * 512)
    return LOAD_SPACE_BYTES + holes


#: file systems whose memory maps take a page for a hole that is only read (shmem): tmpfs,
#: ramfs, hugetlbfs (``statfs``'s magic numbers, linux/magic.h)
_HOLE_FILLING_FILE_SYSTEMS = frozenset({0x01021994, 0x858458F6, 0x958458F6})


def _fills_holes(folder: Path) -> bool:
    """Whether the file system of ``folder`` allocates the holes of a sparse file that a
    memory map reads (tmpfs does; ext4, XFS and btrfs do not). Where ``statfs`` cannot say
    (not Linux, an error), it is assumed to: the larger need is the safe one."""
    place, _ = _free(folder)
    if not sys.platform.startswith("linux"):
        return True
    answer = ctypes.create_string_buffer(256)  # struct statfs: 120 bytes on 64-bit Linux
    if _LIBC.statfs(os.fsencode(place), answer) != 0:
        return True
    return ctypes.c_long.from_buffer(answer).value in _HOLE_FILLING_FILE_SYSTEMS


_LIBC = ctypes.CDLL(None, use_errno=True)


def _create_shard(
    book_folder: Path, dim: int, schema: base.CollectionSchema, layout: _Layout
) -> tuple[str, qe.EdgeShard]:
    """A new, empty generation folder of a book (see :func:`_shard_config`) with the payload
    indexes of a book holding nothing yet (:func:`_index_params`) and WAL segments of
    :data:`WAL_SEGMENT_BYTES` (:func:`_small_wal`)."""
    indexes = _index_params(schema, layout, points=0)
    need = NEW_SHARD_BYTES + (INDEX_BYTES * len(indexes) if _fills_holes(book_folder) else 0)
    what = f"a new shard of book {book_folder.name!r}"
    check_space(book_folder, need, what, inodes=SHARD_INODES)
    name = f"g{time.strftime('%Y%m%d%H%M%S')}-{secrets.token_hex(3)}"
    folder = book_folder / name
    folder.mkdir(parents=True)
    _small_wal(folder, qe.EdgeShard.create(str(folder), _shard_config(dim)))
    shard = qe.EdgeShard.load(str(folder))
    for field_name, params in indexes.items():
        shard.update(qe.UpdateOperation.create_field_index(field_name, params))
    return name, shard


def _small_wal(folder: Path, shard: qe.EdgeShard) -> None:
    """Close the new, empty ``shard`` with its config naming WAL segments of
    :data:`WAL_SEGMENT_BYTES`, and its empty WAL removed (made again at the next load, to that
    size). Edge keeps ``wal_options`` in the shard's config file and honours it at each load,
    but qdrant-edge-py's ``EdgeConfig`` has no argument for it. A shard made before keeps the
    default (32 MiB). A process killed in here leaves a generation no pointer names yet: the
    next write to the book sweeps it."""
    shard.close()
    config_file = folder / _CONFIG_FILE
    config = json.loads(config_file.read_text())
    config["wal_options"] = {
        "segment_capacity": WAL_SEGMENT_BYTES,
        "segment_queue_len": 0,
        "retain_closed": 1,
    }
    temporary = config_file.with_name(config_file.name + ".tmp")
    temporary.write_text(json.dumps(config))
    os.replace(temporary, config_file)
    shutil.rmtree(folder / "wal")


#: a book's shard holds every payload index of the layout from this many points; below, only
#: the schema's core indexes (a filter on another field scans the book's payloads: about 6 ms
#: at 1,000 points, against an index's cost in every small shard: time to create and load,
#: files, ~7 MB of memory; docs/benchmarks.md section 17)
ALL_INDEXES_FROM_POINTS = 1_000

#: past this many points written since the last optimize, a handle optimizes the book's shard
#: before writing more: the appendable segment the writes go to is held in memory (a 1M-point
#: book written at once took 10 GB), the optimized segments are memory-mapped
OPTIMIZE_EVERY_POINTS = 100_000

_COLD = qe.Memory.Cold


def _shard_config(dim: int) -> qe.EdgeConfig:
    """How a book's shard keeps its data (measured at 100k-1M points, docs/benchmarks.md
    section 17): every part memory-mapped, not read at load (``Cold``); dense vectors with
    int8 scalar quantization and an HNSW graph without payload links (one book per shard:
    no filter needs its own graph). Both are built by :meth:`EdgeShard.optimize`, which does
    nothing below Qdrant's indexing threshold (about 6,000 of these vectors): a small book is
    searched exactly, a large one loads in a fraction of a second at 1M points instead of
    20 s and 6 GB."""
    return qe.EdgeConfig(
        vectors={
            base.DENSE_VECTOR: qe.EdgeVectorParams(
                size=dim, distance=qe.Distance.Cosine, memory=_COLD
            )
        },
        sparse_vectors={
            base.SPARSE_VECTOR: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf, memory=_COLD)
        },
        payload_memory=_COLD,
        id_tracker_memory=_COLD,
        hnsw_config=qe.HnswIndexConfig(
            m=16, ef_construct=100, full_scan_threshold=10_000, payload_m=0, memory=_COLD
        ),
        quantization_config=qe.ScalarQuantizationConfig(
            type=qe.ScalarType.Int8, quantile=0.99, memory=_COLD
        ),
    )


def _add_indexes(
    shard: qe.EdgeShard, schema: base.CollectionSchema, layout: _Layout, folder: Path
) -> None:
    """Create the payload indexes a shard of its size should have (:func:`_index_params`) and
    lacks, when the file system of its ``folder`` has room for them (:data:`INDEX_BYTES`
    each). Reads work without them, only slower: without room they are left for later."""
    info = shard.info()
    present = set(info.payload_schema)
    wanted = _index_params(schema, layout, points=int(info.points_count))
    missing = {name: params for name, params in wanted.items() if name not in present}
    each = INDEX_POINT_BYTES * info.points_count + (INDEX_BYTES if _fills_holes(folder) else 0)
    need = SPACE_MARGIN_BYTES + each * len(missing)
    if missing and _room(folder, need, f"{len(missing)} payload indexes of book {_book(folder)}"):
        for name, params in missing.items():
            shard.update(qe.UpdateOperation.create_field_index(name, params))


def _settle_shard(
    shard: qe.EdgeShard, schema: base.CollectionSchema, layout: _Layout, folder: Path
) -> None:
    """After writes: the payload indexes the book's size calls for, and Qdrant's optimizer (it
    builds the HNSW graph and int8 vectors of a segment past its indexing threshold, and does
    nothing for a small book). An optimization writes the segments it merges again before it
    removes them: without room for what the shard's segments take, the book is left as it is
    (searched exactly, only more slowly) until a later write finds room."""
    _add_indexes(shard, schema, layout, folder)
    need = SPACE_MARGIN_BYTES + _allocated(folder / "segments")
    if _room(folder, need, f"optimizing book {_book(folder)}"):
        shard.optimize()


def _room(folder: Path, need: int, what: str) -> bool:
    """Whether ``need`` bytes are free for ``what``, an optional step (logged when not)."""
    place, free = _free(folder)
    if free >= need:
        return True
    log.warning(
        "%s skipped: %.0f MiB free on the file system of %s, about %.0f MiB needed; the book "
        "is searched as it is (only more slowly) until a later write finds room",
        what,
        free / 2**20,
        place,
        need / 2**20,
    )
    return False


def _free(folder: Path) -> tuple[Path, int]:
    """The nearest existing folder of ``folder`` and the bytes free on its file system."""
    place = folder
    while not place.exists() and place != place.parent:
        place = place.parent
    return place, shutil.disk_usage(place).free


def _book(folder: Path) -> str:
    return repr(folder.parent.name)


def _allocated(folder: Path) -> int:
    """The bytes the files under ``folder`` take on disk (their blocks, holes left out)."""
    total = 0
    for path in folder.rglob("*"):
        try:
            info = path.lstat()
        except OSError:  # removed meanwhile
            continue
        if stat.S_ISREG(info.st_mode):
            total += info.st_blocks * 512
    return total


def _search_params(limit: int) -> qe.SearchParams:
    """How a large book's optimized segments are searched (small ones are searched exactly,
    and ignore this): the HNSW graph explores at least 128 candidates, and the int8 vectors'
    best twice ``limit`` are scored again with the original vectors."""
    return qe.SearchParams(
        hnsw_ef=max(128, 2 * limit),
        quantization=qe.QuantizationSearchParams(rescore=True, oversampling=2.0),
    )


def _index_params(schema: base.CollectionSchema, layout: _Layout, *, points: int) -> dict[str, Any]:
    """The engine's parameters of the payload indexes a book's shard of ``points`` points
    has: the tenant's and the schema's core ones, and from :data:`ALL_INDEXES_FROM_POINTS`
    every one the layout names."""
    core = schema.core_indexes
    params: dict[str, Any] = {}
    for field_name, kind in layout.payload_indexes.items():
        small = core is not None and field_name not in core and field_name != schema.tenant_field
        if small and points < ALL_INDEXES_FROM_POINTS:
            continue
        if field_name == schema.tenant_field:
            params[field_name] = qe.KeywordIndexParams(is_tenant=True, memory=_COLD)
        elif kind.endswith("Integer"):
            params[field_name] = qe.IntegerIndexParams(lookup=True, range=True, memory=_COLD)
        else:
            params[field_name] = qe.KeywordIndexParams(memory=_COLD)
    return params


def _load(folder: Path, description: str) -> qe.EdgeShard:
    """A book's generation folder loaded; a missing or unloadable one is that book's damage."""
    book = folder.parent.name
    if not (folder / _CONFIG_FILE).exists():
        if _has_data(folder):
            raise base.BookDamagedError(
                book, f"{folder} holds segments but no {_CONFIG_FILE} ({description})"
            )
        raise base.BookDamagedError(
            book, f"{folder.parent / _CURRENT} names {folder.name}, which is not there"
        )
    try:
        return qe.EdgeShard.load(str(folder))
    except Exception as exc:
        limit = limit_error(exc, f"{description}: cannot open book {book!r}'s shard")
        if limit is not None:  # the machine's limit, not damage: never discarded or rebuilt
            raise limit from exc
        raise base.BookDamagedError(
            book, f"cannot open its shard {folder} ({description}): {exc}"
        ) from exc


def _close_shard(shard: qe.EdgeShard, *, flush: bool = True) -> None:
    try:
        if flush:
            shard.flush()
    finally:
        shard.close()


def _is_empty(shard: qe.EdgeShard) -> bool:
    return int(shard.count(qe.CountRequest())) == 0


def _has_data(folder: Path) -> bool:
    return any(
        (folder / part).is_dir() and any((folder / part).iterdir()) for part in ("segments", "wal")
    )

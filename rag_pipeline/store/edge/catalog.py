"""A book's catalog entry on disk (``summary.json``): the pipeline's data sealed with a
checksum, the book and generation it describes, the points the generation held and a
fingerprint of its files. It is read only while all of that still holds (checked at most
once a minute per process for the same files): a cache, never the truth."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import qdrant_edge as qe

from rag_pipeline.store import base
from rag_pipeline.store.capabilities import BookCatalog
from rag_pipeline.store.edge.common import log
from rag_pipeline.store.edge.files import (
    _CONFIG_FILE,
    _CURRENT,
    _DAMAGED,
    _SUMMARY,
    _listed_books,
    _Pointer,
    _read_pointer,
    _readable,
    _write_bytes,
)
from rag_pipeline.store.edge.handle import Handle, RoutedBook
from rag_pipeline.store.errors import limit_error

#: files of an Edge shard that a read-only load, search, count, scroll or facet rewrites (their
#: times, and edge_config.json's size at the first load; tracker_journal.dat is deleted), as
#: measured on qdrant-edge-py 0.9: left out of a generation's fingerprint. The id tracker's
#: versions file is rewritten (the versions of deleted points cleared) by the first load after
#: a write that deleted points: a search after a one-file edit made every later plan read the
#: shard, the path whose tied revisions gave test_git_books its "2 commits" flake. Every other
#: file (vectors, payload pages, sparse store, id mappings, WAL) is written only by writes,
#: and every write reaches the WAL.
_REWRITTEN_BY_READS = frozenset(
    {
        _CONFIG_FILE,
        "mutable_id_tracker.versions",
        "segment.json",
        "tracker.dat",
        "tracker_journal.dat",
        "flags_a.dat",
        "flags_b.dat",
    }
)

#: a summary is written again after this pause (a few times at most) while its file's time is
#: not past the newest file it vouches for: a change in the same clock tick would go unseen
_RACY_PAUSE_S = 0.01

_RACY_TRIES = 3

#: a summary checked (fingerprint and all) is taken again unchecked, by any handle of the
#: process, for this long while its file and the book's generation are the same ones: a plan
#: asks for it three times per book (recipe, files, index), and a CLI ingest's collection
#: look after its runs once more. The pipeline's own writers drop or replace the file, which
#: ends the trust at once; only damage by other hands waits this long to be noticed.
_RECHECK_AFTER_S = 60.0

#: (book folder, inode, mtime and size of current.json, then of summary.json) -> (until when,
#: the pointer, the summary's data), for the process
_Seen = tuple[str, int, int, int, int, int, int]

_checked: dict[_Seen, tuple[float, _Pointer, dict[str, Any]]] = {}

_checked_lock = threading.Lock()

_CHECKED_MAX = 100_000

#: folders a fingerprint does not walk: a segment's payload indexes (two thirds of a small
#: shard's files and folders) change only with writes, which reach its WAL and payload
#: storage files too; a plan of 1,000 unchanged books spent ~0.4 CPU s in them
_NOT_FINGERPRINTED = frozenset({"payload_index"})


def _fingerprint(generation: Path) -> dict[str, Any]:
    """What a summary vouches for: (path, size, mtime_ns) of every file of the generation
    folder but those a read rewrites (:data:`_REWRITTEN_BY_READS`) and those of
    :data:`_NOT_FINGERPRINTED`, the presence of its config file and segments folder, as one
    digest; and the newest of those times."""
    entries: list[tuple[str, int, int]] = []
    pending = [(str(generation), "")]  # (folder, its path inside the generation)
    while pending:
        folder, rel = pending.pop()
        in_vectors = rel.endswith("/vectors/") or rel == "vectors/"
        # an optimized segment's vector storage keeps its deletion flags in deleted.dat,
        # whose time a read-only load rewrites (its writes reach the WAL's files anyway)
        in_storage = rel.rsplit("/", 2)[-2].startswith("vector_storage") if rel else False
        with os.scandir(folder) as listing:
            for entry in listing:
                name = entry.name
                if entry.is_dir(follow_symlinks=False):
                    if name not in _NOT_FINGERPRINTED:
                        pending.append((entry.path, f"{rel}{name}/"))
                elif (
                    name not in _REWRITTEN_BY_READS
                    and not (in_vectors and name == "status.dat")
                    and not (in_storage and name == "deleted.dat")
                ):
                    st = entry.stat(follow_symlinks=False)
                    entries.append((rel + name, st.st_size, st.st_mtime_ns))
    entries.sort()
    marks = ((generation / _CONFIG_FILE).is_file(), (generation / "segments").is_dir())
    digest = hashlib.sha256(repr((marks, entries)).encode()).hexdigest()
    return {
        "fingerprint": digest,
        "files": len(entries),
        "newest_ns": max((m for _, _, m in entries), default=0),
    }


_SUMMARY_HEAD = b'{"data": '

_SUMMARY_STAMP = b', "store": '


def _sealed(stamp: dict[str, Any], data: Mapping[str, Any]) -> tuple[dict[str, Any], bytes]:
    """``stamp`` with the SHA-256 of ``data`` as the summary file holds it and a checksum over
    both (an edit by other hands, a record's hash changed, a count, makes the file unread),
    and the summary file's bytes: ``data`` encoded once, for its hash and the file alike (a
    250k-point book's summary was encoded twice, the second time by ``json.dump`` in Python:
    1.0 s of a one-file edit, docs/benchmarks.md section 40)."""
    body = json.dumps(data, sort_keys=True).encode()
    sealed = {**stamp, "data_sha256": hashlib.sha256(body).hexdigest()}
    sealed["checksum"] = _stamp_checksum(sealed)
    # what json.dumps({"store": sealed, "data": data}, sort_keys=True) gives, in pieces
    raw = _SUMMARY_HEAD + body + _SUMMARY_STAMP + json.dumps(sealed, sort_keys=True).encode()
    return sealed, raw + b"}"


def _stamp_checksum(stamp: Mapping[str, Any]) -> str:
    fields = {k: v for k, v in stamp.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def _intact(raw: bytes, stamp: Mapping[str, Any]) -> bool:
    """The summary file's bytes are what :func:`_sealed` sealed: its data hashed as they lie
    in the file (between ``{"data": `` and the last ``, "store": ``, which no JSON string can
    hold unescaped), not serialized again."""
    end = raw.rfind(_SUMMARY_STAMP)
    if not raw.startswith(_SUMMARY_HEAD) or end < 0:
        return False
    body = raw[len(_SUMMARY_HEAD) : end]
    return (
        stamp.get("checksum") == _stamp_checksum(stamp)
        and stamp.get("data_sha256") == hashlib.sha256(body).hexdigest()
    )


def _write_summary(folder: Path, generation: str, data: Mapping[str, Any], points: int) -> None:
    """``folder/summary.json``: the pipeline's ``data``, the book and generation it describes,
    the points the generation holds, the fingerprint of its (flushed, closed) files and a
    checksum over all of it. Written again after a short pause while its own time is not
    past the newest file it vouches for (a later change in the same tick would keep that
    time)."""
    path = folder / _SUMMARY
    try:
        stamp: dict[str, Any] = {
            "book": folder.name,
            "generation": generation,
            "points": points,
            **_fingerprint(folder / generation),
        }
    except FileNotFoundError:
        return  # the generation went (purged, emptied): nothing to describe
    stamp, raw = _sealed(stamp, data)
    for _ in range(_RACY_TRIES):
        _write_bytes(path, raw)
        if path.stat().st_mtime_ns > stamp["newest_ns"]:
            return
        time.sleep(_RACY_PAUSE_S)
    log.debug("summary of %s left racy: it is read as absent", folder.name)


def _sound_summary(
    folder: Path, generation: str | None
) -> tuple[dict[str, Any], dict[str, Any], int] | None:
    """(stamp, data, the file's mtime) of ``folder/summary.json`` when it is intact (its
    checksum), names this book and ``generation`` (None: any); None otherwise."""
    try:
        with open(folder / _SUMMARY, "rb") as fh:
            written_ns = os.fstat(fh.fileno()).st_mtime_ns  # the time of what is read
            raw = fh.read()
        saved = json.loads(raw)
    except OSError as exc:
        limit = limit_error(exc, f"cannot read {folder / _SUMMARY}")
        if limit is not None:  # no descriptor left is not a summary to distrust
            raise limit from exc
        return None
    except ValueError:
        return None
    stamp = saved.get("store") if isinstance(saved, dict) else None
    data = saved.get("data") if isinstance(saved, dict) else None
    if not isinstance(stamp, dict) or not isinstance(data, dict):
        return None  # half written cannot happen (tmp + rename); an old format can
    if not _intact(raw, stamp):
        return None  # edited by other hands, or written before summaries had a checksum
    if stamp.get("book") != folder.name:
        return None
    if generation is not None and stamp.get("generation") != generation:
        return None
    return stamp, data, written_ns


def _check_not_orphaned(folder: Path) -> None:
    """A book without ``current.json`` holds nothing, unless its intact summary names a
    generation that is there: then the pointer was lost (no kill of the pipeline leaves
    that: the pointer is written before the first point, the summary after the last), and
    the book is damaged, not empty."""
    sound = _sound_summary(folder, None)
    named = None if sound is None else sound[0].get("generation")
    if isinstance(named, str) and _readable(named) and (folder / named / _CONFIG_FILE).exists():
        raise base.BookDamagedError(
            folder.name, f"{folder / _CURRENT} is missing while its generation {named} is there"
        )


def _promised_points(folder: Path, generation: str) -> int | None:
    """The points the book's intact summary says ``generation`` held when it was saved
    (None: no such summary). The pipeline removes the summary before its first write to the
    generation, so a summary that is there promises the generation as it is now."""
    sound = _sound_summary(folder, generation)
    points = None if sound is None else sound[0].get("points")
    return points if isinstance(points, int) else None


def _read_summary(folder: Path, generation: str) -> dict[str, Any] | None:
    """The pipeline's data of ``folder/summary.json`` if it is intact and vouches for
    ``generation`` as its files are now; None otherwise (the caller reads the shard)."""
    sound = _sound_summary(folder, generation)
    if sound is None:
        return None
    stamp, data, written_ns = sound
    newest = stamp.get("newest_ns")
    if not isinstance(newest, int):
        return None
    if newest >= written_ns:
        return None  # racy: a change in the tick the summary was written would be unseen
    try:
        now = _fingerprint(folder / generation)
    except FileNotFoundError:
        return None
    return data if now == {k: stamp.get(k) for k in now} else None


def _seen(folder: str) -> _Seen | None:
    """The key of the book's summary in :data:`_checked`: its folder and the inode, mtime and
    size of its current.json and summary.json (None: either is missing). Both files are
    replaced, never rewritten in place: a new inode at every change."""
    try:
        pointer_st = os.stat(f"{folder}{os.sep}{_CURRENT}")
        summary_st = os.stat(f"{folder}{os.sep}{_SUMMARY}")
    except OSError:
        return None
    return (
        folder,
        pointer_st.st_ino,
        pointer_st.st_mtime_ns,
        pointer_st.st_size,
        summary_st.st_ino,
        summary_st.st_mtime_ns,
        summary_st.st_size,
    )


def _checked_recently(seen: _Seen) -> tuple[_Pointer, dict[str, Any]] | None:
    """(pointer, summary data) of a summary this process checked under ``seen`` less than
    :data:`_RECHECK_AFTER_S` ago (None: check it)."""
    with _checked_lock:
        checked = _checked.get(seen)
    if checked is None or time.monotonic() >= checked[0]:
        return None
    return checked[1], checked[2]


def checked_pointer(folder: str) -> _Pointer | None:
    """The book's current pointer as a summary check of this process read it a moment ago,
    while its current.json and summary.json are still those files (None: read the pointer):
    the collection page asks every book's recipe right after the plan checked its summary."""
    seen = _seen(folder)
    checked = None if seen is None else _checked_recently(seen)
    return None if checked is None else checked[0]


class EdgeCatalog(BookCatalog):
    """The catalog of :class:`~rag_pipeline.store.edge.store.EdgeStore` (a mixin): each
    book's ``summary.json``, read while it vouches for the generation as its files are."""

    def summaries(self: Handle) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for book in _listed_books(self.books_folder):
            data = self.summary(book)
            if data is not None:
                out[book] = data
        return out

    def summary(self: Handle, tenant: str) -> dict[str, Any] | None:
        """The book's saved summary while it still describes the generation this handle
        reads: same generation, and that folder's fingerprint unchanged (no shard opened).
        None when absent, stale, damaged, or when this handle builds the book beside."""
        if not _readable(tenant):
            return None
        state = self._books.get(tenant)
        if state is not None and state.summary is not None:
            return dict(state.summary)  # saved by this handle, no write since
        if state is not None and (state.summary_dropped or state.pending):
            return None
        folder = f"{self.books_folder}{os.sep}{tenant}"  # (str: a plan asks per book, 4 times)
        if os.path.exists(f"{folder}{os.sep}{_DAMAGED}"):
            return None  # being rebuilt: whoever may read it reads the shard
        seen = _seen(folder)
        if seen is None:
            return None
        checked = _checked_recently(seen)
        if checked is not None:
            current, data = checked  # the same files, checked a moment ago
        else:
            try:
                pointer = _read_pointer(Path(folder) / _CURRENT)
            except base.StoreDamagedError:
                return None  # the full read says so
            read = None if pointer is None else _read_summary(Path(folder), pointer[0])
            if pointer is None or read is None:
                return None
            current, data = pointer, read
            with _checked_lock:
                if len(_checked) > _CHECKED_MAX:  # a long-lived process: forget the oldest
                    for key in list(_checked)[: len(_checked) // 2]:
                        del _checked[key]
                _checked[seen] = (time.monotonic() + _RECHECK_AFTER_S, current, data)
        if self._recipe is not None and self._builds_beside(current):
            return None
        return dict(data)

    def save_summary(self: Handle, tenant: str, data: Mapping[str, Any]) -> None:
        """Kept in memory until the book's shard is flushed and closed (unload or close),
        then written with the fingerprint of its generation's files."""
        with self._lock:
            state = self._route(tenant)
            if state.pending or state.generation is None:
                return  # a summary describes the current generation only
            shard = self._reader(tenant)
            if shard is None:
                return
            state.summary_points = int(self._call("count", shard.count, qe.CountRequest()))
            state.summary = dict(data)
            state.summary_dropped = False  # the next write drops it again

    def _write_summary(self: Handle, state: RoutedBook) -> None:
        data, state.summary = state.summary, None
        if data is None or state.generation is None or not state.folder.is_dir():
            return
        try:
            _write_summary(state.folder, state.generation, data, state.summary_points)
        except OSError as exc:  # no summary is safe (the book is read): never fail a close
            log.warning("summary of book %s not saved: %s", state.folder.name, exc)

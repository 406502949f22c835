"""When a file's recorded stat may stand for its bytes: the rules git's index uses.

A stat recorded when a file was hashed lets a later look skip reading it only while every
field a change moves is the same (:class:`~rag_pipeline.models.FileKey`: device, inode, size,
mtime and ctime in nanoseconds, mode). ctime cannot be set by a user, so a rewrite whose old
mtime is put back (``rsync -t``, ``cp -p``, ``tar``, ``touch -d``), a rename or swap (the
inode moves), and a ``chmod`` are all seen. A stat whose times are not safely older than the
moment it was recorded is *racy* (a write in the same clock tick keeps every field, and file
times move in coarse ticks): it is never recorded as trusted, so the file is hashed again.
Whatever moved, the SHA-256 of the content decides. A source whose versions name content (a
git blob id: a string key, :data:`~rag_pipeline.models.VersionKey`) has no racy window: its
key is always settled. The books sensor, ``plan`` and the runs
apply these rules and no other, so they cannot disagree about a file.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from rag_pipeline.models import FileKey, VersionKey

__all__ = [
    "FINE_RACY_NS",
    "RACY_NS",
    "file_key",
    "key_from_json",
    "key_to_json",
    "now_ns",
    "settle_wait_s",
    "settled",
    "trusted_hash",
]

#: a stat whose mtime or ctime is this close to the moment it was recorded may share its
#: clock tick with a later write, and is not trusted. File times on a file system that keeps
#: only whole seconds (or milliseconds: FAT keeps 2 s) tick that coarsely: 2 s covers them.
#: Times with digits below the millisecond come from the kernel's coarse clock, which moves
#: every jiffy (at most 10 ms): for those :data:`FINE_RACY_NS` is enough.
RACY_NS = 2_000_000_000
FINE_RACY_NS = 50_000_000
_MS = 1_000_000
_FIELDS = len(FileKey._fields)


def file_key(st: os.stat_result) -> FileKey:
    return FileKey(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)


def now_ns() -> int:
    """The moment a look begins, on the clock file times are taken from."""
    return time.time_ns()


def settled(key: VersionKey, recorded_at_ns: int) -> bool:
    """The stat was safely older than the moment it was recorded: a later change of the file
    moves one of its fields (a content token always is)."""
    if isinstance(key, str):
        return True
    fine = key.mtime_ns % _MS or key.ctime_ns % _MS
    window = FINE_RACY_NS if fine else RACY_NS
    return max(key.mtime_ns, key.ctime_ns) + window < recorded_at_ns


def settle_wait_s(key: VersionKey, now: int) -> float:
    """Seconds from ``now`` until a stat ``key`` is :func:`settled` (0 when it is)."""
    if isinstance(key, str):
        return 0.0
    fine = key.mtime_ns % _MS or key.ctime_ns % _MS
    window = FINE_RACY_NS if fine else RACY_NS
    return max(0, max(key.mtime_ns, key.ctime_ns) + window + 1 - now) / 1e9


def trusted_hash(
    key: VersionKey, known: Mapping[str, tuple[VersionKey, str]], source_file: str
) -> str | None:
    """The recorded SHA-256 of ``source_file`` if its stat is still exactly the recorded one
    (entries are recorded only when :func:`settled`), else None: hash the file."""
    seen = known.get(source_file)
    if seen is None or seen[0] != key:
        return None
    return seen[1]


def key_to_json(key: VersionKey) -> list[int] | str:
    """A key as :func:`key_from_json` reads it back."""
    return key if isinstance(key, str) else list(key)


def key_from_json(value: object) -> VersionKey | None:
    """A key as saved in JSON (a list of six integers, or a content token); None for anything
    else (a record written by an older version: the file is hashed)."""
    if type(value) is str and value:
        return value
    if type(value) is not list or len(value) != _FIELDS:
        return None
    for v in value:  # (a plan reads 20,000 of them at 1,000 books: no generator)
        if type(v) is not int:
            return None
    return FileKey._make(value)

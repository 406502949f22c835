"""The store on Qdrant Edge (``qdrant-edge-py``): Qdrant's own engine embedded in the process,
one Edge shard per book.

Unlike qdrant-client's local mode it uses the payload indexes, so a book-filtered query stays in
the low milliseconds at 100k points. Opening an Edge shard costs time and memory in proportion
to its points, so each book is its own shard (issue 17): a step opens only the books it
touches.

Layout of ``<path>/<collection>/`` (the *layout root*)::

    layout.json                     {"layout": "book-shards", "version": 1, "dense_dim": N,
                                     "payload_indexes": {field: kind}}
    locks/<book>.lock (+ .wait)     the book's FolderLock
    books/<book>/current.json       {"generation": <folder>, "recipe": {...}|null, "dense_dim": N}
    books/<book>/pending.json       (while a new recipe is built beside) the same shape
    books/<book>/summary.json       the pipeline's catalog entry (see :mod:`.catalog`)
                                    with the fingerprint of the generation it describes
    books/<book>/<generation>/      one EdgeShard folder (see :mod:`.engine`)

``<path>/<collection>.lock`` is the layout lock, held briefly (create, migrate, set aside).
A handle takes a book's lock the first time it touches the book (lazily), under the lock
discipline of :class:`~rag_pipeline.store.lock.LockGroup`: a book it wrote is kept until it
closes; of the books it only read it keeps at most ``loaded_books`` (the least recently used is
let go), and none while it waits for another book's lock. So readers and writers of a book
take turns, runs of different books do not wait for each other, and a handle's descriptors
are bounded whatever the collection's size. Whole-collection looks (tenants, dimension,
indexes) read files and open no shard.

A handle on which :meth:`EdgeStore.ensure_collection` was called with a recipe tag is a
*builder*: a book whose current generation carries another recipe signature is read and
written in a pending generation beside it, until :meth:`EdgeStore.switch` makes it current.
Every other handle reads the current generation.

The modules, one concern each: :mod:`.store` (a handle: routing, the contract's primitives),
:mod:`.engine` (shards), :mod:`.files` (pointers, layout, folders), :mod:`.catalog` (summaries),
:mod:`.rebuild` (whole-store locks, ``--rebuild``'s swap), :mod:`.migration` (the old
single-shard layout).
"""

from rag_pipeline.store.edge.engine import EDGE, LOAD_SPACE_BYTES, check_space
from rag_pipeline.store.edge.files import LAYOUT_FILE
from rag_pipeline.store.edge.migration import migrate_single_shard
from rag_pipeline.store.edge.rebuild import (
    clear_rebuild_root,
    layout_lock,
    rebuild_lock,
    rebuild_root,
    swap_in_rebuilt,
    whole_store_locked,
)
from rag_pipeline.store.edge.store import MAX_OPEN_SHARDS, EdgeStore

__all__ = [
    "EDGE",
    "LAYOUT_FILE",
    "LOAD_SPACE_BYTES",
    "MAX_OPEN_SHARDS",
    "EdgeStore",
    "check_space",
    "clear_rebuild_root",
    "layout_lock",
    "migrate_single_shard",
    "rebuild_lock",
    "rebuild_root",
    "swap_in_rebuilt",
    "whole_store_locked",
]

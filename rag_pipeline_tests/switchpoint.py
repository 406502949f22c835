"""Run ``rag-pipeline`` and switch a book to another model from inside a search (fault
injection for tests).

    python -m rag_pipeline_tests.switchpoint BOOK DIMENSION [rag-pipeline arguments...]

The first time the hash embedder embeds a query with :data:`MARKER` (after its vector is
made, before the search reads the store), every store handle of the process lets go of the
books it only read, as :class:`~rag_pipeline.store.lock.LockGroup` does when another request
backs off from a busy book, and the ingest pipeline runs the book with
``RAG_HASH_DIMENSION=DIMENSION`` to its end (in this process, with its own store handle: what
``rag-pipeline ingest --book BOOK`` runs, without Dagster's start): it switches the book to
``hash-DIMENSION`` between the query's embedding and its search. Nothing in the product
knows about this.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

#: the word whose query embedding switches the book
MARKER = "switchmarkerword"


def install(book: str, dimension: int) -> None:
    from rag_pipeline.cli.app import book_pipeline
    from rag_pipeline.config import Settings
    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline.store.edge import EdgeStore

    handles: weakref.WeakSet[EdgeStore] = weakref.WeakSet()
    real_init, real_embed = EdgeStore.__init__, HashEmbedder.embed_query
    done = {"switched": False}

    def init(self: EdgeStore, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        handles.add(self)

    def embed_query(self: HashEmbedder, text: str) -> Any:
        vector = real_embed(self, text)
        if MARKER in text and not done["switched"]:
            done["switched"] = True
            for handle in list(handles):
                with handle._lock:
                    handle.folder_lock._shrink(0)  # what a request backing off does
            # the pipeline every run goes through, in this process (Dagster's start would
            # take most of a test's time): another handle, so another holder of the lock
            settings = Settings(hash_dimension=dimension)
            report = book_pipeline(settings).run([book], run_id="switchpoint")
            print(f"switchpoint: {book} -> hash-{dimension}: {report}", file=sys.stderr)
        return vector

    EdgeStore.__init__ = init  # type: ignore[method-assign]
    HashEmbedder.embed_query = embed_query  # type: ignore[method-assign]


if __name__ == "__main__":
    install(sys.argv[1], int(sys.argv[2]))
    from rag_pipeline.cli import main

    main(sys.argv[3:], prog_name="rag-pipeline")

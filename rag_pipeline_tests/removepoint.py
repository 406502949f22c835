"""Run ``rag-pipeline`` and remove or rename a book folder from inside a run (fault injection).

    python -m rag_pipeline_tests.removepoint FOLDER [NEW_NAME|-] [rag-pipeline arguments...]

The hash embedder, the first time it is given a text with :data:`MARKER`, renames ``FOLDER``
to ``NEW_NAME`` beside it (``-``: deletes it) and goes on embedding: the book goes away while a
Dagster run is in the middle of its embedding step, as a user's ``rm -r`` or ``mv`` may.
Nothing in the product knows about this.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: the word whose embedding removes the folder
MARKER = "removemarkerword"


def install(folder: Path, new_name: str) -> None:
    from rag_pipeline.embed.hashing import HashEmbedder

    real = HashEmbedder._embed_batch
    done = {"removed": False}

    def embed_batch(self: HashEmbedder, texts: Sequence[str]) -> Any:
        if not done["removed"] and any(MARKER in t for t in texts):
            done["removed"] = True
            if new_name == "-":
                shutil.rmtree(folder)
            else:
                folder.rename(folder.with_name(new_name))
        return real(self, texts)

    HashEmbedder._embed_batch = embed_batch  # type: ignore[method-assign]


if __name__ == "__main__":
    install(Path(sys.argv[1]), sys.argv[2])
    from rag_pipeline.cli import main

    main(sys.argv[3:], prog_name="rag-pipeline")

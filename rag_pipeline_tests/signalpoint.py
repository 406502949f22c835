"""Run ``rag-pipeline`` and signal it from inside a run (fault injection for tests).

    python -m rag_pipeline_tests.signalpoint SIGNAL [rag-pipeline arguments...]

The hash embedder, the first time it is given a text with :data:`MARKER`, sends ``SIGNAL``
(SIGTERM, SIGINT) to its own process and goes on embedding: the signal arrives while a
Dagster run is in the middle of its embedding step, as a user's Ctrl-C or a service
manager's stop may. Nothing in the product knows about this.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

#: the word whose embedding sends the signal
MARKER = "signalmarkerword"


def install(signal_name: str) -> None:
    from rag_pipeline.embed.hashing import HashEmbedder

    number = signal.Signals[signal_name]
    real = HashEmbedder._embed_batch
    sent = {"done": False}

    def embed_batch(self: HashEmbedder, texts: Sequence[str]) -> Any:
        if not sent["done"] and any(MARKER in t for t in texts):
            sent["done"] = True
            os.kill(os.getpid(), number)
            time.sleep(0.5)  # the signal is handled while the step is still running
        return real(self, texts)

    HashEmbedder._embed_batch = embed_batch  # type: ignore[method-assign]


if __name__ == "__main__":
    install(sys.argv[1])
    from rag_pipeline.cli import main

    main(sys.argv[2:], prog_name="rag-pipeline")

"""Run ``rag-pipeline`` over object-store books (the CLI's whole path: plan, Dagster runs).

    python -m rag_pipeline_tests.s3cli BOOKS_JSON [rag-pipeline arguments...]

``BOOKS_JSON`` is a file ``{book_id: {"s3": ..., "endpoint_url": ...}}``; the settings'
source is replaced by the :class:`~rag_pipeline.sources.s3.S3Source` of those books before
the CLI runs (until the sources file declares them, the one place the CLI builds its source).
The warm server's children do the same for a "point" ``s3-books:BOOKS_JSON`` (warm.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def install(books_json: str) -> None:
    """Make the settings' source the object-store books declared in ``books_json``."""
    from rag_pipeline import config
    from rag_pipeline.sources.s3 import S3BookSpec, S3Source

    declared = json.loads(Path(books_json).read_text())
    books = {b: S3BookSpec.model_validate(spec) for b, spec in declared.items()}

    def source(settings: config.Settings) -> S3Source:
        return S3Source(books, max_file_bytes=settings.max_file_bytes)

    setattr(config.Settings, "source", source)  # noqa: B010


def main() -> None:
    install(sys.argv[1])
    from rag_pipeline.cli import main as cli

    sys.argv = ["rag-pipeline", *sys.argv[2:]]
    cli()


if __name__ == "__main__":
    main()

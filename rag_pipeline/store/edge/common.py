"""What the package's modules share: its logger."""

from __future__ import annotations

import logging

log = logging.getLogger("rag_pipeline.store.edge")

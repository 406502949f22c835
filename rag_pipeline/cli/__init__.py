"""``rag-pipeline``: plan and ingest books through Dagster, search them, walk lineage, evaluate.

Every command reads the same environment as the Dagster code location (README: Configuration).
``--json`` output is a stable contract documented in the README; human output uses tables.
Dagster is imported only by the commands that run it, so searches start fast.

No command prints a Python traceback: bad input and bad settings exit 2 with a message naming
what is wrong, failed work exits 1 (``-v`` adds the traceback of an unexpected error); output
whose reader exits early (``| head``) stops quietly with 141.

The commands: :mod:`.ingest` (ingest, plan, books), :mod:`.live` (watch), :mod:`.query`
(search, context, document, lineage, serve), :mod:`.evaluation` (eval), on the group of
:mod:`.app`.
"""

from rag_pipeline.cli import evaluation, ingest, live, query  # noqa: F401 - they add the commands
from rag_pipeline.cli.app import SIGPIPE_EXIT, main

__all__ = ["SIGPIPE_EXIT", "main"]

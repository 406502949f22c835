"""Old home of the run launcher, kept because ``dagster.yaml`` copies name it: the CLI copies
the repository's file into ``$DAGSTER_HOME`` only when none is there, and deployments copy
``deploy/dagster.postgres.yaml`` by hand, so an existing instance may still say
``module: rag_pipeline.orchestration.launcher`` (or ``rag_pipeline.defs.launcher``, the
current home), and its daemon would not start without this module."""

from rag_pipeline.defs.launcher import LocalRunLauncher

__all__ = ["LocalRunLauncher"]

"""Old names only (see :mod:`.launcher`): the Dagster layer lives in :mod:`rag_pipeline.defs`."""

"""The Dagster layer, all of it: partitions, assets with inline checks, jobs, sensors, the IO
manager (``location.build_defs`` binds them to resources; ``rag_pipeline.definitions`` is the
code location), and the harness that runs them from the CLI (``runner`` executes an ingest
plan's runs in this process; ``reaper`` fails runs whose process died; ``instance`` opens the
instance in ``DAGSTER_HOME``; ``launcher`` is the run launcher ``dagster.yaml`` names, with a
worker health check; ``partition_marker`` remembers the book partitions beside the instance).

Importing this package imports no Dagster module: the CLI's no-change path reads
``partition_marker`` without loading Dagster.
"""

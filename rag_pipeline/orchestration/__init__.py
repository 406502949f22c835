"""The CLI's run harness: running Dagster jobs in-process, beside the definitions in ``defs/``.

``runner`` executes an ingest plan's runs in this process; ``reaper`` fails runs whose process
died; ``instance`` opens the instance in ``DAGSTER_HOME``; ``launcher`` is the run launcher
``dagster.yaml`` names (with a worker health check); ``partition_marker`` remembers the book
partitions beside the instance. Importing this package imports no Dagster module (the CLI's
no-change path reads ``partition_marker`` without loading Dagster).
"""

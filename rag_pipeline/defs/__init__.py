"""The Dagster layer: partitions, assets with inline checks, jobs, the sensor, the runner.

``location.build_defs`` binds them to resources; ``rag_pipeline.definitions`` is the code
location. Importing this package imports no Dagster module (the CLI's no-change path reads
``partition_marker`` without loading Dagster).
"""

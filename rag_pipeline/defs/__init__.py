"""The Dagster definitions: partitions, assets with inline checks, jobs, sensors, the IO manager.

``location.build_defs`` binds them to resources; ``rag_pipeline.definitions`` is the code
location. The CLI's harness that runs them (runner, reaper, instance, launcher) is
:mod:`rag_pipeline.orchestration`. Importing this package imports no Dagster module.
"""

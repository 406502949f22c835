"""The store opener: the plain object through which the pipeline's stages open the store
(Dagster binds the pipeline that holds it as a resource, see ``defs/location.py``)."""

from rag_pipeline.resources.store import StoreOpener

__all__ = ["StoreOpener"]

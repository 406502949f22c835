"""ConfigurableResource wrappers that hand the pure modules their configured objects."""

from rag_pipeline.resources.books import BookSourceResource
from rag_pipeline.resources.embedder import EmbedderResource
from rag_pipeline.resources.store import QdrantStoreResource

__all__ = ["BookSourceResource", "EmbedderResource", "QdrantStoreResource"]

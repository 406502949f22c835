"""``rag-pipeline serve``: the retrieval API over HTTP, sharing an embedded store with ingestion.

FastAPI on uvicorn, one process (the embedded store's folder lock admits one holder); the
model and the store are loaded once, query embeddings are cached (LRU).
"""

from __future__ import annotations

from rag_pipeline.serve.app import CachedQueryEmbedder, Service, create_app, query_recipe
from rag_pipeline.serve.holder import StoreHolder

__all__ = ["CachedQueryEmbedder", "Service", "StoreHolder", "create_app", "query_recipe", "serve"]


def serve(app: object, host: str, port: int, *, access_log: bool = False) -> None:
    """Run the application until interrupted (uvicorn, one worker)."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=access_log)  # type: ignore[arg-type]  # a FastAPI app is an ASGI app

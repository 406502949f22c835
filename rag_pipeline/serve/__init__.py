"""``rag-pipeline serve``: the retrieval API over HTTP, sharing an embedded store with ingestion.

FastAPI on uvicorn, one process (the embedded store's folder lock admits one holder); the
model and the store are loaded once, query embeddings are cached (LRU).
"""

from __future__ import annotations

from rag_pipeline.serve.app import CachedQueryEmbedder, Service, create_app, query_recipe, warm_up
from rag_pipeline.serve.holder import StoreHolder

__all__ = [
    "CachedQueryEmbedder",
    "Service",
    "StoreHolder",
    "create_app",
    "query_recipe",
    "serve",
    "warm_up",
]


def serve(
    app: object,
    host: str,
    port: int,
    *,
    access_log: bool = False,
    read_timeout_s: float = 10.0,
    max_connections: int | None = None,
) -> None:
    """Run the application until interrupted (uvicorn, one worker), closing requests not
    complete within ``read_timeout_s`` and holding at most ``max_connections`` connections
    (default: see :func:`~rag_pipeline.serve.connections.max_connections`)."""
    import uvicorn

    from rag_pipeline.serve.connections import guarded_protocol
    from rag_pipeline.serve.connections import max_connections as held_at_most

    protocol = guarded_protocol(read_timeout_s, held_at_most(max_connections))
    uvicorn.run(
        app,  # type: ignore[arg-type]  # a FastAPI app is an ASGI app
        host=host,
        port=port,
        log_level="warning",
        access_log=access_log,
        http=protocol,
    )

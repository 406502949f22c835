"""The store on qdrant-client: a Qdrant server (url), an embedded folder (path) or memory.

qdrant-client's local mode (path / :memory:) is exact but brute force: it evaluates filters and
sparse vectors in Python, ignores payload indexes, writes one SQLite commit per point and loads
the whole collection on open; a folder is held under the same :class:`FolderLock` as Qdrant
Edge's. The embedded default is Qdrant Edge (``store/edge.py``); use this mode with
``RAG_QDRANT_EMBEDDED=client``, ``:memory:`` for tests, and a server for anything shared.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from qdrant_client import QdrantClient
from qdrant_client import models as qm
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from rag_pipeline.store import base, native
from rag_pipeline.store.filters import TenantFilter
from rag_pipeline.store.lock import FolderLock, prepare_folder
from rag_pipeline.urls import shown_url

__all__ = ["CLIENT", "QdrantStore"]

T = TypeVar("T")
#: qdrant-client's version check at a client's start, when it cannot reach the server: the
#: store's own error names the server and the attempts (a second, vaguer line said first, from
#: a background thread, told the user to turn the check off). An incompatible version is
#: still warned of.
UNREACHABLE_VERSION_WARNING = "Failed to obtain server version"
warnings.filterwarnings("ignore", message=UNREACHABLE_VERSION_WARNING, category=UserWarning)
_RETRYABLE = (ResponseHandlingException, ConnectionError, TimeoutError)
CLIENT = native.Dialect(
    models=qm,
    range=qm.Range,
    has_id=lambda ids: qm.HasIdCondition(has_id=list(ids)),
    point=qm.PointStruct,
)


class QdrantStore(base.VectorStore):
    """qdrant-client backed store on a server URL, a local folder or ``:memory:``."""

    def __init__(
        self,
        collection: str,
        schema: base.CollectionSchema,
        *,
        path: str | Path | None = None,
        url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 30.0,
        retries: int = 4,
        shards: int | None = None,
        replication_factor: int | None = None,
        busy_wait_s: float = 0.0,
    ) -> None:
        self.collection = collection
        self.schema = schema
        self._retries = max(retries, 1)
        self._shards = shards
        self._replication = replication_factor
        self._exists = False
        self._folder_lock: FolderLock | None = None
        self.is_server = url is not None
        if url:
            self._client = QdrantClient(url=url, api_key=api_key, timeout=int(timeout_s))
            self.description = f"Qdrant server {shown_url(url)}"
        elif path is None or str(path) == ":memory:":
            self._client = QdrantClient(location=":memory:")
            self.description = "qdrant-client in memory"
        else:
            self.description = f"qdrant-client local folder {path}"
            prepare_folder(Path(path))
            self._folder_lock = FolderLock(
                Path(path) / ".rag-store.lock", f"the embedded Qdrant store at {path}"
            )
            self._folder_lock.acquire(busy_wait_s)
            try:
                self._client = QdrantClient(path=str(path))
            except RuntimeError as exc:
                self._folder_lock.release()
                if "already accessed" in str(exc):  # a program that skipped the lock file
                    raise base.StoreBusyError(
                        f"{self.description} is in use by another process that does not take "
                        "its lock file"
                    ) from None
                raise

    @property
    def folder_lock(self) -> FolderLock | None:
        return self._folder_lock

    def _call(self, fn: Callable[[], T]) -> T:
        """Run a client call; server calls retry connection errors with exponential backoff."""
        if not self.is_server:
            return fn()
        wrapped = retry(
            reraise=True,
            stop=stop_after_attempt(self._retries),
            wait=wait_exponential(multiplier=0.5, max=8),
            retry=retry_if_exception_type(_RETRYABLE),
        )(fn)
        try:
            return wrapped()
        except _RETRYABLE as exc:
            raise base.StoreUnavailableError(
                f"{self.description} is unreachable after {self._retries} attempts: {exc}"
            ) from exc
        except UnexpectedResponse as exc:
            raise base.StoreError(f"{self.description} refused the request: {exc}") from exc

    # -- collection -------------------------------------------------------------------------

    def collection_exists(self) -> bool:
        if not self._exists:  # once seen, it stays: saves a round trip per call on a server
            self._exists = self._call(lambda: self._client.collection_exists(self.collection))
        return self._exists

    def dense_dimension(self) -> int | None:
        if not self.collection_exists():
            return None
        info = self._call(lambda: self._client.get_collection(self.collection))
        vectors = info.config.params.vectors
        if isinstance(vectors, dict) and base.DENSE_VECTOR in vectors:
            return vectors[base.DENSE_VECTOR].size
        return None

    def ensure_collection(self, spec: base.CollectionSpec) -> None:
        existing = self.dense_dimension()
        if existing is None and self.collection_exists():
            raise base.StoreError(
                f"collection {self.collection!r} exists without a "
                f"{base.DENSE_VECTOR!r} vector; it was not made by rag_pipeline"
            )
        self._check_dimension(existing, spec)
        if existing is None:
            self._create(spec)
        if self.is_server:  # local mode evaluates filters in Python and ignores payload indexes
            self._create_indexes()

    def _create(self, spec: base.CollectionSpec) -> None:
        layout: dict[str, Any] = {}
        if self.is_server:
            replication = self._replication
            layout = {
                "shard_number": self._shards,
                "replication_factor": replication,
                # a write succeeds once a majority of replicas has it
                "write_consistency_factor": replication // 2 + 1 if replication else None,
            }
        self._call(
            lambda: self._client.create_collection(
                self.collection,
                vectors_config={
                    base.DENSE_VECTOR: qm.VectorParams(
                        size=spec.dense_dim, distance=qm.Distance.COSINE
                    )
                },
                sparse_vectors_config={
                    base.SPARSE_VECTOR: qm.SparseVectorParams(modifier=qm.Modifier.IDF)
                },
                **{k: v for k, v in layout.items() if v is not None},
            )
        )
        self._exists = True

    def _create_indexes(self) -> None:
        present = set(self.payload_indexes())
        wanted: dict[str, Any] = {
            self.schema.tenant_field: qm.KeywordIndexParams(
                type=qm.KeywordIndexType.KEYWORD, is_tenant=True
            )
        }
        for name, kind in self.schema.payload_indexes.items():
            wanted[name] = (
                qm.PayloadSchemaType.INTEGER if kind == "integer" else qm.PayloadSchemaType.KEYWORD
            )
        for name, schema in wanted.items():
            if name not in present:
                self._create_index(name, schema)

    def _create_index(self, name: str, schema: Any) -> None:
        self._call(
            lambda: self._client.create_payload_index(
                self.collection, name, field_schema=schema, wait=True
            )
        )

    def drop_collection(self) -> None:
        """Delete the whole collection (``ingest --rebuild`` on a server)."""
        self._call(lambda: self._client.delete_collection(self.collection))
        self._exists = False

    def payload_indexes(self) -> dict[str, str]:
        if not self.collection_exists():
            return {}
        info = self._call(lambda: self._client.get_collection(self.collection))
        return {k: str(v.data_type) for k, v in (info.payload_schema or {}).items()}

    # -- primitives -------------------------------------------------------------------------

    def _filter(self, where: TenantFilter) -> qm.Filter:
        flt: qm.Filter = native.native_filter(CLIENT, self.schema.tenant_field, where)
        return flt

    def _upsert(self, points: Sequence[base.PointRecord]) -> None:
        structs = [native.native_point(CLIENT, p) for p in points]
        self._call(lambda: self._client.upsert(self.collection, structs, wait=True))

    def _delete(self, where: TenantFilter) -> None:
        selector = qm.FilterSelector(filter=self._filter(where))
        self._call(lambda: self._client.delete(self.collection, selector, wait=True))

    def _count(self, where: TenantFilter) -> int:
        flt = self._filter(where)
        return self._call(
            lambda: self._client.count(self.collection, count_filter=flt, exact=True)
        ).count

    def _scroll_page(self, page: base.ScrollPage) -> tuple[list[base.StoredRecord], Any]:
        flt = self._filter(page.where)
        records, next_offset = self._call(
            lambda: self._client.scroll(
                self.collection,
                scroll_filter=flt,
                limit=page.limit,
                offset=page.offset,
                with_payload=native.payload_selector(page.fields),
                with_vectors=native.vector_selector(page.with_vectors),
            )
        )
        return [native.to_record(r) for r in records], next_offset

    def _query_batch(self, queries: Sequence[base.NearestQuery]) -> list[list[base.ScoredRecord]]:
        requests = [self._request(q) for q in queries]
        responses = self._call(
            lambda: self._client.query_batch_points(self.collection, requests=requests)
        )
        return [[native.to_scored(p) for p in response.points] for response in responses]

    def _request(self, q: base.NearestQuery) -> qm.QueryRequest:
        flt = self._filter(q.where)
        pairs = [(native.native_vector(CLIENT, v), name) for v, name in q.nearest]
        if q.fusion is None:
            (query, using), prefetch = pairs[0], None
        else:
            query = (
                qm.FusionQuery(fusion=qm.Fusion.DBSF)
                if q.fusion.method == "dbsf"
                else qm.RrfQuery(rrf=qm.Rrf(k=q.fusion.rrf_k))
            )
            using = None
            prefetch = [
                qm.Prefetch(query=v, using=name, filter=flt, limit=q.prefetch_limit)
                for v, name in pairs
            ]
        return qm.QueryRequest(
            query=query,
            using=using,
            prefetch=prefetch,
            filter=flt,
            limit=q.limit,
            score_threshold=q.score_threshold,
            with_payload=native.payload_selector(q.with_payload),
            with_vector=False,
        )

    def _facet(self, key: str, where: TenantFilter | None) -> list[tuple[str, int]]:
        flt = None if where is None else self._filter(where)
        facets = self._call(
            lambda: self._client.facet(
                self.collection, key=key, facet_filter=flt, limit=1_000_000, exact=True
            )
        )
        return [(str(hit.value), int(hit.count)) for hit in facets.hits]

    def close(self) -> None:
        try:
            self._client.close()
        finally:
            if self._folder_lock is not None:
                self._folder_lock.release()

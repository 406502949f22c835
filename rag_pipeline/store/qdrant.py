"""The store on qdrant-client: a Qdrant server (url), an embedded folder (path) or memory.

qdrant-client's local mode (path / :memory:) is exact but brute force: it evaluates filters and
sparse vectors in Python, ignores payload indexes, writes one SQLite commit per point and loads
the whole collection on open; it also locks its folder against a second process. The embedded
default is Qdrant Edge (``store/edge.py``); use this mode with ``RAG_QDRANT_EMBEDDED=client``,
``:memory:`` for tests, and a server for anything shared.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from qdrant_client import QdrantClient
from qdrant_client import models as qm
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse
from tenacity import (
    retry,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
)

from rag_pipeline.store.base import (
    DENSE_VECTOR,
    PAYLOAD_INDEXES,
    SPARSE_VECTOR,
    CollectionSpec,
    PointRecord,
    ScoredRecord,
    SparseVector,
    StoreBusyError,
    StoredRecord,
    StoreError,
    StoreUnavailableError,
    VectorStore,
    batched,
)
from rag_pipeline.store.filters import Condition, Match, MatchAny, Range, TenantFilter

__all__ = ["QdrantStore", "to_qdrant_filter"]

T = TypeVar("T")
_RETRYABLE = (ResponseHandlingException, ConnectionError, TimeoutError)


def to_qdrant_filter(where: TenantFilter) -> qm.Filter:
    """The native filter: the tenant condition first, then every other condition."""
    must: list[qm.Condition] = [
        qm.FieldCondition(key="book_id", match=qm.MatchValue(value=where.book_id))
    ]
    must.extend(_condition(c) for c in where.conditions)
    return qm.Filter(must=must)


def _condition(c: Condition) -> qm.FieldCondition:
    if isinstance(c, Match):
        return qm.FieldCondition(key=c.key, match=qm.MatchValue(value=c.value))
    if isinstance(c, MatchAny):
        return qm.FieldCondition(key=c.key, match=qm.MatchAny(any=list(c.values)))
    if isinstance(c, Range):
        return qm.FieldCondition(key=c.key, range=qm.Range(gte=c.gte, lte=c.lte))
    raise TypeError(f"unknown condition {c!r}")


class QdrantStore(VectorStore):
    """qdrant-client backed store; ``location`` is a folder, ``:memory:`` or a server URL."""

    def __init__(
        self,
        collection: str,
        *,
        path: str | Path | None = None,
        url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 30.0,
        retries: int = 4,
        shards: int | None = None,
        replication_factor: int | None = None,
        client: QdrantClient | None = None,
    ) -> None:
        self.collection = collection
        self._retries = max(retries, 1)
        self._shards = shards
        self._replication = replication_factor
        self._exists = False
        self.is_server = url is not None
        if client is not None:
            self._client = client
            self.description = "qdrant-client (given client)"
        elif url:
            self._client = QdrantClient(url=url, api_key=api_key, timeout=int(timeout_s))
            self.description = f"Qdrant server {url}"
        elif path is None or str(path) == ":memory:":
            self._client = QdrantClient(location=":memory:")
            self.description = "qdrant-client in memory"
        else:
            Path(path).mkdir(parents=True, exist_ok=True)
            try:
                self._client = QdrantClient(path=str(path))
            except RuntimeError as exc:
                if "already accessed" in str(exc):
                    raise StoreBusyError(
                        f"the embedded Qdrant store at {path} is in use by another process "
                        "(a running ingest, `dagster dev`, or another CLI). Wait for it to "
                        "finish, or use a Qdrant server (RAG_QDRANT_URL) for concurrent access."
                    ) from None
                raise
            self.description = f"qdrant-client local folder {path}"

    # -- plumbing ---------------------------------------------------------------------------

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
            raise StoreUnavailableError(
                f"{self.description} is unreachable after {self._retries} attempts: {exc}"
            ) from exc
        except UnexpectedResponse as exc:
            raise StoreError(f"{self.description} refused the request: {exc}") from exc

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
        if isinstance(vectors, dict) and DENSE_VECTOR in vectors:
            return vectors[DENSE_VECTOR].size
        return None

    def ensure_collection(self, spec: CollectionSpec) -> None:
        existing = self.dense_dimension()
        if existing is not None:
            if existing != spec.dense_dim:
                raise StoreError(
                    f"collection {self.collection!r} holds {existing}-dimensional vectors but "
                    f"the embedder makes {spec.dense_dim}: use another RAG_COLLECTION or "
                    "re-create it"
                )
            self._ensure_indexes()
            return
        if self.collection_exists():
            raise StoreError(
                f"collection {self.collection!r} exists without a "
                f"{DENSE_VECTOR!r} vector; it was not made by rag_pipeline"
            )
        kwargs: dict[str, Any] = {}
        if self.is_server:
            replication = spec.replication_factor or self._replication
            kwargs = {
                "shard_number": spec.shard_number or self._shards,
                "replication_factor": replication,
                # a write succeeds once a majority of replicas has it
                "write_consistency_factor": replication // 2 + 1 if replication else None,
            }
        self._call(
            lambda: self._client.create_collection(
                self.collection,
                vectors_config={
                    DENSE_VECTOR: qm.VectorParams(size=spec.dense_dim, distance=qm.Distance.COSINE)
                },
                sparse_vectors_config={
                    SPARSE_VECTOR: qm.SparseVectorParams(modifier=qm.Modifier.IDF)
                },
                **{k: v for k, v in kwargs.items() if v is not None},
            )
        )
        self._ensure_indexes()

    def _ensure_indexes(self) -> None:
        if not self.is_server:
            return  # local mode evaluates filters in Python and ignores payload indexes
        info = self._call(lambda: self._client.get_collection(self.collection))
        present = set(info.payload_schema or {})
        for field, kind in PAYLOAD_INDEXES.items():
            if field in present:
                continue
            schema: Any
            if kind == "tenant":
                schema = qm.KeywordIndexParams(type=qm.KeywordIndexType.KEYWORD, is_tenant=True)
            elif kind == "integer":
                schema = qm.PayloadSchemaType.INTEGER
            else:
                schema = qm.PayloadSchemaType.KEYWORD
            self._call(
                lambda f=field, s=schema: self._client.create_payload_index(
                    self.collection, f, field_schema=s, wait=True
                )
            )

    def payload_indexes(self) -> dict[str, str]:
        info = self._call(lambda: self._client.get_collection(self.collection))
        return {k: str(v.data_type) for k, v in (info.payload_schema or {}).items()}

    # -- writes -----------------------------------------------------------------------------

    def upsert(self, points: Sequence[PointRecord]) -> int:
        for batch in batched(points):
            structs = [_to_struct(p) for p in batch]
            self._call(lambda s=structs: self._client.upsert(self.collection, s, wait=True))
        return len(points)

    def delete_ids(self, where: TenantFilter, ids: Sequence[str]) -> int:
        deleted = 0
        for batch in batched(list(ids), 1024):
            # The tenant condition keeps the delete inside the book even for foreign ids.
            native = qm.Filter(
                must=[*to_qdrant_filter(where).must, qm.HasIdCondition(has_id=list(batch))]
            )
            matching = self._count_native(native)
            if matching:
                self._call(
                    lambda f=native: self._client.delete(
                        self.collection, qm.FilterSelector(filter=f), wait=True
                    )
                )
                deleted += matching
        return deleted

    def delete_where(self, where: TenantFilter) -> int:
        before = self.count(where)
        if before:
            selector = qm.FilterSelector(filter=to_qdrant_filter(where))
            self._call(lambda: self._client.delete(self.collection, selector, wait=True))
        return before

    # -- reads ------------------------------------------------------------------------------

    def scroll(
        self,
        where: TenantFilter,
        *,
        fields: Sequence[str] | None = None,
        with_vectors: bool = False,
        page_size: int = 1024,
    ) -> Iterator[StoredRecord]:
        if not self.collection_exists():
            return
        native = to_qdrant_filter(where)
        payload: Any = list(fields) if fields is not None else True
        vectors: Any = [DENSE_VECTOR] if with_vectors else False
        offset = None
        while True:
            points, offset = self._call(
                lambda o=offset: self._client.scroll(
                    self.collection,
                    scroll_filter=native,
                    limit=page_size,
                    offset=o,
                    with_payload=payload,
                    with_vectors=vectors,
                )
            )
            for p in points:
                yield _to_record(p)
            if offset is None:
                return

    def retrieve(
        self, where: TenantFilter, ids: Sequence[str], *, with_vectors: bool = False
    ) -> list[StoredRecord]:
        if not ids or not self.collection_exists():
            return []
        native = qm.Filter(
            must=[*to_qdrant_filter(where).must, qm.HasIdCondition(has_id=list(ids))]
        )
        points, _ = self._call(
            lambda: self._client.scroll(
                self.collection,
                scroll_filter=native,
                limit=len(ids),
                with_payload=True,
                with_vectors=[DENSE_VECTOR] if with_vectors else False,
            )
        )
        return [_to_record(p) for p in points]

    def count(self, where: TenantFilter) -> int:
        return self._count_native(to_qdrant_filter(where))

    def _count_native(self, native: qm.Filter) -> int:
        if not self.collection_exists():
            return 0
        result = self._call(
            lambda: self._client.count(self.collection, count_filter=native, exact=True)
        )
        return result.count

    def query_dense(
        self,
        where: TenantFilter,
        vector: np.ndarray,
        *,
        limit: int,
        score_threshold: float | None = None,
    ) -> list[ScoredRecord]:
        return self._query(
            where,
            query=np.asarray(vector, dtype=np.float32).tolist(),
            using=DENSE_VECTOR,
            limit=limit,
            score_threshold=score_threshold,
        )

    def query_sparse(
        self,
        where: TenantFilter,
        vector: SparseVector,
        *,
        limit: int,
        score_threshold: float | None = None,
    ) -> list[ScoredRecord]:
        return self._query(
            where,
            query=_sparse(vector),
            using=SPARSE_VECTOR,
            limit=limit,
            score_threshold=score_threshold,
        )

    def query_hybrid(
        self,
        where: TenantFilter,
        dense: np.ndarray,
        sparse: SparseVector,
        *,
        limit: int,
        prefetch_limit: int,
        rrf_k: int = 60,
        score_threshold: float | None = None,
    ) -> list[ScoredRecord]:
        native = to_qdrant_filter(where)
        prefetch = [
            qm.Prefetch(
                query=np.asarray(dense, dtype=np.float32).tolist(),
                using=DENSE_VECTOR,
                filter=native,
                limit=prefetch_limit,
            ),
            qm.Prefetch(
                query=_sparse(sparse), using=SPARSE_VECTOR, filter=native, limit=prefetch_limit
            ),
        ]
        return self._query(
            where,
            query=qm.RrfQuery(rrf=qm.Rrf(k=rrf_k)),
            prefetch=prefetch,
            limit=limit,
            score_threshold=score_threshold,
        )

    def _query(self, where: TenantFilter, *, limit: int, **kwargs: Any) -> list[ScoredRecord]:
        if not self.collection_exists():
            return []
        response = self._call(
            lambda: self._client.query_points(
                self.collection,
                query_filter=to_qdrant_filter(where),
                limit=limit,
                with_payload=True,
                **kwargs,
            )
        )
        return [ScoredRecord(str(p.id), float(p.score), p.payload or {}) for p in response.points]

    def book_ids(self) -> list[str]:
        if not self.collection_exists():
            return []
        facets = self._call(
            lambda: self._client.facet(self.collection, key="book_id", limit=100_000, exact=True)
        )
        return sorted(str(hit.value) for hit in facets.hits if hit.count > 0)

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Block until the server answers (for tests and deployments that start one)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._client.get_collections()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def close(self) -> None:
        self._client.close()


def _sparse(vector: SparseVector) -> qm.SparseVector:
    return qm.SparseVector(indices=list(vector.indices), values=list(vector.values))


def _to_struct(point: PointRecord) -> qm.PointStruct:
    vector: dict[str, Any] = {}
    if point.dense is not None:
        vector[DENSE_VECTOR] = np.asarray(point.dense, dtype=np.float32).tolist()
    if point.sparse is not None and point.sparse.indices:
        vector[SPARSE_VECTOR] = _sparse(point.sparse)
    return qm.PointStruct(id=point.id, vector=vector, payload=point.payload)


def _to_record(point: qm.Record) -> StoredRecord:
    dense = None
    if isinstance(point.vector, dict) and DENSE_VECTOR in point.vector:
        dense = np.asarray(point.vector[DENSE_VECTOR], dtype=np.float32)
    return StoredRecord(str(point.id), point.payload or {}, dense)

"""The store on Qdrant Edge (``qdrant-edge-py``): Qdrant's own engine embedded in the process.

Unlike qdrant-client's local mode it uses the payload indexes, so a book-filtered query stays in
the low milliseconds at 100k points. One collection is one Edge shard, kept in
``<path>/<collection>``. Segments are searched as written (plain index + payload indexes); the
HNSW build (``optimize``) is left out on purpose: it takes minutes at 100k points on two cores
and filtered search is already fast without it.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import qdrant_edge as qe

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
    VectorStore,
    batched,
)
from rag_pipeline.store.filters import Condition, Match, MatchAny, Range, TenantFilter

__all__ = ["EdgeStore", "to_edge_filter"]


def to_edge_filter(where: TenantFilter, *extra: Any) -> qe.Filter:
    must: list[Any] = [qe.FieldCondition(key="book_id", match=qe.MatchValue(where.book_id))]
    must.extend(_condition(c) for c in where.conditions)
    must.extend(extra)
    return qe.Filter(must=must)


def _condition(c: Condition) -> qe.FieldCondition:
    if isinstance(c, Match):
        return qe.FieldCondition(key=c.key, match=qe.MatchValue(c.value))
    if isinstance(c, MatchAny):
        return qe.FieldCondition(key=c.key, match=qe.MatchAny(list(c.values)))
    if isinstance(c, Range):
        return qe.FieldCondition(key=c.key, range=qe.RangeFloat(gte=c.gte, lte=c.lte))
    raise TypeError(f"unknown condition {c!r}")


class EdgeStore(VectorStore):
    """A collection as a Qdrant Edge shard in ``<path>/<collection>``."""

    def __init__(self, collection: str, path: str | Path) -> None:
        self.collection = collection
        self.root = Path(path)
        self.folder = self.root / collection
        self.description = f"Qdrant Edge folder {self.folder}"
        self._shard: qe.EdgeShard | None = None
        self._lock = threading.RLock()
        if (self.folder / "edge_config.json").exists():
            self._shard = self._load()

    def _load(self) -> qe.EdgeShard:
        try:
            return qe.EdgeShard.load(str(self.folder))
        except Exception as exc:
            message = str(exc)
            # a second opener of the folder fails on the WAL's file lock ("WouldBlock")
            if "WouldBlock" in message or "lock" in message.lower():
                raise StoreBusyError(
                    f"the Qdrant Edge store at {self.folder} is in use by another process "
                    "(a running ingest, `dagster dev`, or another CLI); wait for it, or use a "
                    "Qdrant server (RAG_QDRANT_URL) for concurrent access"
                ) from None
            raise StoreError(f"cannot open the Qdrant Edge store at {self.folder}: {exc}") from exc

    # -- collection -------------------------------------------------------------------------

    def collection_exists(self) -> bool:
        return self._shard is not None

    def dense_dimension(self) -> int | None:
        config_file = self.folder / "edge_config.json"
        if self._shard is None or not config_file.is_file():
            return None
        vectors = json.loads(config_file.read_text()).get("vectors") or {}
        size = (vectors.get(DENSE_VECTOR) or {}).get("size")
        return int(size) if size is not None else None

    def ensure_collection(self, spec: CollectionSpec) -> None:
        with self._lock:
            if self._shard is None:
                self.folder.mkdir(parents=True, exist_ok=True)
                config = qe.EdgeConfig(
                    vectors={
                        DENSE_VECTOR: qe.EdgeVectorParams(
                            size=spec.dense_dim, distance=qe.Distance.Cosine
                        )
                    },
                    sparse_vectors={
                        SPARSE_VECTOR: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)
                    },
                )
                self._shard = qe.EdgeShard.create(str(self.folder), config)
            existing = self.dense_dimension()
            if existing is not None and existing != spec.dense_dim:
                raise StoreError(
                    f"collection {self.collection!r} holds {existing}-dimensional vectors but "
                    f"the embedder makes {spec.dense_dim}: use another RAG_COLLECTION"
                )
            present = set(self._shard.info().payload_schema)
            for field, kind in PAYLOAD_INDEXES.items():
                if field in present:
                    continue
                if kind == "tenant":
                    params: Any = qe.KeywordIndexParams(is_tenant=True)
                elif kind == "integer":
                    params = qe.IntegerIndexParams(lookup=True, range=True)
                else:
                    params = qe.KeywordIndexParams()
                self._shard.update(qe.UpdateOperation.create_field_index(field, params))

    def payload_indexes(self) -> dict[str, str]:
        if self._shard is None:
            return {}
        return {k: str(v.data_type) for k, v in self._shard.info().payload_schema.items()}

    def drop(self) -> None:
        """Delete the collection's folder (tests and `--recreate`)."""
        self.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    # -- writes -----------------------------------------------------------------------------

    def _require(self) -> qe.EdgeShard:
        if self._shard is None:
            raise StoreError(f"collection {self.collection!r} does not exist yet")
        return self._shard

    def upsert(self, points: Sequence[PointRecord]) -> int:
        shard = self._require()
        with self._lock:
            for batch in batched(points):
                shard.update(qe.UpdateOperation.upsert_points([_to_point(p) for p in batch]))
            shard.flush()
        return len(points)

    def delete_ids(self, where: TenantFilter, ids: Sequence[str]) -> int:
        if self._shard is None or not ids:
            return 0
        deleted = 0
        with self._lock:
            for batch in batched(list(ids), 1024):
                native = to_edge_filter(where, qe.HasIdCondition(set(batch)))
                matching = self._shard.count(qe.CountRequest(filter=native))
                if matching:
                    self._shard.update(qe.UpdateOperation.delete_points_by_filter(native))
                    deleted += matching
            self._shard.flush()
        return deleted

    def delete_where(self, where: TenantFilter) -> int:
        if self._shard is None:
            return 0
        native = to_edge_filter(where)
        with self._lock:
            matching = self._shard.count(qe.CountRequest(filter=native))
            if matching:
                self._shard.update(qe.UpdateOperation.delete_points_by_filter(native))
                self._shard.flush()
        return matching

    # -- reads ------------------------------------------------------------------------------

    def scroll(
        self,
        where: TenantFilter,
        *,
        fields: Sequence[str] | None = None,
        with_vectors: bool = False,
        page_size: int = 1024,
    ) -> Iterator[StoredRecord]:
        if self._shard is None:
            return
        native = to_edge_filter(where)
        payload: Any = list(fields) if fields is not None else True
        vectors: Any = [DENSE_VECTOR] if with_vectors else False
        offset = None
        while True:
            records, offset = self._shard.scroll(
                qe.ScrollRequest(
                    filter=native,
                    limit=page_size,
                    offset=offset,
                    with_payload=payload,
                    with_vector=vectors,
                )
            )
            for r in records:
                yield _to_record(r)
            if offset is None:
                return

    def retrieve(
        self, where: TenantFilter, ids: Sequence[str], *, with_vectors: bool = False
    ) -> list[StoredRecord]:
        if self._shard is None or not ids:
            return []
        native = to_edge_filter(where, qe.HasIdCondition(set(ids)))
        records, _ = self._shard.scroll(
            qe.ScrollRequest(
                filter=native,
                limit=len(ids),
                with_payload=True,
                with_vector=[DENSE_VECTOR] if with_vectors else False,
            )
        )
        return [_to_record(r) for r in records]

    def count(self, where: TenantFilter) -> int:
        if self._shard is None:
            return 0
        return int(self._shard.count(qe.CountRequest(filter=to_edge_filter(where))))

    def query_dense(
        self,
        where: TenantFilter,
        vector: np.ndarray,
        *,
        limit: int,
        score_threshold: float | None = None,
    ) -> list[ScoredRecord]:
        query = qe.Query.Nearest(np.asarray(vector, dtype=np.float32).tolist(), using=DENSE_VECTOR)
        return self._query(where, query=query, limit=limit, score_threshold=score_threshold)

    def query_sparse(
        self,
        where: TenantFilter,
        vector: SparseVector,
        *,
        limit: int,
        score_threshold: float | None = None,
    ) -> list[ScoredRecord]:
        if not vector.indices:
            return []
        return self._query(
            where,
            query=qe.Query.Nearest(_sparse(vector), using=SPARSE_VECTOR),
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
        native = to_edge_filter(where)
        prefetches = [
            qe.Prefetch(
                query=qe.Query.Nearest(
                    np.asarray(dense, dtype=np.float32).tolist(), using=DENSE_VECTOR
                ),
                filter=native,
                limit=prefetch_limit,
            )
        ]
        if sparse.indices:
            prefetches.append(
                qe.Prefetch(
                    query=qe.Query.Nearest(_sparse(sparse), using=SPARSE_VECTOR),
                    filter=native,
                    limit=prefetch_limit,
                )
            )
        return self._query(
            where,
            query=qe.Fusion.Rrf(k=rrf_k),
            prefetches=prefetches,
            limit=limit,
            score_threshold=score_threshold,
        )

    def _query(self, where: TenantFilter, *, limit: int, **kwargs: Any) -> list[ScoredRecord]:
        if self._shard is None:
            return []
        points = self._shard.query(
            qe.QueryRequest(
                limit=limit,
                filter=to_edge_filter(where),
                with_payload=True,
                with_vector=False,
                **kwargs,
            )
        )
        return [ScoredRecord(str(p.id), float(p.score), dict(p.payload or {})) for p in points]

    def book_ids(self) -> list[str]:
        if self._shard is None:
            return []
        hits = self._shard.facet(qe.FacetRequest(key="book_id", limit=1_000_000, exact=True))
        # the keyword index may keep a value whose points were all deleted, with count 0
        return sorted(str(h.value) for h in hits if h.count > 0)

    def close(self) -> None:
        with self._lock:
            if self._shard is not None:
                self._shard.flush()
                self._shard.close()
                self._shard = None


def _sparse(vector: SparseVector) -> qe.SparseVector:
    return qe.SparseVector(indices=list(vector.indices), values=list(vector.values))


def _to_point(point: PointRecord) -> qe.Point:
    vector: dict[str, Any] = {}
    if point.dense is not None:
        vector[DENSE_VECTOR] = np.asarray(point.dense, dtype=np.float32).tolist()
    if point.sparse is not None and point.sparse.indices:
        vector[SPARSE_VECTOR] = _sparse(point.sparse)
    return qe.Point(id=point.id, vector=vector, payload=point.payload)


def _to_record(record: Any) -> StoredRecord:
    dense = None
    vectors = record.vector
    if isinstance(vectors, dict) and DENSE_VECTOR in vectors:
        dense = np.asarray(vectors[DENSE_VECTOR], dtype=np.float32)
    return StoredRecord(str(record.id), dict(record.payload or {}), dense)

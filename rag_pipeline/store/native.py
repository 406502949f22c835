"""Conversion between the neutral store types and the client libraries' own models.

qdrant-client's models and Qdrant Edge's classes share their shapes and keyword names
(``FieldCondition(key=, match=MatchValue(value=))``, ``Filter(must=)``, ``SparseVector(indices=,
values=)``, records with ``.id`` / ``.payload`` / ``.vector``), so one set of functions serves
both; a :class:`Dialect` names the few classes that differ.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rag_pipeline.store.base import (
    DENSE_VECTOR,
    SPARSE_VECTOR,
    PointRecord,
    ScoredRecord,
    SparseVector,
    StoredRecord,
)
from rag_pipeline.store.filters import Condition, HasIds, Match, MatchAny, Range, TenantFilter

__all__ = [
    "Dialect",
    "native_filter",
    "native_point",
    "native_sparse",
    "native_vector",
    "payload_selector",
    "to_record",
    "to_scored",
    "vector_selector",
]


@dataclass(frozen=True, slots=True)
class Dialect:
    """One client library's model classes."""

    models: Any  # the module: qdrant_client.models or qdrant_edge
    range: Callable[..., Any]  # Range | RangeFloat
    has_id: Callable[[list[str]], Any]  # HasIdCondition(has_id=...) | (point_ids=...)
    point: Callable[..., Any]  # PointStruct | Point


def native_filter(dialect: Dialect, tenant_field: str, where: TenantFilter) -> Any:
    """The native filter: the tenant condition first, then every other condition."""
    m = dialect.models
    must = [m.FieldCondition(key=tenant_field, match=m.MatchValue(value=where.tenant))]
    for condition in where.conditions:
        if condition.key == tenant_field:
            raise ValueError(f"{tenant_field} is the tenant key; it cannot be filtered again")
        must.append(_condition(dialect, condition))
    return m.Filter(must=must)


def _condition(dialect: Dialect, c: Condition) -> Any:
    m = dialect.models
    if isinstance(c, Match):
        return m.FieldCondition(key=c.key, match=m.MatchValue(value=c.value))
    if isinstance(c, MatchAny):
        return m.FieldCondition(key=c.key, match=m.MatchAny(any=list(c.values)))
    if isinstance(c, Range):
        return m.FieldCondition(key=c.key, range=dialect.range(gte=c.gte, lte=c.lte))
    if isinstance(c, HasIds):
        return dialect.has_id(list(c.ids))
    raise TypeError(f"unknown condition {c!r}")


def native_sparse(dialect: Dialect, vector: SparseVector) -> Any:
    return dialect.models.SparseVector(indices=list(vector.indices), values=list(vector.values))


def native_vector(dialect: Dialect, vector: np.ndarray | SparseVector) -> Any:
    """A query vector: a list of floats (dense) or the library's sparse vector."""
    if isinstance(vector, SparseVector):
        return native_sparse(dialect, vector)
    return np.asarray(vector, dtype=np.float32).tolist()


def native_point(dialect: Dialect, point: PointRecord) -> Any:
    vector: dict[str, Any] = {}
    if point.dense is not None:
        vector[DENSE_VECTOR] = np.asarray(point.dense, dtype=np.float32).tolist()
    if point.sparse is not None and point.sparse.indices:
        vector[SPARSE_VECTOR] = native_sparse(dialect, point.sparse)
    return dialect.point(id=point.id, vector=vector, payload=point.payload)


def payload_selector(fields: Sequence[str] | bool | None) -> Any:
    """``True`` (all), ``False`` (none) or the list of fields; None means all."""
    if fields is None or isinstance(fields, bool):
        return fields is None or fields
    return list(fields)


def vector_selector(with_vectors: bool) -> Any:
    return [DENSE_VECTOR] if with_vectors else False


def to_record(raw: Any) -> StoredRecord:
    dense = None
    vectors = raw.vector
    if isinstance(vectors, dict) and DENSE_VECTOR in vectors:
        dense = np.asarray(vectors[DENSE_VECTOR], dtype=np.float32)
    return StoredRecord(str(raw.id), dict(raw.payload or {}), dense)


def to_scored(raw: Any) -> ScoredRecord:
    return ScoredRecord(str(raw.id), float(raw.score), dict(raw.payload or {}))

"""Backend-neutral filters whose type makes the tenant condition impossible to omit.

Every read, count and delete of a store takes a :class:`TenantFilter`; it cannot exist without
a tenant value, and each backend turns it into a native filter whose first ``must`` condition
is ``<tenant field> == tenant``. Which payload field is the tenant key is the collection
schema's business (:class:`rag_pipeline.store.base.CollectionSchema`), not this module's.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "Condition",
    "HasIds",
    "Match",
    "MatchAny",
    "Range",
    "Scalar",
    "TenantFilter",
    "check_point_id",
]

Scalar = str | int | bool
# Qdrant stores integers as signed 64-bit: a larger value is refused by the engine, not here.
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


def _check_scalar(key: str, value: object) -> None:
    if isinstance(value, bool | str):
        return
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            raise ValueError(f"filter value {value} for {key!r} does not fit in 64 bits")
        return
    raise ValueError(f"filter value {value!r} for {key!r} must be a string, integer or boolean")


@dataclass(frozen=True, slots=True)
class Match:
    key: str
    value: Scalar

    def __post_init__(self) -> None:
        _check_scalar(self.key, self.value)


@dataclass(frozen=True, slots=True)
class MatchAny:
    key: str
    values: tuple[Scalar, ...]

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError(f"match-any on {self.key!r} needs at least one value")
        for value in self.values:
            _check_scalar(self.key, value)


@dataclass(frozen=True, slots=True)
class Range:
    key: str
    gte: int | float | None = None
    lte: int | float | None = None

    def __post_init__(self) -> None:
        for bound in (self.gte, self.lte):
            if isinstance(bound, int) and not INT64_MIN <= bound <= INT64_MAX:
                raise ValueError(f"range bound {bound} for {self.key!r} does not fit in 64 bits")


def check_point_id(point_id: str) -> str:
    """``point_id`` in canonical form if it is a UUID (every id this pipeline writes), else
    ValueError naming it."""
    try:
        return str(uuid.UUID(str(point_id).strip()))
    except (ValueError, AttributeError):
        raise ValueError(
            f"{str(point_id)[:80]!r} is not a point id (point ids are UUIDs, e.g. from "
            "`search --json`)"
        ) from None


@dataclass(frozen=True, slots=True)
class HasIds:
    """Points whose id is one of ``ids`` (and that meet the rest of the filter)."""

    ids: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "ids", tuple(check_point_id(i) for i in self.ids))

    @property
    def key(self) -> str:
        return ""  # an id condition names no payload field


Condition = Match | MatchAny | Range | HasIds


@dataclass(frozen=True, slots=True)
class TenantFilter:
    """``<tenant field> == tenant`` AND all ``conditions``."""

    tenant: str
    conditions: tuple[Condition, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.tenant, str) or not self.tenant:
            raise ValueError("a store filter needs a tenant: results never cross tenants")

    def with_conditions(self, *conditions: Condition) -> TenantFilter:
        return TenantFilter(self.tenant, self.conditions + tuple(conditions))

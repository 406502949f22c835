"""Backend-neutral filters whose type makes the tenant (book) condition impossible to omit.

Every read, count and delete of a store takes a :class:`TenantFilter`; the only way to build one
is with a validated ``book_id``, and each backend turns it into a native filter whose first
``must`` condition is ``book_id == ...``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rag_pipeline.crawl import validate_book_id
from rag_pipeline.models import normalize_proficiency

__all__ = [
    "Condition",
    "Match",
    "MatchAny",
    "Range",
    "SearchFilters",
    "TenantFilter",
    "tenant_filter",
]

Scalar = str | int | bool


@dataclass(frozen=True, slots=True)
class Match:
    key: str
    value: Scalar


@dataclass(frozen=True, slots=True)
class MatchAny:
    key: str
    values: tuple[Scalar, ...]


@dataclass(frozen=True, slots=True)
class Range:
    key: str
    gte: int | float | None = None
    lte: int | float | None = None


Condition = Match | MatchAny | Range


@dataclass(frozen=True, slots=True)
class TenantFilter:
    """``book_id == X`` AND all ``conditions``. Build it with :func:`tenant_filter`."""

    book_id: str
    conditions: tuple[Condition, ...] = ()

    def __post_init__(self) -> None:
        validate_book_id(self.book_id)
        for condition in self.conditions:
            if condition.key == "book_id":
                raise ValueError("book_id is the tenant key; it cannot be filtered again")

    def with_conditions(self, *conditions: Condition) -> TenantFilter:
        return TenantFilter(self.book_id, self.conditions + tuple(conditions))


def tenant_filter(book_id: str, *conditions: Condition) -> TenantFilter:
    return TenantFilter(book_id, tuple(conditions))


@dataclass(frozen=True, slots=True)
class SearchFilters:
    """The user-facing filters of a search, all optional and combined with AND."""

    module: str | None = None
    chapter_min: int | None = None
    chapter_max: int | None = None
    lesson: int | None = None
    hardware_tier: int | None = None  # this tier or lower
    proficiency_levels: tuple[str, ...] = ()
    equals: Mapping[str, Scalar] = field(default_factory=dict)

    def conditions(self) -> tuple[Condition, ...]:
        out: list[Condition] = []
        if self.module is not None:
            out.append(Match("module", self.module))
        if self.chapter_min is not None or self.chapter_max is not None:
            if (
                self.chapter_min is not None
                and self.chapter_max is not None
                and self.chapter_min > self.chapter_max
            ):
                raise ValueError(
                    f"chapter range is empty: min {self.chapter_min} > max {self.chapter_max}"
                )
            out.append(Range("chapter", gte=self.chapter_min, lte=self.chapter_max))
        if self.lesson is not None:
            out.append(Match("lesson", self.lesson))
        if self.hardware_tier is not None:
            out.append(Range("hardware_tier", lte=self.hardware_tier))
        if self.proficiency_levels:
            levels = tuple(normalize_proficiency(v) for v in self.proficiency_levels)
            out.append(MatchAny("proficiency_level", levels))
        for key, value in sorted(self.equals.items()):
            if key in ("book_id", "record_type"):
                raise ValueError(f"{key} cannot be used as a free filter")
            out.append(Match(key, value))
        return tuple(out)


def parse_equals(pairs: Sequence[str]) -> dict[str, Scalar]:
    """``key=value`` strings to a dict; integer-looking values become ints, true/false bools."""
    out: dict[str, Scalar] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"filter {pair!r} is not key=value")
        value: Scalar = raw
        if raw.lstrip("-").isdigit():
            value = int(raw)
        elif raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        out[key.strip()] = value
    return out

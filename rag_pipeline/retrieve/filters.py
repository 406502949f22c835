"""The user-facing search filters of a book's chunks, turned into store conditions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rag_pipeline.models import normalize_proficiency
from rag_pipeline.schema import BOOK_ID
from rag_pipeline.store import Condition, Match, MatchAny, Range
from rag_pipeline.store.filters import INT64_MAX, INT64_MIN, Scalar

__all__ = ["SearchFilters", "parse_equals"]


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
        """Store conditions; ``ValueError`` naming the filter when one cannot hold."""
        for name in ("chapter_min", "chapter_max", "lesson", "hardware_tier"):
            value = getattr(self, name)
            if value is not None and not INT64_MIN <= value <= INT64_MAX:
                raise ValueError(f"--{name.replace('_', '-')} {value} does not fit in 64 bits")
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
            if key in (BOOK_ID, "record_type"):
                raise ValueError(f"{key} cannot be used as a free filter")
            out.append(Match(key, value))
        return tuple(out)


def parse_equals(pairs: Sequence[str]) -> dict[str, Scalar]:
    """``key=value`` strings to a dict; integer-looking values become ints, true/false bools.

    An integer too large for the index (64 bits) is an error, never a silent mismatch."""
    out: dict[str, Scalar] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"filter {pair!r} is not key=value")
        value: Scalar = raw
        if raw.lstrip("-").isdigit() and raw.lstrip("-").isascii():
            number = int(raw)
            if not INT64_MIN <= number <= INT64_MAX:
                raise ValueError(f"filter {pair!r}: {raw} does not fit in 64 bits")
            value = number
        elif raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        out[key.strip()] = value
    return out

"""The user-facing search filters of a book's chunks, turned into store conditions."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from rag_pipeline.models import normalize_proficiency
from rag_pipeline.schema import (
    CHAPTER,
    HARDWARE_TIER,
    LESSON,
    MODULE,
    PAYLOAD_INDEXES,
    PROFICIENCY_LEVEL,
    SCOPE_FIELDS,
)
from rag_pipeline.store import Condition, Match, MatchAny, Range
from rag_pipeline.store.filters import INT64_MAX, INT64_MIN, Scalar

__all__ = ["EQUALS_FIELDS", "SearchFilters", "parse_equals", "parse_integer"]

_Value = TypeVar("_Value", bound=Scalar)

#: an integer's text: ASCII digits with an optional sign (not ``1.0``, ``1_000``, ``--5``, ``٣``)
_INTEGER = re.compile(r"[+-]?[0-9]+")


def parse_integer(text: str) -> int:
    """The integer ``text`` names, by the one rule every integer a caller gives is read with
    (an option, a query parameter, a ``key=value`` filter): ASCII digits with an optional
    sign. ``ValueError`` saying what is wrong with the text (the caller names what it was
    for): not a whole number, or digits past Python's conversion limit (4300), whose own
    message named its settings. A value read is checked against its bounds by the caller
    (64 bits for a filter: a 400 naming it)."""
    if not _INTEGER.fullmatch(text):
        raise ValueError(f"{_clipped(text)!r} is not a whole number")
    try:
        return int(text)
    except ValueError:  # digits only: past Python's conversion limit, far past 64 bits
        raise ValueError(
            f"{_clipped(text)!r} ({len(text)} characters) does not fit in 64 bits"
        ) from None


def _clipped(text: str, chars: int = 40) -> str:
    return text if len(text) <= chars else text[: chars - 1] + "…"


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
            out.append(Match(MODULE, _utf8("--module", self.module)))
        if self.chapter_min is not None or self.chapter_max is not None:
            if (
                self.chapter_min is not None
                and self.chapter_max is not None
                and self.chapter_min > self.chapter_max
            ):
                raise ValueError(
                    f"chapter range is empty: min {self.chapter_min} > max {self.chapter_max}"
                )
            out.append(Range(CHAPTER, gte=self.chapter_min, lte=self.chapter_max))
        if self.lesson is not None:
            out.append(Match(LESSON, self.lesson))
        if self.hardware_tier is not None:
            out.append(Range(HARDWARE_TIER, lte=self.hardware_tier))
        if self.proficiency_levels:
            levels = tuple(
                normalize_proficiency(_utf8("--proficiency", v)) for v in self.proficiency_levels
            )
            if not all(levels):
                raise ValueError("--proficiency needs a level (e.g. beginner or B1), not ''")
            out.append(MatchAny(PROFICIENCY_LEVEL, levels))
        for key, value in sorted(self.equals.items()):
            if key in SCOPE_FIELDS:
                raise ValueError(f"{key} cannot be used as a free filter")
            out.append(Match(key, _utf8(f"filter {key}", value)))
        return tuple(out)


def _utf8(name: str, value: _Value) -> _Value:
    """``value``, if it is text the store can match: an argument holding a byte that is not
    UTF-8 (the shell passes it on, Python keeps it as a lone surrogate) is refused naming the
    filter (it reached the engine, which failed the search with an internal type error)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            shown = value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            raise ValueError(f"{name} value '{shown}' is not valid UTF-8 text") from None
    return value


#: what ``key=value`` filters may name: the chunk payload's indexed fields, with their types
#: (the tenant and the record type are set by every search itself)
EQUALS_FIELDS: dict[str, str] = {
    key: kind for key, kind in PAYLOAD_INDEXES.items() if key not in SCOPE_FIELDS
}


def parse_equals(pairs: Sequence[str]) -> dict[str, Scalar]:
    """``key=value`` strings to a dict, each value of its field's type (an integer field's
    value an int, a keyword field's the text as given).

    A key that is not a filterable field, a value of the wrong type, an integer too large for
    the index (64 bits) and a key given twice (which value would it mean?) are errors naming
    what is wrong, never a silent empty answer or a silently dropped value."""
    out: dict[str, Scalar] = {}
    given: dict[str, str] = {}  # key -> the pair that gave it
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"filter {pair!r} is not key=value")
        if key in given:
            raise ValueError(
                f"filter key {key!r} is given twice ({given[key]!r} and {pair!r}): "
                "give each key once"
            )
        given[key] = pair
        if key in SCOPE_FIELDS:
            raise ValueError(f"{key} cannot be used as a free filter")
        kind = EQUALS_FIELDS.get(key)
        if kind is None:
            raise ValueError(
                f"filter {pair!r}: {key!r} is not a filterable field; use one of "
                f"{', '.join(sorted(EQUALS_FIELDS))}"
            )
        value: Scalar = raw
        if kind == "integer":
            try:
                number = parse_integer(raw.strip())
            except ValueError as exc:
                raise ValueError(
                    f"filter {_clipped(pair)!r}: {key} is an integer field: {exc}"
                ) from None
            if not INT64_MIN <= number <= INT64_MAX:
                raise ValueError(f"filter {_clipped(pair)!r}: {raw} does not fit in 64 bits")
            value = number
        elif key == PROFICIENCY_LEVEL:
            value = normalize_proficiency(raw)  # as stored, and as --proficiency matches
        out[key] = value
    return out

"""The retrieval commands' parameters, declared once: ``rag-pipeline search`` (and ``context``)
builds its options from these, ``GET /search`` (and ``/context``) its query parameters, and
both read the values into one :class:`~rag_pipeline.retrieve.request.SearchRequest`, so a
default, a bound or a choice cannot differ between the CLI and the HTTP service.

The one-value rule is stated here too (:func:`repeated`): a parameter that takes one value may
be given once; the CLI and the service each apply it to what they were given. So is how a
value's text is read (:meth:`Param.read`): both read every value given as text through it, so
neither takes a value the other refuses (the service's types took ``limit=1.0``).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from types import SimpleNamespace
from typing import Any, cast

from rag_pipeline.retrieve.filters import SearchFilters, parse_equals, parse_integer
from rag_pipeline.retrieve.request import MAX_GROUP_SIZE, MAX_LIMIT, SEARCH_MODES, SearchRequest
from rag_pipeline.retrieve.search import FUSIONS, GROUP_KEYS, GroupBy, SearchMode
from rag_pipeline.store import FusionMethod

__all__ = [
    "BOOK",
    "CONTEXT_PARAMS",
    "SEARCH_PARAMS",
    "Param",
    "param",
    "repeated",
    "search_request",
]


def _default(name: str) -> Any:
    """A search's default, as :class:`SearchRequest` declares it."""
    return next(f.default for f in fields(SearchRequest) if f.name == name)


@dataclass(frozen=True)
class Param:
    """One parameter: its name (the HTTP query name; the CLI option is ``--name`` with
    dashes), type, default (None: not given), help, bounds or choices, and whether it may be
    given several times (its value is then a sequence)."""

    name: str
    kind: type
    default: Any
    help: str
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] | None = None
    repeatable: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def read(self, text: str) -> Any:
        """The value ``text`` gives, by the one rule both interfaces read values with:
        an integer is ASCII digits with an optional sign (:func:`parse_integer`, as a
        ``where`` filter's integer),
        a number an ASCII decimal (``nan``, ``inf`` read: the search refuses them), within the
        bounds, one of the choices.
        ``ValueError`` saying what is wrong (the caller names the parameter)."""
        value: Any = text
        if self.kind is int:
            value = parse_integer(text)
        elif self.kind is float:
            try:  # Python's float in ASCII: nan and inf are read (and refused as not finite)
                if not _DECIMAL.fullmatch(text):
                    raise ValueError
                value = float(text)
            except ValueError:
                raise ValueError(f"{text!r} is not a number") from None
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"{text!r} is not one of {', '.join(self.choices)}")
        low, high = self.minimum, self.maximum
        if (low is not None and value < low) or (high is not None and value > high):
            shown = f"{'' if low is None else low}..{'' if high is None else high}"
            raise ValueError(f"{value} is not within {shown}")
        return value


_DECIMAL = re.compile(
    r"[+-]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|nan|inf|infinity)",
    re.IGNORECASE,
)


#: the tenant of every retrieval command (required: answers never cross books)
BOOK = Param("book", str, None, "book id (tenant); required: answers never cross books")

#: what a search takes besides its query text and its book
SEARCH_PARAMS: tuple[Param, ...] = (
    Param("module", str, None, "exact module"),
    Param("chapter_min", int, None, "chapters from this one"),
    Param("chapter_max", int, None, "chapters up to this one"),
    Param("lesson", int, None, "this lesson"),
    Param("hardware_tier", int, None, "this tier or lower"),
    Param("proficiency", str, None, "any of these levels; repeatable", repeatable=True),
    Param("where", str, None, "payload equality filter key=value; repeatable", repeatable=True),
    Param(
        "limit",
        int,
        _default("limit"),
        "hits (with group_by: groups)",
        minimum=1,
        maximum=MAX_LIMIT,
    ),
    Param(
        "score_threshold",
        float,
        None,
        "minimum score: cosine (dense), BM25 (sparse) or the fused score (hybrid; min-max "
        "scores lie in [0, 1])",
    ),
    Param(
        "mode",
        str,
        _default("mode"),
        "dense, sparse or hybrid (the default, chosen by measurement)",
        choices=SEARCH_MODES,
    ),
    Param(
        "fusion",
        str,
        _default("fusion"),
        "how hybrid mode fuses its dense and sparse lists: minmax (client-side min-max, "
        "alpha 0.5; the default, chosen by measurement), dbsf or rrf (the engine's)",
        choices=FUSIONS,
    ),
    Param("rrf_k", int, _default("rrf_k"), "k of fusion rrf", minimum=1, maximum=100_000),
    Param(
        "group_by",
        str,
        None,
        "the best chunks of each of the limit best files",
        choices=tuple(GROUP_KEYS),
    ),
    Param(
        "group_size",
        int,
        _default("group_size"),
        "chunks per group with group_by",
        minimum=1,
        maximum=MAX_GROUP_SIZE,
    ),
)

#: what ``context`` takes besides its chunk id and its book
CONTEXT_PARAMS: tuple[Param, ...] = (
    Param("prev", int, 1, "chunks before it", minimum=0, maximum=100),
    Param("next", int, 1, "chunks after it", minimum=0, maximum=100),
)


def param(name: str) -> Param:
    """The search parameter ``name`` (for a command that takes some of them)."""
    return next(p for p in SEARCH_PARAMS if p.name == name)


def search_request(query: str, book_id: str, values: Mapping[str, Any]) -> SearchRequest:
    """The search the values of :data:`SEARCH_PARAMS` describe (``ValueError`` naming the
    first thing wrong: see :class:`SearchRequest`)."""
    # read by attribute: each is a parameter's name (the payload keys are schema.py's)
    v = SimpleNamespace(**{p.name: values.get(p.name, p.default) for p in SEARCH_PARAMS})
    return SearchRequest(
        query,
        book_id,
        SearchFilters(
            module=v.module,
            chapter_min=v.chapter_min,
            chapter_max=v.chapter_max,
            lesson=v.lesson,
            hardware_tier=v.hardware_tier,
            proficiency_levels=tuple(v.proficiency or ()),
            equals=parse_equals(v.where or ()),
        ),
        limit=v.limit,
        mode=cast("SearchMode", v.mode),
        fusion=cast("FusionMethod", v.fusion),
        rrf_k=v.rrf_k,
        score_threshold=v.score_threshold,
        group_by=cast("GroupBy | None", v.group_by),
        group_size=v.group_size,
    )


def single_valued(params: Sequence[Param]) -> frozenset[str]:
    """The names of ``params`` that take one value."""
    return frozenset(p.name for p in params if not p.repeatable)


def repeated(given: Iterable[str], single: Collection[str]) -> tuple[str, int] | None:
    """The one-value rule: the first name of ``single`` that ``given`` (the names of a
    request's parameters, in order, once per value) holds more than once, and how often;
    None when there is none. Both interfaces refuse such a request instead of keeping one of
    the values silently (a gateway that checked the first ``book`` would be bypassed)."""
    counts = Counter(given)
    for name in dict.fromkeys(given):
        if name in single and counts[name] > 1:
            return name, counts[name]
    return None

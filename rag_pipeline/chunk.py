"""Heading-aware, token-budgeted chunking of Markdown documents.

A document goes through small pure steps:

1. **blocks**: markdown-it-py splits the body into top-level blocks (headings, paragraphs, lists,
   fenced or indented code, tables, HTML/JSX), each counted with the embedder's tokenizer;
2. **runs**: every content block is led by the headings right above it (of any level), so a
   heading always travels with its body and never ends a chunk. Only headings that end the
   document (no body to travel with) may end one, and headings longer than half a chunk, cut
   into pieces of which the last leads the body;
3. **sections**: a run whose headings include one of level <= ``split_level`` opens a section;
4. **units**: each run becomes what packing never cuts: its headings plus its block, or, for a
   block too big for one chunk, self-contained pieces of it (code re-fenced, table pieces keep
   their header) with the headings on the first;
5. **packing**: units fill a chunk up to ``target_tokens``; a split inside a section repeats the
   tail (about ``overlap`` of the target) of the previous chunk, cut at sentence or line
   boundaries, unless the next chunk opens with a heading. A section smaller than
   ``min_tokens`` merges into the next one only when that one then fits whole, else it joins
   the chunk before it (or stands alone), so that an edit to it never moves the split points of
   a neighbouring section;
6. **limit**: every chunk is counted exactly on the text the embedder reads (title and heading
   path included, special tokens too) and cut again if it exceeds the hard limit, the smaller of
   ``max_tokens`` and the model's input. The header (title and heading path) is itself cut to a
   quarter of the limit, at token boundaries and marked with "…", so no title or heading can
   push a chunk over the limit;
7. **linking**: ids and prev/next links.

A chunk's ``section_title`` is the heading path (below the document title) at its first block,
so it names every heading the chunk opens with.

Point ids are uuid5 of (book id, document path, content hash, occurrence), so unchanged text
keeps its id across runs and repeated text inside a document still gets distinct ids.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Literal, NamedTuple

from markdown_it import MarkdownIt
from markdown_it.rules_block import StateBlock
from markdown_it.rules_block import table as markdown_table
from markdown_it.token import Token

from rag_pipeline.config import ChunkingConfig
from rag_pipeline.embed.base import TokenCounter
from rag_pipeline.models import POINT_NAMESPACE, Chunk, ParsedDocument, compose_embed_text

__all__ = [
    "CHUNKER_VERSION",
    "ChunkBudget",
    "chunk_document",
    "chunk_id",
    "content_hash",
]

#: bump when the way text is cut changes, so every file is re-chunked on the next run
CHUNKER_VERSION = "3"
# Block structure is all the chunker needs; skipping inline parsing halves the parse time.
_md = MarkdownIt("commonmark").enable("table").disable(["inline", "text_join"])
#: a table's tokens the chunker reads; the rest (a dozen per row) are never kept
_TABLE_ENDS = ("table_open", "table_close")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")
_DELIMITER_ROW = re.compile(r"^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")
_FENCE = re.compile(r"^([ \t]*)(`{3,}|~{3,})")
#: the embedded header (title and heading path) takes at most 1/_HEADER_SHARE of the limit
_HEADER_SHARE = 4
_ELLIPSIS = "…"
_PATH_SEP = " > "
_NO_OVERLAP = ("fence", "code", "table")  # kinds that never get an overlap tail
#: a chunk's text holds at most this many characters per token of the hard limit
_MAX_CHARS_PER_TOKEN = 32
_LONG_SPACE = re.compile(r"\s{65,}")
#: a text longer than this is counted and split in pieces of about this size (see _large_tokens)
_WHOLE_COUNT_CHARS = 1 << 16
#: a tokenizer call gets texts of at most about this many characters in all: it holds every
#: token of a call at once (ids, offsets, strings), hundreds of MB for a large document
_COUNT_CALL_CHARS = 1 << 18
_SPACE = re.compile(r"\s")


@dataclass(frozen=True, slots=True)
class ChunkBudget:
    """Token budget resolved against one embedder (limit = what the model reads at most)."""

    target: int
    limit: int
    minimum: int
    overlap: int
    split_level: int = 2

    @classmethod
    def for_tokenizer(cls, config: ChunkingConfig, tokenizer: TokenCounter) -> ChunkBudget:
        limit = min(config.max_tokens, tokenizer.max_input_tokens)
        target = min(config.target_tokens, limit)
        minimum = min(config.min_tokens, target)
        return cls(target, limit, minimum, round(target * config.overlap))


@dataclass(frozen=True, slots=True)
class _Block:
    kind: str  # heading | fence | code | table | text
    text: str
    tokens: int = 0
    level: int = 0  # heading level
    title: str = ""  # heading text


@dataclass(frozen=True, slots=True)
class _Run:
    """A content block and the headings right above it (None: headings that end the text)."""

    headings: tuple[_Block, ...]
    content: _Block | None


@dataclass(frozen=True, slots=True)
class _Unit:
    """What packing never cuts: a block or a piece of one, led by its headings if any."""

    text: str
    tokens: int
    path: str | None  # heading path at this unit, as embedded
    kind: str  # kind of the block the unit ends with
    body: str = ""  # the unit without its leading headings (where an overlap tail comes from)
    lead: bool = False  # opens with a heading: a chunk may start here without overlap


@dataclass(frozen=True, slots=True)
class _Piece:
    """The text of one chunk, its heading path and its tokens (estimated, then exact)."""

    text: str
    path: str | None
    tokens: int
    starts_with_overlap: bool = False


@dataclass(frozen=True, slots=True)
class _Room:
    soft: int  # body tokens a chunk aims for
    hard: int  # body tokens a chunk may never exceed


class _Fence(NamedTuple):
    start: int  # line of the opener
    end: int | None  # line of the closer; None: the fence runs to the end of the text
    indent: str
    marker: str  # ``` or ~~~ (or longer)


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def chunk_id(book_id: str, source_file: str, digest: str, occurrence: int) -> str:
    key = f"chunk\x1f{book_id}\x1f{source_file}\x1f{digest}\x1f{occurrence}"
    return str(uuid.uuid5(POINT_NAMESPACE, key))


def chunk_document(
    doc: ParsedDocument, tokenizer: TokenCounter, budget: ChunkBudget
) -> list[Chunk]:
    """Split one document into linked chunks; an empty document gives no chunk.

    Every chunk's embedded text fits ``budget.limit`` tokens, special tokens included."""
    if doc.is_empty:
        return []
    tokenizer = _BoundedCalls(tokenizer)
    body, title = _valid_text(doc.body), _valid_text(doc.meta.title)
    blocks = _count(_blocks(body), tokenizer)
    if not blocks:
        return []
    header = _Header(title, tokenizer, budget)
    runs = _runs(blocks)
    paths = header.paths(_heading_paths(runs, title))
    units = [
        _units(run, path, header, tokenizer, budget) for run, path in zip(runs, paths, strict=True)
    ]
    sections = [
        [u for i in indexes for u in units[i]] for indexes in _sections(runs, budget.split_level)
    ]
    pieces = _pack(sections, header, tokenizer, budget)
    pieces = _enforce_limit(pieces, header, tokenizer, budget)
    pieces = _bound_chars(pieces, header, tokenizer, budget)
    meta = doc.meta if header.title == doc.meta.title else replace(doc.meta, title=header.title)
    return _link(replace(doc, meta=meta), pieces, header)


def _valid_text(text: str) -> str:
    """``text`` with any lone surrogate replaced, so it can be encoded and tokenized."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return text


class _BoundedCalls(TokenCounter):
    """``tokenizer`` fed at most about ``_COUNT_CALL_CHARS`` characters a call, so that what a
    call holds stays small however many texts a large document asks it to count at once."""

    def __init__(self, tokenizer: TokenCounter) -> None:
        self._tokenizer = tokenizer
        self.special_tokens = tokenizer.special_tokens
        self.max_input_tokens = tokenizer.max_input_tokens

    def count(self, texts: Sequence[str]) -> list[int]:
        counts: list[int] = []
        start, size = 0, 0
        for i, text in enumerate(texts):
            if size + len(text) > _COUNT_CALL_CHARS and i > start:
                counts += self._tokenizer.count(texts[start:i])
                start, size = i, 0
            size += len(text)
        return counts + self._tokenizer.count(texts[start:]) if start < len(texts) else counts

    def split(self, text: str, max_tokens: int) -> list[str]:
        """The tokenizer's split; a large text is fed in pieces cut before white space, the
        last part of each carried into the next: the same parts for a tokenizer whose tokens
        never span white space, in linear time and memory."""
        if len(text) <= _WHOLE_COUNT_CHARS:
            return self._tokenizer.split(text, max_tokens)
        parts: list[str] = []
        rest = ""
        for piece in _cut_before_space(text, _WHOLE_COUNT_CHARS):
            cut = self._tokenizer.split(rest + piece, max_tokens)
            if len(cut) < 2:  # too few tokens to cut yet
                rest += piece
                continue
            parts += cut[:-1]
            rest = cut[-1]
        return parts + self._tokenizer.split(rest, max_tokens)


# -- markdown to blocks, runs and sections ------------------------------------------------


def _table_outline(state: StateBlock, start: int, end: int, silent: bool) -> bool:
    """markdown-it's table rule, keeping only the tokens that open and close the table: the
    chunker reads no cell, and a dozen tokens a row would hold hundreds of MB for a large table
    (and take half its parse time)."""
    if silent:
        return markdown_table(state, start, end, silent)
    push = state.push
    cell = Token("cell", "", 0)  # stands in for every inner token, which the rule only fills

    def push_table_ends(ttype: str, tag: str, nesting: Literal[-1, 0, 1]) -> Token:
        if ttype in _TABLE_ENDS:
            return push(ttype, tag, nesting)
        state.level += nesting  # what push does to the level
        return cell

    state.push = push_table_ends  # type: ignore[method-assign]
    try:
        return markdown_table(state, start, end, silent)
    finally:
        del state.push


# the table rule may interrupt a paragraph or a reference, as markdown-it declares it
_md.block.ruler.at("table", _table_outline, {"alt": ["paragraph", "reference"]})


def _blocks(body: str) -> list[_Block]:
    lines = body.split("\n")
    tokens = _md.parse(body)
    blocks: list[_Block] = []
    for i, tok in enumerate(tokens):
        if tok.level != 0 or tok.map is None or tok.nesting == -1:
            continue
        start, end = tok.map
        text = "\n".join(lines[start:end]).strip("\n")
        if not text.strip():
            continue
        if tok.type == "heading_open":
            title = tokens[i + 1].content.strip() if i + 1 < len(tokens) else ""
            blocks.append(_Block("heading", text, level=int(tok.tag[1]), title=title))
        elif tok.type in ("fence", "code_block"):
            blocks.append(_Block("fence" if tok.type == "fence" else "code", text))
        elif tok.type == "table_open":
            blocks.append(_Block("table", _compact_delimiter_row(text)))
        else:
            blocks.append(_Block("text", text))
    return blocks


def _count(blocks: list[_Block], tokenizer: TokenCounter) -> list[_Block]:
    """The blocks with their tokens (see :func:`_counts`)."""
    counts = _counts([b.text for b in blocks], tokenizer)
    return [replace(b, tokens=n) for b, n in zip(blocks, counts, strict=True)]


def _counts(texts: Sequence[str], tokenizer: TokenCounter) -> list[int]:
    """The tokens of each text, one longer than ``_WHOLE_COUNT_CHARS`` counted in pieces until
    it is sure to be over any limit (see :func:`_large_tokens`)."""
    counts = tokenizer.count([t if len(t) <= _WHOLE_COUNT_CHARS else "" for t in texts])
    for i, text in enumerate(texts):
        if len(text) > _WHOLE_COUNT_CHARS:
            counts[i] = _large_tokens(text, tokenizer, 4 * tokenizer.max_input_tokens)
    return counts


def _large_tokens(text: str, tokenizer: TokenCounter, enough: int) -> int:
    """The tokens of a large text, or, once its first pieces (cut before white space) have more
    than ``enough``, their sum: all that matters of a text far over the limit is that it is
    over, and a tokenizer given one huge text holds all its tokens and takes more than linear
    time. The sum is exact for a tokenizer whose tokens never span white space (a WordPiece),
    else off by a few tokens per cut, which changes nothing that far over the limit."""
    total = 0
    for piece in _cut_before_space(text, _WHOLE_COUNT_CHARS):
        total += tokenizer.count([piece])[0]
        if total > enough:
            return total
    return tokenizer.count([text])[0]


def _cut_before_space(text: str, size: int) -> Iterator[str]:
    """``text`` as consecutive pieces of about ``size`` characters, each cut before the first
    white space at or after its size (so a piece with none runs on to the end)."""
    start = 0
    while len(text) - start > size:
        space = _SPACE.search(text, start + size)
        if space is None:
            break
        yield text[start : space.start()]
        start = space.start()
    yield text[start:]


def _runs(blocks: Sequence[_Block]) -> list[_Run]:
    """Each content block with the headings right above it; trailing headings on their own."""
    runs: list[_Run] = []
    headings: list[_Block] = []
    for block in blocks:
        if block.kind == "heading":
            headings.append(block)
        else:
            runs.append(_Run(tuple(headings), block))
            headings = []
    if headings:
        runs.append(_Run(tuple(headings), None))
    return runs


def _sections(runs: Sequence[_Run], split_level: int) -> list[list[int]]:
    """Indexes of the runs of each section: a run with a heading of level <= ``split_level``
    opens a new one (with the headings above it that have no body of their own)."""
    sections: list[list[int]] = []
    for i, run in enumerate(runs):
        if not sections or any(h.level <= split_level for h in run.headings):
            sections.append([i])
        else:
            sections[-1].append(i)
    return sections


def _heading_paths(runs: Sequence[_Run], doc_title: str) -> list[tuple[str, ...]]:
    """The heading names above each run's content, outermost first; an outermost heading that
    repeats the document title is left out (the title leads every embedded text anyway)."""
    stack: list[tuple[int, str]] = []
    paths: list[tuple[str, ...]] = []
    for run in runs:
        for heading in run.headings:
            while stack and stack[-1][0] >= heading.level:
                stack.pop()
            stack.append((heading.level, heading.title))
        names = [name for _, name in stack if name]
        if names and names[0].strip().lower() == doc_title.strip().lower():
            names = names[1:]
        paths.append(tuple(names))
    return paths


# -- the embedded header: title and heading path, cut to a share of the limit -------------


class _Header:
    """The title and heading paths as embedded with every chunk, each cut to fit a quarter of
    the limit (the title to half of that), and the room they leave for a chunk's body."""

    def __init__(self, title: str, tokenizer: TokenCounter, budget: ChunkBudget) -> None:
        self._tokenizer = tokenizer
        self._budget = budget
        self.share = max(budget.limit // _HEADER_SHARE, 2)
        self.title = _cut(title, self.share // 2, tokenizer)
        self._paths: dict[tuple[str, ...], str | None] = {}
        self._tokens: dict[str | None, int] = {}  # tokens of the header of each path
        self._rooms: dict[str | None, _Room] = {}

    def text(self, path: str | None, body: str) -> str:
        return compose_embed_text(self.title, path, body)

    def paths(self, names: Sequence[tuple[str, ...]]) -> list[str | None]:
        """The heading path of each list of names as embedded (see :meth:`path`); the paths
        that fit whole, nearly all of them, are counted in one call."""
        new = list(dict.fromkeys(n for n in names if n not in self._paths))
        full = [_PATH_SEP.join(n) or None for n in new]
        counts = self._tokenizer.count([self.text(path, "") for path in full])
        for key, path, n in zip(new, full, counts, strict=True):
            if n <= self.share:
                self._paths[key] = path
                self._tokens[path] = n
        return [self.path(n) for n in names]

    def path(self, names: tuple[str, ...]) -> str | None:
        """The heading path as embedded: outer names give way to "…" first, then the innermost
        name is cut, until title and path fit the header share."""
        if names not in self._paths:
            count = self._tokenizer.count
            path = None
            room = self.share - count([self.title + _PATH_SEP])[0]
            while names and room >= 1:
                path = _cut_path(names, room, self._tokenizer)
                if count([self.text(path, "")])[0] <= self.share:
                    break
                path, room = None, room - 1
            self._paths[names] = path
        return self._paths[names]

    def room(self, path: str | None) -> _Room:
        """Body tokens left in a chunk of this path: what the header and the model's special
        tokens (and the blank line after the header) leave of the target and of the limit."""
        if path not in self._rooms:
            header = self.text(path, "")
            if path not in self._tokens:
                self._tokens[path] = self._tokenizer.count([header])[0]
            overhead = self._tokenizer.special_tokens + (self._tokens[path] + 2 if header else 0)
            hard = max(self._budget.limit - overhead, 1)
            self._rooms[path] = _Room(min(max(self._budget.target - overhead, 8), hard), hard)
        return self._rooms[path]


def _cut(text: str, max_tokens: int, tokenizer: TokenCounter) -> str:
    """``text`` if it has at most ``max_tokens`` tokens, else its head cut at a token boundary
    and marked with "…" so that the whole still fits."""
    if tokenizer.count([text])[0] <= max_tokens:
        return text
    # the head is all that can stay: no need to tokenize a huge tail again and again
    head = text[: 64 * max_tokens]
    n = max_tokens - 1
    while n >= 1:
        parts = tokenizer.split(head, n)
        cut = (parts[0].rstrip() if parts else "") + _ELLIPSIS
        over = tokenizer.count([cut])[0] - max_tokens
        if over <= 0:
            return cut
        n -= over
    return _ELLIPSIS if tokenizer.count([_ELLIPSIS])[0] <= max_tokens else ""


def _cut_path(names: tuple[str, ...], max_tokens: int, tokenizer: TokenCounter) -> str:
    """The path if it fits, else its innermost names behind "…", else the innermost name cut."""
    for k in range(len(names)):
        path = _PATH_SEP.join((_ELLIPSIS, *names[k:]) if k else names)
        if tokenizer.count([path])[0] <= max_tokens:
            return path
    return _cut(names[-1], max_tokens, tokenizer)


# -- runs to units ------------------------------------------------------------------------


def _units(
    run: _Run, path: str | None, header: _Header, tokenizer: TokenCounter, budget: ChunkBudget
) -> list[_Unit]:
    """A run as units: its headings travel with its block (or the first piece of it)."""
    room = header.room(path)
    units: list[_Unit] = []
    lead = "\n\n".join(h.text for h in run.headings)
    lead_tokens = sum(h.tokens for h in run.headings)
    if lead_tokens > room.hard // 2:
        # Headings longer than half a chunk cannot travel with a body: cut them into pieces,
        # the last of which leads the body.
        parts = _split_text(lead, "heading", tokenizer, max(room.hard // 2, 1))
        units += [_Unit(p.text, p.tokens, path, "heading", lead=True) for p in parts[:-1]]
        lead, lead_tokens = (parts[-1].text, parts[-1].tokens) if parts else ("", 0)
    content = run.content
    if content is None:  # headings that end the document: nothing to travel with
        return [*units, _Unit(lead, lead_tokens, path, "heading", lead=True)] if lead else units
    if lead_tokens + content.tokens <= room.hard:
        pieces = [content]
    else:
        # prose pieces leave room for the overlap that will precede them; code and tables
        # never get an overlap tail, so they may fill the chunk (all but what the headings take)
        size = room.hard - lead_tokens
        if content.kind not in _NO_OVERLAP:
            size = min(size, room.soft - budget.overlap)
        size = min(max(size, 8), max(room.hard - lead_tokens, 1))
        pieces = _split_block(content, tokenizer, size) or [content]
    first = pieces[0]
    text = f"{lead}\n\n{first.text}" if lead else first.text
    units.append(_Unit(text, lead_tokens + first.tokens, path, first.kind, first.text, bool(lead)))
    units += [_Unit(p.text, p.tokens, path, p.kind, p.text) for p in pieces[1:]]
    return units


def _split_block(block: _Block, tokenizer: TokenCounter, limit: int) -> list[_Block]:
    """Cut a block that exceeds ``limit`` into self-contained pieces that each fit."""
    if block.kind == "table":
        return _split_table(block, tokenizer, limit)
    lines = block.text.split("\n")
    if block.kind == "fence" or _fences(lines):  # code, or code nested in a list item
        return _pack_lines(lines, limit, tokenizer, block.kind)
    return _split_text(block.text, block.kind, tokenizer, limit)


def _split_text(text: str, kind: str, tokenizer: TokenCounter, limit: int) -> list[_Block]:
    """Prose cut between lines, or between sentences when it is one line."""
    units = [u for u in text.split("\n") if u.strip()]
    if len(units) == 1:
        units = _SENTENCE_END.split(units[0])
    return _group_lines(units, "\n" if "\n" in text else " ", "", "", tokenizer, limit, kind)


def _compact_delimiter_row(table: str) -> str:
    """``| ------------ | :-----: |`` -> ``| --- | :---: |``: the same table once rendered, but
    a wide delimiter row would otherwise cost a token per dash (and repeat in every piece)."""
    lines = table.split("\n")
    if len(lines) > 1 and _DELIMITER_ROW.match(lines[1]):
        cells = [c.strip() for c in lines[1].strip().strip("|").split("|")]
        compact = [
            (":" if c.startswith(":") else "") + "---" + (":" if c.endswith(":") else "")
            for c in cells
        ]
        lines[1] = "| " + " | ".join(compact) + " |"
    return "\n".join(lines)


def _split_table(block: _Block, tokenizer: TokenCounter, limit: int) -> list[_Block]:
    lines = block.text.split("\n")
    header = "\n".join(lines[:2]) + "\n"
    if tokenizer.count([header])[0] > limit // 3:  # a huge header would crowd out the rows
        return _group_lines(lines, "\n", "", "", tokenizer, limit, "table")
    return _group_lines(lines[2:], "\n", header, "", tokenizer, limit, "table")


def _group_lines(
    lines: Sequence[str],
    sep: str,
    prefix: str,
    suffix: str,
    tokenizer: TokenCounter,
    limit: int,
    kind: str,
) -> list[_Block]:
    """Pack lines into pieces of at most ``limit`` tokens, each wrapped in prefix/suffix."""
    wrap = tokenizer.count([prefix + suffix])[0] if (prefix or suffix) else 0
    room = max(limit - wrap, 1)
    out: list[_Block] = []
    group: list[str] = []
    total = 0
    for unit, n in _cut_long_lines(lines, room, tokenizer):
        if group and total + n > room:
            out.append(_Block(kind, prefix + sep.join(group) + suffix, tokens=total + wrap))
            group, total = [], 0
        group.append(unit)
        total += n
    if group:
        out.append(_Block(kind, prefix + sep.join(group) + suffix, tokens=total + wrap))
    return out


def _cut_long_lines(
    lines: Sequence[str], room: int, tokenizer: TokenCounter
) -> list[tuple[str, int]]:
    """Each line with its tokens; one longer than ``room`` is cut at token boundaries."""
    out: list[tuple[str, int]] = []
    for line, n in zip(lines, _counts(lines, tokenizer), strict=True):
        if n > room:
            parts = tokenizer.split(line, max(room, 1))
            out.extend(zip(parts, tokenizer.count(parts), strict=True))
        else:
            out.append((line, n))
    return out


def _pack_lines(
    lines: Sequence[str], limit: int, tokenizer: TokenCounter, kind: str
) -> list[_Block]:
    """Pack lines into pieces of at most ``limit`` tokens; a piece that starts or ends inside a
    fenced code block re-opens or closes it, so every piece stays valid Markdown (unless the
    fence's opener is so long that repeating it would crowd out the code)."""
    fences = _fences(lines)
    inside: list[_Fence | None] = [None] * len(lines)  # the fence each line belongs to
    for each in fences:
        end = len(lines) - 1 if each.end is None else each.end
        for i in range(each.start, end + 1):
            inside[i] = each
    wrap: dict[_Fence, tuple[str, int, str, int]] = {}  # opener, its tokens, closer, its tokens
    for each in fences:
        fence_opener, fence_closer = lines[each.start], each.indent + each.marker
        n_open, n_close = tokenizer.count([fence_opener, fence_closer])
        if n_open + n_close <= limit // 3:
            wrap[each] = (fence_opener, n_open, fence_closer, n_close)
    out: list[_Block] = []
    part: list[str] = []
    total = 0
    closer: tuple[str, int] | None = None  # what closes the fence the part ends inside, if any
    for i, (line, n_line) in enumerate(zip(lines, tokenizer.count(list(lines)), strict=True)):
        fence = inside[i] if inside[i] in wrap else None
        opener, n_open, _, n_close = wrap[fence] if fence else ("", 0, "", 0)
        closing = fence is not None and i == fence.end
        reopen = fence is not None and i != fence.start  # a piece starting here re-opens
        # what this line needs on top of itself: the closer of its fence, unless it closes it
        reserve = n_close if fence and not closing else 0
        room = max(limit - reserve - (n_open if reopen else 0), 1)
        units = [(line, n_line)] if n_line <= room else _cut_long_lines([line], room, tokenizer)
        for unit, n in units:
            if part and total + n + reserve > limit:
                out += _closed(part, total, closer, kind)
                part, total = ([opener], n_open) if reopen else ([], 0)
            part.append(unit)
            total += n
            closer = (wrap[fence][2], n_close) if fence and not closing else None
    return out + _closed(part, total, closer, kind)


def _closed(
    lines: list[str], tokens: int, closer: tuple[str, int] | None, kind: str
) -> list[_Block]:
    """The piece these lines make, closing the fence they end inside; none if it is blank."""
    if closer is not None:
        lines, tokens = [*lines, closer[0]], tokens + closer[1]
    text = "\n".join(lines).strip("\n")
    return [_Block(kind, text, tokens=tokens)] if text.strip() else []


# -- packing ------------------------------------------------------------------------------


def _pack_section(
    units: Sequence[_Unit], header: _Header, tokenizer: TokenCounter, budget: ChunkBudget
) -> list[_Piece]:
    """Fill chunks with a section's units up to the soft target; a chunk that continues a unit
    of prose repeats the tail of the chunk before it."""
    pieces: list[_Piece] = []
    texts: list[str] = []
    tokens = 0
    path: str | None = None
    overlap = False
    last: _Unit | None = None  # the last unit in the open chunk, None while it has none
    for unit in units:
        if last is not None and tokens + unit.tokens > header.room(path).soft:
            pieces.append(_Piece("\n\n".join(texts), path, tokens, overlap))
            tail = None if unit.lead else _overlap_tail(last, tokenizer, budget.overlap)
            if tail is not None and tail[1] + unit.tokens > header.room(unit.path).hard:
                tail = None
            texts, tokens, overlap = ([tail[0]], tail[1], True) if tail else ([], 0, False)
            last = None
        if last is None:
            path = unit.path
        texts.append(unit.text)
        tokens += unit.tokens
        last = unit
    if last is not None:
        pieces.append(_Piece("\n\n".join(texts), path, tokens, overlap))
    return pieces


def _pack(
    sections: Sequence[Sequence[_Unit]],
    header: _Header,
    tokenizer: TokenCounter,
    budget: ChunkBudget,
) -> list[_Piece]:
    """Pack each section, chaining them. A section smaller than the minimum merges into the
    next one when that one then fits whole in the same chunk, else it joins the piece before it
    (or stands alone): an edit to it never moves the split points of the next section."""
    pieces: list[_Piece] = []
    carry: _Piece | None = None  # a small section (or several) waiting for the next one
    for units in sections:
        if carry is not None:
            whole = sum(u.tokens for u in units)
            if carry.tokens + whole <= header.room(carry.path).soft:
                carry = _joined(carry, _Piece("\n\n".join(u.text for u in units), None, whole))
                if carry.tokens >= budget.minimum:
                    pieces.append(carry)
                    carry = None
                continue
            pieces = _join_small_last([*pieces, carry], header, budget)
            carry = None
        packed = _pack_section(units, header, tokenizer, budget)
        if len(packed) == 1 and packed[0].tokens < budget.minimum:
            carry = packed[0]
        else:
            pieces.extend(packed)
    return _join_small_last([*pieces, carry], header, budget) if carry else pieces


def _joined(first: _Piece, second: _Piece) -> _Piece:
    return _Piece(
        first.text + "\n\n" + second.text,
        first.path,
        first.tokens + second.tokens,
        first.starts_with_overlap,
    )


def _join_small_last(pieces: list[_Piece], header: _Header, budget: ChunkBudget) -> list[_Piece]:
    """The last piece, when small, joins the one before it if both fit in the target."""
    if len(pieces) < 2:
        return pieces
    prev, last = pieces[-2], pieces[-1]
    if (
        last.tokens < budget.minimum
        and not last.starts_with_overlap
        and prev.tokens + last.tokens <= header.room(prev.path).soft
    ):
        return [*pieces[:-2], _joined(prev, last)]
    return pieces


def _overlap_tail(unit: _Unit, tokenizer: TokenCounter, overlap: int) -> tuple[str, int] | None:
    """The last sentences or lines of a unit of prose, at most ``overlap`` tokens, never code."""
    if overlap <= 0 or unit.kind != "text":
        return None
    lines = unit.body.split("\n")
    fences = _fences(lines)
    if fences:  # only what follows the last (closed) fence may repeat
        end = fences[-1].end
        lines = lines[end + 1 :] if end is not None else []
    units = [u for u in lines if u.strip()]
    if len(units) == 1:
        units = _SENTENCE_END.split(units[0])
    if len(units) < 2:
        return None
    counts = tokenizer.count(units)
    taken: list[str] = []
    total = 0
    for text, n in zip(reversed(units[1:]), reversed(counts[1:]), strict=True):
        if total + n > overlap:
            break
        taken.append(text)
        total += n
    if not taken:
        return None
    sep = "\n" if "\n" in unit.body else " "
    return sep.join(reversed(taken)), total


# -- the hard limit -----------------------------------------------------------------------


def _enforce_limit(
    pieces: Sequence[_Piece], header: _Header, tokenizer: TokenCounter, budget: ChunkBudget
) -> list[_Piece]:
    """The pieces with exact counts of their embedded texts (special tokens included), any
    piece over the limit cut until each part fits: token counts of parts are not additive."""
    special = tokenizer.special_tokens
    counts = tokenizer.count([header.text(p.path, p.text) for p in pieces])
    out: list[_Piece] = []
    for piece, n in zip(pieces, counts, strict=True):
        if n + special <= budget.limit:
            out.append(replace(piece, tokens=n + special))
            continue

        def measure(text: str, path: str | None = piece.path) -> int:
            return tokenizer.count([header.text(path, text)])[0] + special

        parts = _fit(piece.text, measure, budget.limit, tokenizer)
        out += [
            _Piece(text, piece.path, m, piece.starts_with_overlap and i == 0)
            for i, (text, m) in enumerate(parts)
        ]
    return [p for p in out if p.text.strip()]


def _bound_chars(
    pieces: list[_Piece], header: _Header, tokenizer: TokenCounter, budget: ChunkBudget
) -> list[_Piece]:
    """Pieces whose text is over ``_MAX_CHARS_PER_TOKEN`` characters per token of the limit,
    cut down: the tokenizer ignores white space, so a list nested thousands of levels deep
    packs megabytes of indentation into a chunk that is within its token budget. Such a piece
    has its white space runs shortened to 64 characters, then is cut between lines. Ordinary
    text runs at 3-13 characters per token (both corpora: at most 12.2, longest chunk 2,833
    characters), so ordinary documents come back untouched, piece for piece."""
    max_chars = budget.limit * _MAX_CHARS_PER_TOKEN
    if all(len(p.text) <= max_chars for p in pieces):
        return pieces
    special = tokenizer.special_tokens
    out: list[_Piece] = []
    for piece in pieces:
        if len(piece.text) <= max_chars:
            out.append(piece)
            continue
        text = _LONG_SPACE.sub(lambda m: m.group(0)[:64], piece.text).strip()
        parts = _char_groups(text, max_chars)
        counts = tokenizer.count([header.text(piece.path, t) for t in parts])
        for i, (part, n) in enumerate(zip(parts, counts, strict=True)):
            first = piece.starts_with_overlap and i == 0
            if n + special <= budget.limit:
                out.append(_Piece(part, piece.path, n + special, first))
            else:  # a part of a piece within the limit rarely is over it; cut it if so

                def measure(t: str, path: str | None = piece.path) -> int:
                    return tokenizer.count([header.text(path, t)])[0] + special

                fitted = _fit(part, measure, budget.limit, tokenizer)
                out += [
                    _Piece(t, piece.path, m, first and j == 0) for j, (t, m) in enumerate(fitted)
                ]
    return [p for p in out if p.text.strip()]


def _char_groups(text: str, max_chars: int) -> list[str]:
    """``text`` as consecutive groups of whole lines of at most ``max_chars`` characters; a
    longer line is halved at white space until it fits."""
    lines: list[str] = []
    todo = text.split("\n")[::-1]
    while todo:
        line = todo.pop()
        if len(line) <= max_chars:
            lines.append(line)
        else:
            todo.extend(reversed(_halve(line)))
    groups: list[str] = []
    group: list[str] = []
    size = 0
    for line in lines:
        if group and size + 1 + len(line) > max_chars:
            groups.append("\n".join(group))
            group, size = [], 0
        size += len(line) + (1 if group else 0)
        group.append(line)
    if group:
        groups.append("\n".join(group))
    return [g for g in groups if g.strip()]


def _fit(
    text: str, measure: Callable[[str], int], limit: int, tokenizer: TokenCounter
) -> list[tuple[str, int]]:
    """``text`` cut into consecutive parts that each measure at most ``limit``, with their
    measures. A part over the limit is packed again by lines into the room its own measure
    leaves, or, when that cannot cut it, cut in two at the space nearest its middle: every cut
    makes strictly shorter parts, so this ends, and only a single character could stay over
    the limit (which a header bounded to a quarter of the limit rules out)."""
    out: list[tuple[str, int]] = []
    todo = [text]
    while todo:
        part = todo.pop()
        n = measure(part)
        if n <= limit or len(part) < 2:
            out.append((part, n))
            continue
        room = limit - (n - tokenizer.count([part])[0])  # what the header leaves for the body
        parts = [b.text for b in _pack_lines(part.split("\n"), max(room, 1), tokenizer, "")]
        if len(parts) < 2 or any(len(p) >= len(part) for p in parts):
            parts = _halve(part)
        todo.extend(reversed(parts))
    return out


def _fences(lines: Sequence[str]) -> list[_Fence]:
    """The fenced code blocks among ``lines`` (CommonMark rules: a closer uses the opener's
    character, at least as many times, and nothing else; an unclosed fence runs to the end)."""
    fences: list[_Fence] = []
    opened: _Fence | None = None
    for i, line in enumerate(lines):
        m = _FENCE.match(line)
        if m is None:
            continue
        marker, rest = m.group(2), line[m.end() :]
        if opened is None:
            if not (marker[0] == "`" and "`" in rest):  # a backtick info string has none
                opened = _Fence(i, None, m.group(1), marker)
        elif (
            marker[0] == opened.marker[0] and len(marker) >= len(opened.marker) and not rest.strip()
        ):
            fences.append(opened._replace(end=i))
            opened = None
    if opened is not None:
        fences.append(opened)
    return fences


def _halve(text: str) -> list[str]:
    """``text`` cut in two at the white space nearest its middle (within the middle half),
    else mid-word: both parts strictly shorter."""
    middle = len(text) // 2
    lo, hi = len(text) // 4, 3 * len(text) // 4 + 1
    before = max(text.rfind(c, lo, middle + 1) for c in " \n\t")
    after = [i for i in (text.find(c, middle, hi) for c in " \n\t") if i >= 0]
    cuts = [i for i in (before, min(after, default=-1)) if i > 0]
    cut = min(cuts, key=lambda i: abs(i - middle)) if cuts else max(middle, 1)
    halves = [text[:cut].rstrip(), text[cut:].lstrip()]
    return [h for h in halves if h.strip()]


# -- ids and links ------------------------------------------------------------------------


def _link(doc: ParsedDocument, pieces: Sequence[_Piece], header: _Header) -> list[Chunk]:
    seen: dict[str, int] = {}
    drafts: list[Chunk] = []
    for piece in pieces:
        digest = content_hash(header.text(piece.path, piece.text))
        occurrence = seen.get(digest, 0)
        seen[digest] = occurrence + 1
        drafts.append(
            Chunk(
                id=chunk_id(doc.book_id, doc.source_file, digest, occurrence),
                book_id=doc.book_id,
                source_file=doc.source_file,
                source_file_hash=doc.source_file_hash,
                parent_doc_id=doc.parent_doc_id,
                content_hash=digest,
                text=piece.text,
                section_title=piece.path,
                chunk_index=0,
                total_chunks=0,
                prev_chunk_id=None,
                next_chunk_id=None,
                token_count=piece.tokens,
                meta=doc.meta,
            )
        )
    total = len(drafts)
    return [
        replace(
            c,
            chunk_index=i,
            total_chunks=total,
            prev_chunk_id=drafts[i - 1].id if i > 0 else None,
            next_chunk_id=drafts[i + 1].id if i + 1 < total else None,
        )
        for i, c in enumerate(drafts)
    ]

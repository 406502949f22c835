"""A Markdown document's structure as the chunker reads it: markdown-it blocks (headings,
paragraphs, lists, fences, tables), their token counts with the model's own tokenizer, runs
of blocks under one heading, sections, heading paths and the header every chunk embeds."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Literal, NamedTuple

from markdown_it import MarkdownIt
from markdown_it.rules_block import StateBlock
from markdown_it.rules_block import table as markdown_table
from markdown_it.token import Token

from rag_pipeline.chunking.base import LINES_PER_BLOCK, ChunkBudget, TooManyBlocks
from rag_pipeline.config import DEFAULT_MAX_FILE_BLOCKS
from rag_pipeline.embed.base import TokenCounter
from rag_pipeline.models import compose_embed_text

# Block structure is all the chunker needs; skipping inline parsing halves the parse time.
_md = MarkdownIt("commonmark").enable("table").disable(["inline", "text_join"])

#: a table's tokens the chunker reads; the rest (a dozen per row) are never kept
_TABLE_ENDS = ("table_open", "table_close")

_DELIMITER_ROW = re.compile(r"^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")

_FENCE = re.compile(r"^([ \t]*)(`{3,}|~{3,})")

#: the embedded header (title and heading path) takes at most 1/_HEADER_SHARE of the limit
_HEADER_SHARE = 4

_ELLIPSIS = "…"

_PATH_SEP = " > "

#: a text longer than this is counted and split in pieces of about this size (see _large_tokens)
_WHOLE_COUNT_CHARS = 1 << 16

#: a tokenizer call gets texts of at most about this many characters in all: it holds every
#: token of a call at once (ids, offsets, strings), hundreds of MB for a large document
_COUNT_CALL_CHARS = 1 << 18

_SPACE = re.compile(r"\s")


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
class _Room:
    soft: int  # body tokens a chunk aims for
    hard: int  # body tokens a chunk may never exceed


class _Fence(NamedTuple):
    start: int  # line of the opener
    end: int | None  # line of the closer; None: the fence runs to the end of the text
    indent: str
    marker: str  # ``` or ~~~ (or longer)


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


#: the parse's env keys: how many more blocks the document may start, and its limit
_BLOCKS_LEFT, _MAX_BLOCKS = "blocks_left", "max_blocks"


def _block_limit(state: StateBlock, start: int, end: int, silent: bool) -> bool:
    """Tried first wherever markdown-it starts a block (nested ones too), it makes none: it
    counts them, and stops the parse once a document starts more than it may. markdown-it
    holds every token of a document (about 1.3 kB and 40 us a block): 10 MB of one-line
    paragraphs would be minutes and gigabytes; a 10 MB table or paragraph is one block."""
    left = state.env.get(_BLOCKS_LEFT)
    if not silent and left is not None:  # None: a parse without a limit
        if left <= 0:
            raise TooManyBlocks(state.env[_MAX_BLOCKS])
        state.env[_BLOCKS_LEFT] = left - 1
    return False


_md.block.ruler.before("table", "block_limit", _block_limit)


def _blocks(body: str, max_blocks: int = DEFAULT_MAX_FILE_BLOCKS) -> list[_Block]:
    count = body.count("\n") + 1
    if count > LINES_PER_BLOCK * max_blocks:  # counted before markdown-it holds each line
        raise TooManyBlocks(max_blocks, count)
    tokens = _md.parse(body, {_BLOCKS_LEFT: max_blocks, _MAX_BLOCKS: max_blocks})
    lines = body.split("\n")
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

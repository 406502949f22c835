"""Blocks packed into chunks within the budget: a heading travels with its body, a small
section merges forward or back, oversized blocks are split at sentence, line or row
boundaries (fences and tables re-fenced or keeping their header), the overlap tail, the hard
limit and the character bound enforced, and the chunks linked prev/next."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from rag_pipeline.chunking.base import ChunkBudget, chunk_id, content_hash
from rag_pipeline.chunking.structure import _Block, _counts, _Fence, _fences, _Header, _Run
from rag_pipeline.embed.base import TokenCounter
from rag_pipeline.models import Chunk, ParsedDocument

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")

_NO_OVERLAP = ("fence", "code", "table")  # kinds that never get an overlap tail

#: a chunk's text holds at most this many characters per token of the hard limit
_MAX_CHARS_PER_TOKEN = 32

_LONG_SPACE = re.compile(r"\s{65,}")


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

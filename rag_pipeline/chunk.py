"""Heading-aware, token-budgeted chunking of Markdown documents.

The body is parsed with markdown-it-py into top-level blocks (headings, paragraphs, lists,
fenced code, tables, HTML/JSX). Blocks are packed greedily into chunks:

* a heading of level <= ``split_level`` starts a new chunk once the current one holds at least
  ``min_tokens``; a smaller section merges into the next one when that one then fits whole,
  else it joins the chunk before it (or stands alone), so that an edit to it never moves the
  split points of a neighbouring section;
* a chunk grows up to ``target_tokens`` and never past the hard limit, which is the smaller of
  ``max_tokens`` and the embedder's input length, counted with the embedder's own tokenizer on
  exactly the text it embeds (title and section path included);
* a split inside a section repeats the tail (about ``overlap`` of the target) of the previous
  chunk, cut at sentence or line boundaries;
* no split falls inside a fenced code block or a table: blocks too big for one chunk are cut
  into self-contained pieces (each code piece re-fenced, each table piece keeps its header).

Point ids are uuid5 of (book id, document path, content hash, occurrence), so unchanged text
keeps its id across runs and repeated text inside a document still gets distinct ids.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace

from markdown_it import MarkdownIt

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
CHUNKER_VERSION = "2"
# Block structure is all the chunker needs; skipping inline parsing halves the parse time.
_md = MarkdownIt("commonmark").enable("table").disable(["inline", "text_join"])
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")
_DELIMITER_ROW = re.compile(r"^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")


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


@dataclass(slots=True)
class _Block:
    kind: str  # heading | fence | table | text
    text: str
    tokens: int = 0
    level: int = 0  # heading level
    title: str = ""  # heading text


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def chunk_id(book_id: str, source_file: str, digest: str, occurrence: int) -> str:
    key = f"chunk\x1f{book_id}\x1f{source_file}\x1f{digest}\x1f{occurrence}"
    return str(uuid.uuid5(POINT_NAMESPACE, key))


def chunk_document(
    doc: ParsedDocument, tokenizer: TokenCounter, budget: ChunkBudget
) -> list[Chunk]:
    """Split one document into linked chunks; an empty document gives no chunk."""
    if doc.is_empty:
        return []
    blocks = _blocks(doc.body)
    if not blocks:
        return []
    counts = tokenizer.count([b.text for b in blocks])
    for block, n in zip(blocks, counts, strict=True):
        block.tokens = n
    pieces = _pack(doc, blocks, tokenizer, budget)
    return _link(doc, pieces, tokenizer, budget)


# -- markdown to blocks -------------------------------------------------------------------


def _blocks(body: str) -> list[_Block]:
    lines = body.split("\n")
    tokens = _md.parse(body)
    blocks: list[_Block] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.level != 0 or tok.map is None or tok.nesting == -1:
            i += 1
            continue
        start, end = tok.map
        text = "\n".join(lines[start:end]).strip("\n")
        if tok.type == "heading_open":
            title = tokens[i + 1].content.strip() if i + 1 < len(tokens) else ""
            blocks.append(_Block("heading", text, level=int(tok.tag[1]), title=title))
        elif tok.type in ("fence", "code_block"):
            blocks.append(_Block("fence" if tok.type == "fence" else "code", text))
        elif tok.type == "table_open":
            blocks.append(_Block("table", _compact_delimiter_row(text)))
        elif text.strip():
            blocks.append(_Block("text", text))
        i += 1
    return blocks


# -- packing ------------------------------------------------------------------------------


@dataclass(slots=True)
class _Piece:
    text: str
    section_title: str | None
    tokens: int
    starts_with_overlap: bool = False


def _has_content(blocks: list[_Block]) -> bool:
    return any(b.kind not in ("heading", "overlap") for b in blocks)


def _pack(
    doc: ParsedDocument, blocks: list[_Block], tokenizer: TokenCounter, budget: ChunkBudget
) -> list[_Piece]:
    title = doc.meta.title
    stack: list[tuple[int, str]] = []
    pieces: list[_Piece] = []
    current: list[_Block] = []
    current_tokens = 0
    current_section: str | None = None
    header_cache: dict[str | None, int] = {}

    def room(section: str | None) -> tuple[int, int]:
        """(soft target, hard limit) left for body tokens in a chunk of this section."""
        if section not in header_cache:
            header = compose_embed_text(title, section, "")
            header_cache[section] = tokenizer.special_tokens + (
                tokenizer.count([header])[0] + 2 if header else 0
            )
        overhead = header_cache[section]
        return max(budget.target - overhead, 8), max(budget.limit - overhead, 8)

    # True while the current chunk continues a section that was split: its tail must not merge
    # into the next section, or an edit would shift every chunk boundary after it.
    continuation = False
    # Tokens of each section (from its heading to the next heading that splits), by the index
    # of its heading: a small section merges forward only into a section that then fits whole.
    section_tokens: dict[int, int] = {}
    opened: int | None = None
    for index, block in enumerate(blocks):
        if block.kind == "heading" and block.level <= budget.split_level:
            opened = index
            section_tokens[index] = 0
        if opened is not None:
            section_tokens[opened] += block.tokens

    def join_small_last() -> None:
        """The last piece, when small, joins the one before it if both fit in the target."""
        last = pieces[-1] if pieces else None
        if len(pieces) >= 2 and last.tokens < budget.minimum and not last.starts_with_overlap:
            prev = pieces[-2]
            if prev.tokens + last.tokens <= room(prev.section_title)[0]:
                pieces[-2:] = [
                    _Piece(
                        prev.text + "\n\n" + last.text,
                        prev.section_title,
                        prev.tokens + last.tokens,
                        prev.starts_with_overlap,
                    )
                ]

    def flush(with_overlap: bool) -> None:
        nonlocal current, current_tokens
        text = "\n\n".join(b.text for b in current)
        starts = current[0].kind == "overlap"
        pieces.append(_Piece(text, current_section, current_tokens, starts))
        tail = _overlap_tail(current, tokenizer, budget.overlap) if with_overlap else None
        current = [tail] if tail else []
        current_tokens = tail.tokens if tail else 0

    for index, block in enumerate(blocks):
        if block.kind == "heading":
            while stack and stack[-1][0] >= block.level:
                stack.pop()
            stack.append((block.level, block.title))
            if block.level <= budget.split_level and _has_content(current):
                if current_tokens >= budget.minimum or continuation:
                    flush(with_overlap=False)
                elif current_tokens + section_tokens[index] > room(current_section)[0]:
                    # Merged into a section that gets split, a small section's length would
                    # move every split point of that section: an edit would re-embed it all.
                    flush(with_overlap=False)
                    join_small_last()
            if block.level <= budget.split_level and not _has_content(current):
                continuation = False
        section = _section_title(title, stack)
        if not _has_content(current):
            current_section = section
        soft, hard = room(current_section)
        lead = (
            sum(b.tokens for b in current if b.kind == "heading")
            if not _has_content(current)
            else 0
        )
        if lead + block.tokens <= hard:
            units = [block]
        else:
            # prose pieces leave room for the overlap that will precede them; code and tables
            # never get an overlap tail, so they may fill the chunk
            size = (
                hard - lead
                if block.kind in ("fence", "code", "table")
                else min(hard - lead, soft - budget.overlap)
            )
            units = _split_block(block, tokenizer, max(size, 8))
        for unit in units:
            if current_tokens + unit.tokens > soft and _has_content(current):
                flush(with_overlap=unit.kind != "heading")
                continuation = True
                current_section = section
                soft, hard = room(section)
            if current_tokens + unit.tokens > hard and current and current[0].kind == "overlap":
                current_tokens -= current.pop(0).tokens
            current.append(unit)
            current_tokens += unit.tokens
    if any(b.kind != "overlap" for b in current):
        flush(with_overlap=False)
    # A small last section joins the chunk before it when both fit in the target.
    join_small_last()
    return pieces


def _section_title(doc_title: str, stack: list[tuple[int, str]]) -> str | None:
    names = [name for _, name in stack if name]
    if names and names[0].strip().lower() == doc_title.strip().lower():
        names = names[1:]
    return " > ".join(names) or None


def _overlap_tail(blocks: list[_Block], tokenizer: TokenCounter, overlap: int) -> _Block | None:
    """The last sentences or lines of a chunk, at most ``overlap`` tokens, never cut code."""
    if overlap <= 0:
        return None
    last = blocks[-1]
    if last.kind in ("fence", "code", "table", "heading", "overlap"):
        return None
    lines = last.text.split("\n")
    fence_lines = [i for i, line in enumerate(lines) if line.lstrip().startswith(("```", "~~~"))]
    if fence_lines:  # only what follows the last (closing) fence may repeat
        lines = lines[fence_lines[-1] + 1 :]
    units = [u for u in lines if u.strip()]
    if len(units) == 1:
        units = _SENTENCE_END.split(units[0])
    if len(units) < 2:
        return None
    counts = tokenizer.count(units)
    taken: list[str] = []
    total = 0
    for unit, n in zip(reversed(units[1:]), reversed(counts[1:]), strict=True):
        if total + n > overlap:
            break
        taken.append(unit)
        total += n
    if not taken:
        return None
    text = "\n".join(reversed(taken)) if "\n" in last.text else " ".join(reversed(taken))
    return _Block("overlap", text, tokens=total)


def _split_block(block: _Block, tokenizer: TokenCounter, limit: int) -> list[_Block]:
    """Cut a block that exceeds ``limit`` into self-contained pieces that each fit."""
    if block.kind == "fence":
        return _split_fence(block, tokenizer, limit)
    if block.kind == "table":
        return _split_table(block, tokenizer, limit)
    if "```" in block.text or "~~~" in block.text:  # e.g. code nested in a list item
        return _split_by_halving(block, tokenizer, limit)
    units = [u for u in block.text.split("\n") if u.strip()]
    if len(units) == 1:
        units = _SENTENCE_END.split(units[0])
    return _group_lines(
        units, "\n" if "\n" in block.text else " ", "", "", tokenizer, limit, block.kind
    )


def _split_by_halving(
    block: _Block, tokenizer: TokenCounter, limit: int, depth: int = 0
) -> list[_Block]:
    out: list[_Block] = []
    for half in _halve(block.text, tokenizer, limit):
        n = tokenizer.count([half])[0]
        piece = _Block(block.kind, half, tokens=n)
        if n <= limit or depth >= 16:
            out.append(piece)
        else:
            out.extend(_split_by_halving(piece, tokenizer, limit, depth + 1))
    return out


def _split_fence(block: _Block, tokenizer: TokenCounter, limit: int) -> list[_Block]:
    lines = block.text.split("\n")
    opener = lines[0]
    fence_chars = re.match(r"\s*(`{3,}|~{3,})", opener)
    closer = fence_chars.group(1) if fence_chars else "```"
    inner = lines[1:-1] if len(lines) > 1 and lines[-1].strip().startswith(closer) else lines[1:]
    return _group_lines(inner, "\n", opener + "\n", "\n" + closer, tokenizer, limit, "fence")


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
    units: list[str] = []
    unit_counts: list[int] = []
    for line, n in zip(lines, tokenizer.count(list(lines)), strict=True):
        if n > room:  # one line longer than a chunk: cut it at token boundaries
            parts = tokenizer.split(line, room)
            units.extend(parts)
            unit_counts.extend(tokenizer.count(parts))
        else:
            units.append(line)
            unit_counts.append(n)
    out: list[_Block] = []
    group: list[str] = []
    total = 0
    for unit, n in zip(units, unit_counts, strict=True):
        if group and total + n > room:
            out.append(_Block(kind, prefix + sep.join(group) + suffix, tokens=total + wrap))
            group, total = [], 0
        group.append(unit)
        total += n
    if group:
        out.append(_Block(kind, prefix + sep.join(group) + suffix, tokens=total + wrap))
    return out


# -- ids and links ------------------------------------------------------------------------


def _link(
    doc: ParsedDocument, pieces: list[_Piece], tokenizer: TokenCounter, budget: ChunkBudget
) -> list[Chunk]:
    title = doc.meta.title
    pieces = _enforce_limit(title, pieces, tokenizer, budget)
    texts = [compose_embed_text(title, p.section_title, p.text) for p in pieces]
    counts = [p.tokens for p in pieces]
    seen: dict[str, int] = {}
    drafts: list[Chunk] = []
    for piece, embed_text, n in zip(pieces, texts, counts, strict=True):
        digest = content_hash(embed_text)
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
                section_title=piece.section_title,
                chunk_index=0,
                total_chunks=0,
                prev_chunk_id=None,
                next_chunk_id=None,
                token_count=n,
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


def _enforce_limit(
    title: str, pieces: list[_Piece], tokenizer: TokenCounter, budget: ChunkBudget
) -> list[_Piece]:
    """Exact counts of the embedded texts (special tokens included), splitting any piece over
    the limit: token counts of parts are not always additive."""
    texts = [compose_embed_text(title, p.section_title, p.text) for p in pieces]
    out: list[_Piece] = []
    for piece, n in zip(pieces, tokenizer.count(texts), strict=True):
        piece.tokens = n + tokenizer.special_tokens
        if piece.tokens <= budget.limit:
            out.append(piece)
        else:
            out.extend(_shrink(title, piece, tokenizer, budget))
    return out


def _shrink(
    title: str, piece: _Piece, tokenizer: TokenCounter, budget: ChunkBudget, depth: int = 0
) -> list[_Piece]:
    header = tokenizer.count([compose_embed_text(title, piece.section_title, "")])[0]
    room = max(budget.limit - tokenizer.special_tokens - header - 4, 1)
    out: list[_Piece] = []
    for part in _halve(piece.text, tokenizer, room):
        candidate = _Piece(part, piece.section_title, 0)
        n = tokenizer.count([compose_embed_text(title, piece.section_title, part)])[0]
        candidate.tokens = n + tokenizer.special_tokens
        if candidate.tokens <= budget.limit or depth >= 16:
            out.append(candidate)
        else:
            out.extend(_shrink(title, candidate, tokenizer, budget, depth + 1))
    return out


def _halve(text: str, tokenizer: TokenCounter, room: int) -> list[str]:
    """Two halves cut at a line boundary near the middle (preferring a blank line outside any
    code fence); a cut inside a fence closes it and re-opens it, so both halves stay valid.
    Text without line breaks is cut at word boundaries by token count."""
    lines = text.split("\n")
    if len(lines) < 2:
        return tokenizer.split(text, room)
    fence_at: list[str | None] = []  # the opener of the fence each line is inside, if any
    closers: set[int] = set()
    opener: str | None = None
    for i, line in enumerate(lines):
        stripped = line.lstrip()
        if opener is None and stripped.startswith(("```", "~~~")):
            fence_at.append(None)
            opener = line
        elif (
            opener is not None
            and stripped.startswith(opener.lstrip()[:3])
            and not stripped[3:].strip()
        ):
            fence_at.append(opener)
            closers.add(i)
            opener = None
        else:
            fence_at.append(opener)
    middle = len(lines) / 2
    blank_cuts = [i for i in range(1, len(lines)) if not lines[i].strip() and fence_at[i] is None]
    cut = min(blank_cuts or range(1, len(lines)), key=lambda i: abs(i - middle))
    if cut in closers:  # keep a closing fence with its block
        cut = cut + 1 if cut + 1 < len(lines) else max(cut - 1, 1)
    first, second = lines[:cut], lines[cut:]
    inside = fence_at[cut]
    if inside is not None:  # line ``cut`` is inside a fence that is open at the boundary
        first = [*first, inside.lstrip()[:3]]
        second = [inside, *second]
    halves = ["\n".join(first).strip("\n"), "\n".join(second).strip("\n")]
    return [h for h in halves if h.strip()]

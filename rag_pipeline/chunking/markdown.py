"""The Markdown chunker: heading-aware, token-budgeted chunks of Markdown documents (the
default :class:`~rag_pipeline.chunking.base.Chunker`).

A document goes through small pure steps:

1. **blocks** (:mod:`.structure`, steps 1-3): markdown-it-py splits the body into top-level
   blocks (headings, paragraphs, lists, fenced or indented code, tables, HTML/JSX), each
   counted with the embedder's tokenizer;
2. **runs**: every content block is led by the headings right above it (of any level), so a
   heading always travels with its body and never ends a chunk. Only headings that end the
   document (no body to travel with) may end one, and headings longer than half a chunk, cut
   into pieces of which the last leads the body;
3. **sections**: a run whose headings include one of level <= ``split_level`` opens a section;
4. **units** (:mod:`.packing`, steps 4-7): each run becomes what packing never cuts: its
   headings plus its block, or, for a block too big for one chunk, self-contained pieces of
   it (code re-fenced, table pieces keep their header) with the headings on the first;
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

from dataclasses import replace

from rag_pipeline.chunking.base import ChunkBudget, Chunker
from rag_pipeline.chunking.packing import _bound_chars, _enforce_limit, _link, _pack, _units
from rag_pipeline.chunking.structure import (
    _blocks,
    _BoundedCalls,
    _count,
    _Header,
    _heading_paths,
    _runs,
    _sections,
    _valid_text,
)
from rag_pipeline.embed.base import TokenCounter
from rag_pipeline.models import Chunk, ParsedDocument

__all__ = ["CHUNKER_VERSION", "DEFAULT_CHUNKER", "MarkdownChunker", "chunk_document"]

#: bump when the way text is cut changes, so every file is re-chunked on the next run ("3":
#: the heading-aware packer of issue 12, recorded by every index built since)
CHUNKER_VERSION = "3"


class MarkdownChunker(Chunker):
    """Heading-aware, token-budgeted chunks of a Markdown document: a heading travels with its
    body, code fences and tables are never cut inside, a section split in the middle repeats
    about ``budget.overlap`` tokens of the previous chunk (see :mod:`.packing`)."""

    version = CHUNKER_VERSION

    def chunk(
        self, doc: ParsedDocument, tokenizer: TokenCounter, budget: ChunkBudget
    ) -> list[Chunk]:
        return chunk_document(doc, tokenizer, budget)


#: the chunker every recipe uses unless given another (one place: the recipe's signature and
#: the chunks asset's code version both read its version)
DEFAULT_CHUNKER = MarkdownChunker()


def chunk_document(
    doc: ParsedDocument, tokenizer: TokenCounter, budget: ChunkBudget
) -> list[Chunk]:
    """Split one document into linked chunks; an empty document gives no chunk.

    Every chunk's embedded text fits ``budget.limit`` tokens, special tokens included."""
    if doc.is_empty:
        return []
    tokenizer = _BoundedCalls(tokenizer)
    body, title = _valid_text(doc.body), _valid_text(doc.meta.title)
    blocks = _count(_blocks(body, budget.max_blocks), tokenizer)
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

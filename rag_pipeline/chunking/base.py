"""What every chunker shares: the token budget resolved against an embedder, the chunker
interface (its version is part of every index recipe's signature and the chunks asset's
code version), and the content-derived ids of chunks."""

from __future__ import annotations

import hashlib
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from rag_pipeline.config import DEFAULT_MAX_FILE_BLOCKS, ChunkingConfig
from rag_pipeline.embed.base import TokenCounter
from rag_pipeline.models import POINT_NAMESPACE, Chunk, ParsedDocument

__all__ = ["ChunkBudget", "Chunker", "TooManyBlocks", "chunk_id", "content_hash"]


@dataclass(frozen=True, slots=True)
class ChunkBudget:
    """Token budget resolved against one embedder (limit = what the model reads at most)."""

    target: int
    limit: int
    minimum: int
    overlap: int
    split_level: int = 2
    #: Markdown blocks a document may hold (RAG_MAX_FILE_BLOCKS; see ChunkingConfig): not how
    #: chunks are cut, so not in the budget's text (the recipe's signature); a change of it
    #: reads again the files refused under another (the recipe's ``parse_version``)
    max_blocks: int = field(default=DEFAULT_MAX_FILE_BLOCKS, repr=False, compare=False)

    @classmethod
    def for_tokenizer(cls, config: ChunkingConfig, tokenizer: TokenCounter) -> ChunkBudget:
        limit = min(config.max_tokens, tokenizer.max_input_tokens)
        target = min(config.target_tokens, limit)
        minimum = min(config.min_tokens, target)
        overlap = round(target * config.overlap)
        return cls(target, limit, minimum, overlap, max_blocks=config.max_blocks)


#: lines a document may hold per block of its limit: markdown-it holds a few numbers a line
#: (about 140 bytes) before it starts a block, so the lines are bounded too
LINES_PER_BLOCK = 10


class TooManyBlocks(ValueError):
    """A document holds more Markdown blocks than ``budget.max_blocks`` (or more lines than
    ``LINES_PER_BLOCK`` times as many): refused, an error of that file alone, before the rest
    is parsed."""

    def __init__(self, limit: int, lines: int | None = None) -> None:
        what = (
            f"too many Markdown blocks: more than {limit:,} (headings, paragraphs, list items"
            if lines is None
            else f"too many lines: {lines:,}, more than {LINES_PER_BLOCK * limit:,} "
            f"({LINES_PER_BLOCK} per block of the limit"
        )
        super().__init__(f"{what}; RAG_MAX_FILE_BLOCKS)")


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def chunk_id(book_id: str, source_file: str, digest: str, occurrence: int) -> str:
    key = f"chunk\x1f{book_id}\x1f{source_file}\x1f{digest}\x1f{occurrence}"
    return str(uuid.uuid5(POINT_NAMESPACE, key))


class Chunker(ABC):
    """Cuts one parsed document into linked chunks whose embedded text the model reads whole.

    The contract every chunker keeps: deterministic (the same document, tokenizer and budget
    give the same chunks); every chunk's ``embed_text`` fits ``budget.limit`` tokens of the
    model's own tokenizer, special tokens included; ids derived from the content
    (:func:`chunk_id`: unchanged text keeps its id); the chunks of a document linked in order
    (``chunk_index``, ``total_chunks``, ``prev_chunk_id``, ``next_chunk_id``); an empty
    document gives none. :attr:`version` names the way text is cut: it is part of every
    book's recipe signature and of the ``chunks`` asset's code version, so a change of it
    chunks and embeds every file again (give a new chunker a version of its own)."""

    #: the way this chunker cuts text (see the class docstring)
    version: str

    @abstractmethod
    def chunk(
        self, doc: ParsedDocument, tokenizer: TokenCounter, budget: ChunkBudget
    ) -> list[Chunk]:
        """The document's chunks (none for an empty document)."""

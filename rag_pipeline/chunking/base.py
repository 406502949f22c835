"""What every chunker shares: the token budget resolved against an embedder, the chunker
interface (its version is part of every index recipe's signature and the chunks asset's
code version), and the content-derived ids of chunks."""

from __future__ import annotations

import hashlib
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass

from rag_pipeline.config import ChunkingConfig
from rag_pipeline.embed.base import TokenCounter
from rag_pipeline.models import POINT_NAMESPACE, Chunk, ParsedDocument

__all__ = ["ChunkBudget", "Chunker", "chunk_id", "content_hash"]


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

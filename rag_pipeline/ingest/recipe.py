"""The index recipe: how text becomes points (chunk budget, dense embedder, sparse encoder).

One :class:`IndexRecipe` is built per process from the settings and handed to every stage.
It owns the index *signature* (a change re-processes every file) and the lineage fields every
point records.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from rag_pipeline import __version__
from rag_pipeline.chunk import CHUNKER_VERSION, ChunkBudget
from rag_pipeline.config import ChunkingConfig
from rag_pipeline.embed.base import Embedder
from rag_pipeline.sparse import Bm25Encoder

__all__ = ["IndexRecipe", "LineageInfo"]


@dataclass(frozen=True, slots=True)
class LineageInfo:
    """Where and how a run wrote its points (goes into every payload)."""

    embedding_model: str
    embedding_dim: int
    sparse_model: str
    signature: str
    pipeline_version: str
    run_id: str | None = None


@dataclass(frozen=True)
class IndexRecipe:
    """The chunk budget, the dense embedder and the sparse encoder of one index."""

    embedder: Embedder
    budget: ChunkBudget
    sparse: Bm25Encoder = field(default_factory=Bm25Encoder)

    @classmethod
    def build(
        cls, embedder: Embedder, chunking: ChunkingConfig, sparse: Bm25Encoder | None = None
    ) -> IndexRecipe:
        """The recipe for ``embedder``, its budget resolved against the model's tokenizer."""
        budget = ChunkBudget.for_tokenizer(chunking, embedder.tokenizer)
        return cls(embedder, budget, sparse or Bm25Encoder())

    @property
    def embedding_model(self) -> str:
        return self.embedder.model_name

    @property
    def dimension(self) -> int:
        return self.embedder.dimension

    @property
    def signature(self) -> str:
        """Identifies how chunks were cut and embedded."""
        key = (
            f"{CHUNKER_VERSION}|{self.budget}|{self.embedder.model_name}|"
            f"{self.embedder.dimension}|{self.sparse.name}"
        )
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    def lineage(self, run_id: str | None) -> LineageInfo:
        return LineageInfo(
            self.embedder.model_name,
            self.embedder.dimension,
            self.sparse.name,
            self.signature,
            __version__,
            run_id,
        )

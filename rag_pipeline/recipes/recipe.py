"""The index recipe: how text becomes points (chunk budget, dense embedder, sparse encoder).

One :class:`IndexRecipe` is built per process from the settings and handed to every stage.
It owns the index *signature* (a change re-processes every file) and the lineage fields every
point records.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from rag_pipeline import __version__
from rag_pipeline.chunking import DEFAULT_CHUNKER, ChunkBudget, Chunker
from rag_pipeline.config import DEFAULT_MAX_FILE_BLOCKS, ChunkingConfig
from rag_pipeline.embed.base import Embedder
from rag_pipeline.ingest.parse import PARSE_RULES_VERSION
from rag_pipeline.schema import EMBEDDING_MODEL, SIGNATURE
from rag_pipeline.sparse import Bm25Encoder, avg_len_of, fallback_avg_len

__all__ = ["IndexRecipe", "LineageInfo", "parse_version_of"]


def parse_version_of(parse_rules: str, max_blocks: int) -> str:
    """The parse rules, and the block limit when it is not the default: what decides whether
    a file is refused (:attr:`IndexRecipe.parse_version`; known without building a recipe,
    so the books sensor compares it without loading a model)."""
    if max_blocks == DEFAULT_MAX_FILE_BLOCKS:
        return parse_rules
    return f"{parse_rules}, at most {max_blocks} blocks"


@dataclass(frozen=True, slots=True)
class LineageInfo:
    """Where and how a run wrote its points (goes into every payload)."""

    embedding_model: str
    embedding_dim: int
    sparse_model: str
    signature: str
    pipeline_version: str
    run_id: str | None = None
    #: the book's revision the run read (a git commit; None: a source without one)
    source_revision: str | None = None
    #: source_file -> what its source calls the version read (a git blob id, an S3 ETag)
    source_versions: Mapping[str, str] = field(default_factory=dict)
    #: the parse rules the run reads files with (recorded on every document record)
    parse_version: str = PARSE_RULES_VERSION
    #: the read settings files are read under (``ParseOptions.key``)
    read_options: str = ""

    def source_version(self, source_file: str) -> str | None:
        return self.source_versions.get(source_file)


@dataclass(frozen=True)
class IndexRecipe:
    """The chunker and its budget, the dense embedder and the sparse encoder of one index."""

    embedder: Embedder
    budget: ChunkBudget
    sparse: Bm25Encoder = field(default_factory=Bm25Encoder)
    #: True when ``sparse`` carries an average measured for the whole index (an evaluation
    #: corpus); otherwise each book's average is its own, fixed when it is first indexed
    sparse_fixed: bool = False
    chunker: Chunker = DEFAULT_CHUNKER
    #: the parse rules files are read with (see :attr:`parse_version`)
    parse_rules: str = PARSE_RULES_VERSION

    @classmethod
    def build(
        cls,
        embedder: Embedder,
        chunking: ChunkingConfig,
        sparse: Bm25Encoder | None = None,
        chunker: Chunker = DEFAULT_CHUNKER,
    ) -> IndexRecipe:
        """The recipe for ``embedder``, its budget resolved against the model's tokenizer;
        ``sparse``, when given, is used for every book as it is."""
        budget = ChunkBudget.for_tokenizer(chunking, embedder.tokenizer)
        if sparse is not None:
            return cls(embedder, budget, sparse, sparse_fixed=True, chunker=chunker)
        average = fallback_avg_len(budget.target)
        return cls(embedder, budget, Bm25Encoder(avg_len=average), chunker=chunker)

    @property
    def embedding_model(self) -> str:
        return self.embedder.model_name

    @property
    def dimension(self) -> int:
        return self.embedder.dimension

    @property
    def parse_version(self) -> str:
        """The parse rules, and the block limit when it is not the default: what decides
        whether a file is refused. Not part of the signature: a change of it reads again only
        the files whose records are errors written under another (see ``classify_files``)."""
        return parse_version_of(self.parse_rules, self.budget.max_blocks)

    @property
    def signature(self) -> str:
        """Identifies how chunks were cut and embedded."""
        key = (
            f"{self.chunker.version}|{self.budget}|{self.embedder.model_name}|"
            f"{self.embedder.dimension}|{self.sparse.family}"
        )
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    def tag(self) -> dict[str, str]:
        """The recipe as the store records it per book generation (small strings; the store
        compares ``signature`` only, the rest says what the generation was built with)."""
        return {
            SIGNATURE: self.signature,
            EMBEDDING_MODEL: self.embedder.model_name,
            "dimension": str(self.embedder.dimension),
            "chunker_version": self.chunker.version,
            "budget": str(self.budget),
            "sparse_family": self.sparse.family,
        }

    def sparse_for(self, recorded: str | None, lengths: Callable[[], Iterable[int]]) -> Bm25Encoder:
        """The sparse encoder of one book: the one its chunks already record (same family),
        else one whose average is measured over ``lengths()``, the analysed lengths of the
        book's chunk texts (``len(self.sparse.terms(text))`` each: a book being indexed for the
        first time, or rebuilt). Every encoder it returns analyses texts as ``self.sparse``."""
        if self.sparse_fixed:
            return self.sparse
        if recorded:
            try:
                encoder = Bm25Encoder.from_name(recorded)
            except ValueError:
                encoder = None
            if encoder is not None and encoder.family == self.sparse.family:
                return encoder
        average = avg_len_of(lengths(), fallback=self.sparse.avg_len)
        # the recipe's stem cache shared: only the texts' lengths are kept from this pass
        return self.sparse.with_avg_len(average)

    def lineage(self, run_id: str | None, sparse_model: str | None = None) -> LineageInfo:
        return LineageInfo(
            self.embedder.model_name,
            self.embedder.dimension,
            sparse_model or self.sparse.name,
            self.signature,
            __version__,
            run_id,
            parse_version=self.parse_version,
        )

"""Retrieval evaluation on BEIR-format datasets (corpus.jsonl, queries.jsonl, qrels/<split>.tsv).

The corpus is ingested as one book through the same chunk / embed / index code as Markdown
books (each BEIR document is one document: its title and text), every query is searched in that
book, and a document split into several chunks is ranked by its best chunk.
"""

from __future__ import annotations

import csv
import json
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from rag_pipeline.chunk import chunk_document
from rag_pipeline.ingest.assess import BookAssessment, BookFilesRead, assess, read_book_index
from rag_pipeline.ingest.changes import FileChanges
from rag_pipeline.ingest.stages import (
    ParsedBook,
    chunk_book,
    embed_book,
    vectors_to_reuse,
    write_book,
)
from rag_pipeline.models import DocumentMeta, ParsedDocument, SourceFile, document_id
from rag_pipeline.recipes.recipe import IndexRecipe
from rag_pipeline.retrieve.search import (
    DEFAULT_FUSION,
    DEFAULT_MODE,
    DEFAULT_RRF_K,
    Hit,
    SearchMode,
    search,
)
from rag_pipeline.schema import SOURCE_FILE, SPARSE_MODEL, chunks_of
from rag_pipeline.sparse import Bm25Encoder, measure_avg_len
from rag_pipeline.store import FusionMethod, VectorStore

__all__ = [
    "METRICS",
    "BeirDataset",
    "EvalReport",
    "EvalRun",
    "candidate_book_id",
    "compare_reports",
    "eval_book_id",
    "eval_runs",
    "evaluate",
    "index_corpus",
    "load_beir",
    "measured_recipe",
    "mrr_at_k",
    "ndcg_at_k",
    "recall_at_k",
    "run_evaluation",
]


@dataclass(frozen=True)
class BeirDataset:
    name: str
    corpus: dict[str, tuple[str, str]]  # doc id -> (title, text)
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]  # query id -> {doc id: relevance}


def load_beir(directory: Path | str, split: str = "test") -> BeirDataset:
    root = Path(directory)
    for needed in ("corpus.jsonl", "queries.jsonl", f"qrels/{split}.tsv"):
        if not (root / needed).is_file():
            raise FileNotFoundError(f"{root / needed} is missing: not a BEIR dataset folder")
    corpus: dict[str, tuple[str, str]] = {}
    with open(root / "corpus.jsonl", encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                row = json.loads(line)
                corpus[str(row["_id"])] = (row.get("title") or "", row.get("text") or "")
    queries: dict[str, str] = {}
    with open(root / "queries.jsonl", encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                row = json.loads(line)
                queries[str(row["_id"])] = row["text"]
    qrels: dict[str, dict[str, int]] = {}
    with open(root / "qrels" / f"{split}.tsv", encoding="utf-8") as fh:
        reader = csv.reader(fh, delimiter="\t")
        for row in reader:
            if not row or row[0] == "query-id":
                continue
            qrels.setdefault(row[0], {})[row[1]] = int(row[2])
    return BeirDataset(root.name, corpus, queries, qrels)


# -- metrics (binary or graded relevance, as pytrec_eval computes them) --------------------


def ndcg_at_k(ranked: Sequence[str], relevant: Mapping[str, int], k: int = 10) -> float:
    dcg = sum(relevant.get(doc, 0) / math.log2(i + 2) for i, doc in enumerate(ranked[:k]))
    ideal = sorted((g for g in relevant.values() if g > 0), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def recall_at_k(ranked: Sequence[str], relevant: Mapping[str, int], k: int) -> float:
    wanted = {d for d, g in relevant.items() if g > 0}
    return len(wanted & set(ranked[:k])) / len(wanted) if wanted else 0.0


def mrr_at_k(ranked: Sequence[str], relevant: Mapping[str, int], k: int = 10) -> float:
    for i, doc in enumerate(ranked[:k]):
        if relevant.get(doc, 0) > 0:
            return 1.0 / (i + 1)
    return 0.0


# -- indexing the corpus as one book -------------------------------------------------------


def _documents(book_id: str, corpus: Mapping[str, tuple[str, str]]) -> list[ParsedDocument]:
    import hashlib

    docs = []
    for doc_id, (title, text) in corpus.items():
        digest = hashlib.sha256(f"{title}\x1f{text}".encode()).hexdigest()
        docs.append(
            ParsedDocument(
                book_id,
                doc_id,
                digest,
                document_id(book_id, doc_id),
                DocumentMeta(title=title.strip()),
                text,
            )
        )
    return docs


def _chunk_texts(docs: Sequence[ParsedDocument], recipe: IndexRecipe) -> Iterator[str]:
    """What the sparse encoder will see of each chunk (documents that fail to chunk are left
    out here, as the index leaves them out)."""
    for doc in docs:
        try:
            chunks = chunk_document(doc, recipe.embedder.tokenizer, recipe.budget)
        except Exception:  # chunk_book records the error when the corpus is indexed
            continue
        for chunk in chunks:
            yield chunk.embed_text


def measured_recipe(
    store: VectorStore,
    recipe: IndexRecipe,
    book_id: str,
    corpus: Mapping[str, tuple[str, str]],
) -> IndexRecipe:
    """``recipe`` with its BM25 ``avg_len`` set for this corpus: the collection constant.

    An evaluation corpus is one collection known in advance, so its mean analysed chunk length
    is measured over its chunks before anything is encoded (SciFact: 88.4). Like any
    collection's, the value is fixed when the index is built and recorded with it (in every
    chunk's ``sparse_model``): when the index already holds the whole corpus under the
    recorded encoder, that encoder is reused without chunking everything again."""
    sparse = recipe.sparse
    recorded = _recorded_encoder(store, book_id)
    if recorded is not None and (recorded.analyzer, recorded.language, recorded.k1, recorded.b) == (
        sparse.analyzer,
        sparse.language,
        sparse.k1,
        sparse.b,
    ):
        candidate = replace(recipe, sparse=recorded, sparse_fixed=True)
        docs = _documents(book_id, corpus)
        if not _corpus_assessment(store, book_id, docs, candidate).changes.has_work:
            return candidate
    avg = measure_avg_len(
        _chunk_texts(_documents(book_id, corpus), recipe),
        analyzer=sparse.analyzer,
        language=sparse.language,
        fallback=sparse.avg_len,
    )
    encoder = Bm25Encoder(
        k1=sparse.k1, b=sparse.b, avg_len=avg, language=sparse.language, analyzer=sparse.analyzer
    )
    return replace(recipe, sparse=encoder, sparse_fixed=True)


def _recorded_encoder(store: VectorStore, book_id: str) -> Bm25Encoder | None:
    for record in store.scroll(chunks_of(book_id), fields=[SPARSE_MODEL], page_size=1):
        try:
            return Bm25Encoder.from_name(str(record.payload.get(SPARSE_MODEL) or ""))
        except ValueError:
            return None
    return None


def _corpus_assessment(
    store: VectorStore, book_id: str, docs: Sequence[ParsedDocument], recipe: IndexRecipe
) -> BookAssessment:
    """What indexing the documents with ``recipe`` would change in the index, assessed as a
    book's files are (a document no longer in the corpus is gone)."""
    files = tuple(SourceFile(book_id, d.source_file, "", 0, 0, d.source_file_hash) for d in docs)
    found = BookFilesRead(book_id, "", files, ())
    return assess(found, read_book_index(store, book_id, recipe), recipe)


def index_corpus(
    store: VectorStore,
    book_id: str,
    corpus: Mapping[str, tuple[str, str]],
    recipe: IndexRecipe,
    *,
    batch_docs: int = 500,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, int]:
    """Index (incrementally: a re-run embeds nothing) every document of the corpus."""
    lineage = recipe.lineage(run_id=None)
    docs = _documents(book_id, corpus)
    assessment = _corpus_assessment(store, book_id, docs, recipe)
    changes = assessment.changes
    todo = [d for d in docs if d.source_file in set(changes.changed)]
    totals = {
        "documents": len(docs),
        "indexed": 0,
        "skipped": len(docs) - len(todo),
        "chunks": 0,
        "embedded": 0,
    }
    batches = [todo[start : start + batch_docs] for start in range(0, len(todo), batch_docs)]
    if changes.deleted:  # documents no longer in the corpus
        batches.append([])
    for part in batches:
        names = {d.source_file for d in part}
        # each batch is written as a run of the book whose changes are the batch's files
        part_changes = FileChanges(
            new=tuple(n for n in changes.new if n in names),
            modified=tuple(n for n in changes.modified if n in names),
            deleted=() if part else changes.deleted,
        )
        files = tuple(f for f in assessment.files if f.source_file in names)
        inventory = replace(assessment, files=files, changes=part_changes)
        chunked = chunk_book(ParsedBook(inventory, tuple(part), ()), recipe)
        embedded = embed_book(chunked, recipe, vectors_to_reuse(chunked, recipe, store))
        write_book(store, chunked, embedded, lineage)
        totals["indexed"] += len(part)
        totals["chunks"] += len(chunked.chunks)
        totals["embedded"] += embedded.embedded
        if progress and part:
            progress(totals["indexed"], len(todo))
    return totals


@dataclass(frozen=True)
class EvalReport:
    dataset: str
    split: str
    mode: str
    queries: int
    ndcg_at_10: float
    recall_at_10: float
    recall_at_100: float
    mrr_at_10: float
    seconds: float
    #: hybrid runs: how the lists were fused, e.g. "minmax", "rrf(k=60)"; else None
    fusion: str | None = None
    #: the sparse encoder the index was built with (its name records the measured avg_len)
    sparse_model: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "dataset": self.dataset,
            "split": self.split,
            "mode": self.mode,
            "fusion": self.fusion,
            "sparse_model": self.sparse_model,
            "ndcg@10": round(self.ndcg_at_10, 5),
            "recall@10": round(self.recall_at_10, 5),
            "recall@100": round(self.recall_at_100, 5),
            "mrr@10": round(self.mrr_at_10, 5),
            "queries": self.queries,
            "seconds": round(self.seconds, 2),
        }


#: the metrics of a report (its ``as_dict`` keys), in the order they are shown
METRICS = ("ndcg@10", "recall@10", "recall@100", "mrr@10")


def compare_reports(
    current: Sequence[EvalReport], candidate: Sequence[EvalReport]
) -> list[dict[str, object]]:
    """Candidate minus current, per run (the same runs in the same order) and metric."""
    deltas: list[dict[str, object]] = []
    for now, then in zip(current, candidate, strict=True):
        a, b = now.as_dict(), then.as_dict()
        delta: dict[str, object] = {"mode": now.mode, "fusion": now.fusion}
        for metric in METRICS:
            delta[metric] = round(float(b[metric]) - float(a[metric]), 5)  # type: ignore[arg-type]
        deltas.append(delta)
    return deltas


def rank_documents(hits: Iterable[Hit], depth: int = 100) -> list[str]:
    """Document ids in the order of their best chunk."""
    ranked: list[str] = []
    seen: set[str] = set()
    for hit in hits:
        doc = str(hit.payload.get(SOURCE_FILE))
        if doc not in seen:
            seen.add(doc)
            ranked.append(doc)
        if len(ranked) >= depth:
            break
    return ranked


def evaluate(
    store: VectorStore,
    recipe: IndexRecipe,
    dataset: BeirDataset,
    book_id: str,
    *,
    mode: SearchMode,
    split: str = "test",
    fusion: FusionMethod = DEFAULT_FUSION,
    rrf_k: int = DEFAULT_RRF_K,
    depth: int = 100,
    progress: Callable[[int, int], None] | None = None,
) -> EvalReport:
    """Run every judged query of the split and average the metrics."""
    started = time.perf_counter()
    ids = [q for q in dataset.qrels if q in dataset.queries]
    totals = {"ndcg": 0.0, "r10": 0.0, "r100": 0.0, "mrr": 0.0}
    for n, query_id in enumerate(ids, 1):
        # a few more chunks than documents, since a long document may fill several slots
        hits = search(
            store,
            recipe.embedder,
            dataset.queries[query_id],
            book_id,
            limit=depth * 2,
            mode=mode,
            sparse_encoder=recipe.sparse,
            fusion=fusion,
            rrf_k=rrf_k,
            prefetch_limit=depth * 2,
        )
        ranked = rank_documents(hits, depth)
        relevant = dataset.qrels[query_id]
        totals["ndcg"] += ndcg_at_k(ranked, relevant, 10)
        totals["r10"] += recall_at_k(ranked, relevant, 10)
        totals["r100"] += recall_at_k(ranked, relevant, 100)
        totals["mrr"] += mrr_at_k(ranked, relevant, 10)
        if progress:
            progress(n, len(ids))
    count = max(len(ids), 1)
    return EvalReport(
        dataset.name,
        split,
        mode,
        len(ids),
        totals["ndcg"] / count,
        totals["r10"] / count,
        totals["r100"] / count,
        totals["mrr"] / count,
        time.perf_counter() - started,
        fusion=(f"rrf(k={rrf_k})" if fusion == "rrf" else fusion) if mode == "hybrid" else None,
        sparse_model=recipe.sparse.name,
    )


#: (mode, fusion) of one evaluation run; the fusion is None outside hybrid
EvalRun = tuple[SearchMode, FusionMethod | None]


def eval_book_id(dataset: BeirDataset) -> str:
    """The book id a dataset is indexed as (its name, made a valid book id)."""
    name = "".join(c if c.isalnum() or c in "-_." else "-" for c in dataset.name)
    return ("eval-" + name)[:128]


def candidate_book_id(dataset: BeirDataset, recipe: IndexRecipe) -> str:
    """The book a candidate recipe's index of the dataset is built as, beside the current
    one (same collection, its own book): each recipe is indexed once, re-runs embed nothing."""
    return f"{eval_book_id(dataset)[:100]}-candidate-{recipe.signature[:12]}"


def eval_runs(modes: Sequence[SearchMode], fusions: Sequence[FusionMethod]) -> list[EvalRun]:
    """The (mode, fusion) runs asked for: hybrid once per fusion, every other mode once;
    the defaults when none is named."""
    chosen = list(dict.fromkeys(fusions)) or [DEFAULT_FUSION]
    return [
        (mode, fusion if mode == "hybrid" else None)
        for mode in dict.fromkeys(modes or [DEFAULT_MODE])
        for fusion in (chosen if mode == "hybrid" else [None])
    ]


def run_evaluation(
    store: VectorStore,
    recipe: IndexRecipe,
    dataset: BeirDataset,
    runs: Sequence[EvalRun],
    *,
    split: str = "test",
    rrf_k: int = DEFAULT_RRF_K,
    indexing: Callable[[int, int], None] | None = None,
    querying: Callable[[EvalRun], Callable[[int, int], None] | None] = lambda run: None,
    book_id: str | None = None,
) -> tuple[IndexRecipe, list[EvalReport]]:
    """Index ``dataset`` as one book (its BM25 average length measured first, so nothing is
    encoded before it is known) and evaluate each run on it: the recipe it measured and one
    report per run. ``indexing`` and ``querying(run)`` report progress; ``book_id`` (default
    :func:`eval_book_id`) is the book it is indexed as."""
    book_id = book_id or eval_book_id(dataset)
    recipe = measured_recipe(store, recipe, book_id, dataset.corpus)
    index_corpus(store, book_id, dataset.corpus, recipe, progress=indexing)
    reports = [
        evaluate(
            store,
            recipe,
            dataset,
            book_id,
            mode=mode,
            split=split,
            fusion=fusion or DEFAULT_FUSION,
            rrf_k=rrf_k,
            progress=querying((mode, fusion)),
        )
        for mode, fusion in runs
    ]
    return recipe, reports

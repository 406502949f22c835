"""An evaluation: a BEIR corpus indexed as one book by the ingest pipeline (its BM25 average
measured over the whole corpus, as any book's is at its first run), then every judged query
searched in that book; a document split into several chunks is ranked by its best chunk.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

from rag_pipeline.evaluation.beir import BeirDataset, BeirSource
from rag_pipeline.evaluation.metrics import EvalReport, mrr_at_k, ndcg_at_k, recall_at_k
from rag_pipeline.ingest.pipeline import IngestPipeline
from rag_pipeline.recipes.choice import FixedRecipe
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
from rag_pipeline.sparse import Bm25Encoder
from rag_pipeline.store import FusionMethod, VectorStore

__all__ = [
    "EvalRun",
    "candidate_book_id",
    "eval_book_id",
    "eval_runs",
    "evaluate",
    "index_dataset",
    "rank_documents",
    "recorded_encoder",
    "run_evaluation",
]


def index_dataset(
    pipeline: IngestPipeline,
    dataset: BeirDataset,
    recipe: IndexRecipe,
    book_id: str,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, int]:
    """Index the corpus as book ``book_id`` with ``recipe``, through the pipeline (a re-run
    embeds nothing): how many documents it has, were indexed (new or changed), skipped
    (unchanged), and the chunks and embeddings of this run. ``progress(done, total)``:
    chunks embedded so far."""
    indexer = IngestPipeline(
        BeirSource(dataset, book_id), pipeline.store, FixedRecipe(recipe), parsing=pipeline.parsing
    )

    def embedded(done: int, total: int, tokens_done: int | None, tokens_total: int | None) -> None:
        if progress is not None:
            progress(done, total)

    run = indexer.run([book_id], progress=embedded)[book_id]
    changed = len(run.inventory.changes.changed)
    return {
        "documents": len(run.inventory.files),
        "indexed": changed,
        "skipped": len(run.inventory.files) - changed,
        "chunks": len(run.chunked.chunks),
        "embedded": run.embedded.embedded,
    }


def recorded_encoder(store: VectorStore, book_id: str) -> Bm25Encoder | None:
    """The sparse encoder the book's chunks were encoded with (its measured average)."""
    for record in store.scroll(chunks_of(book_id), fields=[SPARSE_MODEL], page_size=1):
        try:
            return Bm25Encoder.from_name(str(record.payload.get(SPARSE_MODEL) or ""))
        except ValueError:
            return None
    return None


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
    sparse_encoder: Bm25Encoder | None = None,
) -> EvalReport:
    """Run every judged query of the split and average the metrics (``sparse_encoder``: the
    one the book's chunks record, see :func:`recorded_encoder`; default the recipe's)."""
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
            sparse_encoder=sparse_encoder or recipe.sparse,
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
        sparse_model=(sparse_encoder or recipe.sparse).name,
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
    pipeline: IngestPipeline,
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
    """Index ``dataset`` as one book with ``recipe`` (see :func:`index_dataset`) and evaluate
    each run on it: the recipe and one report per run. ``indexing`` and ``querying(run)``
    report progress; ``book_id`` (default :func:`eval_book_id`) is the book it is indexed as."""
    book_id = book_id or eval_book_id(dataset)
    index_dataset(pipeline, dataset, recipe, book_id, progress=indexing)
    with pipeline.store.open() as store:
        encoder = recorded_encoder(store, book_id) or recipe.sparse
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
                sparse_encoder=encoder,
            )
            for mode, fusion in runs
        ]
    return recipe, reports

"""``rag-pipeline eval``: a BEIR dataset indexed as one book by the pipeline and searched,
the current recipe beside a candidate's."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click
from rich.table import Table

from rag_pipeline.cli.app import _settings, book_pipeline, emit_json, err, fail, main, out
from rag_pipeline.cli.query import _declared, _fusion_option
from rag_pipeline.config import Settings, load_settings
from rag_pipeline.embed.registry import LOCAL_PRECISIONS
from rag_pipeline.retrieve.params import param

if TYPE_CHECKING:
    from rag_pipeline.evaluation.metrics import EvalReport
    from rag_pipeline.recipes.recipe import IndexRecipe
    from rag_pipeline.retrieve.search import SearchMode
    from rag_pipeline.store import FusionMethod


def _candidate_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--candidate-*``: what a candidate recipe changes of the current one (``--compare``)."""
    candidate = {
        "--candidate-precision": (
            click.Choice(list(LOCAL_PRECISIONS)),
            "the candidate's local model precision [default: the current one]",
        ),
        "--candidate-target-tokens": (
            click.IntRange(16, 100_000),
            "the candidate's chunk target tokens [default: RAG_CHUNK_TARGET_TOKENS]",
        ),
    }
    for flag, (kind, text) in reversed(candidate.items()):
        fn = click.option(flag, type=kind, default=None, help=f"with --compare: {text}")(fn)
    return fn


@main.command(name="eval")
@click.option(
    "--dataset",
    "dataset_dir",
    required=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="BEIR folder: corpus.jsonl, queries.jsonl, qrels/<split>.tsv",
)
@click.option("--split", default="test", show_default=True)
@click.option(
    "--mode",
    "modes",
    multiple=True,
    type=click.Choice(list(param("mode").choices or ())),
    help="repeatable; default: the default search mode",
)
@_fusion_option(multiple=True)
@_declared([param("rrf_k")])
@click.option(
    "--collection",
    default=None,
    help="collection for the evaluation index [default: RAG_COLLECTION + '_eval']",
)
@click.option(
    "--compare",
    is_flag=True,
    help="evaluate the current recipe and a candidate (the --candidate-* options) side by "
    "side, each indexed once in the evaluation collection",
)
@_candidate_options
@click.option("--json", "as_json", is_flag=True)
def eval_command(
    dataset_dir: Path,
    split: str,
    modes: tuple[str, ...],
    fusion: tuple[str, ...],
    rrf_k: int,
    collection: str | None,
    compare: bool,
    candidate_precision: str | None,
    candidate_target_tokens: int | None,
    as_json: bool,
) -> None:
    """nDCG@10, recall@10/100 and MRR@10 on a BEIR dataset (indexed as one book).

    The dataset goes into its own collection, apart from the books: an ingest purges books
    without a folder, and an evaluation corpus has none. The current recipe is the one a book
    gets (the recorded precision wins over auto); --compare also evaluates a candidate recipe,
    indexed as a book of its own beside it, so a team sees what a change does before making
    it."""
    from rich.progress import Progress

    from rag_pipeline.evaluation.beir import load_beir
    from rag_pipeline.evaluation.run import (
        EvalRun,
        candidate_book_id,
        eval_book_id,
        eval_runs,
        run_evaluation,
    )

    if not compare and (candidate_precision or candidate_target_tokens):
        fail("--candidate-precision and --candidate-target-tokens need --compare")
    if compare and not (candidate_precision or candidate_target_tokens):
        fail("--compare needs a candidate: --candidate-precision and/or --candidate-target-tokens")
    base = _settings()
    settings = load_settings(collection=collection or f"{base.collection}_eval")
    try:
        dataset = load_beir(dataset_dir, split)
    except (FileNotFoundError, ValueError, KeyError) as exc:
        fail(f"cannot read the BEIR dataset at {dataset_dir}: {exc}")
    runs = eval_runs(
        cast("list[SearchMode]", list(modes)), cast("list[FusionMethod]", list(fusion))
    )
    pipeline = book_pipeline(settings)
    with Progress(console=err, transient=True) as progress:

        def evaluate_as(recipe: IndexRecipe, book_id: str) -> tuple[IndexRecipe, list[EvalReport]]:
            task = progress.add_task(f"embedding {dataset.name}", total=None)

            def querying(run: EvalRun) -> Callable[[int, int], None]:
                label = run[0] + (f", {run[1]}" if run[1] else "")
                return _advance(progress, progress.add_task(f"queries ({label})", total=None))

            return run_evaluation(
                pipeline,
                recipe,
                dataset,
                runs,
                split=split,
                rrf_k=rrf_k,
                indexing=lambda done, total: progress.update(task, completed=done, total=total),
                querying=querying,
                book_id=book_id,
            )

        with pipeline.store.open() as store:
            current = pipeline.recipes.for_book(store, eval_book_id(dataset)).recipe
        candidate = (
            _candidate_recipe(settings, current, candidate_precision, candidate_target_tokens)
            if compare
            else None
        )
        recipe, reports = evaluate_as(current, eval_book_id(dataset))
        compared = (
            evaluate_as(candidate, candidate_book_id(dataset, candidate)) if candidate else None
        )
    if compared is not None:
        _print_comparison(dataset.name, split, (recipe, reports), compared, as_json)
        return
    if as_json:
        emit_json(
            reports[0].as_dict() if len(reports) == 1 else {"runs": [r.as_dict() for r in reports]}
        )
        return
    table = Table(title=f"{dataset.name} ({split}, {recipe.embedding_model})", title_justify="left")
    for column in ("mode", "fusion", "nDCG@10", "recall@10", "recall@100", "MRR@10", "queries"):
        table.add_column(column, justify="right")
    table.add_column("s", justify="right")
    for r in reports:
        table.add_row(
            r.mode,
            r.fusion or "",
            f"{r.ndcg_at_10:.4f}",
            f"{r.recall_at_10:.4f}",
            f"{r.recall_at_100:.4f}",
            f"{r.mrr_at_10:.4f}",
            str(r.queries),
            f"{r.seconds:.1f}",
        )
    out.print(table)


def _candidate_recipe(
    settings: Settings,
    current: IndexRecipe,
    precision: str | None,
    target_tokens: int | None,
) -> IndexRecipe:
    """The current recipe with the candidate's precision and chunk target (exit 2 for a
    candidate that cannot be built, or that is the current recipe)."""
    from dataclasses import replace

    from rag_pipeline.embed import kind_of, model_names
    from rag_pipeline.recipes.lazy import LazyRecipe
    from rag_pipeline.recipes.recipe import IndexRecipe

    embedding, chunking = settings.embedding(), settings.chunking()
    if target_tokens is not None:
        if target_tokens > chunking.max_tokens:
            fail(
                f"--candidate-target-tokens {target_tokens} is above RAG_CHUNK_MAX_TOKENS "
                f"({chunking.max_tokens})"
            )
        if target_tokens < chunking.min_tokens:
            fail(
                f"--candidate-target-tokens {target_tokens} is below RAG_CHUNK_MIN_TOKENS "
                f"({chunking.min_tokens})"
            )
        chunking = replace(chunking, target_tokens=target_tokens)
    names = model_names(embedding)
    if precision is None or names.get(current.embedding_model) == precision:
        candidate = IndexRecipe.build(current.embedder, chunking)  # the same model, loaded once
    elif not kind_of(embedding).precisions:
        fail(f"--candidate-precision is the local model's; RAG_EMBEDDER is {embedding.provider}")
    else:
        model = next(name for name, p in names.items() if p == precision)
        candidate = LazyRecipe(embedding, chunking).for_model(model)
    if candidate.signature == current.signature:
        fail(
            f"the candidate is the current recipe ({current.embedding_model}, chunk target "
            f"{current.budget.target} tokens): name a different one"
        )
    return candidate


def _recipe_json(recipe: IndexRecipe, reports: Sequence[EvalReport]) -> dict[str, Any]:
    return {
        "embedding_model": recipe.embedding_model,
        "chunk_target_tokens": recipe.budget.target,
        "signature": recipe.signature,
        "runs": [r.as_dict() for r in reports],
    }


def _print_comparison(
    name: str,
    split: str,
    current: tuple[IndexRecipe, list[EvalReport]],
    candidate: tuple[IndexRecipe, list[EvalReport]],
    as_json: bool,
) -> None:
    """The current and the candidate recipe's metrics side by side, with the difference."""
    from rag_pipeline.evaluation.metrics import METRICS, compare_reports

    deltas = compare_reports(current[1], candidate[1])
    if as_json:
        emit_json(
            {
                "dataset": name,
                "split": split,
                "current": _recipe_json(*current),
                "candidate": _recipe_json(*candidate),
                "delta": deltas,
            }
        )
        return
    title = (
        f"{name} ({split}): current {current[0].embedding_model} "
        f"(chunk target {current[0].budget.target}) -> candidate "
        f"{candidate[0].embedding_model} (chunk target {candidate[0].budget.target})"
    )
    table = Table(title=title, title_justify="left")
    for column in ("mode", "fusion", *METRICS):
        table.add_column(column, justify="right")
    for now, then, delta in zip(current[1], candidate[1], deltas, strict=True):
        a, b = now.as_dict(), then.as_dict()
        cells = [f"{a[m]:.4f} -> {b[m]:.4f} ({delta[m]:+.4f})" for m in METRICS]
        table.add_row(now.mode, now.fusion or "", *cells)
    out.print(table)


def _advance(progress: Any, task: Any) -> Callable[[int, int], None]:
    return lambda done, total: progress.update(task, completed=done, total=total)

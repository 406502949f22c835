import json
import math

import pytest

from rag_pipeline.evaluation.beir import (
    evaluate,
    index_corpus,
    load_beir,
    mrr_at_k,
    ndcg_at_k,
    rank_documents,
    recall_at_k,
)
from rag_pipeline.retrieve import Hit
from rag_pipeline_tests.conftest import make_recipe


def test_ndcg_by_hand():
    # relevant d1 at rank 1 and d3 at rank 3; two relevant docs in total
    ranked = ["d1", "d2", "d3"]
    relevant = {"d1": 1, "d3": 1}
    dcg = 1 / math.log2(2) + 1 / math.log2(4)
    idcg = 1 / math.log2(2) + 1 / math.log2(3)
    assert ndcg_at_k(ranked, relevant, 10) == pytest.approx(dcg / idcg)
    assert ndcg_at_k(["d3", "d1"], relevant, 10) == pytest.approx(1.0)
    assert ndcg_at_k(["x"], relevant, 10) == 0.0
    # graded relevance
    assert ndcg_at_k(["b", "a"], {"a": 2, "b": 1}, 10) == pytest.approx(
        (1 + 2 / math.log2(3)) / (2 + 1 / math.log2(3))
    )


def test_recall_and_mrr_by_hand():
    ranked = [f"d{i}" for i in range(20)]
    relevant = {"d3": 1, "d15": 1, "missing": 1}
    assert recall_at_k(ranked, relevant, 10) == pytest.approx(1 / 3)
    assert recall_at_k(ranked, relevant, 100) == pytest.approx(2 / 3)
    assert mrr_at_k(ranked, relevant, 10) == pytest.approx(1 / 4)
    assert mrr_at_k(ranked, {"d15": 1}, 10) == 0.0


def test_documents_are_ranked_by_their_best_chunk():
    hits = [
        Hit(str(i), 1.0 - i / 10, {"source_file": doc})
        for i, doc in enumerate(["a", "b", "a", "c", "b"])
    ]
    assert rank_documents(hits) == ["a", "b", "c"]


@pytest.fixture
def tiny_beir(tmp_path):
    corpus = [
        {"_id": "1", "title": "Robot arms", "text": "Robot arms grasp objects with grippers."},
        {"_id": "2", "title": "Soil", "text": "Clay soil holds water longer than sandy soil."},
        {"_id": "3", "title": "Legged robots", "text": "Bipedal robots balance while walking."},
    ]
    queries = [
        {"_id": "q1", "text": "grasp objects gripper"},
        {"_id": "q2", "text": "water clay soil"},
        {"_id": "q3", "text": "unjudged"},
    ]
    (tmp_path / "qrels").mkdir()
    (tmp_path / "corpus.jsonl").write_text("\n".join(json.dumps(d) for d in corpus))
    (tmp_path / "queries.jsonl").write_text("\n".join(json.dumps(q) for q in queries))
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\t1\t1\nq2\t2\t1\n")
    return tmp_path


def test_eval_end_to_end_on_a_tiny_dataset(tiny_beir, store, hash_embedder):
    dataset = load_beir(tiny_beir)
    assert len(dataset.corpus) == 3 and set(dataset.qrels) == {"q1", "q2"}
    recipe = make_recipe(hash_embedder)
    first = index_corpus(store, "eval-tiny", dataset.corpus, recipe)
    assert first["indexed"] == 3 and first["embedded"] == 3
    again = index_corpus(store, "eval-tiny", dataset.corpus, recipe)
    assert again["indexed"] == 0 and again["skipped"] == 3  # re-runs embed nothing
    report = evaluate(store, recipe, dataset, "eval-tiny", mode="sparse")
    assert report.queries == 2
    assert report.ndcg_at_10 == pytest.approx(1.0)
    assert report.as_dict()["mrr@10"] == pytest.approx(1.0)


def test_missing_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"corpus\.jsonl is missing"):
        load_beir(tmp_path)


def test_the_corpus_bm25_average_is_measured_before_encoding_and_recorded(
    tiny_beir, store, hash_embedder, monkeypatch
):
    from rag_pipeline.evaluation import beir as evaluation
    from rag_pipeline.schema import chunks_of
    from rag_pipeline.sparse import Bm25Encoder

    dataset = load_beir(tiny_beir)
    recipe = evaluation.measured_recipe(
        store, make_recipe(hash_embedder), "eval-tiny", dataset.corpus
    )
    # title + text of each one-chunk document, as the sparse encoder sees them
    lengths = [
        len(Bm25Encoder().terms(f"{title}\n\n{text}")) for title, text in dataset.corpus.values()
    ]
    assert recipe.sparse.avg_len == round(sum(lengths) / len(lengths), 1)
    assert recipe.sparse.name == f"bm25v2-english-k1=1.2-b=0.75-avg={recipe.sparse.avg_len:g}"
    index_corpus(store, "eval-tiny", dataset.corpus, recipe)
    recorded = {r.payload["sparse_model"] for r in store.scroll(chunks_of("eval-tiny"))}
    assert recorded == {recipe.sparse.name}
    # a re-run finds the corpus indexed under the recorded encoder: nothing is chunked again
    monkeypatch.setattr(evaluation, "_chunk_texts", lambda *a: pytest.fail("measured again"))
    again = evaluation.measured_recipe(
        store, make_recipe(hash_embedder), "eval-tiny", dataset.corpus
    )
    assert again.sparse == recipe.sparse and again.signature == recipe.signature
    assert index_corpus(store, "eval-tiny", dataset.corpus, again)["indexed"] == 0


def test_eval_reports_the_fusion_of_hybrid_runs(tiny_beir, store, hash_embedder):
    dataset = load_beir(tiny_beir)
    recipe = make_recipe(hash_embedder)
    index_corpus(store, "eval-tiny", dataset.corpus, recipe)
    runs = {
        (mode, fusion): evaluate(store, recipe, dataset, "eval-tiny", mode=mode, fusion=fusion)
        for mode, fusion in [("hybrid", "minmax"), ("hybrid", "rrf"), ("sparse", "minmax")]
    }
    assert runs["hybrid", "minmax"].as_dict()["fusion"] == "minmax"
    assert runs["hybrid", "rrf"].as_dict()["fusion"] == "rrf(k=60)"
    assert runs["sparse", "minmax"].as_dict()["fusion"] is None
    assert all(r.as_dict()["sparse_model"] == recipe.sparse.name for r in runs.values())
    assert all(r.ndcg_at_10 == pytest.approx(1.0) for r in runs.values())


def test_lost_chunk_points_of_a_corpus_are_indexed_again(tiny_beir, store, hash_embedder):
    """The corpus is assessed as a book is: a document whose record promises chunk points the
    index no longer holds is indexed again."""
    from rag_pipeline.schema import book_filter, chunks_of

    dataset = load_beir(tiny_beir)
    recipe = make_recipe(hash_embedder)
    index_corpus(store, "eval-tiny", dataset.corpus, recipe)
    lost = [r.id for r in store.scroll(chunks_of("eval-tiny")) if r.payload["source_file"] == "2"]
    store.delete_ids(book_filter("eval-tiny"), lost)
    again = index_corpus(store, "eval-tiny", dataset.corpus, recipe)
    assert again["indexed"] == 1 and again["skipped"] == 2
    assert index_corpus(store, "eval-tiny", dataset.corpus, recipe)["indexed"] == 0


def test_eval_runs_are_each_mode_once_and_hybrid_once_per_fusion():
    from rag_pipeline.evaluation.beir import eval_runs

    assert eval_runs([], []) == [("hybrid", "minmax")]
    assert eval_runs(["dense", "hybrid", "dense"], ["rrf", "dbsf", "rrf"]) == [
        ("dense", None),
        ("hybrid", "rrf"),
        ("hybrid", "dbsf"),
    ]


def test_the_eval_command_reports_every_run(tiny_beir, tmp_path, monkeypatch):
    """`rag-pipeline eval --json`, in-process: the dataset indexed once in its own collection,
    one report per (mode, fusion)."""
    from click.testing import CliRunner

    from rag_pipeline.cli import main

    for name, value in {
        "RAG_EMBEDDER": "hash",
        "RAG_QDRANT_PATH": str(tmp_path / "qdrant"),
        "RAG_CACHE_DIR": str(tmp_path / "cache"),
        "RAG_DATA_DIR": str(tmp_path),
    }.items():
        monkeypatch.setenv(name, value)
    args = ["eval", "--dataset", str(tiny_beir), "--json", "--mode", "sparse", "--mode", "hybrid"]
    result = CliRunner().invoke(main, [*args, "--fusion", "rrf", "--fusion", "minmax"])
    assert result.exit_code == 0, result.output
    runs = json.loads(result.stdout)["runs"]
    assert [(r["mode"], r["fusion"]) for r in runs] == [
        ("sparse", None),
        ("hybrid", "rrf(k=60)"),
        ("hybrid", "minmax"),
    ]
    assert all(r["queries"] == 2 and r["ndcg@10"] > 0.5 for r in runs), runs

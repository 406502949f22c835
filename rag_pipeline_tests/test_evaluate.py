import json
import math

import pytest

from rag_pipeline.evaluation.beir import BeirSource, load_beir
from rag_pipeline.evaluation.metrics import mrr_at_k, ndcg_at_k, recall_at_k
from rag_pipeline.evaluation.run import evaluate, index_dataset, rank_documents, recorded_encoder
from rag_pipeline.retrieve import Hit
from rag_pipeline_tests.conftest import make_pipeline, make_recipe


@pytest.fixture
def store(opened):
    """The store on each embedded backend, indexed by the pipeline (see conftest's StoreView)."""
    return opened


@pytest.fixture
def pipeline(store, tmp_path, hash_embedder):
    """The ingest pipeline writing into ``store`` (its book source is the corpus's)."""
    return make_pipeline(tmp_path, store, make_recipe(hash_embedder))


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


def test_eval_end_to_end_on_a_tiny_dataset(tiny_beir, store, pipeline, hash_embedder):
    dataset = load_beir(tiny_beir)
    assert len(dataset.corpus) == 3 and set(dataset.qrels) == {"q1", "q2"}
    recipe = make_recipe(hash_embedder)
    first = index_dataset(pipeline, dataset, recipe, "eval-tiny")
    assert first["indexed"] == 3 and first["embedded"] == 3
    again = index_dataset(pipeline, dataset, recipe, "eval-tiny")
    assert again["indexed"] == 0 and again["skipped"] == 3  # re-runs embed nothing
    report = evaluate(store, recipe, dataset, "eval-tiny", mode="sparse")
    assert report.queries == 2
    assert report.ndcg_at_10 == pytest.approx(1.0)
    assert report.as_dict()["mrr@10"] == pytest.approx(1.0)


def test_missing_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"corpus\.jsonl is missing"):
        load_beir(tmp_path)


def test_a_corpus_is_a_book_source_of_its_rows(tiny_beir):
    """Adding a source is one class: the corpus lists one book, each document a file whose
    version is the hash of its row, and a document is its title and text (no Markdown is
    parsed out of a row: a text starting with '#' stays text, an empty title stays empty)."""
    from rag_pipeline.models import ParsedDocument
    from rag_pipeline.sources.base import ParseOptions

    dataset = load_beir(tiny_beir)
    dataset.corpus["4"] = ("", "# not a heading\n\nplain text")
    source = BeirSource(dataset, "eval-tiny")
    assert source.list_books().book_ids == ("eval-tiny",)
    found = source.scan("eval-tiny")
    assert [f.source_file for f in found.files] == ["1", "2", "3", "4"] and found.hashed == 0
    file = found.files[3]
    doc = source.to_document(
        "eval-tiny", "4", source.read("eval-tiny", file, ""), file.sha256, ParseOptions()
    )
    assert isinstance(doc, ParsedDocument)
    assert (doc.meta.title, doc.body) == ("", "# not a heading\n\nplain text")
    assert source.is_gone("eval-tiny", "5") and not source.is_gone("eval-tiny", "4")
    assert source.is_gone("another-book")


def test_the_corpus_bm25_average_is_measured_over_the_corpus_and_recorded(
    tiny_beir, store, pipeline, hash_embedder
):
    """The corpus is one book indexed in one run: its BM25 average is measured over every
    chunk of it before anything is encoded, recorded in every chunk, and reused by a re-run."""
    from rag_pipeline.schema import chunks_of
    from rag_pipeline.sparse import Bm25Encoder

    dataset = load_beir(tiny_beir)
    recipe = make_recipe(hash_embedder)
    index_dataset(pipeline, dataset, recipe, "eval-tiny")
    # title + text of each one-chunk document, as the sparse encoder sees them
    lengths = [
        len(Bm25Encoder().terms(f"{title}\n\n{text}")) for title, text in dataset.corpus.values()
    ]
    encoder = recorded_encoder(store, "eval-tiny")
    assert encoder is not None and encoder.avg_len == round(sum(lengths) / len(lengths), 1)
    assert encoder.name == f"bm25v2-english-k1=1.2-b=0.75-avg={encoder.avg_len:g}"
    recorded = {r.payload["sparse_model"] for r in store.scroll(chunks_of("eval-tiny"))}
    assert recorded == {encoder.name}
    assert index_dataset(pipeline, dataset, recipe, "eval-tiny")["indexed"] == 0
    assert recorded_encoder(store, "eval-tiny") == encoder


def test_eval_reports_the_fusion_of_hybrid_runs(tiny_beir, store, pipeline, hash_embedder):
    dataset = load_beir(tiny_beir)
    recipe = make_recipe(hash_embedder)
    index_dataset(pipeline, dataset, recipe, "eval-tiny")
    encoder = recorded_encoder(store, "eval-tiny")
    runs = {
        (mode, fusion): evaluate(
            store, recipe, dataset, "eval-tiny", mode=mode, fusion=fusion, sparse_encoder=encoder
        )
        for mode, fusion in [("hybrid", "minmax"), ("hybrid", "rrf"), ("sparse", "minmax")]
    }
    assert runs["hybrid", "minmax"].as_dict()["fusion"] == "minmax"
    assert runs["hybrid", "rrf"].as_dict()["fusion"] == "rrf(k=60)"
    assert runs["sparse", "minmax"].as_dict()["fusion"] is None
    assert encoder is not None
    assert all(r.as_dict()["sparse_model"] == encoder.name for r in runs.values())
    assert all(r.ndcg_at_10 == pytest.approx(1.0) for r in runs.values())


def test_lost_chunk_points_of_a_corpus_are_indexed_again(tiny_beir, store, pipeline, hash_embedder):
    """The corpus is assessed as a book is: a document whose record promises chunk points the
    index no longer holds is indexed again."""
    from rag_pipeline.schema import book_filter, chunks_of

    dataset = load_beir(tiny_beir)
    recipe = make_recipe(hash_embedder)
    index_dataset(pipeline, dataset, recipe, "eval-tiny")
    lost = [r.id for r in store.scroll(chunks_of("eval-tiny")) if r.payload["source_file"] == "2"]
    store.delete_ids(book_filter("eval-tiny"), lost)
    again = index_dataset(pipeline, dataset, recipe, "eval-tiny")
    assert again["indexed"] == 1 and again["skipped"] == 2
    assert index_dataset(pipeline, dataset, recipe, "eval-tiny")["indexed"] == 0


def test_a_document_removed_from_the_corpus_is_removed_from_its_book(
    tiny_beir, store, pipeline, hash_embedder
):
    from rag_pipeline.schema import chunks_of

    dataset = load_beir(tiny_beir)
    recipe = make_recipe(hash_embedder)
    index_dataset(pipeline, dataset, recipe, "eval-tiny")
    del dataset.corpus["3"]
    index_dataset(pipeline, dataset, recipe, "eval-tiny")
    files = {r.payload["source_file"] for r in store.scroll(chunks_of("eval-tiny"))}
    assert files == {"1", "2"}


def test_eval_runs_are_each_mode_once_and_hybrid_once_per_fusion():
    from rag_pipeline.evaluation.run import eval_runs

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
    from rag_pipeline_tests.pins import STAGES, pipeline_spies

    args = ["eval", "--dataset", str(tiny_beir), "--json", "--mode", "sparse", "--mode", "hybrid"]
    with pipeline_spies() as spies:  # the corpus is indexed by the one pipeline, nothing else
        result = CliRunner().invoke(main, [*args, "--fusion", "rrf", "--fusion", "minmax"])
    assert result.exit_code == 0, result.output
    assert tuple(spies.stages) == STAGES and spies.writes > 0 and spies.outside == []
    runs = json.loads(result.stdout)["runs"]
    assert [(r["mode"], r["fusion"]) for r in runs] == [
        ("sparse", None),
        ("hybrid", "rrf(k=60)"),
        ("hybrid", "minmax"),
    ]
    assert all(r["queries"] == 2 and r["ndcg@10"] > 0.5 for r in runs), runs

import json

import numpy as np
import pytest

from rag_pipeline.config import load_settings
from rag_pipeline.embed import EmbedError, create_embedder
from rag_pipeline.embed.base import RegexTokenCounter
from rag_pipeline.embed.hashing import HashEmbedder
from rag_pipeline.embed.local import LocalEmbedder, find_model_dir
from rag_pipeline_tests.conftest import FIXTURES

REFERENCE = json.loads((FIXTURES / "minilm_reference_vectors.json").read_text())


def test_local_model_matches_sentence_transformers(local_embedder):
    """The ONNX graph built from the weights reproduces sentence-transformers' vectors."""
    vectors = local_embedder.embed(REFERENCE["texts"])
    reference = np.asarray(REFERENCE["vectors"], dtype=np.float32)
    cosines = (vectors * reference).sum(axis=1)
    assert vectors.shape == (len(REFERENCE["texts"]), 384)
    assert cosines.min() >= 0.999, cosines


def test_local_model_is_semantic(local_embedder):
    query = local_embedder.embed_query("How do robots talk to each other?")
    docs = local_embedder.embed(
        [
            "ROS 2 nodes communicate by publishing messages on topics.",
            "The recipe needs two cups of flour and an egg.",
        ]
    )
    scores = docs @ query
    assert scores[0] > scores[1] + 0.2


def test_local_tokenizer_counts_and_limit(local_embedder):
    tok = local_embedder.tokenizer
    assert tok.max_input_tokens == 256
    assert tok.special_tokens == 2
    assert tok.count(["hello world", ""]) == [2, 0]
    pieces = tok.split("word " * 1000, 100)
    assert all(n <= 100 for n in tok.count(pieces))
    assert "".join(pieces).split() == ["word"] * 1000


def test_onnx_graph_is_cached(tmp_path):
    first = LocalEmbedder(cache_dir=tmp_path)
    first.embed(["warm up"])
    cached = list(tmp_path.glob("*.onnx"))
    assert len(cached) == 1
    second = LocalEmbedder(cache_dir=tmp_path)
    np.testing.assert_allclose(second.embed(["same text"]), first.embed(["same text"]), atol=1e-6)


def test_embedding_order_is_kept_despite_length_sorting(hash_embedder):
    texts = ["a " * n + f"marker{n}" for n in (50, 1, 20, 3, 400)]
    together = hash_embedder.embed(texts)
    alone = np.stack([hash_embedder.embed([t])[0] for t in texts])
    np.testing.assert_allclose(together, alone, atol=1e-6)


def test_hash_embedder_is_deterministic_and_normalized():
    a, b = HashEmbedder(), HashEmbedder()
    v = a.embed(["the same text", "other words"])
    np.testing.assert_array_equal(v, b.embed(["the same text", "other words"]))
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-6)
    assert a.embed([]).shape == (0, 384)


def test_regex_token_counter_split_keeps_words():
    tok = RegexTokenCounter()
    pieces = tok.split("alpha, beta gamma delta", 2)
    assert "".join(pieces).replace(" ", "") == "alpha,betagammadelta"
    assert all(n <= 2 for n in tok.count(pieces))


def test_create_embedder_by_name(monkeypatch):
    assert create_embedder(load_settings(embedder="hash").embedding()).model_name == "hash-384"
    with pytest.raises(EmbedError, match="OPENAI_API_KEY"):
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
        create_embedder(load_settings(embedder="openai", openai_api_key=None).embedding())


def test_missing_model_folder_is_a_clear_error(tmp_path):
    with pytest.raises(EmbedError, match="not a sentence-transformers model folder"):
        find_model_dir(tmp_path)

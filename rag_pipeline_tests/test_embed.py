import json
import re

import numpy as np
import pytest

from rag_pipeline.config import load_settings
from rag_pipeline.embed import EmbeddingAnswerError, EmbedError, check_query_vector, create_embedder
from rag_pipeline.embed.base import RegexTokenCounter
from rag_pipeline.embed.hashing import HashEmbedder
from rag_pipeline.embed.local import (
    LocalEmbedder,
    cpu_has_fast_int8,
    find_model_dir,
    resolve_precision,
)
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


@pytest.fixture(scope="session")
def int8_embedder(local_embedder):
    """int8 beside the fp32 graph, in the same cache folder."""
    return LocalEmbedder(cache_dir=local_embedder._cache_dir, precision="int8")


@pytest.mark.slow  # quantizes the model's graph (seconds of ONNX Runtime work)
def test_int8_model_stays_close_to_fp32(local_embedder, int8_embedder):
    """ONNX Runtime's dynamic quantization (per-channel int8 MatMul weights) moves vectors a
    little: measured mean cosine 0.9928, min 0.9888 on these texts (0.9943 / 0.9878 on 320
    real chunks) with VNNI or AMX; on an AVX2-only CPU (an AMD EPYC here), whose u8s8 kernels
    can saturate, mean 0.9913, min 0.9847 (``auto`` keeps fp32 there: only a forced int8
    runs so). The bounds hold on every kind."""
    fp32 = local_embedder.embed(REFERENCE["texts"])
    int8 = int8_embedder.embed(REFERENCE["texts"])
    cosines = (int8 * fp32).sum(axis=1)
    assert cosines.mean() >= 0.99, cosines
    assert cosines.min() >= 0.98, cosines
    assert not np.allclose(int8, fp32, atol=1e-4)  # it really is another graph


@pytest.mark.slow  # quantizes the model's graph (seconds of ONNX Runtime work)
def test_int8_has_its_own_model_name(local_embedder, int8_embedder):
    """Points record model_name: int8 and fp32 vectors must never mix in one index."""
    assert local_embedder.model_name == "sentence-transformers/all-MiniLM-L6-v2"
    assert int8_embedder.model_name == "sentence-transformers/all-MiniLM-L6-v2#int8"
    assert int8_embedder.dimension == 384
    assert int8_embedder.tokenizer.max_input_tokens == 256


@pytest.mark.slow  # quantizes the model's graph (seconds of ONNX Runtime work)
def test_int8_graph_is_cached_beside_fp32_and_reused(tmp_path, monkeypatch):
    import onnxruntime.quantization

    first = LocalEmbedder(cache_dir=tmp_path, precision="int8")
    vectors = first.embed(["warm up", "another text"])
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 2 and sum(n.endswith("-int8.onnx") for n in names) == 1, names

    def must_not_quantize(*args, **kwargs):
        raise AssertionError("the cached int8 graph should have been reused")

    monkeypatch.setattr(onnxruntime.quantization, "quantize_dynamic", must_not_quantize)
    second = LocalEmbedder(cache_dir=tmp_path, precision="int8")
    np.testing.assert_allclose(second.embed(["warm up", "another text"]), vectors, atol=1e-6)
    assert sorted(p.name for p in tmp_path.iterdir()) == names  # nothing new, no temp file left


@pytest.mark.slow  # quantizes the model's graph (seconds of ONNX Runtime work)
def test_int8_without_a_cache_folder(int8_embedder):
    vectors = LocalEmbedder(precision="int8").embed(REFERENCE["texts"][:2])
    np.testing.assert_allclose(vectors, int8_embedder.embed(REFERENCE["texts"][:2]), atol=1e-5)


def test_precision_choice(tmp_path, monkeypatch):
    assert resolve_precision("fp32") == "fp32" and resolve_precision("int8") == "int8"
    with pytest.raises(EmbedError, match="unknown local precision"):
        resolve_precision("fp16")
    assert not cpu_has_fast_int8(tmp_path / "absent")  # each CPU kind: the test below
    import rag_pipeline.embed.local as local

    monkeypatch.setattr(local, "cpu_has_fast_int8", lambda: True)
    assert resolve_precision("auto") == "int8"
    monkeypatch.setattr(local, "cpu_has_fast_int8", lambda: False)
    assert resolve_precision("auto") == "fp32"
    settings = load_settings(local_precision="int8", cache_dir=tmp_path)
    assert create_embedder(settings.embedding()).model_name.endswith("#int8")


CPU_KINDS = {
    kind: spec
    for kind, spec in json.loads((FIXTURES / "cpuinfo_kinds.json").read_text()).items()
    if not kind.startswith("_")
}


@pytest.mark.parametrize("kind", sorted(CPU_KINDS))
def test_precision_auto_on_each_cpu_kind(kind, tmp_path, monkeypatch):
    """``auto`` reads the /proc/cpuinfo of each kind of CPU sessions and users get: int8 where
    ONNX Runtime has int8 dot products (AMX, AVX-512 VNNI, AVX-VNNI), fp32 on AVX2 alone and on
    aarch64 (whose cpuinfo has 'Features', not 'flags')."""
    import rag_pipeline.embed.local as local

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(CPU_KINDS[kind]["cpuinfo"])
    expected = CPU_KINDS[kind]["fast_int8"]
    assert cpu_has_fast_int8(cpuinfo) is expected
    monkeypatch.setattr(local, "cpu_has_fast_int8", lambda: cpu_has_fast_int8(cpuinfo))
    assert resolve_precision("auto") == ("int8" if expected else "fp32")


def test_local_batches_are_sorted_by_tokens_and_results_keep_input_order(local_embedder):
    """Texts of equal length in characters but very different token counts go to different
    batches; every vector still lands on its own text's row."""
    texts = [("x" * 9 + " ") * 20, "word " * 40, "a", "antidisestablishmentarianism " * 7, "b c"]
    seen: list[list[int]] = []
    real = local_embedder._embed_batch

    def spy(items):
        seen.append([len(i) for i in items])
        return real(items)

    local_embedder._embed_batch = spy
    try:
        local_embedder.batch_size = 2
        together = local_embedder.embed(texts)
    finally:
        local_embedder.batch_size = 32
        del local_embedder._embed_batch
    flat = [n for batch in seen for n in batch]
    assert flat == sorted(flat) and [len(b) for b in seen] == [2, 2, 1]
    alone = np.stack([local_embedder.embed([t])[0] for t in texts])
    np.testing.assert_allclose(together, alone, atol=1e-5)


@pytest.mark.parametrize(
    ("lengths", "bounds"),
    [
        ([10] * 70, [(0, 32), (32, 64), (64, 70)]),  # short texts: batch_size rules
        ([256] * 20, [(0, 16), (16, 20)]),  # full-length texts: 16 x 256 = 4096 tokens
        ([100] * 30 + [200] * 30, [(0, 30), (30, 50), (50, 60)]),  # the longest bounds it
        ([5000], [(0, 1)]),  # one text over the budget still goes alone
        ([], []),
    ],
)
def test_local_batches_are_bounded_by_padded_tokens(lengths, bounds):
    """The ORT arena keeps the largest batch's tensors resident: 32 x 256 tokens held
    ~1.15 GB, 16 x 256 ~0.68 GB at the same speed (docs/benchmarks.md, section 8)."""
    embedder = LocalEmbedder.__new__(LocalEmbedder)
    embedder.batch_size, embedder.max_batch_tokens = 32, 4096
    assert list(embedder._batch_bounds(lengths)) == bounds


def test_local_texts_are_tokenized_once(tmp_path):
    embedder = LocalEmbedder(cache_dir=tmp_path, batch_size=8)
    calls: list[int] = []

    class Counting:
        def __init__(self, inner):
            self.inner = inner

        def encode_batch(self, texts):
            calls.append(len(texts))
            return self.inner.encode_batch(texts)

    embedder._encoder = Counting(embedder._encoder)
    vectors = embedder.embed([f"sentence number {i} " * (i % 5 + 1) for i in range(40)])
    assert vectors.shape == (40, 384)
    assert calls == [40]  # one pass for sorting and for the 5 batches


def test_progress_is_reported_after_every_batch(hash_embedder):
    calls: list[tuple[int, int]] = []
    texts = [f"text {i} " * (i % 7 + 1) for i in range(600)]
    hash_embedder.embed(texts, progress=lambda done, total, *tokens: calls.append((done, total)))
    assert calls == [(256, 600), (512, 600), (600, 600)]
    hash_embedder.embed([], progress=lambda done, total, *tokens: calls.append((done, total)))
    assert len(calls) == 3  # nothing to embed, no batch, no call


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


def _rows(v, pick, value):
    """``v`` with the rows ``pick(row numbers)`` selects set to ``value``."""
    return np.where(pick(np.arange(len(v)))[:, None], value, v)


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda v: v[:, :-1], "returned vectors of dimension 383, not 384, for 3 inputs"),
        (lambda v: _rows(v, lambda r: r == 0, np.nan), "non-finite values for 1 of 3"),
        (lambda v: _rows(v, lambda r: r < 2, 0.0), "all-zero vectors for 2 of 3"),
        (lambda v: v * np.float32(3e38), "vectors whose length overflows float32 for 3 of 3"),
        (lambda v: v[:-1], "returned 2 vectors (shape (2, 384)) for 3 inputs"),
    ],
)
def test_every_embedder_answer_is_checked_before_use(hash_embedder, monkeypatch, corrupt, message):
    """A local model's batch is checked as the API's answers are: before, NaN rows were
    returned as they were and zero rows as zeros (found by no search, or scoring 0.0)."""
    real = hash_embedder._embed_batch
    monkeypatch.setattr(hash_embedder, "_embed_batch", lambda items: corrupt(real(items)))
    with pytest.raises(EmbeddingAnswerError, match=re.escape(message)) as info:
        hash_embedder.embed(["one text", "two", "three"])
    assert str(info.value).startswith("the hash-384 embedder returned")
    with pytest.raises(EmbeddingAnswerError):
        hash_embedder.embed_query("one text")


def test_a_query_vector_is_checked_against_the_embedders_dimension(hash_embedder):
    good = hash_embedder.embed_query("robots")
    assert check_query_vector(good, hash_embedder) is not None
    with pytest.raises(EmbeddingAnswerError, match="the hash-384 embedder returned vectors of"):
        check_query_vector(good[:10], hash_embedder)
    with pytest.raises(EmbeddingAnswerError, match="the FakeEmbedder embedder returned non-fin"):
        check_query_vector(np.full(4, np.inf), type("FakeEmbedder", (), {})())


def test_an_embedder_is_one_entry_of_the_registry(monkeypatch):
    """Every choice of an embedder reads one table: a provider added to it is accepted by
    the settings, names its models, builds its embedder, prices its tokens and claims a book
    recorded with its model under another configured provider."""
    from dataclasses import replace

    from rag_pipeline.config import load_settings
    from rag_pipeline.embed import registry
    from rag_pipeline.embed.hashing import HashEmbedder

    built = []

    def build(config, threads):  # type: ignore[no-untyped-def]
        built.append(threads)
        embedder = HashEmbedder(8)
        embedder.model_name = "echo-8"
        return embedder

    echo = registry.EmbedderKind(
        name="echo",
        description="a stand-in",
        ui_kind="python",
        models=lambda config: {"echo-8": None},
        claims=lambda config, model: (
            replace(config, provider="echo") if model == "echo-8" else None
        ),
        build=build,
        price=lambda config: 1.5,
    )
    monkeypatch.setitem(registry.EMBEDDERS, "echo", echo)
    settings = load_settings(embedder="echo")
    config = settings.embedding()
    assert registry.model_names(config) == {"echo-8": None}
    assert registry.create_embedder(config, threads=2).model_name == "echo-8" and built == [2]
    assert registry.usd_per_million_tokens(config) == 1.5
    hashed = load_settings(embedder="hash").embedding()
    assert registry.config_for_model(hashed, "echo-8").provider == "echo"
    assert registry.config_for_model(hashed, "nobody-knows") is None
    with pytest.raises(ValueError, match="unknown embedder 'bogus'"):
        registry.kind_of("bogus")


def test_token_counts_are_remembered_and_right(local_embedder, monkeypatch):
    """Issue 41.1: the chunker counts the same texts several times (and a live edit's file
    again): a counter tokenizes each text once, and its counts are the tokenizer's."""
    from rag_pipeline.embed import local

    tok = local.HFTokenCounter(local_embedder.model_dir / "tokenizer.json", 256)
    texts = ["hello world", "", "hello world", "a longer line of text, with punctuation!"]
    direct = [len(e.ids) for e in tok._tokenizer.encode_batch(texts, add_special_tokens=False)]
    encoded: list[list[str]] = []
    real = tok._tokenizer

    class Counting:
        def encode_batch(self, batch, add_special_tokens):  # type: ignore[no-untyped-def]
            encoded.append(list(batch))
            return real.encode_batch(batch, add_special_tokens=add_special_tokens)

    tok._tokenizer = Counting()
    assert tok.count(texts) == direct
    assert encoded == [["hello world", "", "a longer line of text, with punctuation!"]]
    assert tok.count([*texts, "new"]) == [*direct, 1] and encoded[1:] == [["new"]]
    monkeypatch.setattr(local, "_COUNTED_CHARS", 14)  # past the budget the oldest go
    tok.count(["another text"])
    assert list(tok._counts) == ["another text"]

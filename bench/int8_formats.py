"""Which int8 graph is fastest on this CPU: ONNX Runtime's quantization formats, fused
operators, threads and batch shapes for the local all-MiniLM-L6-v2, against fp32.

    python bench/int8_formats.py [--chunks 600] [--rounds 3] [--variants a,b,...]

(the ``*_fused`` variants need ``pip install sympy`` for the optimizer's shape inference; without
it they are left out, saying so)

Every variant embeds the same real chunks (powershell-docs, cut by the real chunker) in one
process, alternated round by round (A B C ..., then ... C B A), so a busy machine slows all of
them alike. Each variant is one ONNX graph and session settings:

- ``fp32``: the graph the product builds (ORT_ENABLE_ALL fuses LayerNorm and GELU itself).
- ``fp32_fused``: that graph after ONNX Runtime's BERT optimizer (``onnxruntime.transformers
  .optimizer``, which prints the operators it fused: BiasGelu and LayerNormalization here).
- ``int8``: the product's int8 graph (``quantize_dynamic`` of the MatMuls, per-channel QInt8
  weights, QOperator: DynamicQuantizeLinear + MatMulInteger, fused by ORT into
  DynamicQuantizeMatMul).
- ``int8_fused``: the optimizer's graph, then ``quantize_dynamic`` of MatMul *and* Attention
  (QAttention): ONNX Runtime's documented recipe for BERT on CPU. On this project's graph the
  optimizer fuses BiasGelu and LayerNormalization but finds no Attention pattern (it prints
  what it fused), so no QAttention is made.
- ``int8_fused_u8``: the same with QUInt8 weights (u8u8 kernels instead of VNNI's u8s8).
- ``int8_t1`` / ``int8_fused_t1``: one intra-op thread instead of one per core.
- ``*_b1k`` / ``*_b2k`` / ``*_b8k``: batches of at most 1,024 / 2,048 / 8,192 padded tokens
  instead of 4,096.

Reports chunks a second (best and median round), wall and process CPU seconds per round, the
ratio to fp32 within each round (median over rounds), and each variant's cosine to fp32's
vectors (mean and min). Prints JSON and writes bench/results/int8_formats.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from rag_pipeline.embed.local import _QUANTIZATION, LocalEmbedder

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from common import save_results  # noqa: E402
from embed_precision import timings  # noqa: E402
from embed_runtime import sample_texts  # noqa: E402


class GraphEmbedder(LocalEmbedder):
    """The product's embedder (tokenizing, batching, pooling) on a given ONNX graph."""

    def __init__(self, graph: str, *, threads: int | None, max_batch_tokens: int) -> None:
        super().__init__(precision="fp32", threads=threads, max_batch_tokens=max_batch_tokens)
        self._graph = graph

    def _onnx_model(self) -> str | bytes:
        return self._graph


def fused(fp32: str, folder: Path, heads: int, hidden: int) -> str:
    """The graph after ONNX Runtime's BERT optimizer (CPU, no fp16)."""
    from onnxruntime.transformers.optimizer import optimize_model

    model = optimize_model(
        fp32, model_type="bert", num_heads=heads, hidden_size=hidden, opt_level=0, use_gpu=False
    )
    out = folder / "fused.onnx"
    model.save_model_to_file(str(out))
    counts = model.get_fused_operator_statistics()
    print("fused operators:", {k: v for k, v in counts.items() if v}, file=sys.stderr)
    return str(out)


def quantized(source: str, folder: Path, name: str, ops: list[str], weight: str) -> str:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out = folder / f"{name}.onnx"
    quantize_dynamic(
        source,
        out,
        op_types_to_quantize=ops,
        per_channel=bool(_QUANTIZATION["per_channel"]),
        reduce_range=bool(_QUANTIZATION["reduce_range"]),
        weight_type=QuantType[weight],
        # the optimizer's contrib ops (BiasGelu) have no ONNX shape inference
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )
    return str(out)


def build_variants(folder: Path) -> dict[str, dict[str, Any]]:
    cache = folder / "cache"
    base = LocalEmbedder(cache_dir=cache, precision="fp32")
    fp32 = str(base._fp32_model())
    int8 = str(LocalEmbedder(cache_dir=cache, precision="int8")._int8_model(fp32))
    heads = int(base._config["num_attention_heads"])
    try:  # the BERT optimizer's shape inference needs sympy (not a dependency of the project)
        fp32_fused = fused(fp32, folder, heads, base.dimension)
    except ImportError as error:
        print(f"fused variants left out: {error}", file=sys.stderr)
        fp32_fused = None
    ops = ["MatMul", "Attention"]
    t, b = None, base.max_batch_tokens
    variants: dict[str, dict[str, Any]] = {
        "fp32": {"graph": fp32, "threads": t, "max_batch_tokens": b},
        "int8": {"graph": int8, "threads": t, "max_batch_tokens": b},
        "int8_t1": {"graph": int8, "threads": 1, "max_batch_tokens": b},
        "fp32_b2k": {"graph": fp32, "threads": t, "max_batch_tokens": 2048},
        "int8_b2k": {"graph": int8, "threads": t, "max_batch_tokens": 2048},
        "int8_b1k": {"graph": int8, "threads": t, "max_batch_tokens": 1024},
    }
    if fp32_fused is None:
        return variants
    int8_fused = quantized(fp32_fused, folder, "int8_fused", ops, "QInt8")
    int8_fused_u8 = quantized(fp32_fused, folder, "int8_fused_u8", ops, "QUInt8")
    return {
        **variants,
        "fp32_fused": {"graph": fp32_fused, "threads": t, "max_batch_tokens": b},
        "int8_fused": {"graph": int8_fused, "threads": t, "max_batch_tokens": b},
        "int8_fused_u8": {"graph": int8_fused_u8, "threads": t, "max_batch_tokens": b},
        "int8_fused_t1": {"graph": int8_fused, "threads": 1, "max_batch_tokens": b},
        "int8_fused_b2k": {"graph": int8_fused, "threads": t, "max_batch_tokens": 2048},
        "int8_fused_b8k": {"graph": int8_fused, "threads": t, "max_batch_tokens": 8192},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", default="", help="comma-separated subset (fp32 always)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="int8-formats-") as tmp:
        specs = build_variants(Path(tmp))
        if args.variants:
            keep = {"fp32", *args.variants.split(",")}
            specs = {k: v for k, v in specs.items() if k in keep}
        embedders = {name: GraphEmbedder(**spec) for name, spec in specs.items()}
        texts = sample_texts(embedders["fp32"], args.chunks)
        for embedder in embedders.values():
            embedder.embed(texts[:16])  # warm-up: session, arenas, thread pools
        names = list(embedders)
        wall: dict[str, list[float]] = {n: [] for n in names}
        cpu: dict[str, list[float]] = {n: [] for n in names}
        vectors: dict[str, np.ndarray] = {}
        for round_ in range(args.rounds):
            for name in names if round_ % 2 == 0 else names[::-1]:
                started, cpu_started = time.perf_counter(), time.process_time()
                vectors[name] = np.asarray(embedders[name].embed(texts))
                wall[name].append(time.perf_counter() - started)
                cpu[name].append(time.process_time() - cpu_started)
                print(f"round {round_} {name}: {wall[name][-1]:.2f} s", file=sys.stderr)
    ratio = {
        n: round(statistics.median(w / f for w, f in zip(wall[n], wall["fp32"], strict=True)), 3)
        for n in names
    }
    cosine = {}
    for name in names:
        cos = (vectors[name] * vectors["fp32"]).sum(1)
        cosine[name] = {"mean": round(float(cos.mean()), 4), "min": round(float(cos.min()), 4)}
    results = {
        **timings(len(texts), args.rounds, wall, cpu),
        "wall_ratio_to_fp32_median": ratio,
        "cosine_to_fp32": cosine,
    }
    save_results("int8_formats", results)


if __name__ == "__main__":
    main()

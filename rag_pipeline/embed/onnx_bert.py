"""Build an ONNX graph of a BERT sentence encoder straight from its safetensors weights.

This lets ONNX Runtime run a sentence-transformers model (e.g. all-MiniLM-L6-v2) with no torch
installed: the graph is the standard BERT encoder (embeddings, post-LN transformer layers with
exact erf GELU) followed by mean or CLS pooling and L2 normalization, so its output matches
sentence-transformers' ``encode(normalize_embeddings=True)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["BertSpec", "build_sentence_encoder"]

OPSET = 18


@dataclass(frozen=True, slots=True)
class BertSpec:
    """The few numbers of a BERT ``config.json`` the graph depends on."""

    hidden_size: int
    num_layers: int
    num_heads: int
    layer_norm_eps: float = 1e-12
    pooling: str = "mean"  # or "cls"

    @classmethod
    def from_config(cls, config: Mapping[str, Any], pooling: str = "mean") -> BertSpec:
        """The spec a model's config.json describes (its values are JSON numbers)."""
        if config.get("model_type") not in (None, "bert"):
            raise ValueError(f"only BERT encoders are supported, got {config.get('model_type')!r}")
        if config.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"unsupported activation {config.get('hidden_act')!r}")
        return cls(
            hidden_size=int(config["hidden_size"]),
            num_layers=int(config["num_hidden_layers"]),
            num_heads=int(config["num_attention_heads"]),
            layer_norm_eps=float(config.get("layer_norm_eps", 1e-12)),
            pooling=pooling,
        )


class _GraphBuilder:
    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def const(self, name: str, value: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], outputs: int = 1, **attrs: Any) -> list[str]:
        self._count += 1
        names = [f"{op_type.lower()}_{self._count}_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, names, **attrs))
        return names

    def one(self, op_type: str, inputs: list[str], **attrs: Any) -> str:
        return self.op(op_type, inputs, **attrs)[0]


def build_sentence_encoder(weights: Mapping[str, np.ndarray], spec: BertSpec) -> onnx.ModelProto:
    """ONNX model: input_ids, attention_mask (int64 [batch, seq]) -> sentence_embedding."""
    g = _GraphBuilder()
    w = {k.removeprefix("bert."): v for k, v in weights.items()}
    hidden, heads = spec.hidden_size, spec.num_heads
    head_dim = hidden // heads
    f32 = np.float32

    def layer_norm(x: str, prefix: str) -> str:
        scale = g.const(f"{prefix}.weight", w[f"{prefix}.weight"].astype(f32))
        bias = g.const(f"{prefix}.bias", w[f"{prefix}.bias"].astype(f32))
        return g.one("LayerNormalization", [x, scale, bias], axis=-1, epsilon=spec.layer_norm_eps)

    def dense(x: str, prefix: str, weight: np.ndarray, bias: np.ndarray) -> str:
        mat = g.const(f"{prefix}.w", weight.astype(f32))
        return g.one("Add", [g.one("MatMul", [x, mat]), g.const(f"{prefix}.b", bias.astype(f32))])

    # Embeddings: word + absolute position + token type 0, then LayerNorm.
    words = g.one(
        "Gather",
        [g.const("word_embeddings", w["embeddings.word_embeddings.weight"]), "input_ids"],
        axis=0,
    )
    seq_len = g.one(
        "Slice",
        [g.one("Shape", ["input_ids"]), g.const("i1", np.array([1])), g.const("i2", np.array([2]))],
    )
    positions = g.one(
        "Slice",
        [
            g.const("position_embeddings", w["embeddings.position_embeddings.weight"]),
            g.const("i0", np.array([0])),
            seq_len,
            g.const("ax0", np.array([0])),
        ],
    )
    token_type = g.const("token_type_0", w["embeddings.token_type_embeddings.weight"][0])
    x = layer_norm(
        g.one("Add", [g.one("Add", [words, positions]), token_type]), "embeddings.LayerNorm"
    )

    mask = g.one("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    # Additive attention bias [batch, 1, 1, seq]: 0 for tokens, -10000 for padding (as BERT).
    not_mask = g.one("Sub", [g.const("one", np.array(1.0, f32)), mask])
    attn_bias = g.one(
        "Unsqueeze",
        [
            g.one("Mul", [not_mask, g.const("neg", np.array(-1e4, f32))]),
            g.const("ax12", np.array([1, 2])),
        ],
    )
    split_heads = g.const("split_heads", np.array([0, 0, heads, head_dim]))
    merge_heads = g.const("merge_heads", np.array([0, 0, hidden]))
    scale = g.const("scale", np.array(1.0 / np.sqrt(head_dim), f32))
    qkv_sizes = g.const("qkv_sizes", np.array([hidden] * 3))
    half = g.const("half", np.array(0.5, f32))
    sqrt2 = g.const("sqrt2", np.array(np.sqrt(2.0), f32))

    for i in range(spec.num_layers):
        p = f"encoder.layer.{i}."
        att = p + "attention.self."
        qkv_w = np.concatenate([w[f"{att}{n}.weight"].T for n in ("query", "key", "value")], 1)
        qkv_b = np.concatenate([w[f"{att}{n}.bias"] for n in ("query", "key", "value")])
        q, k, v = g.op("Split", [dense(x, p + "qkv", qkv_w, qkv_b), qkv_sizes], outputs=3, axis=-1)
        q = g.one("Transpose", [g.one("Reshape", [q, split_heads])], perm=[0, 2, 1, 3])
        k = g.one("Transpose", [g.one("Reshape", [k, split_heads])], perm=[0, 2, 3, 1])
        v = g.one("Transpose", [g.one("Reshape", [v, split_heads])], perm=[0, 2, 1, 3])
        scores = g.one("Add", [g.one("Mul", [g.one("MatMul", [q, k]), scale]), attn_bias])
        context = g.one("MatMul", [g.one("Softmax", [scores], axis=-1), v])
        context = g.one("Reshape", [g.one("Transpose", [context], perm=[0, 2, 1, 3]), merge_heads])
        out = dense(
            context,
            p + "attention.output",
            w[p + "attention.output.dense.weight"].T,
            w[p + "attention.output.dense.bias"],
        )
        x = layer_norm(g.one("Add", [x, out]), p + "attention.output.LayerNorm")
        inner = dense(
            x,
            p + "intermediate",
            w[p + "intermediate.dense.weight"].T,
            w[p + "intermediate.dense.bias"],
        )
        # exact GELU, as BERT: 0.5 * x * (1 + erf(x / sqrt(2)))
        erf = g.one("Erf", [g.one("Div", [inner, sqrt2])])
        gelu = g.one(
            "Mul",
            [
                g.one("Mul", [inner, half]),
                g.one("Add", [erf, g.const(f"{p}one", np.array(1.0, f32))]),
            ],
        )
        out = dense(gelu, p + "output", w[p + "output.dense.weight"].T, w[p + "output.dense.bias"])
        x = layer_norm(g.one("Add", [x, out]), p + "output.LayerNorm")

    if spec.pooling == "cls":
        pooled = g.one(
            "Squeeze",
            [
                g.one(
                    "Slice",
                    [
                        x,
                        g.const("c0", np.array([0])),
                        g.const("c1", np.array([1])),
                        g.const("c_ax", np.array([1])),
                    ],
                ),
                g.const("c_sq", np.array([1])),
            ],
        )
    else:
        weights3 = g.one("Unsqueeze", [mask, g.const("ax2", np.array([2]))])
        summed = g.one(
            "ReduceSum", [g.one("Mul", [x, weights3]), g.const("ax1", np.array([1]))], keepdims=0
        )
        count = g.one("ReduceSum", [mask, g.const("ax1k", np.array([1]))], keepdims=1)
        count = g.one("Max", [count, g.const("tiny", np.array(1e-9, f32))])
        pooled = g.one("Div", [summed, count])
    norm = g.one("ReduceL2", [pooled, g.const("axn", np.array([1]))], keepdims=1)
    norm = g.one("Max", [norm, g.const("tiny_n", np.array(1e-12, f32))])
    g.nodes.append(helper.make_node("Div", [pooled, norm], ["sentence_embedding"]))

    graph = helper.make_graph(
        g.nodes,
        "sentence_encoder",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
        ],
        [helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch", hidden])],
        g.initializers,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="rag_pipeline"
    )
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model

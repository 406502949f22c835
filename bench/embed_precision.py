"""Local embedder speed: fp32 vs int8, batches sorted by characters vs by token count.

    nice -n 5 python bench/embed_precision.py [--chunks 600] [--rounds 2]

The same real chunks (powershell-docs, cut by the real chunker, as bench/embed_runtime.py) are
embedded by the four variants in one process, alternated (A B C D, then D C B A, ...), so a
busy shared machine slows all of them alike; each variant's figure is its best and its median
round. "chars" reproduces the old batch order (texts sorted by characters); "tokens" is the
current one. Also reports the padding share of each order, whether the two orders give the
same vectors, and how close int8 vectors are to fp32 ones. Prints JSON and writes it to
bench/results/embed_precision.json.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime

from rag_pipeline.embed.local import LocalEmbedder, cpu_has_fast_int8

REPO = Path(__file__).resolve().parents[1]


class CharSortedEmbedder(LocalEmbedder):
    """The previous batch order: texts sorted by their length in characters."""

    def _prepare(self, texts):  # type: ignore[no-untyped-def]
        _, ids = super()._prepare(texts)
        return [len(t) for t in texts], ids


def padding_share(embedder: LocalEmbedder, texts: Sequence[str], by_chars: bool) -> float:
    """Padding tokens / tokens the model runs on, for the batches ``embed`` would make."""
    tokens, _ = LocalEmbedder._prepare(embedder, texts)
    keys = [len(t) for t in texts] if by_chars else tokens
    order = sorted(range(len(texts)), key=keys.__getitem__)
    real = padded = 0
    for start, end in embedder._batch_bounds([keys[i] for i in order]):
        batch = [tokens[i] for i in order[start:end]]
        real += sum(batch)
        padded += max(batch) * len(batch)
    return (padded - real) / padded


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return platform.processor()


def timings(
    chunks: int, rounds: int, seconds: dict[str, list[float]], cpu_seconds: dict[str, list[float]]
) -> dict[str, Any]:
    """The machine and each variant's speed: chunks a second (best and median round), wall
    and process CPU seconds of every round."""
    return {
        "cpu": cpu_name(),
        "fast_int8_cpu (VNNI/AMX)": cpu_has_fast_int8(),
        "onnxruntime": onnxruntime.__version__,
        "chunks": chunks,
        "rounds": rounds,
        "chunks_per_s_best": {n: round(chunks / min(s), 2) for n, s in seconds.items()},
        "chunks_per_s_median": {
            n: round(chunks / statistics.median(s), 2) for n, s in seconds.items()
        },
        "seconds_per_round": {n: [round(x, 2) for x in s] for n, s in seconds.items()},
        "cpu_seconds_per_round": {n: [round(x, 2) for x in s] for n, s in cpu_seconds.items()},
    }


def main() -> None:
    import sys

    sys.path.insert(0, str(REPO / "bench"))
    from common import save_results
    from embed_runtime import sample_texts

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    cache = REPO / ".rag" / "cache" / "models"
    variants = {
        "fp32_chars": CharSortedEmbedder(cache_dir=cache, precision="fp32"),
        "fp32_tokens": LocalEmbedder(cache_dir=cache, precision="fp32"),
        "int8_chars": CharSortedEmbedder(cache_dir=cache, precision="int8"),
        "int8_tokens": LocalEmbedder(cache_dir=cache, precision="int8"),
    }
    fp32 = variants["fp32_tokens"]
    texts = sample_texts(fp32, args.chunks)  # type: ignore[arg-type]
    tokens = sum(fp32.tokenizer.count(texts)) + fp32.tokenizer.special_tokens * len(texts)
    for embedder in variants.values():
        embedder.embed(texts[:16])  # warm-up: graph build or load, thread pools
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    cpu_seconds: dict[str, list[float]] = {name: [] for name in variants}
    vectors: dict[str, np.ndarray] = {}
    names = list(variants)
    for round_ in range(args.rounds):
        for name in names if round_ % 2 == 0 else names[::-1]:
            started, cpu_started = time.perf_counter(), time.process_time()
            vectors[name] = variants[name].embed(texts)
            seconds[name].append(time.perf_counter() - started)
            cpu_seconds[name].append(time.process_time() - cpu_started)
    cos = (vectors["int8_tokens"] * vectors["fp32_tokens"]).sum(1)
    same = (vectors["fp32_chars"] * vectors["fp32_tokens"]).sum(1)
    results = {
        **timings(len(texts), args.rounds, seconds, cpu_seconds),
        "tokens": tokens,
        "padding_share": {
            "chars": round(padding_share(fp32, texts, by_chars=True), 4),
            "tokens": round(padding_share(fp32, texts, by_chars=False), 4),
        },
        "fp32_chars_vs_tokens_min_cosine": round(float(same.min()), 6),
        "int8_vs_fp32_cosine": {
            "mean": round(float(cos.mean()), 4),
            "min": round(float(cos.min()), 4),
        },
    }
    pairs = {
        "fp32 tokens vs fp32 chars": ("fp32_tokens", "fp32_chars"),
        "int8 chars vs fp32 chars": ("int8_chars", "fp32_chars"),
        "int8 tokens vs fp32 tokens": ("int8_tokens", "fp32_tokens"),
        "int8 tokens vs fp32 chars": ("int8_tokens", "fp32_chars"),
    }
    # speed-up = time of the second / time of the first, per round (the runs of a round are
    # close in time, so load from other processes mostly cancels out), then their median
    for label, measured in (("speedup", seconds), ("speedup_cpu_time", cpu_seconds)):
        per_round = {
            k: [round(b / a, 3) for a, b in zip(measured[x], measured[y], strict=True)]
            for k, (x, y) in pairs.items()
        }
        results[f"{label}_per_round"] = per_round
        results[f"{label}_median"] = {
            k: round(statistics.median(v), 3) for k, v in per_round.items()
        }
    save_results("embed_precision", results)


if __name__ == "__main__":
    main()

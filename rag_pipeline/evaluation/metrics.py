"""Retrieval metrics (binary or graded relevance, as pytrec_eval computes them) and the report
of one evaluation run."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "METRICS",
    "EvalReport",
    "compare_reports",
    "mrr_at_k",
    "ndcg_at_k",
    "recall_at_k",
]


def ndcg_at_k(ranked: Sequence[str], relevant: Mapping[str, int], k: int = 10) -> float:
    dcg = sum(relevant.get(doc, 0) / math.log2(i + 2) for i, doc in enumerate(ranked[:k]))
    ideal = sorted((g for g in relevant.values() if g > 0), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def recall_at_k(ranked: Sequence[str], relevant: Mapping[str, int], k: int) -> float:
    wanted = {d for d, g in relevant.items() if g > 0}
    return len(wanted & set(ranked[:k])) / len(wanted) if wanted else 0.0


def mrr_at_k(ranked: Sequence[str], relevant: Mapping[str, int], k: int = 10) -> float:
    for i, doc in enumerate(ranked[:k]):
        if relevant.get(doc, 0) > 0:
            return 1.0 / (i + 1)
    return 0.0


@dataclass(frozen=True)
class EvalReport:
    dataset: str
    split: str
    mode: str
    queries: int
    ndcg_at_10: float
    recall_at_10: float
    recall_at_100: float
    mrr_at_10: float
    seconds: float
    #: hybrid runs: how the lists were fused, e.g. "minmax", "rrf(k=60)"; else None
    fusion: str | None = None
    #: the sparse encoder the index was built with (its name records the measured avg_len)
    sparse_model: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "dataset": self.dataset,
            "split": self.split,
            "mode": self.mode,
            "fusion": self.fusion,
            "sparse_model": self.sparse_model,
            "ndcg@10": round(self.ndcg_at_10, 5),
            "recall@10": round(self.recall_at_10, 5),
            "recall@100": round(self.recall_at_100, 5),
            "mrr@10": round(self.mrr_at_10, 5),
            "queries": self.queries,
            "seconds": round(self.seconds, 2),
        }


#: the metrics of a report (its ``as_dict`` keys), in the order they are shown
METRICS = ("ndcg@10", "recall@10", "recall@100", "mrr@10")


def compare_reports(
    current: Sequence[EvalReport], candidate: Sequence[EvalReport]
) -> list[dict[str, object]]:
    """Candidate minus current, per run (the same runs in the same order) and metric."""
    deltas: list[dict[str, object]] = []
    for now, then in zip(current, candidate, strict=True):
        a, b = now.as_dict(), then.as_dict()
        delta: dict[str, object] = {"mode": now.mode, "fusion": now.fusion}
        for metric in METRICS:
            delta[metric] = round(float(b[metric]) - float(a[metric]), 5)  # type: ignore[arg-type]
        deltas.append(delta)
    return deltas

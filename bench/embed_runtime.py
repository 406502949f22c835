"""Which runtime for the local all-MiniLM-L6-v2: throughput on real chunks, and agreement.

    python bench/embed_runtime.py [--chunks 600]

Always measures rag_pipeline's ONNX Runtime embedder. If sentence-transformers and torch are
importable (e.g. a separate venv with `pip install torch==2.13.0 sentence-transformers`, run
with PYTHONPATH=.), it measures them on the same texts, in the same process, and reports the
cosine between the two sets of vectors. Chunks come from the powershell-docs corpus, cut by the
real chunker, so lengths are those the pipeline embeds.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np

from rag_pipeline.chunking import ChunkBudget, chunk_document
from rag_pipeline.config import ChunkingConfig
from rag_pipeline.embed.local import LocalEmbedder, find_model_dir
from rag_pipeline.ingest.parse import parse_document
from rag_pipeline.models import ParsedDocument

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "corpora" / "powershell-docs" / "books"


def sample_texts(embedder: LocalEmbedder, count: int) -> list[str]:
    files = sorted(CORPUS.rglob("*.md"))
    random.Random(7).shuffle(files)
    budget = ChunkBudget.for_tokenizer(ChunkingConfig(), embedder.tokenizer)
    texts: list[str] = []
    for path in files:
        doc = parse_document("b", path.name, path.read_bytes(), "h")
        if isinstance(doc, ParsedDocument):
            texts += [c.embed_text for c in chunk_document(doc, embedder.tokenizer, budget)]
        if len(texts) >= count:
            return texts[:count]
    return texts


def timed(fn, texts: list[str]) -> tuple[np.ndarray, float]:
    fn(texts[:16])  # warm-up: graph build, thread pools, allocator
    started = time.perf_counter()
    vectors = fn(texts)
    return np.asarray(vectors), time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=600)
    args = parser.parse_args()
    ort = LocalEmbedder(cache_dir=REPO / ".rag" / "cache" / "models")
    texts = sample_texts(ort, args.chunks)
    tokens = sum(ort.tokenizer.count(texts)) + 2 * len(texts)
    results: dict = {"chunks": len(texts), "tokens": tokens}
    vectors, seconds = timed(ort.embed, texts)
    results["onnxruntime"] = {
        "chunks_per_s": round(len(texts) / seconds, 1),
        "tokens_per_s": round(tokens / seconds),
    }
    try:
        import sentence_transformers
        import torch
    except ImportError:
        results["sentence_transformers_torch"] = "not installed in this environment"
    else:
        model = sentence_transformers.SentenceTransformer(str(find_model_dir()), device="cpu")
        reference, st_seconds = timed(
            lambda t: model.encode(t, batch_size=32, normalize_embeddings=True), texts
        )
        results["sentence_transformers_torch"] = {
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "chunks_per_s": round(len(texts) / st_seconds, 1),
            "tokens_per_s": round(tokens / st_seconds),
            "min_cosine_to_onnxruntime": round(float((vectors * reference).sum(1).min()), 6),
        }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

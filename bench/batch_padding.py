"""Padding left by the local embedder's batches: sorted per book (what a run does) vs one
global sort of the whole corpus (what bucketing across the runs would give).

    python bench/ingest.py --engine edge      # builds the index read here
    python bench/batch_padding.py

Reads every chunk of the index bench/ingest.py built, counts its tokens with the model's
tokenizer (special tokens included, as the model sees them) and forms batches exactly as
``LocalEmbedder`` does (sorted by token count, at most 32 texts and 4,096 padded tokens).
Padding share = padded tokens not belonging to any text / all padded tokens.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INDEX = REPO / ".rag" / "bench" / "ingest-edge"


def padding(embedder, lengths: list[int]) -> tuple[int, int]:
    """(padded tokens, real tokens) of the batches the embedder forms over ``lengths``."""
    ordered = sorted(lengths)
    padded = sum((end - start) * ordered[end - 1] for start, end in embedder._batch_bounds(ordered))
    return padded, sum(ordered)


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    from rag_pipeline.config import load_settings
    from rag_pipeline.embed.local import LocalEmbedder
    from rag_pipeline.models import compose_embed_text
    from rag_pipeline.schema import COLLECTION_SCHEMA, chunks_of
    from rag_pipeline.store import open_store

    if not (INDEX / "qdrant").is_dir():
        raise SystemExit("run bench/ingest.py --engine edge first (it builds the index read here)")
    embedder = LocalEmbedder(cache_dir=INDEX / "cache" / "models")
    settings = load_settings(qdrant_path=str(INDEX / "qdrant"), qdrant_embedded="edge")
    per_book: dict[str, list[int]] = defaultdict(list)
    with open_store(settings.store(), COLLECTION_SCHEMA) as store:
        for book in store.tenants():
            texts = [
                compose_embed_text(
                    r.payload["title"], r.payload.get("section_title"), r.payload["text"]
                )
                for r in store.scroll(chunks_of(book), fields=["title", "section_title", "text"])
            ]
            lengths, _ = embedder._prepare(texts)
            per_book[book] = list(lengths)
    by_book = [padding(embedder, lengths) for lengths in per_book.values()]
    book_padded, book_real = sum(p for p, _ in by_book), sum(r for _, r in by_book)
    all_padded, all_real = padding(embedder, [n for ls in per_book.values() for n in ls])
    figures = {
        "books": len(per_book),
        "chunks": sum(len(v) for v in per_book.values()),
        "tokens": all_real,
        "padding_share_per_book": round(1 - book_real / book_padded, 4),
        "padding_share_global": round(1 - all_real / all_padded, 4),
        "padded_tokens_saved_by_global_sort": round(1 - all_padded / book_padded, 4),
    }
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()

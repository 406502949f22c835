"""Chunking cost of a file of tiny Markdown blocks, refused past RAG_MAX_FILE_BLOCKS.

    python bench/chunk_tiny_blocks.py CASE KB     # CASE: para ("a\\n\\n"), head ("# h\\n"),
                                                  # list ("- a\\n"); KB: the file's size

Generates the document, chunks it with the real MiniLM tokenizer and the default budget in this
process, and prints one line: chunks made (or the refusal), process CPU and wall seconds of
``chunk_document`` alone, and the process's peak RSS (the interpreter, the tokenizer and the
text included; "before" is what it held before chunking). Run each case in a fresh process.
"""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path

from rag_pipeline.chunking import ChunkBudget, chunk_document
from rag_pipeline.config import ChunkingConfig
from rag_pipeline.embed.local import LocalEmbedder
from rag_pipeline.ingest.parse import parse_document
from rag_pipeline.models import ParsedDocument

REPO = Path(__file__).resolve().parents[1]
UNITS = {"para": "a\n\n", "head": "# h\n", "list": "- a\n"}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def main() -> None:
    case, kb = sys.argv[1], int(sys.argv[2])
    unit = UNITS[case]
    data = (unit * (kb * 1000 // len(unit))).encode()
    doc = parse_document("bench", f"{case}.md", data, "h")
    assert isinstance(doc, ParsedDocument)
    tokenizer = LocalEmbedder(cache_dir=REPO / ".rag" / "cache" / "models").tokenizer
    budget = ChunkBudget.for_tokenizer(ChunkingConfig(), tokenizer)
    before = peak_rss_mb()
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        out = f"{len(chunk_document(doc, tokenizer, budget))} chunks"
    except ValueError as exc:  # TooManyBlocks (a ValueError; absent before the limit)
        out = f"refused: {exc}"
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(
        f"{case} {kb} KB: {out}; cpu {cpu:.2f} s wall {wall:.2f} s; "
        f"peak RSS {peak_rss_mb():.0f} MB (before {before:.0f})"
    )


if __name__ == "__main__":
    main()

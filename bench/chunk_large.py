"""Chunking cost of one huge Markdown file: a 10 MB table and a 10 MB paragraph (issue #19).

    python bench/chunk_large.py [--mb 10] [--cases table paragraph]

Generates each document (a table: a header and rows of four short cells; a paragraph: one line
of short sentences), chunks it with the real MiniLM tokenizer and the default budget, each case
in a fresh child process so its peak RSS is its own, and prints JSON per case: the chunks made,
process CPU seconds (every thread, the tokenizer's included) beside wall seconds, both of
``chunk_document`` alone, and the child's peak RSS (interpreter, tokenizer and the generated
text included; ``rss_before_mb`` is what it held before chunking). Also writes
bench/results/chunk_large.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

from rag_pipeline.chunking import ChunkBudget, chunk_document
from rag_pipeline.chunking.markdown import CHUNKER_VERSION
from rag_pipeline.config import ChunkingConfig
from rag_pipeline.embed.local import LocalEmbedder
from rag_pipeline.ingest.parse import parse_document
from rag_pipeline.models import ParsedDocument

REPO = Path(__file__).resolve().parents[1]
CASES = ("table", "paragraph")
_WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa")


def large_table(size: int, seed: int = 1) -> str:
    """A Markdown table of about ``size`` characters: a header and rows of four cells."""
    rnd = random.Random(seed)
    rows = ["| id | name | value | note |", "| --- | --- | --- | --- |"]
    total = 0
    while total < size:
        i = len(rows) - 2
        row = f"| {i} | item-{rnd.randrange(10**6)} | {rnd.random():.6f} | words about row {i} |"
        rows.append(row)
        total += len(row) + 1
    return "\n".join(rows) + "\n"


def large_paragraph(size: int, seed: int = 2) -> str:
    """One paragraph of about ``size`` characters on a single line: short sentences."""
    rnd = random.Random(seed)
    sentences: list[str] = []
    total = 0
    while total < size:
        sentence = " ".join(rnd.choice(_WORDS) for _ in range(12)).capitalize() + "."
        sentences.append(sentence)
        total += len(sentence) + 1
    return " ".join(sentences) + "\n"


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def measure(case: str, size: int) -> dict:
    """Chunk one generated document in this process; its figures."""
    body = large_table(size) if case == "table" else large_paragraph(size)
    data = body.encode()
    del body
    doc = parse_document("bench", f"{case}.md", data, hashlib.sha256(data).hexdigest())
    assert isinstance(doc, ParsedDocument)
    tokenizer = LocalEmbedder(cache_dir=REPO / ".rag" / "cache" / "models").tokenizer
    budget = ChunkBudget.for_tokenizer(ChunkingConfig(), tokenizer)
    rss_before = peak_rss_mb()
    wall, cpu = time.perf_counter(), time.process_time()
    chunks = chunk_document(doc, tokenizer, budget)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {
        "case": case,
        "input_mb": round(len(data) / 1e6, 2),
        "chunks": len(chunks),
        "cpu_s": round(cpu, 2),
        "wall_s": round(wall, 2),
        "peak_rss_mb": round(peak_rss_mb()),
        "rss_before_mb": round(rss_before),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=10.0, help="size of each document")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    size = int(args.mb * 1_000_000)
    if args.child:  # one case, measured in this fresh process
        print(json.dumps(measure(args.child, size)))
        return
    results: dict = {"chunker_version": CHUNKER_VERSION, "cases": []}
    for case in args.cases:
        child = subprocess.run(
            [sys.executable, __file__, "--mb", str(args.mb), "--child", case],
            check=True,
            capture_output=True,
            text=True,
        )
        results["cases"].append(json.loads(child.stdout.strip().splitlines()[-1]))
    print(json.dumps(results, indent=2))
    out = REPO / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "chunk_large.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

"""Where chunks end, how long they are, and how deep their heading paths go, on real books.

    python bench/chunk_headings.py [--corpora ../shared/corpora] [--names powershell-docs ...]

Chunks every Markdown file of each corpus (``<corpus>/books/<book>/**/*.md[x]``) with the real
MiniLM tokenizer and the default budget, then reads every chunk back with markdown-it and prints
JSON per corpus and in total:

* ``ending_with_heading``: chunks whose last block is a heading (of any level). Split into
  ``orphan_headings`` (a later chunk of the same document holds what follows the heading: the
  goal is 0) and ``bodiless_final_headings`` (a document that ends with a heading and nothing
  after it, so there is no body to travel with);
* ``path_lacks_leading_heading``: chunks that open with a heading whose ``section_title`` does not
  end with that heading's text (the heading path must include the heading);
* ``over_limit``: chunks whose embedded text (title and section path included, special tokens
  counted) exceeds the model's input (must be 0), counted afresh on ``embed_text``;
* token statistics of ``token_count`` and the distribution of the section path depth (number of
  ``" > "``-separated names in ``section_title``; 0 for none).
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import statistics
import time
from pathlib import Path

from markdown_it import MarkdownIt

from rag_pipeline.chunking import ChunkBudget, chunk_document
from rag_pipeline.chunking.markdown import CHUNKER_VERSION
from rag_pipeline.config import ChunkingConfig
from rag_pipeline.embed.local import LocalEmbedder
from rag_pipeline.ingest.parse import parse_document
from rag_pipeline.models import Chunk, ParsedDocument

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CORPORA = REPO.parent / "shared" / "corpora"
NAMES = ("powershell-docs", "physical-ai-textbooks")
_md = MarkdownIt("commonmark").enable("table")


def top_blocks(text: str) -> list[tuple[str, str]]:
    """(token type, inline content) of each top-level block opener of ``text``."""
    tokens = _md.parse(text)
    out = []
    for i, tok in enumerate(tokens):
        if tok.level == 0 and tok.nesting != -1:
            inline = tokens[i + 1].content.strip() if tok.type == "heading_open" else ""
            out.append((tok.type, inline))
    return out


def leading_heading(blocks: list[tuple[str, str]]) -> str | None:
    """The text of the last heading of the heading run a chunk opens with, if it opens so."""
    last = None
    for kind, inline in blocks:
        if kind != "heading_open":
            break
        last = inline
    return last


def files_of(corpus: Path) -> list[tuple[str, Path]]:
    books = corpus / "books"
    return [
        (book.name, path)
        for book in sorted(p for p in books.iterdir() if p.is_dir())
        for path in sorted(book.rglob("*"))
        if path.suffix in (".md", ".mdx") and path.is_file()
    ]


def measure(corpus: Path, embedder: LocalEmbedder) -> dict:
    tokenizer = embedder.tokenizer
    budget = ChunkBudget.for_tokenizer(ChunkingConfig(), embedder.tokenizer)
    files = files_of(corpus)
    chunks: list[Chunk] = []
    counts = collections.Counter()
    started = time.perf_counter()
    for book, path in files:
        data = path.read_bytes()
        rel = path.relative_to(corpus / "books" / book).as_posix()
        doc = parse_document(book, rel, data, hashlib.sha256(data).hexdigest())
        if not isinstance(doc, ParsedDocument):
            counts["parse_errors"] += 1
            continue
        doc_chunks = chunk_document(doc, tokenizer, budget)
        chunks.extend(doc_chunks)
        for c in doc_chunks:
            blocks = top_blocks(c.text)
            if blocks and blocks[-1][0] == "heading_open":
                counts["ending_with_heading"] += 1
                last = c.chunk_index == c.total_chunks - 1
                counts["bodiless_final_headings" if last else "orphan_headings"] += 1
            lead = leading_heading(blocks)
            # an h1 equal to the document title is left out of the path on purpose
            if (
                lead
                and not (c.section_title or "").endswith(lead)
                and lead.strip().lower() != c.meta.title.strip().lower()
            ):
                counts["path_lacks_leading_heading"] += 1
    seconds = time.perf_counter() - started
    exact = tokenizer.count([c.embed_text for c in chunks])
    over = sum(n + tokenizer.special_tokens > budget.limit for n in exact)
    mismatched = sum(
        n + tokenizer.special_tokens != c.token_count for c, n in zip(chunks, exact, strict=True)
    )
    tokens = sorted(c.token_count for c in chunks)
    depth = collections.Counter(
        len(c.section_title.split(" > ")) if c.section_title else 0 for c in chunks
    )
    n = len(chunks)
    return {
        "files": len(files),
        "parse_errors": counts["parse_errors"],
        "chunks": n,
        "ending_with_heading": counts["ending_with_heading"],
        "orphan_headings": counts["orphan_headings"],
        "orphan_heading_share": round(counts["orphan_headings"] / max(n, 1), 4),
        "bodiless_final_headings": counts["bodiless_final_headings"],
        "path_lacks_leading_heading": counts["path_lacks_leading_heading"],
        "over_limit": over,
        "token_count_mismatches": mismatched,
        "limit": budget.limit,
        "tokens": {
            "min": tokens[0] if tokens else 0,
            "mean": round(statistics.mean(tokens), 1) if tokens else 0,
            "median": statistics.median(tokens) if tokens else 0,
            "p95": tokens[int(0.95 * (n - 1))] if tokens else 0,
            "max": tokens[-1] if tokens else 0,
            "under_50": sum(t < 50 for t in tokens),
        },
        "section_depth": {str(k): depth[k] for k in sorted(depth)},
        "chunk_seconds": round(seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpora", type=Path, default=DEFAULT_CORPORA)
    parser.add_argument("--names", nargs="+", default=list(NAMES))
    args = parser.parse_args()
    embedder = LocalEmbedder(cache_dir=REPO / ".rag" / "cache" / "models")
    report: dict = {"chunker_version": CHUNKER_VERSION}
    for name in args.names:
        corpus = args.corpora / name
        if not (corpus / "books").is_dir():
            raise SystemExit(f"{corpus}/books is missing (the shared corpora sit beside the repo)")
        report[name] = measure(corpus, embedder)
    keys = ("files", "chunks", "ending_with_heading", "orphan_headings", "over_limit")
    report["total"] = {k: sum(report[name][k] for name in args.names) for k in keys}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

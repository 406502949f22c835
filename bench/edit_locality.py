"""How many chunks change when one section of a file is rewritten (chunking only, no index).

    python bench/edit_locality.py [--corpus ../shared/corpora/powershell-docs/books]
                                  [--files 300] [--seed 3]

For a random sample of files with at least three `##` sections, rewrites the body of the second
section (the same text incremental.py uses), chunks the file before and after with the real
tokenizer and budget, and counts chunks whose text is new (what a re-run would embed) against
the chunks of the rewritten section itself. Prints the mean and the worst case.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import statistics
from pathlib import Path

from rag_pipeline.chunking import ChunkBudget, chunk_document
from rag_pipeline.chunking.markdown import CHUNKER_VERSION
from rag_pipeline.config import ChunkingConfig
from rag_pipeline.embed.local import LocalEmbedder
from rag_pipeline.ingest.parse import parse_document
from rag_pipeline.models import Chunk, ParsedDocument

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CORPUS = REPO.parent / "shared" / "corpora" / "powershell-docs" / "books"
BODY = (
    "\n\nThis section was rewritten for the incremental benchmark. It explains the same "
    "idea in new words, so its chunks change while the rest of the file stays as it was.\n\n"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--files", type=int, default=300)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()
    if not args.corpus.is_dir():
        raise SystemExit(f"{args.corpus} is missing (the shared corpora sit beside the repo)")
    embedder = LocalEmbedder(cache_dir=REPO / ".rag" / "cache" / "models")
    budget = ChunkBudget.for_tokenizer(ChunkingConfig(), embedder.tokenizer)

    def chunks(name: str, text: str) -> list[Chunk]:
        data = text.encode()
        doc = parse_document("bench", name, data, hashlib.sha256(data).hexdigest())
        if not isinstance(doc, ParsedDocument):
            return []
        return chunk_document(doc, embedder.tokenizer, budget)

    files = sorted(args.corpus.rglob("*.md"))
    random.Random(args.seed).shuffle(files)
    new_counts: list[int] = []
    beyond_section = 0
    for path in files[: args.files]:
        text = path.read_text(encoding="utf-8", errors="replace")
        sections = list(re.finditer(r"^## (.+)$", text, flags=re.M))
        if len(sections) < 3:
            continue
        heading = sections[1].group(1).strip()
        edited = text[: sections[1].end()] + BODY + text[sections[2].start() :]
        before = {c.content_hash for c in chunks(path.name, text)}
        after = chunks(path.name, edited)
        new = [c for c in after if c.content_hash not in before]
        own = [c for c in after if heading in (c.section_title or "") or f"## {heading}" in c.text]
        new_counts.append(len(new))
        beyond_section += len(new) > max(len(own), 1)
    print(
        json.dumps(
            {
                "chunker_version": CHUNKER_VERSION,
                "files_edited": len(new_counts),
                "new_chunks_mean": round(statistics.mean(new_counts), 3),
                "new_chunks_max": max(new_counts),
                "edits_touching_more_than_their_section": beyond_section,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()

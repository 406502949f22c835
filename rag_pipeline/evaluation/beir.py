"""BEIR datasets (corpus.jsonl, queries.jsonl, qrels/<split>.tsv), and the corpus as a book
source: each BEIR document is one file of one book, its bytes its row, its document its title
and text (no Markdown is parsed out of a corpus row), so the corpus is indexed by the same
pipeline as every book folder.
"""

from __future__ import annotations

import csv
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from rag_pipeline.models import (
    DocumentMeta,
    FileError,
    ParsedDocument,
    SourceFile,
    document_id,
)
from rag_pipeline.sources.base import (
    BookListing,
    BookSource,
    BookVersions,
    FileVersion,
    ParseOptions,
    SourceReadError,
)

__all__ = ["BeirDataset", "BeirSource", "load_beir"]


@dataclass(frozen=True)
class BeirDataset:
    name: str
    corpus: dict[str, tuple[str, str]]  # doc id -> (title, text)
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]  # query id -> {doc id: relevance}


def load_beir(directory: Path | str, split: str = "test") -> BeirDataset:
    root = Path(directory)
    for needed in ("corpus.jsonl", "queries.jsonl", f"qrels/{split}.tsv"):
        if not (root / needed).is_file():
            raise FileNotFoundError(f"{root / needed} is missing: not a BEIR dataset folder")
    corpus: dict[str, tuple[str, str]] = {}
    with open(root / "corpus.jsonl", encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                row = json.loads(line)
                corpus[str(row["_id"])] = (row.get("title") or "", row.get("text") or "")
    queries: dict[str, str] = {}
    with open(root / "queries.jsonl", encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                row = json.loads(line)
                queries[str(row["_id"])] = row["text"]
    qrels: dict[str, dict[str, int]] = {}
    with open(root / "qrels" / f"{split}.tsv", encoding="utf-8") as fh:
        reader = csv.reader(fh, delimiter="\t")
        for row in reader:
            if not row or row[0] == "query-id":
                continue
            qrels.setdefault(row[0], {})[row[1]] = int(row[2])
    return BeirDataset(root.name, corpus, queries, qrels)


class BeirSource(BookSource):
    """A BEIR corpus as one book, ``book_id``: a document is a file named by its id, whose
    bytes are its row (title and text, as JSON) and whose version is their SHA-256."""

    def __init__(self, dataset: BeirDataset, book_id: str) -> None:
        self.dataset = dataset
        self.book_id = book_id
        self.description = f"BEIR dataset {dataset.name}"
        self._rows: dict[str, bytes] | None = None

    def _row_bytes(self) -> dict[str, bytes]:
        if self._rows is None:
            self._rows = {
                doc_id: json.dumps([title, text], ensure_ascii=False).encode()
                for doc_id, (title, text) in self.dataset.corpus.items()
            }
        return self._rows

    def list_books(self) -> BookListing:
        return BookListing((self.book_id,))

    def versions(self, book_id: str) -> BookVersions:
        if book_id != self.book_id:
            return BookVersions(book_id, "", ())
        files = tuple(
            FileVersion(doc_id, None, doc_id, hashlib.sha256(data).hexdigest())
            for doc_id, data in sorted(self._row_bytes().items())
        )
        return BookVersions(book_id, "", files)

    def read(self, book_id: str, file: FileVersion | SourceFile, boundary: str) -> bytes:
        data = self._row_bytes().get(file.source_file) if book_id == self.book_id else None
        if data is None:
            raise SourceReadError(None, f"no document {file.source_file!r} in {self.description}")
        return data

    def is_gone(self, book_id: str, source_file: str | None = None) -> bool:
        if book_id != self.book_id:
            return True
        return source_file is not None and source_file not in self.dataset.corpus

    def to_document(
        self, book_id: str, source_file: str, data: bytes, sha256: str, options: ParseOptions
    ) -> ParsedDocument | FileError:
        try:
            title, text = json.loads(data)
        except (ValueError, TypeError) as exc:
            return FileError(book_id, source_file, "parse", f"not a corpus row: {exc}", sha256)
        return ParsedDocument(
            book_id,
            source_file,
            sha256,
            document_id(book_id, source_file),
            DocumentMeta(title=str(title).strip()),
            str(text),
        )

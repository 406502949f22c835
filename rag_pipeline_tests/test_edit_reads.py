"""Issue 40.4: a one-file edit's store reads do not grow with the size of its book.

The edit's run is driven stage by stage (the pipeline's own stages, as a Dagster run's steps
call them) with every point a store read hands back counted per stage: the points read by a
one-file edit are the same in a book of 5 files as in one of 50, and the index it leaves is
the one a clean build of the same folder gives.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from rag_pipeline.schema import COLLECTION_SCHEMA, book_filter
from rag_pipeline.store import base
from rag_pipeline.store.edge import EdgeStore
from rag_pipeline_tests.conftest import make_pipeline, make_recipe, section, store_config

BOOK = "book"
EDITED = "f000.md"


def _write_book(data: Path, files: int) -> None:
    (data / BOOK).mkdir(parents=True)
    for f in range(files):
        text = f"# File {f}\n\n" + "\n".join(
            section(f"Part {s}", seed=f"f{f}s{s}") for s in range(3)
        )
        (data / BOOK / f"f{f:03d}.md").write_text(text)


def _points(qdrant: Path) -> dict[str, dict[str, Any]]:
    """Every point of the book: id -> its payload (content-derived ids: equal maps, equal
    indexes)."""
    with EdgeStore("rag_chunks", qdrant, COLLECTION_SCHEMA) as store:
        return {r.id: r.payload for r in store.scroll(book_filter(BOOK))}


def edit_reads(root: Path, files: int, embedder: Any, monkeypatch: Any) -> Counter[str]:
    """Points read per stage by a one-file edit's run in a book of ``files`` files (after
    its first ingest); asserts that the index it leaves is a clean build's."""
    data, qdrant = root / f"books{files}", root / f"qdrant{files}"
    _write_book(data, files)
    recipe = make_recipe(embedder)
    pipeline = make_pipeline(data, store_config(qdrant), recipe)
    pipeline.run([BOOK], run_id="first")
    with (data / BOOK / EDITED).open("a") as f:
        f.write("\n" + section("Added", seed="edit"))

    reads: Counter[str] = Counter()
    stage = ["none"]
    real = EdgeStore._scroll_page

    def counting(self: EdgeStore, page: base.ScrollPage) -> tuple[list[Any], Any]:
        records, offset = real(self, page)
        reads[stage[0]] += len(records)
        return records, offset

    monkeypatch.setattr(EdgeStore, "_scroll_page", counting)
    stage[0] = "assess"
    assessed = pipeline.assess([BOOK])
    assert assessed[BOOK].inventory.changes.modified == (EDITED,)
    stage[0] = "chunk"
    chunked = pipeline.chunk(pipeline.parse({BOOK: assessed[BOOK].inventory}))
    stage[0] = "embed"
    embedded = pipeline.embed(chunked)
    stage[0] = "write"
    written = pipeline.write(chunked, embedded, run_id="edit")
    monkeypatch.undo()
    assert written[BOOK].consistency is not None and written[BOOK].consistency.passed
    assert embedded[BOOK].reused > 0 and embedded[BOOK].embedded > 0  # old text reused

    clean = root / f"clean{files}"
    make_pipeline(data, store_config(clean), recipe).run([BOOK], run_id="clean")
    ours, theirs = _points(qdrant), _points(clean)
    assert ours.keys() == theirs.keys()
    # when and by which run; the BM25 average stays the one the book was first encoded with
    volatile = {"run_id", "indexed_at", "sparse_model"}
    for point_id, payload in ours.items():
        assert {k: v for k, v in payload.items() if k not in volatile} == {
            k: v for k, v in theirs[point_id].items() if k not in volatile
        }, point_id
    return reads


def test_a_one_file_edits_reads_do_not_grow_with_its_book(tmp_path, hash_embedder, monkeypatch):
    small = edit_reads(tmp_path, 5, hash_embedder, monkeypatch)
    large = edit_reads(tmp_path, 50, hash_embedder, monkeypatch)
    print(dict(small), dict(large))
    assert small == large, (dict(small), dict(large))
    # the assessment reads one chunk (the book's sparse encoder): the records and counts
    # come from the book's saved summary
    assert small["assess"] <= 1, dict(small)

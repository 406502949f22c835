"""A first ingest's memory does not grow with its book where it held a point's weight (issue
40.4: a 250k-point book's first ingest peaked at 10 GB): its BM25 vectors and its points'
payloads are built a write batch at a time, and only the analysed lengths are kept for the
book's BM25 average. Counted, not timed: the objects alive while each batch is written."""

from __future__ import annotations

import gc

import pytest

from rag_pipeline.ingest import index
from rag_pipeline.sparse import EncodedWhenRead
from rag_pipeline.store import PointRecord, SparseVector, VectorStore
from rag_pipeline_tests.conftest import make_pipeline, make_recipe, section

BOOK = "bound-book"
#: a small write batch, so that a book of a few files spans several
BATCH = 8


def _alive() -> tuple[int, int]:
    """(point records, sparse vectors) alive now."""
    points = sparse = 0
    for o in gc.get_objects():
        kind = type(o)
        points += kind is PointRecord
        sparse += kind is SparseVector
    return points, sparse


@pytest.fixture
def counted(monkeypatch):
    """(the largest number of chunk points, of sparse vectors) alive at any upsert of chunk
    points, and the chunk points upserted in all."""
    peaks = {"points": 0, "sparse": 0, "upserted": 0}
    real = VectorStore.upsert

    def counting(self, points):  # type: ignore[no-untyped-def]
        if any(p.sparse is not None for p in points):  # chunk points (records have none)
            points_alive, sparse_alive = _alive()
            peaks["points"] = max(peaks["points"], points_alive)
            peaks["sparse"] = max(peaks["sparse"], sparse_alive)
            peaks["upserted"] += len(points)
        return real(self, points)

    monkeypatch.setattr(VectorStore, "upsert", counting)
    monkeypatch.setattr(index, "WRITE_BATCH", BATCH)
    return peaks


def test_a_first_ingest_holds_one_write_batch_of_points_and_sparse_vectors(
    opened, data_dir, write_book, hash_embedder, counted
):
    """However many chunks the book has, the points and sparse vectors alive while it is
    written are one batch's (the code before held every chunk's vector from the embed step
    on, and built every point before the first upsert); the points are the same ones a
    whole-book encoding gives."""
    recipe = make_recipe(hash_embedder, target_tokens=60, max_tokens=100)
    body = {n: "".join(section(f"Part {i}", seed=f"f{n}") for i in range(5)) for n in range(5)}
    files = {f"f{n}.md": f"# File {n}\n\n{text}" for n, text in body.items()}
    write_book(BOOK, files)
    pipeline = make_pipeline(data_dir, opened, recipe)
    gc.collect()
    run = pipeline.run([BOOK], run_id="first")[BOOK]
    chunks = len(run.chunked.chunks)
    assert chunks >= 6 * BATCH  # the book spans several batches
    assert counted["upserted"] == chunks
    assert isinstance(run.embedded.sparse, EncodedWhenRead)  # the embed step holds none
    assert counted["points"] <= BATCH
    assert counted["sparse"] <= BATCH
    # the vectors written are the book encoder's, whole book at once
    texts = [c.embed_text for c in run.chunked.chunks]
    assert list(run.embedded.sparse) == run.embedded.sparse.encoder.encode_documents(texts)


def test_a_summary_is_encoded_once_and_written_as_json_dumps_writes_it(tmp_path, monkeypatch):
    """A book's summary file is its data encoded once (for its hash and the file alike; a
    250k-point book's summary was encoded twice, once by ``json.dump`` in Python), and the
    file's bytes are the format readers and older versions know."""
    import json

    from rag_pipeline.store.edge import catalog as edge

    folder = tmp_path / "book-00"
    (folder / "g1").mkdir(parents=True)
    (folder / "g1" / "edge_config.json").write_text("{}")
    records = {f"f{i}.md": ["ab" * 32, i, 0] for i in range(50)}
    data = {"records": records, "stats": {"f1.md": [1, 2, 3, 4]}, "last_run": "r"}
    encoded: list[object] = []

    def counted(real):  # type: ignore[no-untyped-def]
        def counting(obj, *args, **kwargs):  # type: ignore[no-untyped-def]
            encoded.append(obj.get("data", obj) if isinstance(obj, dict) else obj)
            return real(obj, *args, **kwargs)

        return counting

    monkeypatch.setattr(edge.json, "dumps", counted(json.dumps))
    monkeypatch.setattr(edge.json, "dump", counted(json.dump))
    edge._write_summary(folder, "g1", data, points=7)
    monkeypatch.undo()
    assert sum(1 for o in encoded if isinstance(o, dict) and "records" in o) == 1
    raw = (folder / "summary.json").read_bytes()
    assert raw == json.dumps(json.loads(raw), sort_keys=True).encode()
    sound = edge._sound_summary(folder, "g1")
    assert sound is not None and sound[1] == data and sound[0]["points"] == 7


def test_a_run_lets_go_of_its_parsed_documents_once_they_are_chunked(
    sample_books, tmp_path, monkeypatch
):
    """The run's memory (its IO manager) no longer holds the book's parsed text after the
    chunks step read it (it held every step's output until the run ended); the outputs the
    retried steps read stay."""
    from dagster import DagsterInstance, materialize

    from rag_pipeline.defs.assets import ingestion_assets
    from rag_pipeline.defs.io import RunMemory
    from rag_pipeline.defs.location import fixed_resources
    from rag_pipeline.defs.partitions import BOOKS_PARTITIONS_NAME
    from rag_pipeline.ingest.pipeline import IngestPipeline
    from rag_pipeline_tests.conftest import hash_settings

    memories: list[RunMemory] = []
    real = RunMemory.load_input

    def seen(self, context):  # type: ignore[no-untyped-def]
        memories.append(self)
        return real(self, context)

    monkeypatch.setattr(RunMemory, "load_input", seen)
    settings = hash_settings(sample_books, tmp_path)
    book = sorted(p.name for p in sample_books.iterdir() if p.is_dir())[0]
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(BOOKS_PARTITIONS_NAME, [book])
    resources = fixed_resources(IngestPipeline.from_settings(settings))
    result = materialize(
        ingestion_assets, partition_key=book, instance=instance, resources=resources
    )
    assert result.success and memories
    held = {key[1] for key in memories[-1].values}
    assert "documents" not in held
    assert {"chunks", "chunk_embeddings"} <= held

"""Ingestion without Dagster: full runs, incremental runs, crash convergence; both backends."""

import hashlib
import os

import pytest

from rag_pipeline.chunking import chunk_document
from rag_pipeline.ingest.consistency import check_index
from rag_pipeline.ingest.parse import parse_document
from rag_pipeline.models import ParsedDocument, document_id
from rag_pipeline.schema import DOCUMENT, book_filter, chunks_of, documents_of
from rag_pipeline_tests.conftest import denied, make_pipeline, make_recipe, section

BOOK = "guide"


def long_doc(title: str, sections: int = 4, seed: str = "") -> str:
    return f"---\ntitle: {title}\n---\n" + "".join(
        section(f"Part {i}", 3, 60, seed=seed) for i in range(sections)
    )


@pytest.fixture
def store(opened):
    """The store, read as the pipeline's runs read it (see conftest's StoreView)."""
    return opened


@pytest.fixture
def env(store, data_dir, write_book, hash_embedder):
    recipe = make_recipe(hash_embedder, target_tokens=150, max_tokens=200)
    budget = recipe.budget
    pipeline = make_pipeline(data_dir, store, recipe)
    write_book(
        BOOK,
        {
            "a.md": long_doc("A"),
            "sub/b.md": long_doc("B", seed="b"),
            "c.md": long_doc("C", 2, seed="c"),
        },
    )

    class Env:
        root = data_dir / BOOK

        def __init__(self):
            self.recipe = recipe
            self.pipeline = pipeline

        def run(self, run_id="r", force=False):
            return pipeline.run([BOOK], run_id=run_id, force=force)[BOOK]

        def plan(self, force=False):
            """The book's plan, with the preview of what a run will do."""
            with pipeline.store.open() as reader:
                return pipeline.plan(reader, [BOOK], force=force, detail=True).books[BOOK]

        def expected_ids(self):
            """Chunk ids a from-scratch chunking of the files on disk gives."""
            ids = set()
            for rel in sorted(p.relative_to(self.root).as_posix() for p in self.root.rglob("*.md")):
                data = (self.root / rel).read_bytes()
                doc = parse_document(BOOK, rel, data, hashlib.sha256(data).hexdigest())
                if isinstance(doc, ParsedDocument):
                    ids |= {c.id for c in chunk_document(doc, hash_embedder.tokenizer, budget)}
            return ids

        def chunk_points(self):
            return {r.id: r.payload for r in store.scroll(chunks_of(BOOK))}

        def assert_exact(self):
            points = self.chunk_points()
            assert set(points) == self.expected_ids()
            report = check_index(store, BOOK, hash_embedder.dimension)
            assert report.passed, report.problems()
            return points

    return Env()


def test_first_run_indexes_every_chunk_with_lineage(env, store):
    run = env.run("run-1")
    points = env.assert_exact()
    assert run.embedded.embedded == len(points) > 10
    assert run.embedded.reused == 0
    assert run.inventory.changes.counts()["files_new"] == 3
    sample = next(iter(points.values()))
    for key in (
        "source_file",
        "source_file_hash",
        "content_hash",
        "chunk_index",
        "parent_doc_id",
        "embedding_model",
        "embedding_dim",
        "pipeline_version",
        "run_id",
        "section_title",
        "text",
        "prev_chunk_id",
        "next_chunk_id",
    ):
        assert key in sample
    assert sample["run_id"] == "run-1"
    docs = list(store.scroll(documents_of(BOOK)))
    assert {d.payload["source_file"] for d in docs} == {"a.md", "sub/b.md", "c.md"}
    assert all(d.id == document_id(BOOK, d.payload["source_file"]) for d in docs)


def test_rerun_without_change_does_nothing(env):
    env.run()
    before = env.chunk_points()
    run = env.run("run-2")
    assert run.inventory.changes.has_work is False
    assert run.embedded.embedded == 0 and run.written.upserted == 0
    assert env.chunk_points() == before  # not even the run id changed
    assert env.plan().action == "unchanged"


def test_editing_one_section_embeds_only_that_section(env):
    env.run()
    text = (env.root / "a.md").read_text()
    (env.root / "a.md").write_text(text.replace("part2w1x5", "EDITED WORDS HERE"))
    plan = env.plan()
    assert plan.changes.modified == ("a.md",)
    run = env.run("run-2")
    assert 1 <= run.embedded.embedded <= 3
    assert run.embedded.reused == len(run.chunked.chunks) - run.embedded.embedded
    assert plan.preview.to_embed == run.embedded.embedded
    points = env.assert_exact()
    edited = [p for p in points.values() if "EDITED WORDS HERE" in p["text"]]
    assert edited and all(p["run_id"] == "run-2" for p in edited)
    untouched = [p for p in points.values() if p["source_file"] == "c.md"]
    assert all(p["run_id"] == "r" for p in untouched)


def test_add_delete_and_rename_files(env, write_book):
    env.run()
    os.remove(env.root / "c.md")
    os.rename(env.root / "sub" / "b.md", env.root / "b-renamed.md")
    write_book(BOOK, {"new.md": long_doc("New", 1, seed="n")})
    run = env.run("run-2")
    changes = run.inventory.changes
    assert set(changes.new) == {"b-renamed.md", "new.md"}
    assert set(changes.deleted) == {"c.md", "sub/b.md"}
    # the renamed file's text was embedded before: its vectors are reused
    renamed = [c for c in run.chunked.chunks if c.source_file == "b-renamed.md"]
    assert run.embedded.embedded == len(run.chunked.chunks) - len(renamed)
    points = env.assert_exact()
    assert {p["source_file"] for p in points.values()} == {"a.md", "b-renamed.md", "new.md"}


def test_prev_next_chains_stay_correct_after_edits(env):
    env.run()
    text = (env.root / "a.md").read_text()
    (env.root / "a.md").write_text(
        text.replace("## Part 2", "## Inserted\n\nNew section with some words.\n\n## Part 2")
    )
    env.run("run-2")
    points = env.assert_exact()
    by_doc: dict[str, list] = {}
    for pid, p in points.items():
        by_doc.setdefault(p["parent_doc_id"], []).append((p["chunk_index"], pid, p))
    for members in by_doc.values():
        members.sort()
        for i, (index, _pid, p) in enumerate(members):
            assert index == i
            assert p["prev_chunk_id"] == (members[i - 1][1] if i else None)
            assert p["next_chunk_id"] == (members[i + 1][1] if i + 1 < len(members) else None)


def test_bad_files_are_recorded_and_the_rest_is_ingested(env, write_book, store):
    env.run()
    write_book(BOOK, {"bad.md": b"# caf\xe9", "empty.md": "", "bin.md": b"\x00\x01"})
    run = env.run("run-2")
    reasons = {e.source_file: e.reason for e in run.chunked.errors}
    assert "not valid UTF-8" in reasons["bad.md"] and "binary" in reasons["bin.md"]
    records = {r.payload["source_file"]: r.payload for r in store.scroll(documents_of(BOOK))}
    assert records["bad.md"]["status"] == "error"
    assert "not valid UTF-8" in records["bad.md"]["error"]
    assert records["empty.md"]["status"] == "empty"
    from rag_pipeline.ingest.index import read_index_state

    state = read_index_state(store, BOOK, documents_only=True)
    assert "not valid UTF-8" in state.documents["bad.md"].error
    env.assert_exact()
    # unchanged bad files are not retried
    assert not env.run("run-3").inventory.changes.has_work


def test_a_run_that_dies_before_committing_converges(env, store, monkeypatch):
    from rag_pipeline.store import VectorStore

    env.run()
    text = (env.root / "a.md").read_text()
    (env.root / "a.md").write_text(text.replace("part1w0x1", "CRASHY EDIT"))
    real_upsert = VectorStore.upsert
    calls = {"n": 0}

    def dying_upsert(self, points):
        calls["n"] += 1
        if any(p.payload.get("record_type") == DOCUMENT for p in points):
            raise RuntimeError("killed before commit")
        return real_upsert(self, points)

    monkeypatch.setattr(VectorStore, "upsert", dying_upsert)
    with pytest.raises(RuntimeError, match="killed before commit"):
        env.run("crashed")
    monkeypatch.setattr(VectorStore, "upsert", real_upsert)
    assert env.plan().changes.modified == ("a.md",)  # still pending: no commit mark
    env.run("recovery")
    env.assert_exact()


def test_orphan_chunks_of_a_file_deleted_after_a_crash_are_removed(
    env, store, write_book, monkeypatch
):
    from rag_pipeline.store import VectorStore

    env.run()
    write_book(BOOK, {"late.md": long_doc("Late", 1, seed="l")})
    real_upsert = VectorStore.upsert

    def dying_upsert(self, points):
        if any(p.payload.get("record_type") == DOCUMENT for p in points):
            raise RuntimeError("killed")
        return real_upsert(self, points)

    monkeypatch.setattr(VectorStore, "upsert", dying_upsert)
    with pytest.raises(RuntimeError):
        env.run("crashed")
    monkeypatch.setattr(VectorStore, "upsert", real_upsert)
    os.remove(env.root / "late.md")  # the file goes away before anyone re-runs
    run = env.run("recovery")
    assert "late.md" in run.inventory.changes.deleted
    env.assert_exact()


def test_changing_the_model_reembeds_everything(env, store, data_dir, write_book):
    from rag_pipeline.embed.hashing import HashEmbedder

    env.run()
    other = HashEmbedder(dimension=384)
    other.model_name = "hash-384-v2"
    run = make_pipeline(env.root.parent, store, make_recipe(other)).run([BOOK])[BOOK]
    # Qdrant Edge builds the new recipe beside the searched index (every file new there) and
    # switches it in; a store without generations rewrites every file in place
    assert set(run.inventory.changes.changed) == {"a.md", "sub/b.md", "c.md"}
    assert run.embedded.reused == 0
    edge = store.opener.config.embedded == "edge"  # the backend with generations
    assert run.outcome.switch is not None and run.outcome.switch.pending == edge
    models = {p["embedding_model"] for p in env.chunk_points().values()}
    assert models == {"hash-384-v2"}


def test_interleaved_runs_of_one_book_leave_no_duplicates(env, store, data_dir, hash_embedder):
    """Two runs that read the index before either wrote (the worst interleaving the run
    queue's per-book limit exists to prevent) still leave one consistent version."""
    env.run()
    pipeline = env.pipeline
    path = env.root / "a.md"
    original = path.read_text()

    def prepare(text):
        """A run's stages up to its write, as two runs would interleave them."""
        path.write_text(text)
        assessed = pipeline.assess([BOOK])
        chunked = pipeline.chunk(pipeline.parse({BOOK: assessed[BOOK].inventory}))
        return chunked, pipeline.embed(chunked)

    older = prepare(original.replace("## Part 1", "## Part 1 version one"))
    newer = prepare(original.replace("## Part 1", "## Part 1 version two"))
    pipeline.write(*newer, run_id="newer")
    pipeline.write(*older, run_id="older")  # stale last
    points = env.chunk_points()
    a_points = {pid for pid, p in points.items() if p["source_file"] == "a.md"}
    assert a_points == {c.id for c in older[0][BOOK].chunks}  # one version, not the other
    assert check_index(store, BOOK, hash_embedder.dimension).passed
    # the file on disk is the newer text: the next run notices and converges to it
    assert env.plan().changes.modified == ("a.md",)
    env.run("converge")
    env.assert_exact()


def test_a_file_that_turns_bad_keeps_its_last_good_chunks(env, store):
    env.run()
    before = {pid for pid, p in env.chunk_points().items() if p["source_file"] == "c.md"}
    (env.root / "c.md").write_bytes(b"\x00\x01 binary garbage")
    run = env.run("run-2")
    assert run.chunked.errors[0].source_file == "c.md"
    after = {pid for pid, p in env.chunk_points().items() if p["source_file"] == "c.md"}
    assert after == before  # still searchable
    record = store.retrieve(book_filter(BOOK), [document_id(BOOK, "c.md")])[0].payload
    assert record["status"] == "error" and record["serving_previous_version"] is True
    assert record["total_chunks"] == len(before)
    assert check_index(store, BOOK, 384).passed
    assert not env.run("run-3").inventory.changes.has_work  # not retried until it changes
    (env.root / "c.md").write_text(long_doc("C fixed", 1, seed="z"))
    env.run("run-4")
    env.assert_exact()


def test_too_large_and_duplicate_files(env, write_book):
    env.run()
    big = "# Big\n\n" + "word " * 4_000_000  # 20 MB
    write_book(BOOK, {"big.md": big, "copies/a-copy.md": (env.root / "a.md").read_text()})
    run = env.run("run-2")
    # refused by its size when the run's look hashes it (a crawl error, no byte read)
    errors = {e.source_file: e.reason for e in (*run.inventory.crawl_errors, *run.chunked.errors)}
    assert errors["big.md"].startswith("file too large: 20.0 MB exceeds the 10.5 MB limit")
    copies = [c for c in run.chunked.chunks if c.source_file == "copies/a-copy.md"]
    assert copies and run.embedded.embedded == 0  # identical text: every vector reused
    points = env.chunk_points()
    assert {p["source_file"] for p in points.values()} >= {"a.md", "copies/a-copy.md"}
    assert len({pid for pid, p in points.items() if p["source_file"] == "copies/a-copy.md"}) == len(
        copies
    )


def test_consistency_check_finds_a_duplicated_chunk(env, store):
    import uuid

    from rag_pipeline.store import PointRecord

    env.run()
    record = next(iter(store.scroll(chunks_of(BOOK), with_vectors=True)))
    # a second copy of a chunk under another id, as a writer with a broken id scheme would leave
    store.upsert([PointRecord(str(uuid.uuid4()), dict(record.payload), dense=record.dense)])
    report = check_index(store, BOOK)
    assert not report.passed
    assert any("duplicates the content" in d for d in report.duplicates), report.problems()


def test_repeated_text_within_a_document_is_not_a_duplicate(store, data_dir, write_book, env):
    repeated = section("Same", 2, 50, seed="r")
    write_book(BOOK, {"twice.md": "---\ntitle: T\n---\n" + repeated + repeated + repeated})
    env.run()
    points = env.chunk_points()
    hashes = [p["content_hash"] for p in points.values() if p["source_file"] == "twice.md"]
    assert len(hashes) > len(set(hashes))  # the same text really is indexed more than once
    assert check_index(store, BOOK).passed


# -- what is not a deletion, what is lost, what is damaged ---------------------------------


def test_an_unreadable_file_keeps_its_chunks_and_is_an_error(env, store, monkeypatch):
    """Permission denied (chmod 000, as a non-root user sees it) is not a deletion."""

    from rag_pipeline.sources import folder

    env.run()
    before = {pid for pid, p in env.chunk_points().items() if p["source_file"] == "c.md"}
    real_hash = folder.hash_file
    monkeypatch.setattr(folder, "hash_file", denied(real_hash, "c.md"))
    os.chmod(env.root / "c.md", 0)  # its ctime and mode move: the plan reads it again
    plan = env.plan()
    assert plan.action == "run" and plan.changes.unreadable == ("c.md",)
    assert plan.preview.points_to_delete == 0
    run = env.run("run-2")
    assert run.inventory.changes.deleted == ()
    after = {pid for pid, p in env.chunk_points().items() if p["source_file"] == "c.md"}
    assert after == before
    record = store.retrieve(book_filter(BOOK), [document_id(BOOK, "c.md")])[0].payload
    assert record["status"] == "error" and "Permission denied" in record["error"]
    assert record["serving_previous_version"] is True
    assert check_index(store, BOOK).passed
    standing = env.plan()
    assert standing.action == "unchanged"  # a standing error starts no run
    assert [e for e in standing.errors if "c.md" in e] == [
        f"{BOOK}/c.md: cannot read file: Permission denied"
    ]  # listed once
    assert standing.changes.counts()["files_unreadable"] == 1  # reported by every plan
    assert standing.result().files_unreadable == 1
    monkeypatch.setattr(folder, "hash_file", real_hash)
    os.chmod(env.root / "c.md", 0o644)
    # readable again, with the very bytes of the version it serves: the error is cleared by a
    # run that re-embeds nothing, after which the book is unchanged
    plan = env.plan()
    assert plan.action == "run" and plan.changes.modified == ("c.md",), plan.reasons
    assert any("readable again" in r for r in plan.reasons)
    run = env.run("run-3")
    assert run.embedded.embedded == 0 and run.embedded.reused > 0
    record = store.retrieve(book_filter(BOOK), [document_id(BOOK, "c.md")])[0].payload
    assert record["status"] == "ok" and record["error"] is None
    env.assert_exact()
    assert env.plan().action == "unchanged"


def test_lost_chunk_points_are_detected_and_rebuilt(env, store):
    env.run()
    points = env.chunk_points()
    lost = sorted(pid for pid, p in points.items() if p["source_file"] == "a.md")[:2]
    store.delete_ids(book_filter(BOOK), lost)
    plan = env.plan()
    assert plan.action == "run" and plan.changes.modified == ("a.md",)
    assert any("chunk points" in r for r in plan.reasons)
    run = env.run("repair")
    assert run.embedded.embedded == 2  # only the lost ones; the rest are reused
    env.assert_exact()


def test_force_rebuilds_whatever_the_records_say(env, store):
    env.run()
    store.delete_where(chunks_of(BOOK))  # every chunk gone, the records still promise them
    forced = env.plan(force=True)
    assert forced.action == "run" and forced.reasons == ["forced rebuild"]
    run = env.run("forced", force=True)
    assert run.embedded.reused == 0 and run.embedded.embedded == len(run.chunked.chunks)
    env.assert_exact()


def test_damaged_vectors_are_one_decision_with_one_reason_in_plan_and_run(env, store):
    from rag_pipeline.ingest.assess import DAMAGED_VECTORS
    from rag_pipeline.store import PointRecord

    env.run()
    damaged = [
        PointRecord(r.id, dict(r.payload), dense=r.dense * 0)
        for r in store.scroll(chunks_of(BOOK), with_vectors=True)
    ]
    store.upsert(damaged)  # zero vectors: not what this pipeline writes
    plan = env.plan()
    assert plan.action == "run" and plan.reasons == [DAMAGED_VECTORS]
    run = env.run("repair")
    assert run.inventory.damaged and run.inventory.reembed
    assert plan.changes == run.inventory.changes
    assert set(run.inventory.changes.reasons.values()) == {DAMAGED_VECTORS}
    assert run.embedded.reused == 0 and plan.preview.to_embed == run.embedded.embedded
    env.assert_exact()
    assert env.plan().action == "unchanged"


@pytest.mark.parametrize(
    "change",
    ["edit", "delete", "add", "turn-bad", "lose-points", "rename", "none"],
)
def test_the_plan_is_what_the_run_does(env, store, write_book, change):
    env.run()
    if change == "edit":
        path = env.root / "a.md"
        path.write_text(path.read_text().replace("part2w1x5", "PLANNED EDIT"))
    elif change == "delete":
        os.remove(env.root / "c.md")
    elif change == "add":
        write_book(BOOK, {"new.md": long_doc("New", 2, seed="n")})
    elif change == "turn-bad":
        (env.root / "c.md").write_bytes(b"---\ntitle: [unclosed\n---\nbody")
    elif change == "lose-points":
        store.delete_ids(book_filter(BOOK), sorted(env.chunk_points())[:3])
    elif change == "rename":
        os.rename(env.root / "c.md", env.root / "c2.md")
    plan = env.plan()
    ids_before = set(env.chunk_points())
    run = env.run("checked")
    assert plan.action == ("unchanged" if change == "none" else "run")
    assert plan.changes.new == run.inventory.changes.new
    assert plan.changes.modified == run.inventory.changes.modified
    assert plan.changes.deleted == run.inventory.changes.deleted
    if plan.preview is not None:
        assert plan.preview.to_embed == run.embedded.embedded
        assert plan.preview.reused == run.embedded.reused
        assert plan.preview.points_to_delete == run.written.deleted
        assert plan.preview.chunks == len(run.chunked.chunks)
    # what the run did is exactly what the points show: those it deleted gone, its new
    # chunks there, nothing else moved
    ids_after = set(env.chunk_points())
    written = {c.id for c in run.chunked.chunks}
    stale = ids_before - ids_after
    assert ids_after == (ids_before - stale) | written
    assert len(stale) == run.written.deleted - len(run.inventory.changes.deleted)
    if change != "turn-bad":  # (a file that turned bad keeps its last good chunks)
        env.assert_exact()
    assert check_index(store, BOOK).passed


def test_a_books_bm25_average_is_measured_once_recorded_and_kept(env, store, write_book):
    """BM25 length normalization uses the book's own average chunk length: measured when the
    book is first indexed, recorded in every chunk's sparse_model, reused by later runs (so an
    edit re-encodes nothing else), measured again only when the book is rebuilt."""
    from rag_pipeline.sparse import Bm25Encoder, measure_avg_len

    run = env.run("first")
    names = {p["sparse_model"] for p in env.chunk_points().values()}
    assert len(names) == 1
    recorded = Bm25Encoder.from_name(names.pop())
    measured = measure_avg_len(c.embed_text for c in run.chunked.chunks)
    assert recorded.avg_len == measured and recorded.analyzer == "v2"
    write_book(BOOK, {"short.md": "# Short\n\nA few words only."})
    later = env.run("second")
    assert later.embedded.sparse_model == recorded.name  # the new file uses the book's average
    assert later.inventory.changes.new == ("short.md",) and not later.inventory.changes.modified
    forced = env.run("forced", force=True)
    assert Bm25Encoder.from_name(forced.embedded.sparse_model).avg_len == measure_avg_len(
        c.embed_text for c in forced.chunked.chunks
    )


def test_a_first_run_analyses_each_chunk_text_for_its_bm25_average_and_once_to_write(
    env, monkeypatch
):
    """A book's first run analyses each chunk's text twice: once for its BM25 average (of
    which only the length is kept) and once as its vector is written, a batch at a time
    (issue 40.4: a 1M-point ingest cannot hold every analysis or vector of its big book);
    a later run of the book measures no average. The vectors are the ones the recorded
    encoder gives the texts."""
    from collections import Counter

    from rag_pipeline.sparse import Bm25Encoder

    analysed: list[str] = []
    real = Bm25Encoder.terms

    def counting(self: Bm25Encoder, text: str) -> list[str]:
        analysed.append(text)
        return real(self, text)

    monkeypatch.setattr(Bm25Encoder, "terms", counting)
    run = env.run("first")
    texts = [c.embed_text for c in run.chunked.chunks]
    assert texts and Counter(analysed) == Counter(texts + texts)
    analysed.clear()
    (env.root / "a.md").write_text(long_doc("A edited", seed="edited once"))
    edit = env.run("edit")
    assert edit.embedded.embedded and len(analysed) == len(edit.chunked.chunks)
    monkeypatch.undo()
    encoder = Bm25Encoder.from_name(run.embedded.sparse_model)
    assert list(run.embedded.sparse) == encoder.encode_documents(texts)


def test_a_plan_hashes_each_file_once_and_reads_only_what_runs(env, store, monkeypatch):
    """The plan's decision and its preview come from one assessment: every file is hashed once,
    and only the files that run are read to be parsed (the ingest pre-plan reads none)."""
    import collections

    from rag_pipeline.sources import folder

    env.run()
    (env.root / "a.md").write_text(long_doc("A edited", seed="edited"))
    hashed: collections.Counter[str] = collections.Counter()
    read: collections.Counter[str] = collections.Counter()
    real_hash, real_read = folder.hash_file, folder.read_source

    def counting_hash(path, *args):  # a hash streams the file
        hashed[os.path.relpath(path, env.root)] += 1
        return real_hash(path, *args)

    def counting_read(path, *args):  # a read takes the file it parses whole
        read[os.path.relpath(path, env.root)] += 1
        return real_read(path, *args)

    monkeypatch.setattr(folder, "hash_file", counting_hash)
    monkeypatch.setattr(folder, "read_source", counting_read)
    plan = env.plan()
    assert plan.action == "run" and plan.preview is not None
    # the files whose stat its last run recorded (in the book's summary, on a store that
    # keeps one) are not read again: the edited one is
    every = {"a.md": 1, "sub/b.md": 1, "c.md": 1}
    keeps_summaries = store.opener.config.embedded == "edge"  # the backend with a catalog
    expected = {"a.md": 1} if keeps_summaries else every
    assert hashed == expected
    assert read == {"a.md": 1}
    hashed.clear()
    read.clear()
    with env.pipeline.store.open() as reader:  # as `ingest` plans
        books = env.pipeline.plan(reader, [BOOK]).books
    assert books[BOOK].action == "run" and books[BOOK].preview is None
    assert hashed == expected and not read


def test_a_plan_reads_points_per_file_only_for_a_book_whose_count_is_off(env, store, monkeypatch):
    """A facet by file looks at every file name of the collection: the plan `ingest` makes
    asks for it only for a book whose chunk points are not what its records promise, and still
    names the file that lost points."""
    from rag_pipeline.schema import SOURCE_FILE
    from rag_pipeline.store import VectorStore

    env.run()
    faceted = []
    real_counts_by = VectorStore.counts_by

    def counting(self, where, key):
        faceted.append(key)
        return real_counts_by(self, where, key)

    monkeypatch.setattr(VectorStore, "counts_by", counting)

    def plan_of_ingest():
        with env.pipeline.store.open() as reader:
            return env.pipeline.plan(reader, [BOOK]).books[BOOK]

    book = plan_of_ingest()
    assert book.action == "unchanged" and book.points == book.chunks > 0
    assert SOURCE_FILE not in faceted
    lost = sorted(
        p for p, payload in env.chunk_points().items() if payload["source_file"] == "a.md"
    )
    store.delete_ids(book_filter(BOOK), lost[:1])
    book = plan_of_ingest()
    assert book.action == "run" and book.changes.modified == ("a.md",)
    assert any("chunk points" in r for r in book.reasons) and SOURCE_FILE in faceted


def test_the_plans_preview_is_the_pipelines_parse_and_chunk(env, monkeypatch):
    """`rag-pipeline plan` counts a book's work with the pipeline's own stages (its preview),
    from the assessment the plan made: what it says is what the run does."""
    from rag_pipeline.ingest.pipeline import IngestPipeline

    env.run()
    (env.root / "a.md").write_text(long_doc("A edited", seed="edited"))
    previews = []
    real = IngestPipeline.preview

    def preview(self, assessment, recipe):
        previews.append(assessment.book_id)
        return real(self, assessment, recipe)

    monkeypatch.setattr(IngestPipeline, "preview", preview)
    plan = env.plan()
    assert previews == [BOOK] and plan.preview is not None
    run = env.run("edit")
    assert (plan.preview.to_embed, plan.preview.reused) == (
        run.embedded.embedded,
        run.embedded.reused,
    )


def test_prepared_stages_write_first_and_are_handed_once_to_the_runs_steps(env, store, monkeypatch):
    """Live mode's work first: ``prepare`` writes the book's points under the run's id; the
    run's steps, asking with the very outputs it computed, are handed each stage once
    (nothing parsed, embedded or written twice); a step asking again (a retry) computes."""
    from rag_pipeline.ingest import pipeline as pipeline_module

    pipeline = env.pipeline
    prepared = pipeline.prepare([BOOK], run_id="run-first")
    assert prepared.written
    points = env.assert_exact()
    assert {p["run_id"] for p in points.values()} == {"run-first"}

    def never(*args, **kwargs):
        raise AssertionError("a stage done ahead was done again")

    done = {stage: dict(out) for stage, out in prepared.outputs.items()}
    monkeypatch.setattr(pipeline_module, "parse_book", never)
    monkeypatch.setattr(pipeline_module, "write_and_check", never)
    with pipeline.replaying(prepared):  # the steps of the Dagster run, in order
        assessed = pipeline.assess([BOOK])
        parsed = pipeline.parse({b: a.inventory for b, a in assessed.items()})
        chunked = pipeline.chunk(parsed)
        said: list[str] = []
        embedded = pipeline.embed(chunked, say=said.append)
        written = pipeline.write(chunked, embedded, run_id="run-first")
        assert said and "chunks" in said[0]  # the embed step's log line, said again
        assert embedded[BOOK] is done["embed"][BOOK]
        assert written[BOOK] is done["write"][BOOK]
        with pytest.raises(AssertionError, match="done again"):  # a retried step computes
            pipeline.parse({b: a.inventory for b, a in assessed.items()})
    assert pipeline._replay is None


def test_a_chunk_problem_stops_the_work_first_before_the_embedding(env, monkeypatch):
    """What a blocking check of the run would stop is left to the run's step."""
    import dataclasses

    from rag_pipeline.ingest import stages

    real = stages.chunk_book

    def flawed(*args, **kwargs):
        book = real(*args, **kwargs)
        return dataclasses.replace(book, problems=("a duplicated chunk",))

    monkeypatch.setattr("rag_pipeline.ingest.pipeline.chunk_book", flawed)
    prepared = env.pipeline.prepare([BOOK], run_id="run-x")
    assert set(prepared.outputs) == {"assess", "parse", "chunk"}
    assert not prepared.written
    assert env.chunk_points() == {}

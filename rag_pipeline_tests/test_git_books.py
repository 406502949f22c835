"""Git books (issue 39): books declared in a sources file (``RAG_SOURCES``) beside the folder
books, indexed from the tree of a ref of a git repository, on the production path (the CLI in
real processes, which plans and runs the Dagster job; the books sensor)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from dagster import SkipReason

from rag_pipeline_tests.gitbooks import NEEDS_GIT, GitRepo, paragraphs, write_sources
from rag_pipeline_tests.helpers import Cli, InProcessCli


@pytest.fixture
def repo(tmp_path: Path) -> GitRepo:
    """A repository whose ``docs`` folder is a book of three pages (a README beside it)."""
    repo = GitRepo(tmp_path / "handbook")
    repo.commit(
        "first pages",
        {
            "README.md": "# not part of the book\n",
            **{f"docs/page-{i}.md": paragraphs(f"Page {i}") for i in (1, 2, 3)},
        },
    )
    return repo


@pytest.fixture
def folder_book(data_dir: Path) -> Path:
    book = data_dir / "notes"
    book.mkdir(parents=True)
    (book / "note.md").write_text(paragraphs("Note", sections=1))
    return data_dir


def declared(tmp_path: Path, repo: GitRepo, **more: dict[str, str]) -> Path:
    return write_sources(
        tmp_path / "sources.yaml",
        {"handbook": {"git": str(repo.path), "ref": "main", "path": "docs"}, **more},
    )


def books_of(report: dict) -> dict:
    return report["books"]


@NEEDS_GIT
@pytest.mark.integration
@pytest.mark.slow
def test_a_git_book_follows_its_ref_commit_by_commit(tmp_path, repo, folder_book):
    """First ingest; a one-paragraph commit is planned as exactly that file and embeds at most
    3 chunks; uncommitted edits are never indexed; lineage names the commit; a rename embeds
    nothing; git rm deletes the file's points; a book whose remote cannot be reached fails
    alone; a removed entry's book is purged."""
    cli = Cli(tmp_path, folder_book)
    cli.env["RAG_SOURCES"] = str(
        declared(tmp_path, repo, offline={"git": str(tmp_path / "nowhere.git"), "ref": "main"})
    )
    first_commit = repo.head()
    done = cli("ingest", "--json", check=False)
    report = books_of(json.loads(done.stdout))
    assert done.returncode == 1  # the book that cannot be reached
    assert report["handbook"]["status"] == "ingested" and report["handbook"]["files_new"] == 3
    assert report["notes"]["status"] == "ingested"  # the folder book beside it
    assert report["offline"]["status"] == "failed"
    assert "nowhere.git" in report["offline"]["error_messages"][0]
    assert "not appear to be a git repository" in report["offline"]["error_messages"][0]
    cli.env["RAG_SOURCES"] = str(declared(tmp_path, repo))

    # one paragraph of page 2 edited and committed; page 1 edited but not committed
    page2 = (repo.path / "docs/page-2.md").read_text()
    page2 = re.sub(r"\bpage2part2w1x3\b", "reworded", page2)  # one word of one paragraph
    second_commit = repo.commit("Reword page 2", {"docs/page-2.md": page2})
    (repo.path / "docs/page-1.md").write_text("# uncommitted\n\nnever indexed\n")
    plan = books_of(cli.json("plan"))["handbook"]
    assert plan["action"] == "run"
    assert plan["files"] == {"new": [], "modified": ["page-2.md"], "deleted": [], "unreadable": []}
    assert 1 <= plan["chunks_to_embed"] <= 3
    assert (plan["indexed_revision"], plan["revision"]) == (first_commit, second_commit)
    assert plan["revisions"] == f"commits {first_commit[:12]}..{second_commit[:12]} (1 commit)"
    assert plan["source"] == {
        "kind": "git",
        "location": str(repo.path),
        "ref": "main",
        "path": "docs",
    }
    ran = books_of(cli.json("ingest"))["handbook"]
    assert ran["files_modified"] == 1 and 1 <= ran["embedded"] <= 3
    assert books_of(cli.json("plan"))["handbook"]["action"] == "unchanged"

    hits = cli.json("search", "reworded", "--book", "handbook", "--mode", "sparse")
    assert hits[0]["source_file"] == "page-2.md" and "reworded" in hits[0]["text"]
    lineage = cli.json("lineage", hits[0]["id"], "--book", "handbook")
    assert lineage["source_revision"] == second_commit
    assert lineage["commit"]["sha"] == second_commit
    assert lineage["commit"]["subject"] == "Reword page 2"
    assert lineage["commit"]["author"] == "Ada Writer <ada@example.com>"
    assert lineage["source_version"] == repo.git("rev-parse", "HEAD:docs/page-2.md")
    assert lineage["file_changed_since_indexed"] is False
    shown = cli("lineage", hits[0]["id"], "--book", "handbook").stdout
    assert second_commit in shown and "Reword page 2" in shown

    repo.git("checkout", "--", "docs/page-1.md")
    repo.git("mv", "docs/page-3.md", "docs/renamed.md")
    repo.commit("rename page 3")
    planned = books_of(cli.json("plan"))["handbook"]
    assert "(1 commit; renamed: page-3.md -> renamed.md)" in planned["revisions"]
    renamed = books_of(cli.json("ingest"))["handbook"]
    assert (renamed["files_new"], renamed["files_deleted"], renamed["embedded"]) == (1, 1, 0)

    repo.git("rm", "--quiet", "docs/page-1.md")
    repo.commit("remove page 1")
    removed = books_of(cli.json("ingest"))["handbook"]
    assert removed["files_deleted"] == 1 and removed["deleted"] > 0
    assert removed["points"] == removed["chunks"]
    found = cli.json("search", "page", "--book", "handbook", "--limit", "50", "--mode", "sparse")
    left = {h["source_file"] for h in found}
    assert left <= {"page-2.md", "renamed.md"} and "page-1.md" not in left

    # the entry removed: its book is purged as a removed folder is
    cli.env["RAG_SOURCES"] = str(write_sources(tmp_path / "sources.yaml", {}))
    assert books_of(cli.json("plan"))["handbook"]["action"] == "purge"
    cli("ingest", "--json")
    assert "handbook" not in cli("books").stdout


@pytest.mark.parametrize(
    ("entry", "named"),
    [
        ({"git": "REPO", "ref": "main..x"}, ["entry 'handbook'", "field 'ref'"]),
        ({"git": "REPO", "branch": "main"}, ["entry 'handbook'", "field 'branch'"]),
        ({"gti": "REPO"}, ["entry 'handbook'", "exactly one of the keys git or s3"]),
        ({"git": "REPO", "path": "../up"}, ["entry 'handbook'", "field 'path'"]),
    ],
)
def test_a_bad_sources_entry_is_exit_2_naming_the_entry_and_the_field(
    tmp_path, folder_book, entry, named
):
    cli = InProcessCli(tmp_path, folder_book)
    entry = {k: str(tmp_path / "repo.git") if v == "REPO" else v for k, v in entry.items()}
    cli.env["RAG_SOURCES"] = str(write_sources(tmp_path / "sources.yaml", {"handbook": entry}))
    for command in (("plan",), ("ingest",), ("books",)):
        done = cli(*command, check=False)
        assert done.returncode == 2, done
        assert all(n in done.stderr for n in named), done.stderr
        assert "Traceback" not in done.stderr


def test_a_declared_book_named_as_a_folder_book_is_exit_2_naming_both(tmp_path, folder_book):
    cli = InProcessCli(tmp_path, folder_book)
    cli.env["RAG_SOURCES"] = str(
        write_sources(tmp_path / "sources.yaml", {"notes": {"git": str(tmp_path / "r.git")}})
    )
    done = cli("plan", check=False)
    assert done.returncode == 2
    assert str(folder_book / "notes") in done.stderr and "sources.yaml" in done.stderr


@NEEDS_GIT
@pytest.mark.integration  # git processes
def test_a_git_book_reads_the_ref_not_the_work_tree(tmp_path, repo):
    """The source's view: the tree of the ref (never uncommitted edits), each file's blob id
    its version, the commit its revision; a tag and a sha name their commit; a missing ref or
    folder is the book's failure, naming the repository and the reason."""
    from rag_pipeline.sources.base import BookUnavailableError
    from rag_pipeline.sources.git import GitBookSpec, GitSource

    repo.git("tag", "v1")
    first = repo.head()
    (repo.path / "docs/page-1.md").write_text("# dirty\n")
    (repo.path / "docs/page-9.md").write_text("# untracked\n")
    specs = {
        "main": GitBookSpec(git=str(repo.path), ref="main", path="docs"),
        "tag": GitBookSpec(git=str(repo.path), ref="v1", path="docs"),
        "sha": GitBookSpec(git=str(repo.path), ref=first, path="docs"),
        "nope": GitBookSpec(git=str(repo.path), ref="no-such-branch"),
        "nofolder": GitBookSpec(git=str(repo.path), path="missing"),
    }
    source = GitSource(specs, cache_dir=tmp_path / "cache")
    for book in ("main", "tag", "sha"):
        versions = source.versions(book)
        assert versions.revision == first
        assert [v.source_file for v in versions.files] == ["page-1.md", "page-2.md", "page-3.md"]
        page1 = versions.files[0]
        assert page1.key == repo.git("rev-parse", "HEAD:docs/page-1.md")
        assert source.read(book, page1, versions.boundary).startswith(b"# Page 1")
    assert source.is_gone("main", "page-9.md") and not source.is_gone("main", "page-1.md")
    for book, reason in (("nope", "no-such-branch"), ("nofolder", "no folder 'missing'")):
        with pytest.raises(BookUnavailableError) as failed:
            source.versions(book)
        assert str(repo.path) in str(failed.value) and reason in str(failed.value)
        assert not source.is_gone(book, "page-1.md")  # nothing is taken for deleted
    source.close()


@NEEDS_GIT
@pytest.mark.integration  # git processes
def test_the_books_sensor_runs_a_git_book_on_a_new_commit_only(tmp_path, repo, folder_book):
    """A new commit on the ref requests a run of that book alone; no commit, no run; a book
    whose remote cannot be reached does not stop the tick."""
    from rag_pipeline.sources.declared import DeclaredSources
    from rag_pipeline.sources.scan import clear_scan_cache
    from rag_pipeline_tests.conftest import make_source
    from rag_pipeline_tests.test_sensors import Harness, ingest_requests

    clear_scan_cache()
    sources = declared(tmp_path, repo, offline={"git": str(tmp_path / "nowhere.git")})
    harness = Harness(folder_book)
    source = DeclaredSources(make_source(folder_book), sources, cache_dir=tmp_path / "cache")
    harness.pipeline = harness.pipeline.with_source(source)
    first = harness.tick()
    assert harness.partitions == ["handbook", "notes", "offline"]
    assert ingest_requests(first)
    assert isinstance(harness.tick(), SkipReason)  # nothing changed
    repo.commit("edit page 1", {"docs/page-1.md": paragraphs("Page 1", seed="new")})
    requests = ingest_requests(harness.tick())
    assert [r.partition_key for r in requests] == ["handbook"]
    repo.commit("edit outside the book", {"README.md": "# still not part of it\n"})
    assert isinstance(harness.tick(), SkipReason)


@NEEDS_GIT
@pytest.mark.integration  # git processes
def test_the_dagster_ui_shows_each_books_source_and_commit(tmp_path, repo, folder_book):
    """A git book's materializations show its source and the commit read; the collection's
    table lists each book's source with the commit it was last indexed at."""
    from dagster import DagsterInstance, materialize

    from rag_pipeline.defs.assets import ingestion_assets
    from rag_pipeline.defs.collection import qdrant_collection
    from rag_pipeline.defs.metadata import markdown_rows
    from rag_pipeline.defs.partitions import BOOKS_PARTITIONS_NAME
    from rag_pipeline_tests.conftest import hash_settings
    from rag_pipeline_tests.test_dagster_assets import resources_for

    settings = hash_settings(folder_book, tmp_path, sources=declared(tmp_path, repo))
    resources = resources_for(settings, tmp_path)
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(BOOKS_PARTITIONS_NAME, ["handbook", "notes"])
    commit = repo.commit("Second edition", {"docs/page-1.md": paragraphs("Page 1", seed="v2")})
    for book in ("handbook", "notes"):
        run = materialize(
            ingestion_assets, partition_key=book, instance=instance, resources=resources
        )
        assert run.success
        metadata = {
            e.asset_key.path[-1]: e.materialization.metadata
            for e in run.get_asset_materialization_events()
        }
        for asset in ("source_files", "qdrant_points"):
            shown = {k: getattr(v, "value", v) for k, v in metadata[asset].items()}
            if book == "handbook":
                assert shown["source_kind"] == "git"
                assert shown["source"] == f"location {repo.path}, ref main, path docs"
                assert shown["source_revision"] == commit
                assert shown["source_commit"].startswith(f"{commit[:12]} Second edition (")
            else:
                assert shown["source_kind"] == "folder" and "source_commit" not in shown
    page = materialize([qdrant_collection], instance=instance, resources=resources)
    meta = page.get_asset_materialization_events()[0].materialization.metadata
    rows = {row["book"]: row for row in markdown_rows(meta["book_table"])}
    assert rows["handbook"]["source"] == f"git {repo.path} main:docs @ {commit[:12]}"
    assert rows["notes"]["source"] == f"folder {folder_book / 'notes'}"


@NEEDS_GIT
@pytest.mark.integration
@pytest.mark.slow
def test_live_mode_applies_a_new_commit_of_a_git_book(tmp_path, repo, folder_book):
    """`rag-pipeline watch` notices a new commit on the ref (no file notification comes: it
    asks the remote at every idle look) and applies that book alone."""
    from rag_pipeline_tests.helpers import LiveProcess

    cli = Cli(tmp_path, folder_book)
    cli.env["RAG_SOURCES"] = str(declared(tmp_path, repo))
    live = LiveProcess(cli)
    try:
        live.next_event("ready", timeout=180)
        assert sorted(live.applied_books()) == ["handbook", "notes"]
        commit = repo.commit("live edit", {"docs/page-3.md": paragraphs("Page 3", seed="live")})
        applied = live.next_event("applied", timeout=60)["report"]["books"]
        assert list(applied) == ["handbook"] and applied["handbook"]["files_modified"] == 1
        plan = books_of(cli.json("plan"))["handbook"]
        assert plan["action"] == "unchanged" and plan["indexed_revision"] == commit
    finally:
        live.stop()


@NEEDS_GIT
@pytest.mark.integration  # git processes
def test_a_sources_file_read_while_it_is_written_removes_no_book(tmp_path, repo, folder_book):
    """Fault: a sources file read between an editor's truncate and its write (empty, or
    half its entries) took its declared books for removed: their points were purged, then
    built again in full. An entry missing from a file read in the clock tick of a write is
    decided by the file once that write settled: the write completed, the book is kept; the
    file still without it, the entry was removed."""
    import os
    import threading
    import time

    from rag_pipeline.ingest.plan import decide_purges
    from rag_pipeline.sources.declared import DeclaredSources
    from rag_pipeline_tests.conftest import make_source

    path = declared(tmp_path, repo)
    whole = path.read_text()
    source = DeclaredSources(make_source(folder_book), path, cache_dir=tmp_path / "cache")
    indexed = {"handbook", "notes"}
    assert set(source.list_books().book_ids) == indexed

    def truncated() -> None:
        path.write_text("")  # the truncate
        ahead = time.time_ns() + 300_000_123  # (read in the tick of the write: racy)
        os.utime(path, ns=(ahead, ahead))

    truncated()
    listing = source.list_books()
    assert "handbook" not in listing.book_ids
    writer = threading.Timer(0.1, lambda: path.write_text(whole))  # its write, a moment later
    writer.start()
    decision = decide_purges(source, listing.book_ids, indexed)
    writer.join()
    assert decision.purge == () and "handbook" in decision.kept, decision
    time.sleep(0.1)
    assert set(source.list_books().book_ids) == indexed

    truncated()  # and no write after it: the entry was removed
    listing = source.list_books()
    decision = decide_purges(source, listing.book_ids, indexed)
    assert (decision.purge, decision.kept) == (("handbook",), ()), decision

"""Object-store books (issue 39): :class:`~rag_pipeline.sources.s3.S3Source` against a real
S3-compatible server, moto's server mode on 127.0.0.1 (one per test session,
``rag_pipeline_tests/s3server.py``), through the production client (boto3), and the CLI's
whole path (plan, Dagster runs) in real processes, the books declared in a sources file."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from rag_pipeline_tests.conftest import section
from rag_pipeline_tests.helpers import assert_no_trace, cli_env
from rag_pipeline_tests.s3server import (
    AWS,
    FOREIGN_AWS,
    S3Server,
    closed_port,
)
from rag_pipeline_tests.warm import warm_server


def new_bucket(s3: S3Server) -> str:
    bucket = f"books-{uuid.uuid4().hex[:12]}"
    s3.client().create_bucket(Bucket=bucket)
    return bucket


def put(s3: S3Server, bucket: str, key: str, text: str) -> None:
    s3.client().put_object(Bucket=bucket, Key=key, Body=text.encode())


def page(title: str, seed: str = "") -> str:
    return f"---\ntitle: {title}\n---\n# {title}\n\n" + section("Intro", 2, 30, seed)


# -- the spec and the source, directly -----------------------------------------------------


def test_book_spec_validation() -> None:
    from rag_pipeline.sources.s3 import S3BookSpec

    spec = S3BookSpec(s3="s3://team-docs/runbooks", endpoint_url="http://127.0.0.1:9000")
    assert (spec.s3, spec.bucket, spec.prefix) == (
        "s3://team-docs/runbooks/",
        "team-docs",
        "runbooks/",
    )
    assert S3BookSpec(s3="s3://team-docs").prefix == ""
    for bad, said in [
        ({"s3": "https://team-docs/x/"}, "is not an s3:// URL"),
        ({"s3": "s3://Team_Docs/x/"}, "is not a bucket name"),
        ({"s3": "s3://team-docs/a/../b/"}, "'..' part"),
        ({"s3": "s3://team-docs/", "endpoint_url": "127.0.0.1:9000"}, "http(s)://"),
        ({"s3": "s3://team-docs/", "bucket": "x"}, "Extra inputs are not permitted"),
    ]:
        with pytest.raises(ValidationError, match=None) as caught:
            S3BookSpec.model_validate(bad)
        assert said in str(caught.value), (bad, str(caught.value))


def test_versions_come_from_one_listing_and_name_the_markdown_objects(s3, aws) -> None:
    from rag_pipeline.sources.s3 import S3BookSpec, S3Source

    bucket = new_bucket(s3)
    for key in ("docs/a.md", "docs/guide/b.MDX", "docs/img.png", "docs/.drafts/c.md", "other/d.md"):
        put(s3, bucket, key, page(key))
    s3.client().put_object(Bucket=bucket, Key="docs/guide/", Body=b"")  # a folder marker
    source = S3Source({"docs": S3BookSpec(s3=f"s3://{bucket}/docs", endpoint_url=s3.url)})
    before = len(s3.requests)
    versions = source.versions("docs")
    assert [f.source_file for f in versions.files] == ["a.md", "guide/b.MDX"]
    assert [r.is_listing for r in s3.requests[before:]] == [True]  # one request, no download
    first = versions.files[0]
    assert source.read("docs", first, versions.boundary) == page("docs/a.md").encode()
    put(s3, bucket, "docs/a.md", page("docs/a.md", seed="edited"))
    edited = source.versions("docs").files[0]
    assert edited.key != first.key and edited.key is not None
    # the version listed before the edit is not what is there now: not read as it
    from rag_pipeline.sources.base import SourceReadError

    with pytest.raises(SourceReadError, match="replaced while it was read"):
        source.read("docs", first, versions.boundary)
    # a key of another book (another prefix) is never read through this one
    with pytest.raises(SourceReadError, match="is not an object of"):
        source.read("docs", first.__class__("d.md", None, "other/d.md"), versions.boundary)
    assert source.is_gone("docs", "a.md") is False
    s3.client().delete_object(Bucket=bucket, Key="docs/a.md")
    assert source.is_gone("docs", "a.md") is True
    assert source.is_gone("undeclared") is True and source.is_gone("docs") is False


def test_the_books_sensor_keeps_an_unreachable_book_as_it_last_saw_it(s3, aws) -> None:
    """What the books sensor and live mode look with (scan_books): a book whose endpoint is
    unreachable is never taken as removed, the others are scanned."""
    from rag_pipeline.sources.s3 import S3BookSpec, S3Source
    from rag_pipeline.sources.scan import clear_scan_cache, scan_books

    bucket = new_bucket(s3)
    put(s3, bucket, "a.md", page("A"))
    dead = f"http://127.0.0.1:{closed_port()}"
    source = S3Source(
        {
            "up": S3BookSpec(s3=f"s3://{bucket}/", endpoint_url=s3.url),
            "down": S3BookSpec(s3=f"s3://{bucket}/", endpoint_url=dead),
        }
    )
    clear_scan_cache()
    states, rejected = scan_books(source, {"down": ["stat", "content"]})
    assert set(states) == {"up", "down"} and rejected == []
    # never taken as removed: a digest naming why, so its run is requested once per reason
    # (and fails, naming it), then retried as a failed book is
    assert states["down"].content_digest.startswith("unavailable:")
    assert states["up"].files == 1
    again, _ = scan_books(source, {})
    assert again["down"].content_digest == states["down"].content_digest


# -- the CLI's whole path -------------------------------------------------------------------


class S3Cli:
    """``rag-pipeline`` in a real process over the object-store books ``books``, declared in
    a sources file (``RAG_SOURCES``; JSON is YAML): forked from the warm interpreter
    (warm.py), or (``fresh=True``) started from scratch."""

    def __init__(self, tmp_path: Path, books: dict[str, dict[str, Any]]) -> None:
        self.config = tmp_path / "sources.yaml"
        self.declare(books)
        self.env = {**cli_env(tmp_path, tmp_path / "no_folder_books"), **AWS}
        self.env["RAG_SOURCES"] = str(self.config)
        (tmp_path / "no_folder_books").mkdir(exist_ok=True)
        for var in FOREIGN_AWS:
            self.env.pop(var, None)
        self.cwd = tmp_path

    def declare(self, books: dict[str, dict[str, Any]]) -> None:
        """The sources file declares ``books`` (and no other)."""
        self.config.write_text(json.dumps({"books": books}))

    def __call__(
        self, *args: str, env: dict[str, str] | None = None, fresh: bool = False
    ) -> subprocess.CompletedProcess[str]:
        env = {**self.env, **(env or {})}
        if fresh:
            return subprocess.run(
                [sys.executable, "-m", "rag_pipeline.cli", *args],
                env=env,
                cwd=self.cwd,
                capture_output=True,
                text=True,
                timeout=300,
            )
        proc = warm_server().start(list(args), env, self.cwd, None)
        stdout, stderr = proc.communicate(timeout=300)
        return subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)

    def ingest(
        self, env: dict[str, str] | None = None, code: int = 0, fresh: bool = False
    ) -> dict[str, Any]:
        done = self("ingest", "--json", env=env, fresh=fresh)
        assert done.returncode == code, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        assert_no_trace(done.stderr)
        report: dict[str, Any] = json.loads(done.stdout)["books"]
        return report


@pytest.mark.integration
@pytest.mark.slow
def test_an_s3_book_through_the_cli_first_ingest_edit_delete_and_a_free_rerun(s3, tmp_path) -> None:
    bucket = new_bucket(s3)
    for name in ("disk.md", "network.md", "guide/deploy.md"):
        put(s3, bucket, f"runbooks/{name}", page(name))
    put(s3, bucket, "handbook/index.md", page("index"))
    cli = S3Cli(
        tmp_path,
        {
            "runbooks": {"s3": f"s3://{bucket}/runbooks/", "endpoint_url": s3.url},
            "handbook": {"s3": f"s3://{bucket}/handbook/", "endpoint_url": s3.url},
        },
    )
    first = cli.ingest()
    assert first["runbooks"]["status"] == "ingested" and first["runbooks"]["files_new"] == 3
    assert first["handbook"]["files_new"] == 1  # each prefix is its own book
    points = first["runbooks"]["points"]
    assert points >= 3

    put(s3, bucket, "runbooks/disk.md", page("disk.md", seed="edited"))
    edited = cli.ingest()["runbooks"]
    assert (edited["files_modified"], edited["files_new"], edited["files_deleted"]) == (1, 0, 0)
    # lineage: the object's ETag as the run read it, and the object read again, unchanged
    hits = json.loads(
        cli("search", "Intro", "--book", "runbooks", "--limit", "10", "--json").stdout
    )
    point = next(h["id"] for h in hits if h["source_file"] == "disk.md")
    traced = json.loads(cli("lineage", point, "--book", "runbooks", "--json").stdout)
    etag = s3.client().head_object(Bucket=bucket, Key="runbooks/disk.md")["ETag"].strip('"')
    assert (traced["source_version"], traced["file_changed_since_indexed"]) == (etag, False)
    assert traced["file_path"] == f"s3://{bucket}/runbooks/disk.md"

    s3.client().delete_object(Bucket=bucket, Key="runbooks/network.md")
    deleted = cli.ingest()["runbooks"]
    assert (deleted["files_deleted"], deleted["files_modified"]) == (1, 0)
    assert deleted["points"] < points

    since = len(s3.requests)
    again = cli.ingest(fresh=True)  # a process started from scratch, as a user's
    assert {b: r["status"] for b, r in again.items()} == {
        "runbooks": "unchanged",
        "handbook": "unchanged",
    }
    # an unchanged bucket costs one listing per book, not a download of every object
    assert s3.downloads(since) == []
    assert sorted(r.path for r in s3.requests[since:]) == [f"/{bucket}", f"/{bucket}"]


@pytest.mark.integration
@pytest.mark.slow
def test_a_bad_s3_source_fails_its_book_only_and_loses_nothing(s3, tmp_path) -> None:
    good, unreadable = new_bucket(s3), new_bucket(s3)
    put(s3, good, "a.md", page("A"))
    put(s3, unreadable, "b.md", page("B"))
    dead = f"http://127.0.0.1:{closed_port()}"
    books = {
        "good": {"s3": f"s3://{good}/", "endpoint_url": s3.url},
        "denied": {"s3": f"s3://{unreadable}/", "endpoint_url": s3.url},
        "offline": {"s3": f"s3://{good}/", "endpoint_url": dead},
    }
    cli = S3Cli(tmp_path, books)
    s3.unreadable_buckets.add(unreadable)
    try:
        report = cli.ingest(code=1)
    finally:
        s3.unreadable_buckets.discard(unreadable)
    assert report["good"]["status"] == "ingested"
    assert report["denied"]["status"] == "failed"
    assert report["offline"]["status"] == "failed"
    (denied,) = report["denied"]["error_messages"]
    assert f"s3://{unreadable}/" in denied and "AccessDenied" in denied
    (offline,) = report["offline"]["error_messages"]
    assert f"s3://{good}/ at {dead}" in offline and "cannot connect" in offline

    # credentials refused: every book fails with the reason, nothing indexed is lost
    put(s3, good, "a.md", page("A", seed="edited"))
    s3.refused_keys.add("refused")
    try:
        refused = cli.ingest(env={"AWS_ACCESS_KEY_ID": "refused"}, code=1)
    finally:
        s3.refused_keys.discard("refused")
    assert refused["good"]["status"] == "failed"
    assert "InvalidAccessKeyId" in refused["good"]["error_messages"][0]
    search = cli("search", "Intro", "--book", "good", "--json")
    assert search.returncode == 0 and json.loads(search.stdout), search.stderr

    # the next run retries: the readable books are ingested (the edit, the denied book)
    cli.declare({b: s for b, s in books.items() if b != "offline"})
    after = cli.ingest()
    assert after["good"]["files_modified"] == 1 and after["good"]["status"] == "ingested"
    assert after["denied"]["files_new"] == 1 and after["denied"]["status"] == "ingested"

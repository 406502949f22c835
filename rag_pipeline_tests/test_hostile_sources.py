"""Hostile probes of git and object-store books (``rag_pipeline/sources/``): odd repositories,
odd object keys, sources that fail part-way. Each probe drives the production source classes
in-process (a real git CLI on a local repository, a real S3-compatible server)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rag_pipeline_tests.gitbooks import NEEDS_GIT, GitRepo
from rag_pipeline_tests.s3server import AWS, FOREIGN_AWS, S3Server

LFS_POINTER = (
    "version https://git-lfs.github.com/spec/v1\n"
    "oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n"
    "size 12345\n"
)


def git_source(tmp_path: Path, repo: GitRepo, **spec: str) -> Any:
    from rag_pipeline.sources.git import GitBookSpec, GitSource

    return GitSource(
        {"gb": GitBookSpec(git=str(repo.path), **spec)},
        cache_dir=tmp_path / "cache",
        max_file_bytes=1_000_000,
    )


# -- git books -----------------------------------------------------------------------------


@pytest.mark.integration  # git processes
@NEEDS_GIT
def test_git_links_out_of_the_repo_and_to_another_file_are_refused_not_read(tmp_path):
    repo = GitRepo(tmp_path / "repo")
    repo.commit("pages", {"a.md": "# A\n\ntext\n"})
    os.symlink("/etc/passwd", repo.path / "passwd.md")
    os.symlink("a.md", repo.path / "alias.md")
    os.symlink("../../outside.md", repo.path / "up.md")
    repo.commit("links")
    source = git_source(tmp_path, repo)
    versions = source.versions("gb")
    assert [f.source_file for f in versions.files] == ["a.md"]
    refused = {e.source_file: e.reason for e in versions.errors}
    assert set(refused) == {"alias.md", "passwd.md", "up.md"}
    assert all("symbolic link" in r for r in refused.values())


@pytest.mark.integration  # git processes
@NEEDS_GIT
def test_a_huge_git_blob_is_refused_without_reading_it_into_memory(tmp_path):
    import tracemalloc

    from rag_pipeline.sources.base import SourceReadError

    repo = GitRepo(tmp_path / "repo")
    (repo.path / "huge.md").write_bytes(b"# Huge\n\n" + b"word " * 2_400_000)  # 12 MB
    repo.commit("huge", {"small.md": "# S\n\ntext\n"})
    source = git_source(tmp_path, repo)
    versions = source.versions("gb")
    huge = next(f for f in versions.files if f.source_file == "huge.md")
    tracemalloc.start()
    try:
        with pytest.raises(SourceReadError, match="too large"):
            source.read("gb", huge, versions.boundary)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4_000_000, f"refusing a 12 MB blob took {peak / 1e6:.0f} MB"
    # the reader is still in step: the next blob reads whole
    small = next(f for f in versions.files if f.source_file == "small.md")
    assert source.read("gb", small, versions.boundary) == b"# S\n\ntext\n"
    source.close()


@pytest.mark.integration  # git processes
@NEEDS_GIT
def test_an_empty_repository_and_a_deleted_ref_fail_the_book_naming_it(tmp_path):
    from rag_pipeline.sources.base import BookUnavailableError

    empty = GitRepo(tmp_path / "empty")
    source = git_source(tmp_path, empty, ref="main")
    with pytest.raises(BookUnavailableError) as caught:
        source.versions("gb")
    assert str(empty.path) in str(caught.value) and "main" in str(caught.value)
    assert source.is_gone("gb", "a.md") is False  # nothing taken for deleted

    repo = GitRepo(tmp_path / "repo")
    repo.commit("first", {"a.md": "# A\n\ntext\n"})
    repo.git("branch", "release")
    source = git_source(tmp_path, repo, ref="release")
    assert [f.source_file for f in source.versions("gb").files] == ["a.md"]
    repo.git("branch", "-D", "release")
    with pytest.raises(BookUnavailableError, match="release"):
        source.versions("gb")
    assert source.is_gone("gb", "a.md") is False
    assert "release" in source.why_unreadable("gb", "a.md")
    source.close()


@pytest.mark.integration  # git processes
@NEEDS_GIT
def test_a_book_folder_replaced_by_a_file_or_removed_fails_the_book_deletes_nothing(tmp_path):
    from rag_pipeline.sources.base import BookUnavailableError

    repo = GitRepo(tmp_path / "repo")
    repo.commit("first", {"docs/a.md": "# A\n\ntext\n", "README.md": "# R\n"})
    source = git_source(tmp_path, repo, path="docs")
    assert [f.source_file for f in source.versions("gb").files] == ["a.md"]
    repo.git("rm", "-r", "--quiet", "docs")
    repo.commit("docs becomes a file", {"docs": "not a folder\n"})
    with pytest.raises(BookUnavailableError, match="no folder 'docs'"):
        source.versions("gb")
    assert source.is_gone("gb", "a.md") is False
    (repo.path / "docs").unlink()
    repo.commit("docs removed")
    with pytest.raises(BookUnavailableError, match="no folder 'docs'"):
        source.versions("gb")
    source.close()


@pytest.mark.integration  # git processes
@NEEDS_GIT
def test_a_force_push_and_a_case_only_rename_are_followed_by_blob_id(tmp_path):
    repo = GitRepo(tmp_path / "repo")
    repo.commit("first", {"Guide.md": "# G\n\none\n", "b.md": "# B\n\nb\n"})
    source = git_source(tmp_path, repo)
    first = source.versions("gb")
    repo.git("mv", "Guide.md", "guide.md")
    second_sha = repo.commit("case-only rename")
    second = source.versions("gb")
    assert [f.source_file for f in second.files] == ["b.md", "guide.md"]
    assert second.files[1].key == first.files[0].key  # same blob: nothing to embed
    # a rewritten history: the branch reset to a new root commit
    repo.git("checkout", "--quiet", "--orphan", "rewritten")
    repo.git("rm", "-r", "--quiet", "--cached", ".")
    for p in repo.path.glob("*.md"):
        p.unlink()
    repo.commit("rewritten", {"c.md": "# C\n\nc\n"})
    repo.git("branch", "-M", "rewritten", "main")
    third = source.versions("gb")
    assert [f.source_file for f in third.files] == ["c.md"] and third.revision != second_sha
    said = source.revision_range("gb", second_sha, third.revision)
    assert said is not None and "history rewritten" in said
    source.close()


def test_an_lfs_pointer_is_a_per_file_error_not_indexed_as_text():
    """A file that is only a Git LFS pointer (a clone or bucket without ``git lfs pull``) is not
    the document: indexing its pointer text would serve 'oid sha256:...' as the content."""
    from rag_pipeline.ingest.parse import parse_document
    from rag_pipeline.models import FileError

    parsed = parse_document("b", "big.md", LFS_POINTER.encode(), "h")
    assert isinstance(parsed, FileError), parsed
    assert "LFS" in parsed.reason and parsed.source_file == "big.md"
    crlf = LFS_POINTER.replace("\n", "\r\n").encode()  # a Windows checkout (core.autocrlf)
    assert isinstance(parse_document("b", "big.md", crlf, "h"), FileError)
    # a page that only quotes a pointer is a page
    quoted = "# LFS\n\nA pointer looks like this:\n\n```\n" + LFS_POINTER + "```\n"
    assert not isinstance(parse_document("b", "doc.md", quoted.encode(), "h"), FileError)


# -- object-store books ----------------------------------------------------------------------


def bucket_with(s3: S3Server, keys: dict[str, bytes]) -> str:
    import uuid

    bucket = f"books-{uuid.uuid4().hex[:12]}"
    s3.client().create_bucket(Bucket=bucket)
    for key, body in keys.items():
        s3.client().put_object(Bucket=bucket, Key=key, Body=body)
    return bucket


def s3_source(s3: S3Server, bucket: str, prefix: str = "docs/") -> Any:
    from rag_pipeline.sources.s3 import S3BookSpec, S3Source

    return S3Source({"sb": S3BookSpec(s3=f"s3://{bucket}/{prefix}", endpoint_url=s3.url)})


def test_odd_object_keys_are_named_errors_and_never_leave_the_prefix(s3, aws):
    bucket = bucket_with(
        s3,
        {
            "docs/a.md": b"# A\n\ntext\n",
            "docs/a.md/b.md": b"# AB\n\ntext\n",  # a key beside a "folder" of the same name
            "docs/caf\u00e9 \u65e5\u672c.md": b"# U\n\ntext\n",
            "docs/../escape.md": b"# E\n\ntext\n",
            "docs/x/./dot.md": b"# D\n\ntext\n",
            "docs//lead.md": b"# L\n\ntext\n",
            "docs/tab\tname.md": b"# N\n\ntext\n",
            "escape.md": b"# outside the prefix\n",
        },
    )
    source = s3_source(s3, bucket)
    versions = source.versions("sb")
    names = [f.source_file for f in versions.files]
    assert names == ["a.md", "a.md/b.md", "caf\u00e9 \u65e5\u672c.md", "tab\tname.md"]
    refused = {e.source_file: e.reason for e in versions.errors}
    assert set(refused) == {"../escape.md", "x/./dot.md", "/lead.md"}, refused
    assert all("docs/" in r for r in refused.values())  # the key is named
    for f in versions.files:
        assert source.read("sb", f, versions.boundary).startswith(b"# ")


def test_a_listing_that_fails_mid_way_fails_the_book_and_deletes_nothing(s3, aws):
    from botocore.exceptions import ClientError

    from rag_pipeline.sources.base import BookUnavailableError

    bucket = bucket_with(s3, {f"docs/p{i:04d}.md": b"# P\n\ntext\n" for i in range(3)})
    source = s3_source(s3, bucket)
    real = source.client(source.books["sb"])

    class Client:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def get_paginator(self, name: str) -> Any:
            class Pages:
                def paginate(self, **kwargs: Any) -> Iterator[dict[str, Any]]:
                    pages = real.get_paginator(name).paginate(**kwargs, MaxKeys=1)
                    for n, page in enumerate(pages):
                        if n == 1:
                            raise ClientError(
                                {"Error": {"Code": "InternalError", "Message": "We are sorry"}},
                                "ListObjectsV2",
                            )
                        yield page

            return Pages()

    source._clients[(s3.url, None)] = Client()
    with pytest.raises(BookUnavailableError) as caught:
        source.versions("sb")
    assert "sb" in str(caught.value) and "InternalError" in str(caught.value)
    assert f"s3://{bucket}/docs/" in str(caught.value)


def test_missing_credentials_and_a_wrong_endpoint_fail_the_book_naming_source_and_reason(
    s3, monkeypatch
):
    from rag_pipeline.sources.base import BookUnavailableError
    from rag_pipeline.sources.s3 import S3BookSpec, S3Source
    from rag_pipeline_tests.s3server import closed_port

    for var in (*AWS, *FOREIGN_AWS, "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    bucket = bucket_with(s3, {"docs/a.md": b"# A\n"})
    source = s3_source(s3, bucket)
    with pytest.raises(BookUnavailableError) as caught:
        source.versions("sb")
    assert "'sb'" in str(caught.value) and "credentials" in str(caught.value)
    assert source.is_gone("sb", "a.md") is False

    for var, value in AWS.items():
        monkeypatch.setenv(var, value)
    dead = f"http://127.0.0.1:{closed_port()}"
    wrong = S3Source({"sb": S3BookSpec(s3=f"s3://{bucket}/docs/", endpoint_url=dead)})
    with pytest.raises(BookUnavailableError) as caught:
        wrong.versions("sb")
    assert dead in str(caught.value) and "connect" in str(caught.value)
    assert wrong.is_gone("sb", "a.md") is False


def test_a_listing_beyond_the_prefix_lists_no_other_books_objects(s3, aws):
    """A server (or a proxy) that answers keys outside the prefix asked for: they are named
    as errors, never listed as this book's files under a mangled name."""
    bucket = bucket_with(s3, {"docs/a.md": b"# A\n", "other/secret.md": b"# S\n"})
    source = s3_source(s3, bucket)
    real = source.client(source.books["sb"])

    class Client:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def get_paginator(self, name: str) -> Any:
            class Pages:
                def paginate(self, **kwargs: Any) -> Iterator[dict[str, Any]]:
                    kwargs["Prefix"] = ""  # the prefix ignored
                    yield from real.get_paginator(name).paginate(**kwargs)

            return Pages()

    source._clients[(s3.url, None)] = Client()
    versions = source.versions("sb")
    assert [f.source_file for f in versions.files] == ["a.md"]
    assert [e.source_file for e in versions.errors] == ["other/secret.md"]
    assert "outside the book's prefix" in versions.errors[0].reason


# -- bad input in any book ---------------------------------------------------------------------


def test_frontmatter_surrogate_escapes_never_sink_the_book(tmp_path):
    """YAML (and JSON) ``\\u`` escapes can make half of a UTF-16 pair, which is no character
    and cannot be encoded as UTF-8: the store refused the whole book's write for one such
    title (a TypeError). A pair is its character; a lone half is U+FFFD with a warning naming
    the file; every file of the book is indexed."""
    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline.ingest.parse import parse_document
    from rag_pipeline.models import FileError
    from rag_pipeline_tests.conftest import make_pipeline, make_recipe, store_config

    pair = '---\ntitle: "smile \\ud83d\\ude00"\ntags: ["\\ud83d\\ude00"]\n---\n# T\n\nbody\n'
    parsed = parse_document("b", "pair.md", pair.encode(), "h")
    assert not isinstance(parsed, FileError)
    assert parsed.meta.title == "smile \U0001f600" and not parsed.warnings
    lone = '---\ntitle: "half \\ud800"\nmodule: "\\udfff"\n"\\ud801": x\n---\n# T\n\nbody\n'
    parsed = parse_document("b", "lone.md", lone.encode(), "h")
    assert not isinstance(parsed, FileError)
    assert parsed.meta.title == "half \ufffd" and parsed.meta.module == "\ufffd"
    assert any("surrogate" in w for w in parsed.warnings), parsed.warnings
    json_fm = '{\n"title": "\\ud800"\n}\n# T\n\nbody\n'
    parsed = parse_document("b", "json.md", json_fm.encode(), "h")
    assert not isinstance(parsed, FileError) and parsed.meta.title == "\ufffd"

    books = tmp_path / "books"
    (books / "b").mkdir(parents=True)
    (books / "b" / "pair.md").write_text(pair)
    (books / "b" / "lone.md").write_text(lone)
    (books / "b" / "plain.md").write_text("# Plain\n\nplain text\n")
    pipeline = make_pipeline(books, store_config(tmp_path / "q"), make_recipe(HashEmbedder()))
    written = pipeline.run(["b"], run_id="r")["b"].written
    assert written.documents == 3


def test_lineage_of_an_object_whose_reads_are_denied_says_it_exists_and_why(s3, aws):
    """A bucket that lists but denies reads: the object is there (nothing about it is gone),
    its hash cannot be known, and the problem names the book and the reason."""
    bucket = bucket_with(s3, {"docs/a.md": b"# A\n\ntext\n"})
    source = s3_source(s3, bucket)
    s3.unreadable_buckets.add(bucket)
    try:
        now = source.file_now("sb", "a.md")
    finally:
        s3.unreadable_buckets.discard(bucket)
    assert (now.exists, now.sha256) == (True, None)
    assert now.problem is not None and "AccessDenied" in now.problem and "'sb'" in now.problem
    assert source.file_now("sb", "a.md").sha256 is not None
    assert source.file_now("sb", "gone.md").exists is False


def test_lineage_says_unknown_not_changed_when_the_source_cannot_be_read(s3, aws, tmp_path):
    """Lineage of a point of a book whose objects cannot be read now: whether its file changed
    is unknown (null), with the reason; it said the file changed."""
    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline.ingest.pipeline import IngestPipeline
    from rag_pipeline.resources import StoreOpener
    from rag_pipeline.retrieve.lineage import describe_point, read_point
    from rag_pipeline.schema import book_filter
    from rag_pipeline.sources.base import ParseOptions
    from rag_pipeline_tests.conftest import make_recipe, store_config

    bucket = bucket_with(s3, {"docs/a.md": b"# A\n\nsome text to index\n"})
    source = s3_source(s3, bucket)
    opener = StoreOpener(store_config(tmp_path / "q"))
    recipe = _fixed(make_recipe(HashEmbedder()))
    pipeline = IngestPipeline(source, opener, recipe, parsing=ParseOptions())
    pipeline.run(["sb"], run_id="r")
    with opener.open() as store:
        point = next(iter(store.scroll(book_filter("sb")))).id
        record = read_point(store, "sb", str(point))
    assert record is not None
    assert describe_point(record, source, "sb")["file_changed_since_indexed"] is False
    s3.unreadable_buckets.add(bucket)
    try:
        info = describe_point(record, source, "sb")
    finally:
        s3.unreadable_buckets.discard(bucket)
    assert info["file_exists"] is True and info["file_changed_since_indexed"] is None
    assert "AccessDenied" in info["file_problem"]


def _fixed(recipe: Any) -> Any:
    from rag_pipeline.recipes.choice import FixedRecipe

    return FixedRecipe(recipe)

"""Hostile probes of git and object-store books, as a data engineer meets them: odd names and
keys, tree entries that are not files, refs of every kind, a rewritten or moved remote, a URL
holding credentials, a git environment left by a hook, a listing in many pages, objects
replaced or deleted between the listing and the read, books whose prefixes share a start.

Each probe drives the product's path: the source classes with the real git CLI and a real
S3-compatible server (moto, :mod:`.s3server`), the ingest pipeline over them, or the CLI in
this process (:class:`~rag_pipeline_tests.helpers.InProcessCli`). For each: a bad entry is an
error naming the file and the reason, the rest of the book is ingested, nothing indexed is
lost, a re-run changes nothing and the index equals a clean build.
"""

from __future__ import annotations

import json
import os
import shutil
import unicodedata
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rag_pipeline_tests.gitbooks import NEEDS_GIT, GitRepo, write_sources
from rag_pipeline_tests.helpers import InProcessCli, assert_no_trace
from rag_pipeline_tests.s3server import AWS, S3Server

SECRET = "s3cr3t-T0KEN-9f8e7d"
NFC = unicodedata.normalize("NFC", "caf\u00e9.md")
NFD = unicodedata.normalize("NFD", "caf\u00e9.md")
#: names a tree or a bucket may hold, each a file of its own
ODD_NAMES = [
    "with space.md",
    NFC,
    NFD,
    "-leading-dash.md",
    "--option=x.md",
    "new\nline.md",
    "tab\tname.md",
    "日本語/ページ.md",
    "x.md/inside.md",  # a folder named like a Markdown file
    "back\\slash.md",
    "colon:and@at.md",
    "a+b.md",  # what a URL's encoding changes (an object key travels in one)
    "100%.md",
    "a%20b.md",
    "q?x#y&z=.md",
]
#: the names a bucket of the test server takes (its HTTP path cannot hold a control character)
KEY_NAMES = [n for n in ODD_NAMES if n.isprintable()]


def page(name: str) -> str:
    """A page of its own text (a point id per name)."""
    return f"# {name}\n\nThe page {name!r} says {uuid.uuid5(uuid.NAMESPACE_URL, name)}.\n"


def pipeline_of(source: Any, store: Path) -> Any:
    """The ingest pipeline over ``source`` writing the embedded store at ``store``."""
    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline.ingest.pipeline import IngestPipeline
    from rag_pipeline.recipes.choice import FixedRecipe
    from rag_pipeline.resources import StoreOpener
    from rag_pipeline.sources.base import ParseOptions
    from rag_pipeline_tests.conftest import make_recipe, store_config

    opener = StoreOpener(store_config(store))
    return IngestPipeline(
        source, opener, FixedRecipe(make_recipe(HashEmbedder())), parsing=ParseOptions()
    )


def points(pipeline: Any, book: str) -> dict[str, set[str]]:
    """source_file -> the ids of its points (chunks and document record)."""
    from rag_pipeline.schema import book_filter

    out: dict[str, set[str]] = {}
    with pipeline.store.open() as store:
        for record in store.scroll(book_filter(book)):
            out.setdefault(str(record.payload.get("source_file")), set()).add(str(record.id))
    return out


def clean_build(source: Any, store: Path, book: str) -> dict[str, set[str]]:
    pipeline = pipeline_of(source, store)
    pipeline.run([book], run_id="clean")
    return points(pipeline, book)


def errors_of(run: Any) -> dict[str, str]:
    """source_file -> reason of every per-file error of a book's run."""
    return {e.source_file: e.reason for e in (*run.inventory.crawl_errors, *run.parsed.errors)}


# -- git books -------------------------------------------------------------------------------


def git_source(tmp_path: Path, url: str, **spec: str) -> Any:
    from rag_pipeline.sources.git import GitBookSpec, GitSource

    return GitSource({"gb": GitBookSpec(git=url, **spec)}, cache_dir=tmp_path / "cache")


@pytest.fixture(scope="module")
def odd_repo(tmp_path_factory: pytest.TempPathFactory) -> GitRepo:
    repo = GitRepo(tmp_path_factory.mktemp("odd") / "repo")
    repo.commit("odd names", {name: page(name) for name in ODD_NAMES})
    return repo


@NEEDS_GIT
@pytest.mark.integration  # git processes
@pytest.mark.parametrize("name", ODD_NAMES, ids=ascii)
def test_an_odd_git_file_name_is_its_own_file_read_exactly(tmp_path, odd_repo, name):
    """Spaces, NFC beside NFD, a leading dash, a newline, a folder named ``x.md``: each name
    is listed as the tree holds it and reads its own blob (never normalised into another)."""
    source = git_source(tmp_path, str(odd_repo.path))
    versions = source.versions("gb")
    assert sorted(f.source_file for f in versions.files) == sorted(ODD_NAMES)
    (file,) = [f for f in versions.files if f.source_file == name]
    assert source.read("gb", file, versions.boundary) == page(name).encode()
    source.close()


@NEEDS_GIT
@pytest.mark.integration  # git processes
def test_odd_names_and_entries_that_are_not_files_ingest_the_rest_and_equal_a_clean_build(
    tmp_path,
):
    """A non-UTF-8 name, symlinks out of the repository, to the host and to a sibling, a
    submodule (gitlink): each a per-file error naming it, never read; every other file is
    ingested (NFC and NFD names as two documents); a re-run does nothing; a clean build of
    the same tree is the same index; a search never finds the host file's text."""
    repo = GitRepo(tmp_path / "repo")
    outside = tmp_path / "host-secret.md"
    outside.write_text("# Host\n\nhostsecretword lives outside the repository\n")
    repo.write({f"docs/{n}": page(n) for n in ODD_NAMES})
    (repo.path / os.fsdecode(b"docs/latin1-\xe9.md")).write_text("# L\n\nlatin\n")
    os.symlink(str(outside), repo.path / "docs/host.md")
    os.symlink("../../host-secret.md", repo.path / "docs/up.md")
    os.symlink("with space.md", repo.path / "docs/alias.md")
    os.symlink("/etc", repo.path / "docs/etc.md")
    commit = repo.commit("pages and links")
    repo.git("update-index", "--add", "--cacheinfo", f"160000,{commit},docs/sub.md")
    repo.git("update-index", "--add", "--cacheinfo", f"160000,{commit},docs/vendor")
    repo.git("commit", "--quiet", "-m", "submodules")  # (add --all would drop them)
    source = git_source(tmp_path, str(repo.path), path="docs")
    pipeline = pipeline_of(source, tmp_path / "q")
    run = pipeline.run(["gb"], run_id="first")["gb"]
    errors = errors_of(run)
    assert set(errors) == {"latin1-\\xe9.md", "host.md", "up.md", "alias.md", "etc.md", "sub.md"}
    assert "not valid UTF-8" in errors["latin1-\\xe9.md"]
    assert all("symbolic link" in errors[n] for n in ("host.md", "up.md", "alias.md", "etc.md"))
    assert "submodule" in errors["sub.md"]
    indexed = points(pipeline, "gb")
    assert set(indexed) == set(ODD_NAMES)
    assert indexed[NFC].isdisjoint(indexed[NFD])
    again = pipeline.run(["gb"], run_id="again")["gb"]
    assert again.outcome.result.embedded == 0 and again.outcome.result.deleted == 0
    assert points(pipeline, "gb") == indexed
    assert clean_build(source, tmp_path / "clean", "gb") == indexed
    from rag_pipeline.schema import book_filter

    with pipeline.store.open() as store:
        texts = [str(r.payload.get("text", "")) for r in store.scroll(book_filter("gb"))]
    assert not any("hostsecretword" in t for t in texts)
    source.close()


#: a ref as a sources file may name it -> the commit it names (of the repository below)
REFS = {
    "main": "second",
    "refs/heads/main": "second",
    "heads/main": "second",  # git's short names of a ref
    "tags/v1-light": "first",
    "v1-light": "first",
    "v1-annotated": "first",
    "released": "side",  # a tag of a tag, on no branch
    "SHA": "first",
    "UPPER-SHA": "first",  # git takes a sha in either case
    "SHORT-SHA-ON-A-TAG-ONLY": "side",
}


@NEEDS_GIT
@pytest.mark.integration  # git processes
@pytest.mark.parametrize("ref", sorted(REFS))
def test_a_git_ref_may_be_a_branch_a_tag_or_a_sha(tmp_path, ref):
    """Every name git gives a commit: branches, tags (lightweight, annotated, a tag of a tag),
    their short names (``heads/main``, ``tags/v1``), a sha in either case, a short sha of a
    commit only a tag reaches. (An upper-case sha and the last two were refused: "no
    branch, tag or commit".)"""
    repo = GitRepo(tmp_path / "repo")
    commits = {"first": repo.commit("first", {"a.md": page("a")})}
    repo.git("tag", "v1-light")
    repo.git("tag", "-a", "-m", "release", "v1-annotated")
    repo.git("checkout", "--quiet", "-b", "side")
    commits["side"] = repo.commit("side", {"s.md": page("s")})
    repo.git("tag", "-a", "-m", "inner", "inner")
    repo.git("tag", "-a", "-m", "released", "released", "inner")
    repo.git("checkout", "--quiet", "main")
    repo.git("branch", "-D", "side")
    commits["second"] = repo.commit("later", {"b.md": page("b")})
    named = {
        "SHA": commits["first"],
        "UPPER-SHA": commits["first"].upper(),
        "SHORT-SHA-ON-A-TAG-ONLY": commits["side"][:10],
    }.get(ref, ref)
    source = git_source(tmp_path, str(repo.path), ref=named)
    versions = source.versions("gb")
    assert versions.revision == commits[REFS[ref]]
    expected = {"first": ["a.md"], "side": ["a.md", "s.md"], "second": ["a.md", "b.md"]}
    assert [f.source_file for f in versions.files] == expected[REFS[ref]]
    source.close()


@NEEDS_GIT
@pytest.mark.integration  # git processes
def test_a_tag_of_a_tree_fails_the_book_naming_the_ref(tmp_path):
    from rag_pipeline.sources.base import BookUnavailableError

    repo = GitRepo(tmp_path / "repo")
    repo.commit("first", {"a.md": page("a")})
    repo.git("tag", "tree-tag", "HEAD^{tree}")
    source = git_source(tmp_path, str(repo.path), ref="tree-tag")
    with pytest.raises(BookUnavailableError) as caught:
        source.versions("gb")
    assert str(repo.path) in str(caught.value) and "tree-tag" in str(caught.value)
    assert source.is_gone("gb", "a.md") is False
    source.close()


@NEEDS_GIT
@pytest.mark.integration  # git processes
def test_git_books_whose_paths_share_a_start_or_look_like_patterns_stay_apart(tmp_path):
    """``docs`` never takes ``docs-old``'s files; a ``path`` is a folder's name, never a
    pattern (``d*``, ``:(top)``) nor a link of the tree (never followed): no such folder is the
    book's failure, nothing else is read."""
    from rag_pipeline.sources.base import BookUnavailableError
    from rag_pipeline.sources.git import GitBookSpec, GitSource

    repo = GitRepo(tmp_path / "repo")
    os.symlink("docs", repo.path / "alias")  # a link in the tree where the book's folder is
    first = repo.commit("two books", {"docs/a.md": page("a"), "docs-old/b.md": page("b")})
    repo.git("mv", "docs-old/b.md", "docs-old/c.md")
    second = repo.commit("rename in the other book")
    specs = {
        name: GitBookSpec(git=str(repo.path), path=path)
        for name, path in [
            ("docs", "docs"),
            ("old", "docs-old"),
            ("glob", "d*"),
            ("top", ":(top)"),
            ("alias", "alias"),
            ("through", "alias/sub"),
        ]
    }
    source = GitSource(specs, cache_dir=tmp_path / "cache")
    assert [f.source_file for f in source.versions("docs").files] == ["a.md"]
    assert [f.source_file for f in source.versions("old").files] == ["c.md"]
    assert "renamed" not in (source.revision_range("docs", first, second) or "")
    for book, path in (("glob", "d*"), ("top", ":(top)"), ("alias", "alias"), ("through", "alias")):
        with pytest.raises(BookUnavailableError, match="no folder"):
            source.versions(book)
        assert path in source.why_unreadable(book, "a.md")
    source.close()


@NEEDS_GIT
@pytest.mark.integration  # git processes
def test_a_git_environment_left_by_a_hook_never_redirects_the_cache_repository(
    tmp_path, monkeypatch
):
    """A CLI started from a git hook or a work tree inherits GIT_DIR, GIT_WORK_TREE,
    GIT_OBJECT_DIRECTORY (a pre-receive hook's quarantine), GIT_INDEX_FILE, GIT_NAMESPACE:
    they sent the cache repository's git commands elsewhere (the book failed: "GIT_WORK_TREE
    not allowed without GIT_DIR"). The book reads its own repository whatever is set."""
    repo = GitRepo(tmp_path / "repo")
    repo.commit("first", {"a.md": page("a")})
    other = GitRepo(tmp_path / "other")
    other.commit("other", {"z.md": page("z")})
    foreign = tmp_path / "foreign-objects"
    foreign.mkdir()
    monkeypatch.setenv("GIT_DIR", str(other.path / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(other.path))
    monkeypatch.setenv("GIT_OBJECT_DIRECTORY", str(foreign))
    monkeypatch.setenv("GIT_INDEX_FILE", str(tmp_path / "index"))
    monkeypatch.setenv("GIT_NAMESPACE", "elsewhere")
    source = git_source(tmp_path, str(repo.path))
    versions = source.versions("gb")
    assert [f.source_file for f in versions.files] == ["a.md"]
    assert source.read("gb", versions.files[0], versions.boundary) == page("a").encode()
    assert not any(foreign.iterdir()) and not (tmp_path / "index").exists()
    source.close()


@NEEDS_GIT
@pytest.mark.integration  # git processes
def test_a_force_push_and_a_moved_remote_reuse_every_unchanged_file(tmp_path):
    """History rewritten (the indexed commit no longer an ancestor): the run embeds only the
    changed file and equals a clean build; the remote moved (a clone elsewhere, declared
    anew): same blob ids, nothing embedded, nothing deleted."""
    from rag_pipeline.sources.git import GitBookSpec, GitSource

    repo = GitRepo(tmp_path / "repo")
    repo.commit("first", {"a.md": page("a"), "b.md": page("b"), "c.md": page("c")})
    source = git_source(tmp_path, str(repo.path), ref="main")
    pipeline = pipeline_of(source, tmp_path / "q")
    pipeline.run(["gb"], run_id="first")
    repo.git("checkout", "--quiet", "--orphan", "rewritten")
    repo.commit("rewritten", {"b.md": page("b edited")})
    repo.git("branch", "-M", "rewritten", "main")
    run = pipeline.run(["gb"], run_id="rewritten")["gb"]
    assert (run.outcome.result.files_modified, run.outcome.result.files_new) == (1, 0)
    indexed = points(pipeline, "gb")
    assert clean_build(source, tmp_path / "clean", "gb") == indexed
    source.close()

    moved = tmp_path / "moved.git"
    shutil.copytree(repo.path / ".git", moved)
    elsewhere = GitSource({"gb": GitBookSpec(git=str(moved))}, cache_dir=tmp_path / "cache")
    again = pipeline_of(elsewhere, tmp_path / "q").run(["gb"], run_id="moved")["gb"]
    assert (again.outcome.result.embedded, again.outcome.result.deleted) == (0, 0)
    assert points(pipeline, "gb") == indexed
    elsewhere.close()


# -- credentials in URLs (git and object-store books) -------------------------------------------


CREDENTIAL_ENTRIES = {
    "git-unreachable": {"git": f"https://reader:{SECRET}@127.0.0.1:9/team/handbook.git"},
    "git-token-only": {"git": f"https://{SECRET}@127.0.0.1:9/team/handbook.git", "ref": "v2"},
    "git-ssh": {"git": f"ssh://git:{SECRET}@127.0.0.1:9/team/handbook.git"},
}


@pytest.mark.integration  # git processes
@pytest.mark.parametrize("entry", sorted(CREDENTIAL_ENTRIES))
def test_credentials_in_a_repository_url_are_never_shown(tmp_path, data_dir, entry):
    """A repository URL holding a password or token: plan, ingest's report, the error and
    lineage's location name the repository without it (they printed it whole)."""
    spec = CREDENTIAL_ENTRIES[entry]
    cli = InProcessCli(tmp_path, data_dir)
    cli.env["RAG_SOURCES"] = str(write_sources(tmp_path / "sources.yaml", {"gb": spec}))
    plan = cli("plan", "--json", check=False)
    ingest = cli("ingest", "--json", check=False)
    for done in (plan, ingest):
        assert SECRET not in done.stdout + done.stderr, done.stdout + done.stderr
        assert_no_trace(done.stderr)
    report = json.loads(ingest.stdout)["books"]["gb"]
    assert ingest.returncode == 1 and report["status"] == "failed"
    (message,) = report["error_messages"]
    assert "***@127.0.0.1:9/team/handbook.git" in message
    assert json.loads(plan.stdout)["books"]["gb"]["source"]["location"].startswith(
        spec["git"].split("://")[0] + "://***@127.0.0.1:9/"
    )


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ({"git": f"https://u:{SECRET}@host/r.git", "ref": "bad..ref"}, "ref"),
        ({"git": f"-https://u:{SECRET}@host/r.git"}, "git"),
        (
            {"s3": "s3://team-docs/x/", "endpoint_url": f"http://key:{SECRET}@127.0.0.1:9"},
            "endpoint_url",
        ),
        ({"s3": f"https://key:{SECRET}@team-docs/x/"}, "s3"),
    ],
)
def test_a_bad_entry_holding_credentials_is_exit_2_without_them(tmp_path, data_dir, entry, field):
    """A refused entry is named with its field, never with the URL's credentials; an
    endpoint URL holding credentials is refused (they belong in AWS_* variables)."""
    cli = InProcessCli(tmp_path, data_dir)
    cli.env["RAG_SOURCES"] = str(write_sources(tmp_path / "sources.yaml", {"gb": entry}))
    done = cli("plan", check=False)
    assert done.returncode == 2, done
    assert f"field '{field}'" in done.stderr and SECRET not in done.stderr, done.stderr


def test_a_yaml_error_near_a_url_with_credentials_never_shows_them(tmp_path, data_dir):
    sources = tmp_path / "sources.yaml"
    sources.write_text(f"books:\n  gb: {{git: https://u:{SECRET}@host/r.git, ref: [main}}\n")
    cli = InProcessCli(tmp_path, data_dir)
    cli.env["RAG_SOURCES"] = str(sources)
    done = cli("plan", check=False)
    assert done.returncode == 2 and "not valid YAML" in done.stderr
    assert SECRET not in done.stderr


def test_the_shown_location_of_a_git_book_has_no_credentials(tmp_path):
    from rag_pipeline.sources.git import GitBookSpec, GitSource

    url = f"https://reader:{SECRET}@git.example.com/team/handbook.git"
    source = GitSource({"gb": GitBookSpec(git=url, path="docs")}, cache_dir=tmp_path)
    shown = [
        source.locate("gb", "a.md"),
        json.dumps(source.describe("gb")),
        source.books["gb"].where,
        repr(source),
        source.description,
    ]
    assert not any(SECRET in s for s in shown), shown
    assert source.locate("gb", "a.md") == (
        "https://***@git.example.com/team/handbook.git@HEAD:docs/a.md"
    )


# -- object-store books ------------------------------------------------------------------------


def new_bucket(s3: S3Server, keys: dict[str, bytes]) -> str:
    bucket = f"books-{uuid.uuid4().hex[:12]}"
    client = s3.client()
    client.create_bucket(Bucket=bucket)
    for key, body in keys.items():
        client.put_object(Bucket=bucket, Key=key, Body=body)
    return bucket


def s3_source(s3: S3Server, books: dict[str, str]) -> Any:
    from rag_pipeline.sources.s3 import S3BookSpec, S3Source

    return S3Source({b: S3BookSpec(s3=url, endpoint_url=s3.url) for b, url in books.items()})


ODD_KEYS = {
    "docs/../escape.md": "an empty, '.' or '..' path part",
    "docs//double.md": "an empty, '.' or '..' path part",
    "docs/./dot.md": "an empty, '.' or '..' path part",
    "docs/trailing.md/": None,  # a folder marker: no file, no error
    "docs/guide/": None,
}


def test_odd_object_keys_ingest_the_rest_and_equal_a_clean_build(s3, aws, tmp_path):
    """Keys with ``..``, ``//``, ``./``: each an error naming the key; folder markers (even
    one named ``trailing.md/``) are no files; NFC beside NFD, a key that is also a folder
    prefix (``x.md`` and ``x.md/inside.md``): files of their own. A re-run does nothing; a
    clean build is the same index; a key outside the prefix is never this book's."""
    keys = {f"docs/{n}": page(n).encode() for n in KEY_NAMES}
    keys.update({k: b"# odd\n\nodd key\n" for k in ODD_KEYS})
    keys["docs/x.md"] = page("x.md").encode()  # a file, and the folder of x.md/inside.md
    keys["docs-old/other.md"] = b"# other tenant\n\nothertenantword\n"
    bucket = new_bucket(s3, keys)
    source = s3_source(s3, {"sb": f"s3://{bucket}/docs"})
    pipeline = pipeline_of(source, tmp_path / "q")
    run = pipeline.run(["sb"], run_id="first")["sb"]
    errors = errors_of(run)
    expected = {k[len("docs/") :]: why for k, why in ODD_KEYS.items() if why}
    assert set(errors) == set(expected)
    for name, why in expected.items():
        assert why in errors[name] and f"docs/{name}" in errors[name]
    indexed = points(pipeline, "sb")
    assert set(indexed) == {*KEY_NAMES, "x.md"}
    assert indexed[NFC].isdisjoint(indexed[NFD])
    again = pipeline.run(["sb"], run_id="again")["sb"]
    assert (again.outcome.result.embedded, again.outcome.result.deleted) == (0, 0)
    assert clean_build(source, tmp_path / "clean", "sb") == indexed


def test_a_listing_of_many_pages_is_the_whole_book(s3, aws, tmp_path):
    """A server that answers a few keys a page (as any may): every page is the book's."""
    keys = {f"docs/p{i:03d}.md": page(f"p{i}").encode() for i in range(23)}
    bucket = new_bucket(s3, keys)
    source = s3_source(s3, {"sb": f"s3://{bucket}/docs/"})
    s3.page_size = 5
    try:
        since = len(s3.requests)
        versions = source.versions("sb")
    finally:
        s3.page_size = None
    assert [f.source_file for f in versions.files] == sorted(k[5:] for k in keys)
    assert sum(r.is_listing for r in s3.requests[since:]) == 5


def test_books_whose_prefixes_share_a_start_stay_apart(s3, aws, tmp_path):
    """``docs`` and ``docs-old`` (declared without a trailing slash): each book holds its own
    prefix's files only, in the index too."""
    bucket = new_bucket(
        s3,
        {
            "docs/a.md": page("a").encode(),
            "docs-old/b.md": page("b").encode(),
            "docsx.md": b"# x\n",
        },
    )
    source = s3_source(s3, {"docs": f"s3://{bucket}/docs", "old": f"s3://{bucket}/docs-old"})
    pipeline = pipeline_of(source, tmp_path / "q")
    pipeline.run(["docs", "old"], run_id="first")
    assert set(points(pipeline, "docs")) == {"a.md"}
    assert set(points(pipeline, "old")) == {"b.md"}
    assert source.file_now("docs", "../docs-old/b.md").exists is False


class _Racing:
    """An S3 client whose first ``get_object`` of ``key`` first lets ``change`` happen to the
    object (a writer between the listing and the read)."""

    def __init__(self, real: Any, key: str, change: Any) -> None:
        self.real, self.key, self.change, self.done = real, key, change, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def get_object(self, **kwargs: Any) -> Any:
        if kwargs["Key"] == self.key and not self.done:
            self.done = True
            self.change()
        return self.real.get_object(**kwargs)


@pytest.fixture
def racing_book(s3, aws, tmp_path) -> Iterator[tuple[Any, Any, str]]:
    """(source, pipeline, bucket): book ``sb`` of three pages, indexed."""
    bucket = new_bucket(s3, {f"docs/{n}.md": page(n).encode() for n in ("a", "b", "c")})
    source = s3_source(s3, {"sb": f"s3://{bucket}/docs/"})
    pipeline = pipeline_of(source, tmp_path / "q")
    pipeline.run(["sb"], run_id="first")
    yield source, pipeline, bucket


@pytest.mark.parametrize("change", ["replaced", "deleted"])
def test_an_object_changed_between_the_listing_and_the_read(s3, racing_book, tmp_path, change):
    """Replaced (same key, new ETag): an error naming the file, its indexed points kept, the
    next run reads it. Deleted: the file is gone, its points deleted, the rest untouched. The
    index then equals a clean build."""
    source, pipeline, bucket = racing_book
    before = points(pipeline, "sb")
    client = s3.client()
    for n in ("a", "b"):  # every listed version moves: each is read in the run
        client.put_object(Bucket=bucket, Key=f"docs/{n}.md", Body=page(n + " v2").encode())

    def race() -> None:
        if change == "replaced":
            client.put_object(Bucket=bucket, Key="docs/a.md", Body=page("a v3").encode())
        else:
            client.delete_object(Bucket=bucket, Key="docs/a.md")

    spec = source.books["sb"]
    source._clients[(spec.endpoint_url, spec.region)] = _Racing(
        source.client(spec), "docs/a.md", race
    )
    run = pipeline.run(["sb"], run_id="raced")["sb"]
    after = points(pipeline, "sb")
    assert after["c.md"] == before["c.md"] and after["b.md"] != before["b.md"]
    if change == "replaced":
        assert "replaced while it was read" in errors_of(run)["a.md"]
        assert after["a.md"] == before["a.md"]  # the last good version stays searchable
        again = pipeline.run(["sb"], run_id="next")["sb"]
        assert again.outcome.result.files_modified == 1 and not errors_of(again)
    else:
        assert "a.md" not in after and "a.md" not in errors_of(run)
    assert points(pipeline, "sb") == clean_build(source, tmp_path / "clean", "sb")


def test_aws_secrets_are_never_shown_when_the_store_refuses_them(s3, tmp_path, data_dir):
    """Refused credentials and an unreachable endpoint: the failure names the book, the URL
    and the reason, never the secret key."""
    from rag_pipeline_tests.s3server import FOREIGN_AWS, closed_port

    bucket = new_bucket(s3, {"docs/a.md": page("a").encode()})
    dead = f"http://127.0.0.1:{closed_port()}"
    books = {
        "refused": {"s3": f"s3://{bucket}/docs/", "endpoint_url": s3.url},
        "offline": {"s3": f"s3://{bucket}/docs/", "endpoint_url": dead},
    }
    cli = InProcessCli(tmp_path, data_dir)
    cli.env.update({**AWS, "AWS_ACCESS_KEY_ID": "refusedkey", "AWS_SECRET_ACCESS_KEY": SECRET})
    for var in FOREIGN_AWS:
        cli.env.pop(var, None)
    cli.env["RAG_SOURCES"] = str(write_sources(tmp_path / "sources.yaml", books))
    s3.refused_keys.add("refusedkey")
    try:
        done = cli("ingest", "--json", check=False)
    finally:
        s3.refused_keys.discard("refusedkey")
    assert SECRET not in done.stdout + done.stderr
    report = json.loads(done.stdout)["books"]
    assert "InvalidAccessKeyId" in report["refused"]["error_messages"][0]
    assert dead in report["offline"]["error_messages"][0]
    assert "cannot connect" in report["offline"]["error_messages"][0]


@NEEDS_GIT
@pytest.mark.integration  # git processes
def test_an_indexed_file_turned_into_a_link_out_keeps_its_points_and_is_never_followed(tmp_path):
    """A committed page replaced by a symlink to a file of the host: an error naming it, its
    indexed points kept, the host file never read (search, lineage); lineage says why the
    file is not there. The page put back: the index equals a clean build."""
    from rag_pipeline.retrieve.lineage import describe_point, read_point
    from rag_pipeline.schema import book_filter

    outside = tmp_path / "host-secret.md"
    outside.write_text("# Host\n\nhostsecretword\n")
    repo = GitRepo(tmp_path / "repo")
    repo.commit("pages", {"a.md": page("a"), "b.md": page("b")})
    source = git_source(tmp_path, str(repo.path))
    pipeline = pipeline_of(source, tmp_path / "q")
    pipeline.run(["gb"], run_id="first")
    before = points(pipeline, "gb")
    (repo.path / "a.md").unlink()
    os.symlink(str(outside), repo.path / "a.md")
    repo.commit("a.md now a link to the host")
    run = pipeline.run(["gb"], run_id="linked")["gb"]
    assert "symbolic link" in errors_of(run)["a.md"]
    assert points(pipeline, "gb") == before
    with pipeline.store.open() as store:
        records = list(store.scroll(book_filter("gb")))
        assert not any("hostsecretword" in str(r.payload.get("text", "")) for r in records)
        kept = next(r for r in records if r.payload.get("source_file") == "a.md")
        record = read_point(store, "gb", str(kept.id))
    assert record is not None
    info = describe_point(record, source, "gb")
    assert info["file_exists"] is False and "symbolic link" in str(info["file_problem"])
    assert "hostsecretword" not in json.dumps(info, default=str)
    (repo.path / "a.md").unlink()
    repo.commit("a.md back", {"a.md": page("a")})
    pipeline.run(["gb"], run_id="back")
    assert points(pipeline, "gb") == before == clean_build(source, tmp_path / "clean", "gb")
    source.close()


@NEEDS_GIT
@pytest.mark.integration  # git processes
@pytest.mark.parametrize("fault", ["ref deleted", "remote gone", "path now a file"])
def test_a_git_book_that_cannot_be_read_fails_alone_and_loses_nothing(tmp_path, fault):
    """After a first ingest: the branch deleted, the repository moved away, the book's folder
    replaced by a file. The run fails the book naming the repository and the reason, every
    indexed point stays; once repaired, a re-run changes nothing."""
    from rag_pipeline.sources.base import BookUnavailableError

    repo = GitRepo(tmp_path / "repo")
    repo.commit("pages", {"docs/a.md": page("a"), "docs/b.md": page("b")})
    repo.git("branch", "release")
    source = git_source(tmp_path, str(repo.path), ref="release", path="docs")
    pipeline = pipeline_of(source, tmp_path / "q")
    pipeline.run(["gb"], run_id="first")
    before = points(pipeline, "gb")
    if fault == "ref deleted":
        repo.git("branch", "-D", "release")
        said = "release"
    elif fault == "remote gone":
        repo.path.rename(tmp_path / "away")
        said = "not appear to be a git repository"
    else:
        repo.git("checkout", "--quiet", "release")
        repo.git("rm", "-r", "--quiet", "docs")
        repo.commit("docs a file", {"docs": "not a folder\n"})
        said = "no folder 'docs'"
    with pytest.raises(BookUnavailableError) as failed:  # (a Dagster run fails the book)
        pipeline.run(["gb"], run_id="failed")
    assert said in str(failed.value) and str(repo.path) in str(failed.value)
    assert points(pipeline, "gb") == before
    if fault == "ref deleted":
        repo.git("branch", "release", "main")
    elif fault == "remote gone":
        (tmp_path / "away").rename(repo.path)
    else:
        repo.git("reset", "--quiet", "--hard", "HEAD~1")
    again = pipeline.run(["gb"], run_id="again")["gb"].outcome.result
    assert (again.status, again.embedded, again.deleted) in {
        ("unchanged", 0, 0),
        ("ingested", 0, 0),
    }
    assert points(pipeline, "gb") == before
    source.close()


@NEEDS_GIT
@pytest.mark.integration  # git processes
def test_first_looks_at_a_git_book_at_once_share_its_cache_repository(tmp_path):
    """A sensor tick, an ``ingest`` and live mode looking at a new git book at once (here
    six sources in threads, each as a process of its own would): every look lists the book.
    They collided on git's lock files ("could not lock config file", "cannot copy ...
    hooks: File exists") and the loser's book failed."""
    from concurrent.futures import ThreadPoolExecutor

    repo = GitRepo(tmp_path / "repo")
    repo.commit("pages", {f"p{i}.md": page(str(i)) * 20 for i in range(200)})

    def look(n: int) -> str:
        source = git_source(tmp_path / f"round{n // 6}", str(repo.path))
        try:
            return f"{len(source.versions('gb').files)} files"
        except Exception as exc:
            return f"failed: {exc}"
        finally:
            source.close()

    with ThreadPoolExecutor(6) as pool:
        looks = list(pool.map(look, range(36)))  # six rounds of six on a new cache
    assert looks == ["200 files"] * 36, [s for s in looks if "failed" in s][:3]


@pytest.mark.integration  # git processes
def test_the_books_sensor_never_shows_a_repository_urls_credentials(tmp_path, data_dir, caplog):
    """The sensor's tick over a git book whose URL holds a token and cannot be reached: its
    run requests, its cursor and its log name the book without the token."""
    import logging

    from rag_pipeline.sources.declared import DeclaredSources
    from rag_pipeline.sources.scan import clear_scan_cache
    from rag_pipeline_tests.conftest import make_source
    from rag_pipeline_tests.test_sensors import Harness

    (data_dir / "notes").mkdir()
    (data_dir / "notes" / "n.md").write_text(page("n"))
    url = CREDENTIAL_ENTRIES["git-unreachable"]["git"]
    sources = write_sources(tmp_path / "sources.yaml", {"gb": {"git": url}})
    clear_scan_cache()
    harness = Harness(data_dir)
    source = DeclaredSources(make_source(data_dir), sources, cache_dir=tmp_path / "cache")
    harness.pipeline = harness.pipeline.with_source(source)
    caplog.set_level(logging.DEBUG)
    shown = []
    for _ in range(2):
        result = harness.tick()
        shown += [repr(result), str(harness.cursor)]
    assert harness.partitions == ["gb", "notes"]
    assert not any(SECRET in s for s in [*shown, caplog.text])


LFS_POINTER = (
    b"version https://git-lfs.github.com/spec/v1\n"
    b"oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n"
    b"size 12345\n"
)


@NEEDS_GIT
@pytest.mark.integration  # git processes
@pytest.mark.parametrize(
    ("content", "said"),
    [
        (LFS_POINTER, "Git LFS pointer"),
        (b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8, "binary"),
        (b"# Huge\n\n" + b"word " * 220_000, "too large"),
    ],
    ids=["lfs-pointer", "binary", "huge"],
)
def test_a_git_page_turned_into_a_pointer_binary_or_huge_blob_keeps_its_points(
    tmp_path, content, said
):
    """A committed page replaced by an LFS pointer, binary bytes or a blob over the size
    limit: an error naming the file and why, its last good points kept, the other pages
    ingested; the page fixed, the index equals a clean build."""
    from rag_pipeline.sources.git import GitBookSpec, GitSource

    repo = GitRepo(tmp_path / "repo")
    repo.commit("pages", {"a.md": page("a"), "b.md": page("b")})
    source = GitSource(
        {"gb": GitBookSpec(git=str(repo.path))},
        cache_dir=tmp_path / "cache",
        max_file_bytes=1_000_000,
    )
    pipeline = pipeline_of(source, tmp_path / "q")
    pipeline.run(["gb"], run_id="first")
    before = points(pipeline, "gb")
    (repo.path / "a.md").write_bytes(content)
    repo.commit("a.md broken", {"b.md": page("b v2"), "c.md": page("c")})
    run = pipeline.run(["gb"], run_id="broken")["gb"]
    assert said in errors_of(run)["a.md"], errors_of(run)
    after = points(pipeline, "gb")
    assert after["a.md"] == before["a.md"] and set(after) == {"a.md", "b.md", "c.md"}
    repo.commit("a.md fixed", {"a.md": page("a v2")})
    pipeline.run(["gb"], run_id="fixed")
    assert points(pipeline, "gb") == clean_build(source, tmp_path / "clean", "gb")
    source.close()


def test_a_prefix_with_spaces_and_unicode_and_a_whole_bucket_book(s3, aws):
    """A prefix with a space and an accent is a book like any; a book of the whole bucket
    names a key with a leading ``/`` (an empty first part) as an error, never as a file."""
    bucket = new_bucket(
        s3,
        {
            "my docs/caf\u00e9/a.md": page("a").encode(),
            "/lead.md": page("lead").encode(),
            "top.md": page("top").encode(),
        },
    )
    source = s3_source(
        s3, {"spaced": f"s3://{bucket}/my docs/caf\u00e9", "whole": f"s3://{bucket}"}
    )
    spaced = source.versions("spaced")
    assert [f.source_file for f in spaced.files] == ["a.md"] and not spaced.errors
    assert source.read("spaced", spaced.files[0], spaced.boundary) == page("a").encode()
    whole = source.versions("whole")
    assert [f.source_file for f in whole.files] == ["my docs/caf\u00e9/a.md", "top.md"]
    assert [e.source_file for e in whole.errors] == ["/lead.md"]
    assert "'/lead.md'" in whole.errors[0].reason


@pytest.mark.parametrize("region", ["us-east-1\n", "not a region!", "-east"])
def test_a_bad_region_is_exit_2_naming_the_field(tmp_path, data_dir, region):
    """A region botocore refuses was a failure of every run; one with a newline went into a
    request header and botocore's error quoted the signed header (the access key id and the
    signature) in the book's failure. Both are refused when settings are read."""
    cli = InProcessCli(tmp_path, data_dir)
    entry = {"s3": "s3://team-docs/x/", "endpoint_url": "http://127.0.0.1:9", "region": region}
    cli.env["RAG_SOURCES"] = str(write_sources(tmp_path / "sources.yaml", {"sb": entry}))
    done = cli("plan", check=False)
    assert done.returncode == 2 and "field 'region'" in done.stderr, done.stderr


def test_an_http_clients_error_never_shows_the_request_signature(s3, aws):
    """An HTTP client's error quoting the signed Authorization header: the book's failure
    names the book and the reason with the credential and signature masked."""
    from botocore.exceptions import HTTPClientError

    from rag_pipeline.sources.base import BookUnavailableError

    bucket = new_bucket(s3, {"docs/a.md": b"# A\n"})
    source = s3_source(s3, {"sb": f"s3://{bucket}/docs/"})
    real = source.client(source.books["sb"])
    header = (
        f"AWS4-HMAC-SHA256 Credential=AKIAEXAMPLEKEY/20260101/us-east-1/s3/aws4_request, "
        f"SignedHeaders=host, Signature={SECRET}"
    )

    class Client:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def get_paginator(self, name: str) -> Any:
            raise HTTPClientError(error=f"Invalid header value b'{header}'")

    source._clients[(s3.url, None)] = Client()
    with pytest.raises(BookUnavailableError) as caught:
        source.versions("sb")
    said = str(caught.value)
    assert "'sb'" in said and "Invalid header value" in said
    assert SECRET not in said and "AKIAEXAMPLEKEY" not in said


@NEEDS_GIT
@pytest.mark.integration  # git processes
def test_the_cli_over_a_git_book_of_odd_names_and_links(tmp_path, data_dir):
    """``ingest``, ``plan``, ``search`` and ``lineage`` as a user runs them over a git book of
    odd names and a link to a file of the host: the link is an error naming it, every odd
    name is found and traced to its commit and blob, a second ``plan`` says unchanged, and
    the host file's text is never found."""
    repo = GitRepo(tmp_path / "repo")
    (tmp_path / "host.md").write_text("# Host\n\nhostsecretword\n")
    repo.write({n: page(n) for n in ODD_NAMES})
    os.symlink(str(tmp_path / "host.md"), repo.path / "host.md")
    commit = repo.commit("odd names")
    cli = InProcessCli(tmp_path, data_dir)
    cli.env["RAG_SOURCES"] = str(
        write_sources(tmp_path / "sources.yaml", {"gb": {"git": str(repo.path)}})
    )
    done = cli("ingest", "--json", check=False)
    assert_no_trace(done.stderr)
    report = json.loads(done.stdout)["books"]["gb"]
    assert report["files_new"] == len(ODD_NAMES), report
    (error,) = report["error_messages"]
    assert "host.md" in error and "symbolic link" in error
    assert json.loads(cli("plan", "--json").stdout)["books"]["gb"]["action"] == "unchanged"
    assert cli.json("search", "hostsecretword", "--book", "gb", "--mode", "sparse") == []
    for name in ("new\nline.md", NFD, "-leading-dash.md"):
        word = str(uuid.uuid5(uuid.NAMESPACE_URL, name))
        hits = cli.json("search", word, "--book", "gb", "--mode", "sparse")
        assert hits and hits[0]["source_file"] == name, (name, hits[:1])
        traced = cli.json("lineage", hits[0]["id"], "--book", "gb")
        assert traced["source_revision"] == commit and traced["source_file"] == name
        assert traced["source_version"] == repo.git("rev-parse", f"HEAD:{name}")
        assert traced["file_changed_since_indexed"] is False


@NEEDS_GIT
@pytest.mark.integration  # git processes
@pytest.mark.parametrize("left", ["a ref's lock (a fetch killed)", "config.lock (an init killed)"])
def test_a_lock_file_left_by_a_killed_git_in_the_cache_never_blocks_the_book(tmp_path, left):
    """An ingest killed while its git fetched (or made the cache repository) leaves git's
    lock file behind: every later look at the new commit failed the book ("cannot lock ref
    ...: File exists") until someone removed it by hand. The next look removes it."""
    repo = GitRepo(tmp_path / "repo")
    repo.commit("first", {"a.md": page("a")})
    source = git_source(tmp_path, str(repo.path), ref="main")
    source.versions("gb")
    source.close()
    new = repo.commit("second", {"b.md": page("b")})
    (cache,) = (tmp_path / "cache" / "git").glob("*.git")
    if left.startswith("a ref's"):
        (cache / "refs" / "rag" / "tips" / f"{new}.lock").write_text("")
    else:
        (cache / "config").rename(cache / "config.lock")
    again = git_source(tmp_path, str(repo.path), ref="main")
    versions = again.versions("gb")
    assert versions.revision == new and [f.source_file for f in versions.files] == ["a.md", "b.md"]
    assert not list(cache.rglob("*.lock"))
    again.close()


def test_an_s3_books_source_is_described_as_one(s3, aws, tmp_path, data_dir):
    """What ``plan`` and the Dagster UI say an object-store book is: kind ``s3``, its URL and
    its endpoint (the kind said "book")."""
    bucket = new_bucket(s3, {"docs/a.md": page("a").encode()})
    cli = InProcessCli(tmp_path, data_dir)
    cli.env.update(AWS)
    books = {"sb": {"s3": f"s3://{bucket}/docs", "endpoint_url": s3.url}}
    cli.env["RAG_SOURCES"] = str(write_sources(tmp_path / "sources.yaml", books))
    plan = json.loads(cli("plan", "--json").stdout)["books"]["sb"]
    assert plan["source"] == {"kind": "s3", "location": f"s3://{bucket}/docs/", "endpoint": s3.url}

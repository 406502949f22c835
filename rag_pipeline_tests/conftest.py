"""Shared fixtures: embedders, stores on every backend, and throwaway book trees."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import qdrant_edge as qe

if TYPE_CHECKING:
    from rag_pipeline_tests.s3server import S3Server

os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("DAGSTER_DISABLE_TELEMETRY", "1")

FIXTURES = Path(__file__).parent / "fixtures"
CORPUS = FIXTURES / "corpus"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "corpora"
REPO = Path(__file__).resolve().parents[1]


#: a test that starts a process carries one of these marks, so that `make test-fast`
#: (``-m "not slow and not integration"``) never starts one
PROCESS_MARKS = ("slow", "integration")
#: the ways a test process starts another one, patched to refuse in unmarked tests
_SPAWNERS: tuple[tuple[Any, str], ...] = (
    (subprocess.Popen, "__init__"),
    (os, "system"),
    (os, "fork"),
    (os, "posix_spawn"),
    (os, "posix_spawnp"),
)
_STARTED_A_PROCESS = pytest.StashKey[str]()
# The OpenAI client's request headers name the processor, which the standard library learns by
# running `uname -p`, once per process: learnt here, so that no test is charged with it.
platform.processor()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator:
    """A test without a process mark that starts a process (in its fixtures too) fails."""
    if any(item.get_closest_marker(mark) for mark in PROCESS_MARKS):
        return (yield)
    saved = [(owner, name, getattr(owner, name)) for owner, name in _SPAWNERS]

    def refuse(*args: Any, **kwargs: Any) -> Any:
        item.stash[_STARTED_A_PROCESS] = repr(args[1:2] or args[:1])[:200]
        raise AssertionError(
            f"{item.nodeid} starts a process but is not marked slow or integration "
            "(make test-fast runs no process)"
        )

    for owner, name, _ in saved:
        setattr(owner, name, refuse)
    try:
        return (yield)
    finally:
        for owner, name, real in saved:
            setattr(owner, name, real)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Generator:
    """The refusal fails the test even where the code under test caught the error."""
    report: pytest.TestReport = yield
    started = item.stash.get(_STARTED_A_PROCESS, None)
    if started is not None and report.passed and report.when == "call":
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} starts a process ({started}) but is not marked slow or integration"
        )
    return report


def shared_corpus(name: str) -> Path:
    """A corpus under ../shared/corpora, or skip the test with the reason."""
    path = SHARED / name
    if not path.is_dir():
        pytest.skip(f"{path} is absent: this test reads the shared corpora beside the checkout")
    return path


@pytest.fixture(scope="session")
def hash_embedder():
    from rag_pipeline.embed.hashing import HashEmbedder

    return HashEmbedder()


@pytest.fixture(scope="session")
def local_embedder(tmp_path_factory: pytest.TempPathFactory):
    from rag_pipeline.embed.local import LocalEmbedder

    return LocalEmbedder(cache_dir=tmp_path_factory.mktemp("models"))


@pytest.fixture(params=["client", "edge"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator:
    """An empty store on each embedded backend."""
    from rag_pipeline.schema import COLLECTION_SCHEMA
    from rag_pipeline.store.edge import EdgeStore
    from rag_pipeline.store.qdrant import QdrantStore

    backend: object
    if request.param == "client":
        backend = QdrantStore("test_chunks", COLLECTION_SCHEMA, path=":memory:")
    else:
        backend = EdgeStore("test_chunks", tmp_path / "edge", COLLECTION_SCHEMA)
    yield backend
    backend.close()  # type: ignore[attr-defined]


BookWriter = Callable[[str, Mapping[str, str | bytes]], Path]


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    path = tmp_path / "books"
    path.mkdir()
    return path


@pytest.fixture
def write_book(data_dir: Path) -> BookWriter:
    """Write ``{relative path: text or bytes}`` as a book folder under ``data_dir``."""

    def write(book_id: str, files: Mapping[str, str | bytes]) -> Path:
        root = data_dir / book_id
        for rel, content in files.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content, encoding="utf-8")
        root.mkdir(parents=True, exist_ok=True)
        settle_files()
        return root

    return write


#: every asset of the code location, by name (the names the UI and dg list)
ASSET_NAMES = {
    "source_files",
    "documents",
    "chunks",
    "chunk_embeddings",
    "qdrant_points",
    "qdrant_collection",
}


def step_failure(result: Any) -> str:
    """The error of a run's failed step (a materialize() or execute_in_process result)."""
    failure = next(e for e in result.all_events if e.is_step_failure)
    return str(failure.step_failure_data.error.to_string())


def materialized(result: Any) -> set[str]:
    """The assets a run materialized, by name."""
    return {
        e.materialization.asset_key.to_user_string()
        for e in result.get_asset_materialization_events()
    }


def denied(real: Callable[..., Any], suffix: str) -> Callable[..., Any]:
    """``real`` (an open, a hash, a listing), refused with EACCES for a path ending in
    ``suffix``: what an unreadable file or folder gives a user who is not root."""
    import errno

    def call(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path).endswith(suffix):
            raise PermissionError(errno.EACCES, "Permission denied")
        return real(path, *args, **kwargs)

    return call


def settle_files() -> None:
    """Wait until files written just now are past the racy window of change detection
    (:mod:`rag_pipeline.sources.filekeys`): a stat recorded later is one a plan may trust."""
    from rag_pipeline.sources.filekeys import FINE_RACY_NS

    time.sleep(FINE_RACY_NS / 1e9 + 0.01)


@pytest.fixture
def sample_books(data_dir: Path) -> Path:
    """The two sample books the repository ships, copied so tests may edit them."""
    for book in (REPO / "data" / "books").iterdir():
        if book.is_dir():
            shutil.copytree(book, data_dir / book.name)
    return data_dir


def make_source(data_dir: Path, *, max_file_bytes: int = 10 * 1024 * 1024):
    """The book folders under ``data_dir``, as the pipeline reads them."""
    from rag_pipeline.sources.folder import FolderSource

    return FolderSource(Path(data_dir), max_file_bytes=max_file_bytes)


def hash_settings(data_dir: Path | str, tmp_path: Path, **overrides: Any):  # type: ignore[no-untyped-def]
    """Settings of the books of ``data_dir`` with the hash embedder, the store and cache under
    ``tmp_path`` (``overrides``: other settings, by field name)."""
    from rag_pipeline.config import load_settings

    return load_settings(
        data_dir=data_dir,
        qdrant_path=str(tmp_path / "qdrant"),
        embedder="hash",
        cache_dir=tmp_path / "cache",
        **overrides,
    )


def store_config(path: Path | str, embedded: str = "edge", collection: str = "rag_chunks"):
    """The configuration of an embedded store at ``path`` (":memory:" for qdrant-client's)."""
    from rag_pipeline.config import StoreConfig

    return StoreConfig(
        collection=collection,
        path=str(path),
        url=None,
        api_key=None,
        embedded="client" if str(path) == ":memory:" else embedded,  # type: ignore[arg-type]
        busy_wait_s=5.0,
        timeout_s=30.0,
        retries=1,
    )


def make_pipeline(data_dir: Path, store, recipe, **options):  # type: ignore[no-untyped-def]
    """The ingest pipeline over the books of ``data_dir``, writing through ``store`` (a
    StoreOpener, a :class:`StoreView`, or a store config) with ``recipe`` for every book (a
    recipe source, or one recipe), with the default path patterns."""
    from rag_pipeline.config import DEFAULT_PATH_PATTERNS, StoreConfig
    from rag_pipeline.ingest.pipeline import IngestPipeline
    from rag_pipeline.recipes.choice import FixedRecipe
    from rag_pipeline.recipes.recipe import IndexRecipe
    from rag_pipeline.resources import StoreOpener
    from rag_pipeline.sources.base import ParseOptions

    if isinstance(store, StoreView):
        store = store.opener
    elif isinstance(store, StoreConfig):
        store = StoreOpener(store)
    recipes = FixedRecipe(recipe) if isinstance(recipe, IndexRecipe) else recipe
    source = make_source(data_dir, **options)
    return IngestPipeline(source, store, recipes, parsing=ParseOptions(DEFAULT_PATH_PATTERNS, 1))


class StoreView:
    """A store read the way a run's steps read it: each call opens the store through its
    opener (the process's shared handle, kept open between calls while the test runs, as in
    a run) and lets go of it, so the pipeline's own handles (a builder of a recipe on Qdrant
    Edge) never wait for one a test holds. What a call returns lazily is read at once."""

    def __init__(self, opener: Any) -> None:
        self.opener = opener

    def __getattr__(self, name: str) -> Any:
        with self.opener.open() as store:
            value = getattr(store, name)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            with self.opener.open() as store:
                result = getattr(store, name)(*args, **kwargs)
                if isinstance(result, Iterator):
                    result = iter(list(result))
                return result

        return call

    def close(self) -> None:
        """Nothing to close: the opener's handles close when the test ends."""


@pytest.fixture(params=["client", "edge"])
def opened(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreView]:
    """An empty store on each embedded backend, read through its opener (a
    :class:`StoreView`), its handles kept open between uses as a run keeps them."""
    from rag_pipeline.resources import StoreOpener
    from rag_pipeline.store.sharing import kept_open

    path = ":memory:" if request.param == "client" else tmp_path / "edge"
    with kept_open():
        yield StoreView(StoreOpener(store_config(path, collection="test_chunks")))


def make_recipe(embedder, **chunking):  # type: ignore[no-untyped-def]
    """The index recipe of ``embedder`` with a chunk budget (defaults unless given)."""
    from rag_pipeline.config import ChunkingConfig
    from rag_pipeline.recipes.recipe import IndexRecipe

    return IndexRecipe.build(embedder, ChunkingConfig(**chunking))


def write_two_file_books(root: Path, books: Sequence[str]) -> Path:
    """``root/books/<book>/a.md`` and ``b.md`` for each of ``books`` (a section each, the
    words seeded by the book): the data folder."""
    data_dir = root / "books"
    for book in books:
        folder = data_dir / book
        folder.mkdir(parents=True)
        (folder / "a.md").write_text(f"# {book}\n\n" + section("Nodes", seed=book))
        (folder / "b.md").write_text(f"# {book} b\n\n" + section("Topics", seed=book + "b"))
    return data_dir


def break_chunking_of(patcher: Any, book_id: str) -> None:
    """Make the chunker fail for ``book_id`` alone (``patcher``: a monkeypatch or its
    context): a run of that book fails at its chunks step, the others' are untouched."""
    from rag_pipeline.ingest import pipeline as pipeline_module

    real = pipeline_module.chunk_book

    def broken(parsed: Any, recipe: Any) -> Any:
        if parsed.book_id == book_id:
            raise RuntimeError(f"chunker bug on {book_id} (injected)")
        return real(parsed, recipe)

    patcher.setattr(pipeline_module, "chunk_book", broken)


def section(title: str, paragraphs: int = 3, words: int = 40, seed: str = "") -> str:
    """A ``##`` section of plain prose whose size is easy to reason about."""
    body = []
    for p in range(paragraphs):
        body.append(
            " ".join(f"{seed}{title.lower().replace(' ', '')}w{p}x{i}" for i in range(words)) + "."
        )
    return f"## {title}\n\n" + "\n\n".join(body) + "\n"


@pytest.fixture
def loads(monkeypatch) -> Counter[str]:
    """Every ``EdgeShard.load``, counted by the book folder it opened."""
    opened: Counter[str] = Counter()
    original = qe.EdgeShard.load

    def counting(path: str, *args, **kwargs):  # type: ignore[no-untyped-def]
        opened[Path(path).parent.name] += 1
        return original(path, *args, **kwargs)

    monkeypatch.setattr(qe.EdgeShard, "load", staticmethod(counting))
    return opened


@pytest.fixture
def quick_step_retries(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Dagster's step retries in this process wait a hundredth of their policy's delay (the
    assets' RetryPolicy waits 5 s, then 15 s): for a test whose step fails on every attempt,
    where those 20 s of sleep prove nothing. The retries still happen. Returned: the delays
    asked of a policy, in order (Dagster asks on every failed attempt of a step that has one,
    the last included), so a test can check that the shortening was in its path. (The test of
    the policy riding out an outage keeps the real waits; ``quickretry.py`` shortens them in a
    CLI process.)"""
    from dagster import RetryPolicy

    from rag_pipeline_tests.quickretry import shortened

    asked: list[float] = []
    monkeypatch.setattr(
        RetryPolicy, "calculate_delay", shortened(RetryPolicy.calculate_delay, asked.append)
    )
    return asked


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty folder as DAGSTER_HOME (no dagster.yaml: what a command then writes or
    reviews is the test's subject)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def s3() -> Iterator[S3Server]:
    """One S3-compatible server (moto, over HTTP) per test process, shared by every
    object-store test (each takes a bucket of its own)."""
    from rag_pipeline_tests.s3server import S3Server

    server = S3Server()
    yield server
    server.close()


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test credentials of :mod:`rag_pipeline_tests.s3server` in the environment."""
    from rag_pipeline_tests.s3server import use_test_credentials

    use_test_credentials(monkeypatch)

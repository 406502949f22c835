"""Hostile freshness probes of live mode and the books sensor: the index must end equal to a
clean build of the books as they are at the end (nothing searchable that is not on disk),
whatever the writers do while a run of the book is under way.

Live mode runs in process here (:class:`~rag_pipeline.ingest.live.LiveLoop` with its Dagster
``apply``, :class:`~rag_pipeline.defs.live.LiveRuns`, on an ephemeral instance, real folder
notifications, the hash embedder): the code path of ``rag-pipeline watch`` without the cost of
a process. A clean build is the pipeline run over a copy of the books into a fresh store;
point ids are content-derived, so equal id sets are equal indexes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterInstance

from rag_pipeline.config import BatchConfig
from rag_pipeline.defs.live import LiveRuns, _indexed_books
from rag_pipeline.ingest.live import LiveLoop, LiveMark, LiveTiming
from rag_pipeline.ingest.pipeline import IngestPipeline
from rag_pipeline.recipes.recipe import IndexRecipe
from rag_pipeline.schema import book_filter
from rag_pipeline.sources import watch
from rag_pipeline.sources.scan import clear_scan_cache
from rag_pipeline.store.sharing import kept_open
from rag_pipeline_tests.conftest import hash_settings, make_recipe, settle_files
from rag_pipeline_tests.differential import diverging
from rag_pipeline_tests.gitbooks import NEEDS_GIT, GitRepo, write_sources

#: how long a probe waits for the index to equal a clean build
CONVERGE_S = 20.0


def _page(title: str, words: str) -> str:
    return f"# {title}\n\n{words} " * 3 + "\n"


def point_ids(pipeline: IngestPipeline) -> dict[str, set[str]]:
    """Every book's point ids in the pipeline's store."""
    with pipeline.store.open() as store:
        return {b: {r.id for r in store.scroll(book_filter(b), fields=[])} for b in store.tenants()}


class LiveHarness:
    """Live mode in this process over ``root/books`` (and the sources file, if any), and
    clean builds to compare it with."""

    def __init__(
        self,
        root: Path,
        recipe: IndexRecipe,
        sources: Path | None = None,
        instance: DagsterInstance | None = None,
    ) -> None:
        self.root, self.recipe, self.sources = root, recipe, sources
        self.data = root / "books"
        self.data.mkdir(exist_ok=True)
        self.pipeline = self._pipeline(self.data, root / "live")
        self.instance = instance or DagsterInstance.ephemeral()
        self.notes: list[str] = []
        self.reports: list[Any] = []
        home = Path(self.instance.root_directory) if instance else root / "home"
        home.mkdir(exist_ok=True)
        #: the live lock and applied-state map of the home (held while running)
        self.mark = LiveMark(home, self.pipeline.source)
        self.runs = LiveRuns(
            self.pipeline,
            self.instance,
            home,
            BatchConfig(),
            self.notes.append,
            self.reports.append,
        )
        self.calls: list[list[str]] = []
        self.loop = LiveLoop(
            self.pipeline.source,
            self._apply,
            timing=LiveTiming(debounce_s=0.05, idle_look_s=0.5, retry_after_s=0.5),
            save=self.mark.save,
            notify=self.notes.append,
            workers=2,
            indexed=lambda: _indexed_books(self.pipeline),
        )
        self.builds = 0

    def _pipeline(self, data: Path, store: Path) -> IngestPipeline:
        settings = hash_settings(data, store, sources=self.sources)
        return IngestPipeline.from_settings(settings, self.recipe)

    def _apply(self, books: list[str]) -> Any:
        self.calls.append(list(books))
        return self.runs(books)

    @contextlib.contextmanager
    def running(self) -> Iterator[LiveHarness]:
        clear_scan_cache()
        stop, ready = threading.Event(), threading.Event()
        thread = threading.Thread(target=self.loop.run, args=(stop, ready.set), daemon=True)
        with kept_open(), self.mark.hold():
            thread.start()
            try:
                assert ready.wait(30), self.notes
                yield self
            finally:
                stop.set()
                thread.join(30)
                watcher = watch._watchers.pop(os.path.abspath(self.data), None)
                if watcher is not None:
                    watcher.stop()

    def clean_build(self) -> dict[str, set[str]]:
        """The point ids of a clean build of the books as they are now."""
        self.builds += 1
        build = self.root / f"clean-{self.builds}"
        shutil.copytree(self.data, build / "books", symlinks=True)
        pipeline = self._pipeline(build / "books", build / "store")
        with kept_open():
            books = list(pipeline.source.list_books().book_ids)
            if books:
                pipeline.run(books)
            sets = point_ids(pipeline)
        shutil.rmtree(build, ignore_errors=True)
        return {b: ids for b, ids in sets.items() if ids}

    def index(self) -> dict[str, set[str]]:
        return {b: ids for b, ids in point_ids(self.pipeline).items() if ids}

    def converges(self, what: str, timeout: float = CONVERGE_S) -> float:
        """Wait until the live index equals a clean build of the books now (seconds taken)."""
        start = time.monotonic()
        clean = self.clean_build()
        while True:
            ours = self.index()
            if ours == clean and not self.loop.in_hand:
                return time.monotonic() - start
            if time.monotonic() - start > timeout:
                raise AssertionError(
                    f"{what}: not a clean build after {timeout}s: {diverging(ours, clean)}; "
                    f"in hand {self.loop.in_hand}; notes {self.notes[-5:]}"
                )
            time.sleep(0.1)


@pytest.fixture
def harness(tmp_path: Path, hash_embedder: Any) -> LiveHarness:
    live = LiveHarness(tmp_path, make_recipe(hash_embedder))
    for book in ("alpha", "beta"):
        for n in range(3):
            path = live.data / book / f"p{n}.md"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(_page(f"{book} {n}", f"{book} page {n} start"))
    (live.data / "alpha" / "sub").mkdir()
    (live.data / "alpha" / "sub" / "s.md").write_text(_page("sub", "in a subfolder"))
    settle_files()
    return live


# -- folder books: edits while a run of the book is under way -------------------------------


def _rename_over(book: Path) -> None:
    """An editor's atomic save: a temporary file renamed over the page."""
    temp = book / ".p0.md.swp"
    temp.write_text(_page("renamed over", "atomic rename over"))
    os.replace(temp, book / "p0.md")


def _truncate_then_write(book: Path) -> None:
    with open(book / "p1.md", "r+") as f:
        f.truncate(0)
        f.flush()
        os.fsync(f.fileno())
        time.sleep(0.02)
        f.write(_page("rewritten", "truncated then written"))


class _Away:
    """Two-step writers: the first step, then the second (across a run's read, or at once)."""

    def __init__(self) -> None:
        self.kept: dict[str, bytes] = {}


def _folder_away(book: Path, _: _Away) -> None:
    book.rename(book.with_name(".away"))


def _folder_back(book: Path, _: _Away) -> None:
    book.with_name(".away").rename(book)


def _subfolder_away(book: Path, _: _Away) -> None:
    (book / "sub").rename(book / ".sub")


def _subfolder_back(book: Path, _: _Away) -> None:
    (book / ".sub").rename(book / "sub")


def _all_deleted(book: Path, away: _Away) -> None:
    away.kept = {p.name: p.read_bytes() for p in book.glob("*.md")}
    for p in book.glob("*.md"):
        p.unlink()


def _all_restored(book: Path, away: _Away) -> None:
    for name, data in away.kept.items():
        (book / name).write_bytes(data)


def _passing_edit(book: Path, away: _Away) -> None:
    away.kept = {"p0.md": (book / "p0.md").read_bytes()}
    (book / "p0.md").write_text(_page("passing", "a passing edit"))


def _replaced_by_link(book: Path) -> None:
    other = book.parent / ".shelf" / book.name  # a hidden folder is no book
    shutil.copytree(book, other)
    (other / "p2.md").write_text(_page("elsewhere", "behind a link"))
    shutil.rmtree(book)
    book.symlink_to(os.path.join(".shelf", book.name), target_is_directory=True)


def _case_only_rename(book: Path) -> None:
    (book / "p2.md").rename(book / "P2.md")


def _moved_to_other_book(book: Path) -> None:
    (book / "p1.md").rename(book.parent / "beta" / "moved.md")


def _one(write: Callable[[Path], None]) -> list[Callable[[Path, _Away], None]]:
    return [lambda book, _: write(book)]


#: what a writer does to book ``alpha``, step by step (a step pauses 50 ms after the last
#: one when done at once; steps 2.. come after the run's read when "across_the_read")
WRITERS: dict[str, list[Callable[[Path, _Away], None]]] = {
    "rename_over": _one(_rename_over),
    "truncate_then_write": _one(_truncate_then_write),
    "folder_away_and_back": [_folder_away, _folder_back],
    "subfolder_away_and_back": [_subfolder_away, _subfolder_back],
    "replaced_by_link": _one(_replaced_by_link),
    "all_deleted_then_restored": [_all_deleted, _all_restored],
    "case_only_rename": _one(_case_only_rename),
    "moved_to_other_book": _one(_moved_to_other_book),
    "edited_then_reverted": [_passing_edit, _all_restored],
}


def _write(writer: str, book: Path, away: _Away, steps: slice = slice(None)) -> None:
    for n, step in enumerate(WRITERS[writer][steps]):
        if n:
            time.sleep(0.05)
        step(book, away)


#: when the writer hits the book: after a run of it read the files (before it writes), or its
#: first step before that read and the rest after it (two-step writers). A writer done before
#: the run's read is what the look after the run sees; a plain edit during a run is tested by
#: test_live.py, an edit reverted inside one by test_live_process.py
CASES = [
    *(
        (w, "after_the_read")
        for w in (
            "rename_over",
            "truncate_then_write",
            "case_only_rename",
            "moved_to_other_book",
            "replaced_by_link",
        )
    ),
    *((w, "across_the_read") for w in sorted(WRITERS) if len(WRITERS[w]) > 1),
]


def after_the_read_of(live: Any, book_id: str, act: Callable[[], object]) -> threading.Event:
    """Have ``act`` done once, right after the next live run that holds ``book_id`` read its
    files (its parse step): the event is set once it was."""
    parse = live.pipeline.parse
    hit = threading.Event()

    def parse_then_act(inventories: Any) -> Any:
        parsed = parse(inventories)
        if book_id in inventories and not hit.is_set():
            act()
            hit.set()
        return parsed

    live.pipeline.parse = parse_then_act
    return hit


@pytest.mark.slow
@pytest.mark.parametrize(("writer", "moment"), CASES)
def test_a_folder_books_index_ends_as_a_clean_build_whatever_the_writer_does(
    harness: LiveHarness, writer: str, moment: str
) -> None:
    """Each writer hits book ``alpha`` during a live run of it (an edit starts that run);
    the index ends equal to a clean build of what the writer left. A folder moved away and
    back across the run's read moved no file's stat: before the folders' own stat was in the
    look's digest, live mode took that run as having read what its look saw, and the file
    the run could not read kept its old text for good."""
    book = harness.data / "alpha"
    away = _Away()
    hit = threading.Event()
    with harness.running():
        harness.converges("the first catch-up")
        parse = harness.pipeline.parse

        def parse_hit(inventories: Any) -> Any:
            if "alpha" not in inventories or hit.is_set():
                return parse(inventories)
            if moment == "across_the_read":
                _write(writer, book, away, slice(0, 1))
            parsed = parse(inventories)
            _write(writer, book, away, slice(1 if moment == "across_the_read" else 0, None))
            hit.set()
            return parsed

        harness.pipeline.parse = parse_hit  # type: ignore[method-assign]
        # the edit whose run is hit (in the folder the writer moves, if it moves one)
        first = "sub/s.md" if writer.startswith("subfolder") else "p2.md"
        (book / first).write_text(_page("first", "the edit whose run is hit"))
        assert hit.wait(10), harness.notes
        harness.converges(f"{writer} {moment}")


# -- git books: commits, force-pushes, a ref away and back, the sources file edited ----------


def _git_page(n: int, seed: str) -> str:
    return _page(f"git page {n}", f"git {seed} page {n}")


@NEEDS_GIT
@pytest.mark.slow
def test_git_books_follow_commits_force_pushes_refs_and_the_sources_file_under_live_mode(
    tmp_path: Path, hash_embedder: Any
) -> None:
    """Live mode over git books (no notification: each look asks the remote): a new commit,
    a force-push back to an older commit (once during a run of the book, after its read),
    the ref deleted (its points kept, nothing purged) then restored, and the sources file
    edited while it runs (a book added, its ref changed, a book removed): after each the
    index equals a clean build of the refs' trees, within seconds."""
    repo = GitRepo(tmp_path / "repo")
    first = repo.commit("one", {f"docs/p{n}.md": _git_page(n, "one") for n in range(3)})
    repo.git("branch", "stable")
    sources = tmp_path / "sources.yaml"
    write_sources(sources, {"handbook": {"git": str(repo.path), "ref": "main", "path": "docs"}})
    live = LiveHarness(tmp_path, make_recipe(hash_embedder), sources=sources)
    (live.data / "notes").mkdir()
    (live.data / "notes" / "n.md").write_text(_page("notes", "a folder book beside"))
    settle_files()
    took: dict[str, float] = {}
    with live.running():
        took["first"] = live.converges("the first catch-up")
        second = repo.commit("two", {"docs/p1.md": _git_page(1, "two")})
        repo.git("branch", "stale1", second)  # (a name as long as "stable")
        took["commit"] = live.converges("a new commit")
        repo.git("reset", "--hard", "--quiet", first)  # a force-push back
        took["force_push"] = live.converges("a force-push back to an older commit")
        # a commit whose run is hit after its read by a force-push back
        parse = live.pipeline.parse
        hit = after_the_read_of(
            live, "handbook", lambda: repo.git("reset", "--hard", "--quiet", first)
        )
        repo.git("reset", "--hard", "--quiet", second)
        assert hit.wait(10), live.notes
        took["force_push_in_run"] = live.converges("a force-push during the run")
        live.pipeline.parse = parse  # type: ignore[method-assign]
        held = live.index()["handbook"]
        repo.git("update-ref", "-d", "refs/heads/main")
        time.sleep(1.5)  # a few looks: the book fails, its points kept
        assert live.index()["handbook"] == held, "a deleted ref purged the book"
        repo.git("update-ref", "refs/heads/main", second)
        took["ref_restored"] = live.converges("the ref restored at another commit")
        write_sources(
            sources,
            {
                "handbook": {"git": str(repo.path), "ref": "main", "path": "docs"},
                "stable": {"git": str(repo.path), "ref": "stable", "path": "docs"},
            },
        )
        took["entry_added"] = live.converges("a book added to the sources file")
        assert "stable" in live.index()
        write_sources(
            sources,
            {
                "handbook": {"git": str(repo.path), "ref": "stable", "path": "docs"},
                "stable": {"git": str(repo.path), "ref": "stable", "path": "docs"},
            },
        )
        took["ref_changed"] = live.converges("a book's ref changed in the sources file")
        # the file rewritten in place, as long as before, its old times put back (a `cp -p`
        # or an archive's extraction of a config): only its ctime says it changed
        before = sources.stat()
        text = sources.read_text()
        assert text.count("ref: stable") == 2
        sources.write_text(text.replace("ref: stable", "ref: stale1", 1))
        os.utime(sources, ns=(before.st_atime_ns, before.st_mtime_ns))
        took["ref_changed_old_times"] = live.converges("a ref changed, the file's times put back")
        write_sources(sources, {"stable": {"git": str(repo.path), "ref": "main", "path": "docs"}})
        took["entry_removed"] = live.converges("a book removed, another's ref changed")
        assert "handbook" not in live.index()
    print({k: round(v, 2) for k, v in took.items()})


# -- object-store books ----------------------------------------------------------------------


@pytest.mark.slow
def test_object_store_books_follow_objects_replaced_deleted_and_added_under_live_mode(
    tmp_path: Path, hash_embedder: Any, s3: Any, aws: None
) -> None:
    """Live mode over an S3 book (no notification: each look lists the prefix): an object
    replaced (once during a run of the book, after its read), deleted, added, deleted and
    put back with the same bytes: after each the index equals a clean build."""
    import uuid

    bucket = f"books-{uuid.uuid4().hex[:12]}"
    client = s3.client()
    client.create_bucket(Bucket=bucket)

    def put(key: str, text: str) -> None:
        client.put_object(Bucket=bucket, Key=f"run/{key}", Body=text.encode())

    for n in range(3):
        put(f"p{n}.md", _page(f"s3 {n}", f"object {n} one"))
    sources = tmp_path / "sources.yaml"
    write_sources(sources, {"runbooks": {"s3": f"s3://{bucket}/run/", "endpoint_url": s3.url}})
    live = LiveHarness(tmp_path, make_recipe(hash_embedder), sources=sources)
    took: dict[str, float] = {}
    with live.running():
        took["first"] = live.converges("the first catch-up")
        put("p0.md", _page("s3 0", "object 0 replaced"))
        took["replaced"] = live.converges("an object replaced")
        parse = live.pipeline.parse
        hit = after_the_read_of(
            live,
            "runbooks",
            lambda: put("p1.md", _page("s3 1", "object 1 replaced after the read")),
        )
        put("p1.md", _page("s3 1", "object 1 replaced, then again"))
        assert hit.wait(10), live.notes
        took["replaced_in_run"] = live.converges("an object replaced during the run")
        live.pipeline.parse = parse  # type: ignore[method-assign]
        client.delete_object(Bucket=bucket, Key="run/p2.md")
        took["deleted"] = live.converges("an object deleted")
        put("p3.md", _page("s3 3", "a new object"))
        took["added"] = live.converges("a new object")
        kept = client.get_object(Bucket=bucket, Key="run/p0.md")["Body"].read().decode()
        client.delete_object(Bucket=bucket, Key="run/p0.md")
        put("p0.md", kept)
        took["back"] = live.converges("an object deleted and put back with the same bytes")
    print({k: round(v, 2) for k, v in took.items()})


# -- the books sensor ------------------------------------------------------------------------


@pytest.mark.parametrize("moved", ["alpha", "alpha/sub"])
@pytest.mark.parametrize("run_status", ["STARTED", "SUCCESS"])
def test_the_sensor_runs_again_a_book_whose_folder_moved_away_and_back_during_its_run(
    data_dir: Path, write_book: Any, moved: str, run_status: str
) -> None:
    """The sensor's rule for a book written while a run of it was in flight (its stat moved,
    its content digest did not: the run may have read a version in between) applied to a
    folder of the book moved away and back (the run found its files missing): no file's stat
    moves, only the folder's, so before the folders' stat was in the look's digest, the book
    never ran again and kept what that run could not read. A folder moved with no run in
    flight still starts nothing."""
    from dagster import DagsterRunStatus

    from rag_pipeline_tests.test_sensors import Harness, fail_run, requested_books

    clear_scan_cache()
    write_book("alpha", {"a.md": "# A\n\none", "sub/s.md": "# S\n\nsub"})
    write_book("beta", {"b.md": "# B\n\ntwo"})
    settle_files()
    harness = Harness(data_dir)
    harness.tick()
    fail_run(harness.instance, "alpha", DagsterRunStatus[run_status])
    folder = data_dir / moved
    folder.rename(folder.with_name(".away"))
    folder.with_name(".away").rename(folder)
    (data_dir / "beta").rename(data_dir / ".beta")  # a book with no run in flight
    (data_dir / ".beta").rename(data_dir / "beta")
    settle_files()
    result = harness.tick()
    assert requested_books(result, harness.instance) == [["alpha"]]


# -- live mode stopped at a random moment: the sensor takes over, a new start catches up -----


@pytest.mark.slow
@pytest.mark.parametrize("seed", [2])
def test_live_mode_stopped_at_a_random_moment_is_taken_over_by_the_sensor_then_a_new_start(
    tmp_path: Path, hash_embedder: Any, seed: int
) -> None:
    """Live mode (on a Dagster home) stopped a random moment after a burst of edits (the
    SIGTERM path: the runs in hand end, the rest is left "applying"), edits made while no
    live process runs (a folder moved away and back among them); the books sensor of that
    home takes the stopped process's map over and its runs (executed as the daemon would)
    leave a clean build; then more edits and a new live start: a clean build again."""
    import random

    from dagster import SensorResult

    from rag_pipeline.defs.runs import books_of_run
    from rag_pipeline_tests.test_sensors import Harness, ingest_requests

    rng = random.Random(seed)
    (tmp_path / "dagster").mkdir()
    instance = DagsterInstance.local_temp(str(tmp_path / "dagster"))
    recipe = make_recipe(hash_embedder)
    live = LiveHarness(tmp_path, recipe, instance=instance)
    for book in ("alpha", "beta", "gamma"):
        for n in range(3):
            path = live.data / book / f"p{n}.md"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(_page(f"{book} {n}", f"{book} page {n} start"))
    settle_files()

    def edit_some(words: str) -> None:
        for path in rng.sample(sorted(live.data.rglob("*.md")), 4):
            path.write_text(_page(path.stem, f"{words} {rng.random()}"))

    with live.running():
        live.converges("the first catch-up")
        edit_some("burst")
        time.sleep(rng.uniform(0.0, 0.5))  # stopped somewhere in the burst's runs
    edit_some("while stopped")
    (live.data / "beta").rename(live.data / ".beta")
    (live.data / ".beta").rename(live.data / "beta")
    settle_files()
    clear_scan_cache()
    harness = Harness(live.data, instance=instance)
    harness.pipeline = live.pipeline
    result = harness.tick()
    assert isinstance(result, SensorResult), result
    order = instance.get_dynamic_partitions("books")
    for request in ingest_requests(result):  # what the daemon's runs do
        books = (
            [request.partition_key] if request.partition_key else books_of_run(request.tags, order)
        )
        with kept_open():
            live.pipeline.run(books)
    assert live.index() == live.clean_build(), "the sensor's runs left another index"
    edit_some("before the next start")
    again = LiveHarness(tmp_path, recipe, instance=instance)
    with again.running():
        again.converges("a new start's catch-up")


def test_a_sources_file_read_in_its_racy_window_is_read_again_once_settled(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write in the clock tick of a read of the sources file leaves its stat as it was
    (what a coarse clock does to two quick saves of one size): a stat read in its racy window
    is read again once it settles, so the second save is not missed for good."""
    from rag_pipeline.models import FileKey
    from rag_pipeline.sources import declared
    from rag_pipeline.sources.folder import FolderSource

    now = time.time_ns()
    same = FileKey(1, 2, 3, now, now, 0o100644)  # one stat for both saves
    monkeypatch.setattr(declared, "file_key", lambda st: same)
    path = write_sources(tmp_path / "sources.yaml", {"one": {"git": "/srv/a.git"}})
    source = declared.DeclaredSources(FolderSource(data_dir), path, cache_dir=tmp_path / "c")
    assert list(source.declared_books()) == ["one"]
    write_sources(path, {"two": {"git": "/srv/a.git"}})
    later = now + 3_000_000_000  # past the racy window
    monkeypatch.setattr(declared, "now_ns", lambda: later)
    assert list(source.declared_books()) == ["two"]
    write_sources(path, {"three": {"git": "/srv/a.git"}})  # a settled stamp is trusted
    assert list(source.declared_books()) == ["two"]

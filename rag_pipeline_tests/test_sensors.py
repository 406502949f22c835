"""books_sensor on a real temp tree, evaluated with build_sensor_context."""

import json
import os
import time
from pathlib import Path

import pytest
from dagster import (
    AddDynamicPartitionsRequest,
    DagsterInstance,
    DeleteDynamicPartitionsRequest,
    SensorResult,
    SkipReason,
    build_sensor_context,
)

from rag_pipeline.defs import sensors as sensors_module
from rag_pipeline.defs.partitions import BOOKS_PARTITIONS_NAME
from rag_pipeline.defs.sensors import build_books_sensor, read_cursor
from rag_pipeline.sources import scan as scan_module
from rag_pipeline.sources.folder import FolderSource
from rag_pipeline.sources.scan import clear_scan_cache, scan_books


class Harness:
    """Ticks the sensor and applies what the daemon would (partition requests, cursor)."""

    def __init__(self, data_dir, batching=None, watch=False, instance=None):
        # (the watcher is tested on its own: its notifications come a moment after a change)
        self.sensor = build_books_sensor(interval_s=1, batching=batching, watch=watch)
        self.pipeline = sensor_pipeline(data_dir)
        self.instance = instance or DagsterInstance.ephemeral()
        self.cursor = None

    def context(self):
        return build_sensor_context(
            instance=self.instance, cursor=self.cursor, resources={"pipeline": self.pipeline}
        )

    def tick(self):
        context = self.context()
        result = self.sensor(context)
        if isinstance(result, SkipReason):
            self.cursor = context.cursor  # kept by the daemon when the sensor updated it
            return result
        for request in result.dynamic_partitions_requests:
            if isinstance(request, AddDynamicPartitionsRequest):
                self.instance.add_dynamic_partitions(
                    request.partitions_def_name, list(request.partition_keys)
                )
            elif isinstance(request, DeleteDynamicPartitionsRequest):
                for key in request.partition_keys:
                    self.instance.delete_dynamic_partition(request.partitions_def_name, key)
        self.cursor = result.cursor
        return result

    @property
    def partitions(self):
        return sorted(self.instance.get_dynamic_partitions(BOOKS_PARTITIONS_NAME))


def store_busy_at(monkeypatch, check_name):
    """Make the sensor's ``check_name`` (``books_of_other_parse_rules``, ...) find the store
    busy for every book, as while a run holds it; the call it returns ends that."""
    from rag_pipeline.ingest.plan import RulesCheck

    real = getattr(sensors_module, check_name)
    monkeypatch.setattr(
        sensors_module, check_name, lambda store, book_ids, *_: RulesCheck(busy=tuple(book_ids))
    )
    return lambda: monkeypatch.setattr(sensors_module, check_name, real)


def sensor_pipeline(data_dir):
    """The pipeline resource the sensor takes (it reads only its book source)."""
    from rag_pipeline.embed.hashing import HashEmbedder
    from rag_pipeline_tests.conftest import make_pipeline, make_recipe, store_config

    return make_pipeline(data_dir, store_config(":memory:"), make_recipe(HashEmbedder()))


@pytest.fixture
def harness(data_dir):
    clear_scan_cache()
    return Harness(data_dir)


def ingest_requests(result):
    return [r for r in result.run_requests if r.job_name == "ingest_books"]


def requested_books(result, instance):
    """The books of each ingest run requested: one partition, or a batch's range."""
    from rag_pipeline.defs.runs import books_of_run

    order = instance.get_dynamic_partitions(BOOKS_PARTITIONS_NAME)
    return [
        [r.partition_key] if r.partition_key else books_of_run(r.tags, order)
        for r in ingest_requests(result)
    ]


def bump_mtime(path):
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))


def test_new_books_get_partitions_and_share_one_run(harness, write_book):
    write_book("alpha", {"a.md": "# A"})
    write_book("beta", {"b.md": "# B"})
    result = harness.tick()
    assert isinstance(result, SensorResult)
    assert harness.partitions == ["alpha", "beta"]
    assert requested_books(result, harness.instance) == [["alpha", "beta"]]
    (request,) = ingest_requests(result)
    assert request.partition_key is None and request.run_key.startswith("ingest:alpha..beta:")
    assert request.tags["rag/batch"] == "2 books"
    assert request.tags["dagster/max_retries"] == "0"  # a failed batch is split, not retried
    books, seq = read_cursor(harness.cursor)
    assert set(books) == {"alpha", "beta"}
    assert all(len(v) == 2 for v in books.values())  # compact: two digests per book
    assert seq == 1


def test_unchanged_books_skip(harness, write_book):
    write_book("alpha", {"a.md": "# A"})
    harness.tick()
    assert isinstance(harness.tick(), SkipReason)


@pytest.mark.parametrize("racy_at_first", [False, True])
def test_a_tick_that_starts_no_run_is_a_skip_whatever_its_cursor_took_in(
    harness, write_book, data_dir, racy_at_first
):
    """A file whose stat is racy at the first tick (written in the tick of the look: here its
    mtime a moment ahead) settles by the second: the cursor takes the settled stat, and the
    tick is still a skip, not a result with no runs (the UI's "skipped" and its reason)."""
    write_book("alpha", {"a.md": "# A"})
    path = data_dir / "alpha" / "a.md"
    if racy_at_first:
        ahead = time.time_ns() + 300_000_000
        os.utime(path, ns=(ahead, ahead))
    harness.tick()
    first_digest = read_cursor(harness.cursor)[0]["alpha"][0]
    assert (first_digest == "") is racy_at_first
    time.sleep(0.45 if racy_at_first else 0)
    result = harness.tick()
    assert isinstance(result, SkipReason), result
    settled_digest = read_cursor(harness.cursor)[0]["alpha"][0]
    assert settled_digest  # kept: the next tick compares stats and hashes nothing
    states, _ = scan_books(harness.pipeline.source, read_cursor(harness.cursor)[0])
    assert states["alpha"].hashed == 0


def test_editing_a_file_requests_a_run_for_that_book_only(harness, write_book, data_dir):
    write_book("alpha", {"a.md": "# A"})
    write_book("beta", {"b.md": "# B"})
    first = harness.tick()
    (data_dir / "alpha" / "a.md").write_text("# A edited")
    bump_mtime(data_dir / "alpha" / "a.md")
    result = harness.tick()
    requests = ingest_requests(result)
    assert [r.partition_key for r in requests] == ["alpha"]  # a run of its own
    assert requests[0].tags["rag/book"] == "alpha"
    assert requests[0].run_key not in {r.run_key for r in first.run_requests}


def test_touch_without_changing_bytes_starts_no_run(harness, write_book, data_dir):
    write_book("alpha", {"a.md": "# A"})
    harness.tick()
    before = read_cursor(harness.cursor)[0]["alpha"]
    bump_mtime(data_dir / "alpha" / "a.md")
    assert isinstance(harness.tick(), SkipReason)  # the content did not move: nothing runs
    after = read_cursor(harness.cursor)[0]["alpha"]
    assert after[0] != before[0] and after[1] == before[1]  # the cursor took the new stat
    assert isinstance(harness.tick(), SkipReason)


def test_deleting_and_renaming_files(harness, write_book, data_dir):
    write_book("alpha", {"a.md": "# A", "b.md": "# B"})
    harness.tick()
    os.remove(data_dir / "alpha" / "b.md")
    assert [r.partition_key for r in ingest_requests(harness.tick())] == ["alpha"]
    os.rename(data_dir / "alpha" / "a.md", data_dir / "alpha" / "renamed.md")
    assert [r.partition_key for r in ingest_requests(harness.tick())] == ["alpha"]


def test_deleting_a_book_removes_its_partition_and_purges_through_a_run(
    harness, write_book, data_dir
):
    import shutil

    write_book("alpha", {"a.md": "# A"})
    write_book("beta", {"b.md": "# B"})
    harness.tick()
    shutil.rmtree(data_dir / "beta")
    result = harness.tick()
    purges = [r for r in result.run_requests if r.job_name == "purge_book"]
    assert len(purges) == 1
    assert purges[0].run_config == {"ops": {"purge_book_points": {"config": {"book_id": "beta"}}}}
    # the partition goes once no run of the book is in flight (here: at the next tick), and
    # the purge is not requested twice
    assert harness.partitions == ["alpha", "beta"]
    assert read_cursor(harness.cursor)[0]["beta"] == sensors_module.PURGING
    result = harness.tick()
    assert not [r for r in result.run_requests if r.job_name == "purge_book"]
    assert harness.partitions == ["alpha"]
    assert "beta" not in read_cursor(harness.cursor)[0]


def test_a_removed_book_keeps_its_partition_while_a_run_of_it_is_in_flight(
    harness, write_book, data_dir
):
    """Deleting the partition under a running run fails that run's outputs (and its retries):
    the deletion waits until the book's runs are over."""
    import shutil

    from dagster import DagsterRunStatus
    from dagster._core.test_utils import create_run_for_test

    write_book("alpha", {"a.md": "# A"})
    write_book("beta", {"b.md": "# B"})
    harness.tick()
    running = create_run_for_test(
        harness.instance,
        job_name="ingest_books",
        status=DagsterRunStatus.STARTED,
        tags={"dagster/partition": "beta"},
    )
    shutil.rmtree(data_dir / "beta")
    for _ in range(2):
        harness.tick()
        assert harness.partitions == ["alpha", "beta"]
    harness.instance.report_run_failed(running)
    result = harness.tick()
    assert harness.partitions == ["alpha"]
    assert not [r for r in result.run_requests if r.job_name == "purge_book"]


def test_a_book_restored_after_its_purge_runs_again(harness, write_book, data_dir):
    import shutil

    write_book("alpha", {"a.md": "# A"})
    write_book("beta", {"b.md": "# B"})
    first = ingest_requests(harness.tick())
    shutil.rmtree(data_dir / "alpha")
    assert harness.partitions == ["alpha", "beta"]
    harness.tick()  # purge requested
    harness.tick()  # no run of it in flight: partition deleted
    assert harness.partitions == ["beta"]
    write_book("alpha", {"a.md": "# A"})
    again = ingest_requests(harness.tick())
    # same content, but its points were purged: a run key Dagster has seen would be skipped
    assert [r.partition_key for r in again] == ["alpha"]
    assert again[0].run_key != first[0].run_key
    assert harness.partitions == ["alpha", "beta"]


def test_a_reverted_edit_runs_again(harness, write_book, data_dir):
    write_book("alpha", {"a.md": "# A"})
    keys = [harness.tick().run_requests[0].run_key]
    for text in ("# A edited", "# A"):  # edit, then revert to the original bytes
        (data_dir / "alpha" / "a.md").write_text(text)
        bump_mtime(data_dir / "alpha" / "a.md")
        keys.append(ingest_requests(harness.tick())[0].run_key)
    assert len(set(keys)) == 3  # the index holds the edit: going back needs its own run


def test_a_retried_tick_requests_the_same_run_keys(harness, write_book):
    write_book("alpha", {"a.md": "# A"})
    harness.tick()
    write_book("beta", {"b.md": "# B"})
    first = harness.sensor(harness.context())
    clear_scan_cache()
    second = harness.sensor(harness.context())
    # the daemon dedupes a tick that is evaluated twice from the same cursor by run key
    assert [r.run_key for r in first.run_requests] == [r.run_key for r in second.run_requests]


def test_a_missing_data_folder_purges_nothing(harness, write_book, data_dir):
    import shutil

    write_book("alpha", {"a.md": "# A"})
    harness.tick()
    cursor = harness.cursor
    shutil.rmtree(data_dir)
    result = harness.tick()
    assert isinstance(result, SkipReason)
    assert "missing" in result.skip_message
    assert harness.partitions == ["alpha"] and harness.cursor == cursor


def test_an_emptied_data_folder_purges_nothing(harness, write_book, data_dir):
    import shutil

    write_book("alpha", {"a.md": "# A"})
    write_book("beta", {"b.md": "# B"})
    harness.tick()
    shutil.rmtree(data_dir / "alpha")
    shutil.rmtree(data_dir / "beta")
    result = harness.tick()
    assert isinstance(result, SkipReason)
    assert "refusing to purge all 2" in result.skip_message
    assert harness.partitions == ["alpha", "beta"]


def test_a_cursor_of_the_first_format_is_read():
    books = {"alpha": ["s", "c"]}
    assert read_cursor(json.dumps(books)) == (books, 0)
    assert read_cursor(None) == ({}, 0)


def test_unsafe_folder_names_are_refused(harness, write_book):
    write_book("bad name", {"a.md": "# A"})
    write_book("good", {"a.md": "# A"})
    result = harness.tick()
    assert [r.partition_key for r in ingest_requests(result)] == ["good"]
    assert harness.partitions == ["good"]


def test_steady_state_ticks_hash_nothing(harness, write_book, data_dir):
    write_book("alpha", {f"f{i}.md": f"# {i}" for i in range(50)})
    harness.tick()
    source = harness.pipeline.source
    states, _ = scan_books(source, read_cursor(harness.cursor)[0])
    assert states["alpha"].hashed == 0
    (data_dir / "alpha" / "f7.md").write_text("# changed")
    bump_mtime(data_dir / "alpha" / "f7.md")
    states, _ = scan_books(source, read_cursor(harness.cursor)[0])
    assert states["alpha"].hashed == 1  # only the file whose stat moved is read


def test_a_file_vanishing_mid_scan_is_tolerated(harness, write_book, data_dir, monkeypatch):
    write_book("alpha", {"a.md": "# A", "b.md": "# B"})
    from rag_pipeline.sources import folder

    real_hash = folder.hash_file

    def flaky_hash(path, folder, *limit):
        if str(path).endswith("b.md"):
            os.remove(path)
        return real_hash(path, folder, *limit)

    monkeypatch.setattr(folder, "hash_file", flaky_hash)
    result = harness.tick()  # no exception; the book is requested with what could be read
    assert [r.partition_key for r in ingest_requests(result)] == ["alpha"]
    monkeypatch.undo()
    time.sleep(0.01)
    result = harness.tick()  # next tick sees the settled folder
    assert isinstance(result, SensorResult | SkipReason)


def test_a_book_whose_runs_keep_failing_is_retried_after_a_back_off(
    harness, write_book, monkeypatch
):
    from dagster import DagsterRunStatus
    from dagster._core.test_utils import create_run_for_test

    from rag_pipeline.defs.jobs import ingest_books_job

    write_book("alpha", {"a.md": "# A"})
    harness.tick()
    failed = create_run_for_test(
        harness.instance,
        job_name=ingest_books_job.name,
        tags={"dagster/partition": "alpha"},
        status=DagsterRunStatus.FAILURE,
    )
    assert isinstance(harness.tick(), SkipReason)  # failed just now: wait for the back-off
    later = time.time() + sensors_module.RETRY_AFTER_S + 1
    monkeypatch.setattr(sensors_module.time, "time", lambda: later)
    result = harness.tick()
    retries = ingest_requests(result)
    assert [r.partition_key for r in retries] == ["alpha"]
    assert retries[0].tags["rag/trigger"] == "books_sensor_retry"
    assert failed.run_id not in retries[0].run_key


def test_a_garbled_cursor_starts_afresh():
    assert read_cursor("{not json") == ({}, 0)
    assert read_cursor('["a list"]') == ({}, 0)


def test_a_data_folder_holding_none_of_the_known_books_purges_nothing(
    harness, write_book, data_dir
):
    """Every known book gone but another folder there (a wrong mount or RAG_DATA_DIR): no
    purge and no run, tick after tick (a run for the other folder would let the next tick
    purge every known book)."""
    import shutil

    write_book("alpha", {"a.md": "# A"})
    write_book("beta", {"b.md": "# B"})
    harness.tick()
    cursor = harness.cursor
    shutil.rmtree(data_dir / "alpha")
    shutil.rmtree(data_dir / "beta")
    write_book("stray", {"s.md": "# S"})
    for _ in range(2):
        result = harness.tick()
        assert isinstance(result, SkipReason)
        assert "none of the 2 indexed books" in result.skip_message
        assert harness.partitions == ["alpha", "beta"] and harness.cursor == cursor


def fail_run(instance, book_id, status=None):
    """An ingest run of the book that ended (failed, by default) now, or one in flight."""
    from dagster import DagsterEvent, DagsterEventType, DagsterRunStatus
    from dagster._core.test_utils import create_run_for_test

    status = status or DagsterRunStatus.FAILURE
    in_flight = status not in (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE)
    run = create_run_for_test(
        instance,
        job_name="ingest_books",
        tags={"dagster/partition": book_id},
        status=status if in_flight else DagsterRunStatus.STARTED,
    )
    if status == DagsterRunStatus.FAILURE:
        instance.report_run_failed(run)
    elif status == DagsterRunStatus.SUCCESS:  # stamped like a real end (to the microsecond)
        success = DagsterEvent(DagsterEventType.RUN_SUCCESS.value, job_name=run.job_name)
        instance.report_dagster_event(success, run_id=run.run_id)
    return run


_real_time = time.time


def later(monkeypatch, seconds):
    """The sensor's clock set ``seconds`` after now."""
    at = _real_time() + seconds
    monkeypatch.setattr(sensors_module.time, "time", lambda: at)


#: the storage methods that query (schema checks such as has_table are not counted)
QUERIES = ("get_", "fetch_", "has_dynamic_partition")


class StorageCalls:
    """Counts the queries a block makes to the instance's run and event log storage."""

    def __init__(self, instance):
        self.instance = instance
        self.calls: list[str] = []

    def __enter__(self):
        for storage in (self.instance.run_storage, self.instance.event_log_storage):
            for name in dir(type(storage)):
                if name.startswith(QUERIES) and callable(getattr(storage, name, None)):
                    setattr(storage, name, self._counted(name, getattr(storage, name)))
        return self

    def _counted(self, name, method):
        def counted(*args, **kwargs):
            self.calls.append(name)
            return method(*args, **kwargs)

        return counted

    def __exit__(self, *exc):
        for storage in (self.instance.run_storage, self.instance.event_log_storage):
            for name in [n for n in vars(storage) if n.startswith(QUERIES)]:
                delattr(storage, name)


def storage_calls_of_a_busy_tick(tmp_path, books, monkeypatch):
    """A tick at ``books`` books where everything happens: failed books due for a retry (one
    of them with a run queued), a success after a failure, a removed book whose partition
    waits for its purge run."""
    import shutil

    from dagster import DagsterRunStatus

    data_dir = tmp_path / f"books-{books}"
    for i in range(books):
        (data_dir / f"book-{i:03d}").mkdir(parents=True)
        (data_dir / f"book-{i:03d}" / "a.md").write_text(f"# Book {i}")
    clear_scan_cache()
    harness = Harness(data_dir)
    harness.tick()
    for book_id in ("book-001", "book-002", "book-003"):
        fail_run(harness.instance, book_id)
    fail_run(harness.instance, "book-003", DagsterRunStatus.SUCCESS)
    fail_run(harness.instance, "book-002", DagsterRunStatus.STARTED)
    shutil.rmtree(data_dir / "book-004")
    harness.tick()  # the purge is requested; the partition waits for it
    later(monkeypatch, sensors_module.RETRY_AFTER_S + 1)
    with StorageCalls(harness.instance) as counted:
        result = harness.tick()
    assert [r.partition_key for r in ingest_requests(result)] == ["book-001"]
    assert harness.partitions == [f"book-{i:03d}" for i in range(books) if i != 4]
    monkeypatch.undo()
    return sorted(counted.calls)


def test_a_tick_asks_the_instance_the_same_few_questions_whatever_the_number_of_books(
    tmp_path, monkeypatch
):
    """Run history and partitions cost a constant number of storage queries per tick: the
    known partitions, the runs finished since the last tick, the runs in flight."""
    few = storage_calls_of_a_busy_tick(tmp_path, 10, monkeypatch)
    many = storage_calls_of_a_busy_tick(tmp_path, 200, monkeypatch)
    assert few == many, (few, many)
    assert few == ["get_dynamic_partitions", "get_run_records", "get_runs"]


def test_the_back_off_doubles_with_each_failure_and_ends_with_a_success_or_a_run_in_flight(
    harness, write_book, monkeypatch
):
    from dagster import DagsterRunStatus

    write_book("alpha", {"a.md": "# A"})
    harness.tick()
    fail_run(harness.instance, "alpha")
    fail_run(harness.instance, "alpha")  # two in a row: wait 10 minutes, not 5
    later(monkeypatch, sensors_module.RETRY_AFTER_S + 1)
    assert isinstance(harness.tick(), SkipReason)
    later(monkeypatch, 2 * sensors_module.RETRY_AFTER_S + 1)
    assert [r.partition_key for r in ingest_requests(harness.tick())] == ["alpha"]
    monkeypatch.undo()  # (Dagster's clock is time.time too: runs end now)
    running = fail_run(harness.instance, "alpha", DagsterRunStatus.STARTED)
    later(monkeypatch, 3 * sensors_module.RETRY_AFTER_S)
    assert isinstance(harness.tick(), SkipReason)  # a run of it is in flight: it may succeed
    monkeypatch.undo()
    harness.instance.report_run_failed(running)
    later(monkeypatch, 3 * sensors_module.RETRY_AFTER_S)
    assert isinstance(harness.tick(), SkipReason)  # a third failure: 20 minutes
    later(monkeypatch, 4 * sensors_module.RETRY_AFTER_S + 1)
    assert [r.partition_key for r in ingest_requests(harness.tick())] == ["alpha"]
    monkeypatch.undo()
    fail_run(harness.instance, "alpha", DagsterRunStatus.SUCCESS)
    later(monkeypatch, sensors_module.RETRY_AFTER_MAX_S + 1)
    assert isinstance(harness.tick(), SkipReason)
    assert isinstance(harness.tick(), SkipReason)


def test_runs_read_again_by_a_later_tick_are_not_counted_twice(harness, write_book, monkeypatch):
    """Each tick reads again the runs that ended just before the newest it saw (a late commit
    is not missed): a failure read twice is still one failure."""
    write_book("alpha", {"a.md": "# A"})
    harness.tick()
    fail_run(harness.instance, "alpha")
    for _ in range(3):
        harness.tick()
    failed = sensors_module.read_failed_books(harness.cursor)
    assert failed.books["alpha"][1] == 1
    later(monkeypatch, sensors_module.RETRY_AFTER_S + 1)
    assert [r.partition_key for r in ingest_requests(harness.tick())] == ["alpha"]


def test_a_long_run_history_is_read_over_ticks_and_retries_nothing_until_read(
    harness, write_book, monkeypatch
):
    """A cursor without run state (a new sensor over an old instance) reads the history a page
    a tick: a failure early in it is no reason for a run while the rest is unread."""
    from dagster import DagsterRunStatus

    write_book("alpha", {"a.md": "# A"})
    harness.tick()
    fail_run(harness.instance, "alpha")
    fail_run(harness.instance, "alpha")
    fail_run(harness.instance, "alpha", DagsterRunStatus.SUCCESS)
    monkeypatch.setattr(sensors_module, "RUNS_PER_TICK", 2)
    later(monkeypatch, sensors_module.RETRY_AFTER_MAX_S + 1)
    assert isinstance(harness.tick(), SkipReason)  # two failures read, the success not yet
    assert sensors_module.read_failed_books(harness.cursor).books["alpha"][1] == 2
    assert isinstance(harness.tick(), SkipReason)
    assert sensors_module.read_failed_books(harness.cursor).books == {}


def batch_run(instance, books, *, failed_with=None, status=None):
    """An ingest run of a batch (``books``, adjacent partitions): failed (its step with an
    error of class ``failed_with``, if given), or in the given status."""
    from dagster import DagsterEvent, DagsterEventType, DagsterRunStatus
    from dagster._core.execution.plan.objects import StepFailureData
    from dagster._core.test_utils import create_run_for_test
    from dagster._utils.error import SerializableErrorInfo

    from rag_pipeline.defs.runs import batch_tags

    run = create_run_for_test(
        instance,
        job_name="ingest_books",
        tags=batch_tags(books),
        status=status or DagsterRunStatus.STARTED,
    )
    if status is None:
        if failed_with is not None:
            error = SerializableErrorInfo(
                "it broke",
                [],
                "DagsterExecutionStepExecutionError",
                cause=SerializableErrorInfo("down", [], failed_with),
            )
            failure = DagsterEvent(
                DagsterEventType.STEP_FAILURE.value,
                job_name=run.job_name,
                step_key="chunk_embeddings",
                event_specific_data=StepFailureData(error=error, user_failure_data=None),
            )
            instance.report_dagster_event(failure, run_id=run.run_id)
        instance.report_run_failed(run)
    return run


def test_books_changed_together_share_runs_of_adjacent_books(write_book, data_dir):
    """A run covers a range of partitions: books that changed in the same tick and are
    adjacent in partition order share one, up to the batch's size; a book that changed alone
    gets its own run."""
    from rag_pipeline.config import BatchConfig

    clear_scan_cache()
    harness = Harness(data_dir, batching=BatchConfig(max_books=2))
    for book in ("alpha", "beta", "gamma"):
        write_book(book, {"a.md": f"# {book}"})
    assert requested_books(harness.tick(), harness.instance) == [["alpha", "beta"], ["gamma"]]

    def edit(*books):
        for book in books:
            (data_dir / book / "a.md").write_text(f"# {book} edited {time.time()}")
            bump_mtime(data_dir / book / "a.md")
        return requested_books(harness.tick(), harness.instance)

    assert edit("alpha", "gamma") == [["alpha"], ["gamma"]]  # not adjacent: beta unchanged
    assert edit("beta", "gamma") == [["beta", "gamma"]]
    assert edit("alpha", "beta", "gamma") == [["alpha", "beta"], ["gamma"]]


def test_no_run_of_a_book_is_requested_beside_another_run_of_it(harness, write_book, data_dir):
    """Runs of different books run side by side, two runs of one book never: a book in a
    batch in flight (which no tag limit of the run queue covers) gets no run, nor its purge,
    until that batch ends; a book with a run of its own in flight gets one alone (its
    partition and book tags, which the queue's per-book limits hold back)."""
    import shutil

    from dagster import DagsterEvent, DagsterEventType, DagsterRunStatus

    for book in ("alpha", "beta", "gamma", "delta"):
        write_book(book, {"a.md": f"# {book}"})
    harness.tick()
    batch = batch_run(harness.instance, ["alpha", "beta"], status=DagsterRunStatus.STARTED)
    fail_run(harness.instance, "gamma", DagsterRunStatus.STARTED)

    def edit(*books):
        for book in books:
            (data_dir / book / "a.md").write_text(f"# {book} edited {time.time()}")
            bump_mtime(data_dir / book / "a.md")

    edit("alpha", "gamma", "delta")
    shutil.rmtree(data_dir / "beta")
    result = harness.tick()
    assert requested_books(result, harness.instance) == [["delta"], ["gamma"]]
    assert {r.tags["rag/book"] for r in ingest_requests(result)} == {"gamma", "delta"}
    assert not [r for r in result.run_requests if r.job_name == "purge_book"]
    assert harness.partitions == ["alpha", "beta", "delta", "gamma"]
    assert isinstance(harness.tick(), SkipReason)  # still in flight: still held
    harness.instance.report_dagster_event(
        DagsterEvent(DagsterEventType.RUN_SUCCESS.value, job_name=batch.job_name),
        run_id=batch.run_id,
    )
    result = harness.tick()
    assert requested_books(result, harness.instance) == [["alpha"]]
    purges = [r for r in result.run_requests if r.job_name == "purge_book"]
    assert [r.tags["rag/book"] for r in purges] == ["beta"]


def test_a_batch_that_failed_is_run_again_book_by_book_at_the_next_tick(harness, write_book):
    """A batch fails as a whole; unless the failure was the run's (the embedding service, the
    store), each of its books is run alone at once, and only a book that fails alone backs
    off."""
    for book in ("alpha", "beta", "gamma"):
        write_book(book, {"a.md": f"# {book}"})
    harness.tick()
    batch_run(harness.instance, ["alpha", "beta", "gamma"], failed_with="StoreDamagedError")
    result = harness.tick()
    assert requested_books(result, harness.instance) == [["alpha"], ["beta"], ["gamma"]]
    assert {r.tags["rag/trigger"] for r in ingest_requests(result)} == {"books_sensor_retry"}
    assert {r.tags.get("rag/book") for r in ingest_requests(result)} == {"alpha", "beta", "gamma"}


def test_a_batch_that_failed_for_the_whole_run_backs_off_like_a_book(
    harness, write_book, monkeypatch
):
    for book in ("alpha", "beta"):
        write_book(book, {"a.md": f"# {book}"})
    harness.tick()
    batch_run(harness.instance, ["alpha", "beta"], failed_with="EmbedderUnavailableError")
    assert isinstance(harness.tick(), SkipReason)  # the service is down: no run at once
    later(monkeypatch, sensors_module.RETRY_AFTER_S + 1)
    assert requested_books(harness.tick(), harness.instance) == [["alpha"], ["beta"]]


def test_a_batch_that_succeeded_ends_the_failures_of_its_books(harness, write_book, monkeypatch):
    from dagster import DagsterEvent, DagsterEventType, DagsterRunStatus

    for book in ("alpha", "beta"):
        write_book(book, {"a.md": f"# {book}"})
    harness.tick()
    fail_run(harness.instance, "alpha")
    run = batch_run(harness.instance, ["alpha", "beta"], status=DagsterRunStatus.STARTED)
    harness.instance.report_dagster_event(
        DagsterEvent(DagsterEventType.RUN_SUCCESS.value, job_name=run.job_name), run_id=run.run_id
    )
    later(monkeypatch, sensors_module.RETRY_AFTER_MAX_S + 1)
    assert isinstance(harness.tick(), SkipReason)
    assert sensors_module.read_failed_books(harness.cursor).books == {}


def test_a_removed_book_keeps_its_partition_while_a_batch_with_it_is_in_flight(
    harness, write_book, data_dir
):
    import shutil

    from dagster import DagsterRunStatus

    for book in ("alpha", "beta", "gamma"):
        write_book(book, {"a.md": f"# {book}"})
    harness.tick()
    running = batch_run(
        harness.instance, ["alpha", "beta", "gamma"], status=DagsterRunStatus.STARTED
    )
    shutil.rmtree(data_dir / "beta")
    for _ in range(2):
        result = harness.tick()
        assert harness.partitions == ["alpha", "beta", "gamma"]
        # (nor is its purge requested beside the batch: two runs of one book never run at once)
        assert isinstance(result, SkipReason) or not result.run_requests
    harness.instance.report_run_failed(running)
    result = harness.tick()  # the purge, and the partition kept until it ran
    assert [r.tags["rag/book"] for r in result.run_requests if r.job_name == "purge_book"] == [
        "beta"
    ]
    harness.tick()
    assert harness.partitions == ["alpha", "gamma"]


@pytest.fixture
def watched(data_dir, write_book, monkeypatch):
    """30 books, and a sensor that stats only what the file system says changed; yields the
    harness and the names of the books each tick stat'ed."""
    from rag_pipeline.sources import watch

    for i in range(30):
        write_book(f"book-{i:02d}", {"a.md": f"# Book {i}"})
    clear_scan_cache()
    harness = Harness(data_dir, watch=True)
    stated: list[str] = []
    real = scan_module._stat_digest

    def counting(root, book_id):
        stated.append(book_id)
        return real(root, book_id)

    monkeypatch.setattr(scan_module, "_stat_digest", counting)
    try:
        yield harness, stated
    finally:
        watcher = watch._watchers.pop(os.path.abspath(data_dir), None)
        if watcher is not None:
            watcher.stop()


def seen_by_the_watcher(data_dir, book, timeout=10.0):
    """Wait until the watcher of ``data_dir`` has the notification of a change in ``book``."""
    from rag_pipeline.sources import watch

    watcher = watch._watchers[os.path.abspath(data_dir)]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with watcher._lock:
            if book in watcher._changed:
                return True
        time.sleep(0.05)
    return False


def test_a_watched_tick_stats_only_the_books_the_file_system_names(watched, data_dir):
    harness, stated = watched
    harness.tick()
    assert len(stated) == 30  # the first look: every book
    stated.clear()
    assert isinstance(harness.tick(), SkipReason) and stated == []  # nothing happened
    (data_dir / "book-07" / "a.md").write_text("# Book 7, edited")
    assert seen_by_the_watcher(data_dir, "book-07")
    result = harness.tick()
    assert stated == ["book-07"]
    assert [r.partition_key for r in ingest_requests(result)] == ["book-07"]


def test_every_watched_book_is_stated_again_within_a_minute(watched, data_dir, monkeypatch):
    """Whatever the notifications missed (a network file system, an overflow), each book is
    stat'ed again within RESCAN_EVERY_S, a share of the books at each tick."""
    from rag_pipeline.sources import watch

    harness, stated = watched
    harness.tick()
    stated.clear()
    start = time.monotonic()
    for step in (10, 20, 30, 40, 50, 61):
        monkeypatch.setattr(watch.time, "monotonic", lambda s=step: start + s)
        harness.tick()
    assert sorted(stated) == sorted(set(stated)) == [f"book-{i:02d}" for i in range(30)]


def test_a_sensor_that_cannot_watch_stats_every_book_each_tick(data_dir, write_book, monkeypatch):
    import watchdog.observers

    from rag_pipeline.sources import watch

    def refused(*args, **kwargs):
        raise OSError(28, "inotify watch limit reached")

    monkeypatch.setattr(watchdog.observers.Observer, "schedule", refused)
    write_book("alpha", {"a.md": "# A"})
    harness = Harness(data_dir, watch=True)
    try:
        harness.tick()
        (data_dir / "alpha" / "a.md").write_text("# A edited")
        bump_mtime(data_dir / "alpha" / "a.md")
        assert [r.partition_key for r in ingest_requests(harness.tick())] == ["alpha"]
        assert not watch._watchers[os.path.abspath(data_dir)].watching
    finally:
        watch._watchers.pop(os.path.abspath(data_dir), None)


# -- live mode: the sensor defers to a live process and takes over from what it applied ------


@pytest.fixture
def home_harness(data_dir):
    """A harness on an instance with a home (a live process shares DAGSTER_HOME's)."""
    from dagster import instance_for_test

    clear_scan_cache()
    with instance_for_test() as instance:
        yield Harness(data_dir, instance=instance)


def test_the_sensor_skips_while_a_live_process_holds_the_home(home_harness, write_book, data_dir):
    from rag_pipeline.ingest.live import LiveMark

    harness = home_harness
    write_book("alpha", {"a.md": "# A"})
    mark = LiveMark(Path(harness.instance.root_directory), harness.pipeline.source)
    with mark.hold():
        skipped = harness.tick()
        assert isinstance(skipped, SkipReason)
        assert "live mode applies every change" in (skipped.skip_message or "")
        assert f"pid {os.getpid()}" in (skipped.skip_message or "")
        assert harness.cursor is None and harness.partitions == []  # nothing taken in
    # a live process of another data folder on the same home is not this sensor's
    other = LiveMark(Path(harness.instance.root_directory), FolderSource(data_dir / "x"))
    with other.hold():
        assert isinstance(harness.tick(), SensorResult)


def test_the_sensor_takes_over_from_a_stopped_live_process_once(home_harness, write_book, data_dir):
    """What the live process applied is not run again; the book it was applying, and a book
    changed after it stopped, are; a second tick takes nothing over again."""
    from rag_pipeline.ingest.live import APPLYING, LiveLoop, LiveMark

    harness = home_harness
    for book in ("alpha", "beta", "gamma"):
        write_book(book, {"a.md": f"# {book}"})
    harness.tick()  # the sensor's cursor, before the live process ran
    harness.instance.add_dynamic_partitions(BOOKS_PARTITIONS_NAME, ["alpha", "beta", "gamma"])
    mark = LiveMark(Path(harness.instance.root_directory), harness.pipeline.source)
    live = LiveLoop(harness.pipeline.source, lambda books: dict.fromkeys(books, True))
    with mark.hold():
        for book in ("alpha", "beta", "gamma"):  # edited while the live process ran
            (data_dir / book / "a.md").write_text(f"# {book} edited")
            bump_mtime(data_dir / book / "a.md")
        live.look()  # applied all three
        books = {**live.known, "beta": list(APPLYING)}  # killed while applying beta
        mark.save(books)
    (data_dir / "gamma" / "a.md").write_text("# gamma edited again")  # after it stopped
    bump_mtime(data_dir / "gamma" / "a.md")
    result = harness.tick()
    assert isinstance(result, SensorResult)
    assert sorted(b for run in requested_books(result, harness.instance) for b in run) == [
        "beta",
        "gamma",
    ]
    assert isinstance(harness.tick(), SkipReason)  # taken over once


@pytest.mark.parametrize("run_status", ["STARTED", "SUCCESS"])
def test_a_book_written_while_its_run_was_in_flight_runs_again(
    harness, write_book, data_dir, run_status
):
    """Issue 43.1's class in the sensor: edited and reverted between two ticks while a run of
    the book was in flight (running, or finished since the previous tick), so its content
    digest is as the cursor has it: that run may have read the version in between, and the
    book runs again. A touch with no run in flight still starts nothing."""
    from dagster import DagsterRunStatus

    write_book("alpha", {"a.md": "# A"})
    write_book("beta", {"b.md": "# B"})
    harness.tick()
    fail_run(harness.instance, "alpha", DagsterRunStatus[run_status])
    path = data_dir / "alpha" / "a.md"
    path.write_text("# A, an edit the run may have read")
    path.write_text("# A")  # reverted
    bump_mtime(path)
    bump_mtime(data_dir / "beta" / "b.md")  # a touch of a book with no run
    result = harness.tick()
    assert requested_books(result, harness.instance) == [["alpha"]]
    assert isinstance(harness.tick(), SkipReason)  # in step once its run is requested

"""Every command, fed malformed arguments and settings, answers with a message and an exit code:
never a Python traceback. Settings errors name the variable and exit 2."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import click
import numpy as np
import pytest
from click.testing import CliRunner

from rag_pipeline.cli import main
from rag_pipeline_tests.fakes import FakeOpenAI
from rag_pipeline_tests.helpers import Cli, assert_no_trace, cli_env, fresh_cli, index_books

GOOD_ID = str(uuid.uuid4())


@pytest.fixture
def env(tmp_path, sample_books, monkeypatch):
    for name in list(os.environ):
        if name.startswith("RAG_") or name.startswith("OPENAI_"):
            monkeypatch.delenv(name)
    values = {
        "RAG_DATA_DIR": str(sample_books),
        "RAG_QDRANT_PATH": str(tmp_path / "qdrant"),
        "RAG_CACHE_DIR": str(tmp_path / "cache"),
        "RAG_EMBEDDER": "hash",
        "RAG_BUSY_WAIT_S": "2",
        "DAGSTER_HOME": str(tmp_path / "home"),
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    return monkeypatch


def run(*args: str):
    result = CliRunner().invoke(main, list(args))
    text = result.output + (getattr(result, "stderr", "") or "")
    assert_no_trace(text)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"{args}: escaped {result.exception!r}\n{text}")
    return result.exit_code, text


COMMANDS = [
    ("ingest",),
    ("plan",),
    ("books",),
    ("search", "robots", "--book", "ros2-fundamentals"),
    ("context", GOOD_ID, "--book", "ros2-fundamentals"),
    ("document", GOOD_ID, "--book", "ros2-fundamentals"),
    ("lineage", GOOD_ID, "--book", "ros2-fundamentals"),
]

BAD_SETTINGS = [
    ("RAG_CHUNK_TARGET_TOKENS", "abc"),
    ("RAG_CHUNK_TARGET_TOKENS", "-5"),
    ("RAG_CHUNK_TARGET_TOKENS", "999999999999"),
    ("RAG_CHUNK_MIN_TOKENS", "450"),
    ("RAG_CHUNK_MAX_TOKENS", "100"),
    ("RAG_CHUNK_OVERLAP", "0.9"),
    ("RAG_PATH_PATTERNS", "["),
    ("RAG_PATH_PATTERNS", '["(unclosed"]'),
    ("RAG_PATH_PATTERNS", '["(?P<bogus>x)"]'),
    ("RAG_PATH_PATTERNS", '{"a": 1}'),
    ("RAG_SENSOR_INTERVAL_S", "0"),
    ("RAG_SENSOR_INTERVAL_S", "soon"),
    ("RAG_QDRANT_URL", "not a url"),
    ("RAG_QDRANT_URL", "http://"),
    ("RAG_QDRANT_URL", "http://host:notaport"),
    ("RAG_COLLECTION", "../x"),
    ("RAG_COLLECTION", "."),
    ("RAG_COLLECTION", "a/b"),
    ("RAG_COLLECTION", "x" * 300),
    ("RAG_EMBEDDER", "nope"),
    ("RAG_QDRANT_EMBEDDED", "nope"),
    ("RAG_BUSY_WAIT_S", "-1"),
    ("RAG_MAX_FILE_BYTES", "0"),
    ("RAG_MAX_FILE_BLOCKS", "0"),
    ("RAG_EMBED_BATCH_SIZE", "0"),
    ("RAG_QDRANT_PATH", ""),
    ("RAG_DATA_DIR", ""),
    ("RAG_DATA_DIR", "  "),
    ("RAG_CACHE_DIR", ""),
    ("RAG_DAGSTER_URL", "ftp://x"),
]


@pytest.mark.parametrize(("name", "value"), BAD_SETTINGS)
def test_a_bad_setting_is_a_message_naming_it_with_exit_2(env, name, value):
    env.setenv(name, value)
    for command in (("books",), ("search", "x", "--book", "ros2-fundamentals"), ("ingest",)):
        code, text = run(*command)
        assert code == 2, (command, text)
        assert name in text or name.removeprefix("RAG_") in text.upper(), text


def test_an_empty_collection_name_is_refused(env):
    env.setenv("RAG_COLLECTION", "")
    code, text = run("books")
    assert code == 2 and "RAG_COLLECTION" in text


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_dagster_home_that_is_a_file_or_a_missing_data_folder(env, tmp_path, command):
    if command[0] == "ingest":
        (tmp_path / "home-file").write_text("not a folder")
        env.setenv("DAGSTER_HOME", str(tmp_path / "home-file"))
        code, text = run(*command)
        assert code == 2 and "DAGSTER_HOME" in text and "is a file" in text
        env.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    env.setenv("RAG_DATA_DIR", str(tmp_path / "not-mounted"))
    code, text = run(*command)
    if command[0] in ("ingest", "plan", "books"):
        assert code == 2 and "not-mounted" in text and "nothing was ingested" in text, text
    else:  # reading the index needs no data folder
        assert code in (0, 1), text


@pytest.mark.parametrize(
    "args",
    [
        ("search", "x"),
        ("search", "x", "--book", "../etc"),
        ("search", "x", "--book", ""),
        ("search", "x", "--book", "b", "--limit", "0"),
        ("search", "x", "--book", "b", "--chapter-min", "1e23"),
        ("search", "x", "--book", "b", "--chapter-min", str(10**30)),
        ("search", "x", "--book", "b", "--where", "chapter=100000000000000000000000"),
        ("search", "x", "--book", "b", "--where", "noequals"),
        ("search", "x", "--book", "b", "--where", "=x"),
        ("search", "x", "--book", "b", "--where", "book_id=other"),
        ("search", "x", "--book", "b", "--chapter-min", "5", "--chapter-max", "1"),
        ("search", "x", "--book", "b", "--mode", "magic"),
        ("context", "not-a-uuid", "--book", "b"),
        ("context", "1e23", "--book", "b"),
        ("context", GOOD_ID, "--book", "b", "--prev", "-1"),
        ("lineage", "123", "--book", "b"),
        ("lineage", "", "--book", "b"),
        ("document", "../../etc/passwd", "--book", "b"),
        ("ingest", "--book", "../x"),
        ("ingest", "--book", "a b"),
        ("ingest", "--rebuild", "--book", "ros2-fundamentals"),
        ("plan", "--book", "\x00"),
        ("eval", "--dataset", "/nonexistent"),
        ("eval", "--dataset", "."),
        ("eval", "--dataset", ".", "--rrf-k", "0"),
        ("nonsense",),
    ],
)
def test_malformed_arguments_are_messages_not_tracebacks(env, args):
    code, text = run(*args)
    assert code in (1, 2), text
    assert text.strip()


def index_the_books() -> None:
    """The books of the environment indexed directly: an ingest's Dagster run would start
    processes (its compute log capture), which the fast suite does not."""
    index_books(Path(os.environ["RAG_DATA_DIR"]), os.environ["RAG_QDRANT_PATH"])


def test_missing_ids_are_exit_1_with_a_message(env):
    index_the_books()
    for command in COMMANDS[4:]:
        code, text = run(*command)
        assert code == 1 and "no " in text, text


@pytest.mark.integration
def test_a_real_process_prints_no_traceback_on_a_bad_setting(tmp_path):
    env = {**os.environ, "RAG_CHUNK_OVERLAP": "7", "DAGSTER_HOME": str(tmp_path / "h")}
    proc = fresh_cli(["plan"], env, tmp_path, timeout=120)
    assert proc.returncode == 2
    assert "RAG_CHUNK_OVERLAP" in proc.stderr
    assert_no_trace(proc.stderr)


def test_a_log_record_prints_without_its_trace_unless_v():
    """Without -v, stderr gets a record's message and its exception's one line: not the
    traceback, nor the ``Stack Trace:`` block of a Dagster failure message."""
    import logging

    from rag_pipeline.cli.app import _TracelessFormatter

    try:
        raise ValueError("bad vector")
    except ValueError:
        record = logging.LogRecord(
            "dagster",
            logging.ERROR,
            __file__,
            1,
            'step failed.\n\nStack Trace:\n  File "x.py", line 3, in f\n',
            None,
            sys.exc_info(),
        )
    text = _TracelessFormatter().format(record)
    assert text == "ERROR dagster: step failed. (ValueError: bad vector)"
    assert record.exc_info is not None  # other handlers still get the whole record
    assert "Stack Trace:" in logging.Formatter().format(record)


@pytest.mark.slow
@pytest.mark.integration
def test_a_failed_step_prints_no_dagster_stack_trace_without_v(tmp_path, sample_books):
    """An embedding server answering the wrong dimension fails the book's embedding step (after
    Dagster's step retries): exit 1, the report names the cause, stderr carries no stack trace;
    with -v, Dagster's full error is on stderr, and the event log keeps it either way. The
    retries wait a hundredth of their policy's 5 + 15 s (quickretry.py: the waits prove
    nothing here; the policy's delays asked are checked)."""
    from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

    from rag_pipeline_tests.conftest import REPO

    with FakeOpenAI(dim=64) as server:
        procs, asked = {}, {}
        for flags in ((), ("-v",)):  # both at once
            home = tmp_path / f"home{''.join(flags)}"
            env = {
                **cli_env(home, sample_books, "openai"),
                "RAG_OPENAI_MAX_RETRIES": "0",
                "OPENAI_API_KEY": "sk-test",
                "OPENAI_BASE_URL": server.base_url,
                "PYTHONPATH": str(REPO),  # the test module that shortens the waits
            }
            asked[flags] = tmp_path / f"retries{''.join(flags)}.log"
            command = [str(asked[flags]), *flags, "ingest", "--book", "ros2-fundamentals"]
            procs[flags] = subprocess.Popen(
                [sys.executable, "-m", "rag_pipeline_tests.quickretry", *command, "--json"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=tmp_path,
            )
        outputs = {flags: proc.communicate(timeout=300) for flags, proc in procs.items()}
    wanted = "returned vectors of shape (64,), not (1536,)"
    for flags, proc in procs.items():
        stdout, stderr = outputs[flags]
        assert proc.returncode == 1, stderr
        # the step failed under its policy: retried after 5 s and 15 s (Dagster asks once more
        # after the last attempt, 35 s, for none)
        assert asked[flags].read_text().split() == ["5.0", "15.0", "35.0"], stderr
        book = json.loads(stdout)["books"]["ros2-fundamentals"]
        assert book["status"] == "failed"
        assert any(wanted in m and "chunk_embeddings" in m for m in book["error_messages"]), book[
            "error_messages"
        ]
    assert_no_trace(outputs[()][1])
    verbose = outputs[("-v",)][1]
    assert "Stack Trace:" in verbose and wanted in verbose and 'File "' in verbose
    with DagsterInstance.from_config(str(tmp_path / "home" / "dagster_home")) as instance:
        (run,) = instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.FAILURE]))
        failures = [e for e in instance.all_logs(run.run_id) if e.is_dagster_event]
        errors = [
            e.dagster_event.step_failure_data.error
            for e in failures
            if e.dagster_event.is_step_failure
        ]
        assert errors and errors[0].stack  # the UI still shows the full error


@pytest.mark.parametrize("engine", ["edge", "client"])
@pytest.mark.parametrize("where", ["a-file", "a-file/below", "/proc/rag-store"])
def test_an_unusable_store_path_is_a_setting_error_naming_it(env, tmp_path, engine, where):
    (tmp_path / "a-file").write_text("not a folder")
    path = where if where.startswith("/") else str(tmp_path / where)
    env.setenv("RAG_QDRANT_PATH", path)
    env.setenv("RAG_QDRANT_EMBEDDED", engine)
    for command in (("search", "x", "--book", "ros2-fundamentals"), ("plan",), ("ingest",)):
        code, text = run(*command)
        assert code == 2, (command, text)
        assert "RAG_QDRANT_PATH" in text and path in text and "unexpected" not in text, text
    code, text = run("ingest", "--rebuild")
    assert code == 2 and "RAG_QDRANT_PATH" in text, text


@pytest.mark.integration  # a Dagster run: its compute log capture starts processes
def test_an_unwritable_partitions_marker_does_not_fail_the_ingest(env, tmp_path):
    """The marker beside the Dagster instance is a hint: the books are ingested, the report
    says so with a warning and the exit code is the work's."""
    home = tmp_path / "home"
    (home / "rag_book_partitions.json").mkdir(parents=True)  # in the way of the marker
    code, text = run("ingest", "--json")
    assert code == 0, text
    report = json.loads(text[text.index("{") :])
    assert {b["status"] for b in report["books"].values()} == {"ingested"}
    assert any("rag_book_partitions.json" in w for w in report["warnings"]), report["warnings"]
    assert not list(home.glob("*.tmp"))


@pytest.mark.parametrize(
    "yaml_text",
    [
        "run_monitoring: [\n  bad: : yaml\n",  # not YAML
        "[1, 2]\n",  # not a mapping
        "run_monitoring:\n  bogus_key: 3\n",  # not Dagster's schema
        "run_storage:\n  module: no_such_module\n  class: X\n",  # a class that cannot load
    ],
    ids=["syntax", "list", "schema", "class"],
)
def test_an_invalid_dagster_yaml_is_a_setting_error_naming_it(env, tmp_path, yaml_text):
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(yaml_text)
    code, text = run("ingest")
    assert code == 2, text
    assert "DAGSTER_HOME" in text and str(home / "dagster.yaml") in text, text
    assert "move it aside" in text and "error: unexpected" not in text, text


@pytest.mark.integration  # a Dagster run: its compute log capture starts processes
def test_a_damaged_dagster_database_is_failed_work_naming_the_file(env, tmp_path):
    history = tmp_path / "home" / "history"
    history.mkdir(parents=True)
    (history / "runs.db").write_bytes(os.urandom(4096))
    code, text = run("ingest")
    assert code == 1, text
    assert str(history / "runs.db") in text and f"Move {history} aside" in text, text
    assert "error: unexpected" not in text, text
    shutil.move(history, tmp_path / "history.aside")  # what the message says to do
    assert run("ingest")[0] == 0


@pytest.mark.integration  # real CLI processes
def test_a_database_with_two_alembic_heads_is_named_with_the_way_out(tmp_path, sample_books):
    """Two processes creating a new instance together (`make ui` before issue 44) could stamp a
    database twice: "Version table 'alembic_version' has more than one head present" at every
    later open, which `ingest` reported as "unexpected CommandError", naming neither the file
    nor the way out."""
    from dagster import DagsterInstance
    from dagster._core.instance.ref import InstanceRef

    cli = Cli(tmp_path, sample_books)  # processes forked from the warm interpreter
    home = Path(cli.env["DAGSTER_HOME"])
    home.mkdir()
    DagsterInstance.from_ref(InstanceRef.from_dir(str(home))).dispose()  # a sound instance
    history = home / "history"
    with sqlite3.connect(history / "runs.db") as db:  # what a second stamp left
        db.execute("insert into alembic_version (version_num) values ('0123456789ab')")
    for command in ("ingest", "init-instance"):
        proc = cli(command, check=False, timeout=300)
        text = proc.stdout + proc.stderr
        assert proc.returncode == 1, (command, text)
        assert str(history / "runs.db") in text and f"Move {history} aside" in text, text
        assert "unexpected" not in text, text
        assert_no_trace(text)
    shutil.move(history, tmp_path / "history.aside")  # what the message says to do
    cli("ingest", timeout=300)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("",), "query is empty"),
        (("  \t ",), "query is empty"),
        (("?!.", "--mode", "sparse"), "no searchable words"),
        (("x", "--score-threshold", "nan"), "finite"),
        (("x", "--where", "chapter=abc"), "chapter is an integer field"),
        (("x", "--where", "text=x"), "'text' is not a filterable field; use one of chapter"),
        (("x", "--where", "run_id=x"), "module"),
        (("x", "--proficiency", ""), "--proficiency needs a level"),
        (("x", "--proficiency", "B1", "--proficiency", " "), "--proficiency needs a level"),
    ],
)
def test_search_input_that_cannot_be_answered_is_exit_2_naming_it(env, args, message):
    code, text = run("search", *args, "--book", "ros2-fundamentals", "--json")
    assert code == 2, text
    assert message in text, text


def test_a_search_of_a_book_with_nothing_indexed_says_so(env):
    result = CliRunner().invoke(main, ["search", "robots", "--book", "nosuch", "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout) == [], result.output
    assert "book nosuch has nothing indexed; the index is empty" in result.stderr
    index_the_books()
    code, text = run("search", "robots", "--book", "nosuch")
    assert code == 0, text
    assert "indexed books: humanoid-robotics-ros2, ros2-fundamentals" in text, text
    code, text = run("search", "robots", "--book", "ros2-fundamentals", "--where", "chapter=999")
    assert code == 0 and "nothing indexed" not in text, text  # indexed, nothing matched


def _sample_value(option: click.Option) -> str:
    """A value the option accepts (the repeat is what is wrong, not the value)."""
    if option.name == "book_id":
        return "ros2-fundamentals"
    if isinstance(option.type, click.Choice):
        return str(option.type.choices[0])
    if isinstance(option.type, click.IntRange):
        return str(option.type.min or 1)
    return {"integer": "1", "float": "0.5"}.get(option.type.name, "x")


#: every option of the retrieval commands that takes one value, from the commands themselves
RETRIEVAL = {name: main.commands[name] for name in ("search", "context", "document", "lineage")}
ONE_VALUE_OPTIONS = [
    (name, p)
    for name, command in RETRIEVAL.items()
    for p in command.params
    if isinstance(p, click.Option) and not (p.multiple or p.is_flag or p.count)
]


def test_the_one_value_options_are_derived_from_every_retrieval_command():
    names = {(command, max(p.opts, key=len)) for command, p in ONE_VALUE_OPTIONS}
    assert {(command, "--book") for command in RETRIEVAL} <= names
    assert {("search", "--limit"), ("search", "--mode"), ("context", "--prev")} <= names
    assert not {o for _, o in names} & {"--where", "--proficiency", "--json"}


@pytest.mark.parametrize(
    ("command", "option"),
    ONE_VALUE_OPTIONS,
    ids=lambda v: v if isinstance(v, str) else max(v.opts, key=len),
)
def test_an_option_that_takes_one_value_given_twice_is_exit_2_naming_it(env, command, option):
    flag, value = max(option.opts, key=len), _sample_value(option)
    first = "robots" if command == "search" else GOOD_ID
    args = [command, first, "--book", "ros2-fundamentals", "--json"]
    if flag != "--book":
        args += [flag, value]
    code, text = run(*args, flag, value)
    assert code == 2, text
    assert f"{flag} is given 2 times" in text, text


@pytest.mark.parametrize("command", list(RETRIEVAL))
def test_a_second_book_is_refused_not_silently_read(env, command):
    first = "robots" if command == "search" else GOOD_ID
    code, text = run(command, first, "--book", "ros2-fundamentals", "--book=humanoid-robotics-ros2")
    assert code == 2, text
    assert "--book is given 2 times" in text, text


def test_a_where_key_given_twice_is_exit_2_naming_it(env):
    code, text = run(
        "search",
        "robots",
        "--book",
        "ros2-fundamentals",
        "--where",
        "module=a",
        "--where",
        "module=b",
    )
    assert code == 2, text
    assert "filter key 'module' is given twice" in text, text
    # distinct keys, and repeatable options, stay fine
    code, text = run(
        "search",
        "robots",
        "--book",
        "ros2-fundamentals",
        "--json",
        "--where",
        "lesson=1",
        "--where",
        "chapter=1",
        "--proficiency",
        "A2",
        "--proficiency",
        "B1",
    )
    assert code == 0, text


@pytest.mark.parametrize("mode", ["dense", "hybrid"])
@pytest.mark.parametrize(
    ("value", "check"), [(np.nan, "non-finite values"), (0.0, "all-zero vectors")]
)
def test_a_bad_query_vector_is_failed_work_naming_the_embedder(env, mode, value, check):
    """Before, a NaN query vector answered [] (dense) or only the sparse half (hybrid) with
    exit 0, and a zero one hits that all scored 0.0."""
    from rag_pipeline.embed.hashing import HashEmbedder

    env.setattr(
        HashEmbedder,
        "_embed_batch",
        lambda self, texts: np.full((len(texts), self.dimension), value, dtype=np.float32),
    )
    code, text = run("search", "robots", "--book", "ros2-fundamentals", "--mode", mode)
    assert code == 1, text
    assert f"the hash-384 embedder returned {check} for 1 of 1 inputs" in text, text


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (429, "HTTP 429"),
        ("hang", "timed out"),
        ("garbage", "malformed embeddings response"),
        ("bad_base64", "undecodable embedding"),
        ("nan", "non-finite values for 1 of 1 inputs"),
    ],
)
def test_a_failing_embedding_api_on_search_is_exit_1_not_2(env, answer, message):
    """Exit 2 is for bad arguments and settings; the API's failure is failed work (it was 2)."""
    with FakeOpenAI() as api:
        api.default, api.hang_s = answer, 2.0
        for name, value in {
            "RAG_EMBEDDER": "openai",
            "OPENAI_API_KEY": "sk-test",
            "OPENAI_BASE_URL": api.base_url,
            "RAG_OPENAI_MAX_RETRIES": "0",
            "RAG_OPENAI_TIMEOUT_S": "0.5",
        }.items():
            env.setenv(name, value)
        code, text = run("search", "robots", "--book", "ros2-fundamentals")
    assert code == 1, text
    assert message in text and api.base_url in text, text


def test_a_missing_api_key_is_still_a_setting_error(env):
    env.setenv("RAG_EMBEDDER", "openai")
    code, text = run("search", "robots", "--book", "ros2-fundamentals")
    assert code == 2 and "OPENAI_API_KEY" in text, text


def test_the_ingest_summary_lists_what_changed_and_counts_the_unchanged_books(capsys):
    """A thousand rows of "unchanged" would hide the book that ran (and cost seconds to draw):
    past a few, unchanged books are one line."""
    from rag_pipeline.cli.ingest import LISTED_UNCHANGED, _print_ingest
    from rag_pipeline.ingest.report import BookResult, IngestReport

    many = LISTED_UNCHANGED + 5
    books = {
        f"quiet-{i:03d}": BookResult(f"quiet-{i:03d}", "unchanged", chunks=3) for i in range(many)
    }
    books["edited"] = BookResult("edited", "ingested", chunks=4, embedded=1)
    _print_ingest(IngestReport(books=books))
    shown = capsys.readouterr().out
    assert "edited" in shown and "quiet-000" not in shown
    assert f"{many} books unchanged: {3 * many} chunks already indexed" in shown
    few = {f"quiet-{i}": BookResult(f"quiet-{i}", "unchanged", chunks=3) for i in range(2)}
    _print_ingest(IngestReport(books=few))
    assert "quiet-1" in capsys.readouterr().out

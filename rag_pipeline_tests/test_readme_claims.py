"""Claims of the README that a user checks by trying them, each where it once did not hold:
``watch --json``'s first line once the books are in step, and the ways the README tells a
user to run a command."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rag_pipeline_tests.conftest import REPO
from rag_pipeline_tests.helpers import Cli, LiveProcess

README = (REPO / "README.md").read_text()


def _write_book(data: Path, book: str) -> None:
    (data / book).mkdir(parents=True)
    (data / book / "a.md").write_text(f"# {book}\n\nThe opening words of {book}.\n")


@pytest.mark.slow
@pytest.mark.integration
def test_watch_json_says_ready_first_when_the_books_are_in_step_and_then_one_line_a_change(
    tmp_path,
):
    """README: ``{"event": "ready", ...}`` once every book is caught up, then an applied
    event per change. The first look at books already indexed applies nothing: it printed an
    applied event with every book "unchanged" before ready (a client reading the first line
    as ready got a report of nothing)."""
    data = tmp_path / "books"
    _write_book(data, "alpha")
    _write_book(data, "beta")
    cli = Cli(tmp_path, data)
    cli("ingest")
    live = LiveProcess(cli)
    try:
        ready = live.next_event("ready", timeout=120)
        assert live.events[0]["event"] == "ready", live.events
        assert ready["books"] == 2
        (data / "beta" / "a.md").write_text("# beta\n\nAn edit of beta.\n")
        report = live.next_event("applied", timeout=60)["report"]
        assert {b: r["status"] for b, r in report["books"].items()} == {"beta": "ingested"}
    finally:
        assert live.stop() == 0, "".join(live.stderr[-30:])


def test_the_dg_commands_the_readme_gives_name_an_absolute_dagster_home():
    """Dagster refuses a relative ``DAGSTER_HOME`` with a traceback ("must be an absolute
    path"): the README's ``dg`` instructions set an absolute one."""
    given = re.findall(r"DAGSTER_HOME=(\S+?)`", README)
    assert given, "the README says which DAGSTER_HOME the dg commands take"
    for value in given:
        assert value.startswith(("/", "$PWD", "$(pwd)", "$HOME")), value

"""Rules of the suite itself: `make test-fast` starts no process and runs no type check."""

from __future__ import annotations

import os
import subprocess

import pytest

from rag_pipeline_tests import conftest, test_lint


def test_an_unmarked_test_cannot_start_a_process(request: pytest.FixtureRequest) -> None:
    with pytest.raises(AssertionError, match="not marked slow or integration"):
        subprocess.run(["true"], check=False)
    with pytest.raises(AssertionError, match="not marked slow or integration"):
        os.system("true")
    # the refusals above are what this test expects: not a failure of it
    del request.node.stash[conftest._STARTED_A_PROCESS]


@pytest.mark.integration
def test_a_marked_test_may_start_one() -> None:
    assert subprocess.run(["true"], check=False).returncode == 0


def test_the_type_check_is_left_out_of_test_fast() -> None:
    marks = {m.name for m in getattr(test_lint.test_type_check_is_clean, "pytestmark", [])}
    assert marks & set(conftest.PROCESS_MARKS), marks

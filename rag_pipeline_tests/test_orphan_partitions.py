"""A book whose runs all failed (or were killed) holds no points, so no plan purges it: once
its folder is gone, ``rag-pipeline ingest`` (no sensor running) deletes its partition, even
when no book needs a run (the ingest that would answer without Dagster)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from dagster import DagsterInstance

from rag_pipeline.defs import runner
from rag_pipeline.defs.partitions import BOOKS_PARTITIONS_NAME
from rag_pipeline_tests.conftest import break_chunking_of, section
from rag_pipeline_tests.helpers import InProcessCli


def partitions(home: Path) -> list[str]:
    with DagsterInstance.from_config(str(home)) as instance:
        return sorted(instance.get_dynamic_partitions(BOOKS_PARTITIONS_NAME))


@pytest.mark.parametrize("how", ["failed", "killed"])
def test_a_removed_book_that_never_ran_to_the_end_loses_its_partition(
    tmp_path, data_dir, write_book, monkeypatch, how
):
    """``failed``: its run failed (the partitions marker then names it); ``killed``: the
    ingest died part way (before it could write the marker again)."""
    write_book("alpha", {"a.md": "# Alpha\n\n" + section("One")})
    cli = InProcessCli(tmp_path, data_dir)
    home = Path(cli.env["DAGSTER_HOME"])
    cli("ingest")
    write_book("beta", {"b.md": "# Beta\n\n" + section("Two", seed="b")})
    with monkeypatch.context() as patched:
        if how == "failed":
            break_chunking_of(patched, "beta")
            assert cli("ingest", check=False).returncode == 1
        else:

            def killed(*args, **kwargs):
                raise KeyboardInterrupt  # the process ends here, as kill -9 would end it

            patched.setattr(runner, "_run_books", killed)
            cli("ingest", check=False)
    assert partitions(home) == ["alpha", "beta"]
    shutil.rmtree(data_dir / "beta")
    cli("ingest")  # alpha unchanged: no run
    assert partitions(home) == ["alpha"]

"""Hostile probes of a home's dagster.yaml review (rag_pipeline/dagster_yaml.py)."""

from __future__ import annotations

import shutil

import pytest

from rag_pipeline.config import SettingsError, ensure_dagster_home
from rag_pipeline.dagster_yaml import REQUIRED_SNIPPET, review_home_config
from rag_pipeline_tests.conftest import REPO

OLD = REPO / "rag_pipeline_tests" / "fixtures" / "dagster_yaml" / "7af2fdd.yaml"


@pytest.mark.parametrize("text", ["", "\n", "# only a comment\n", "---\n"])
def test_an_empty_file_lacks_every_setting(home, capsys, text):
    """Dagster reads an empty dagster.yaml as its defaults: no coordinator, no limits."""
    (home / "dagster.yaml").write_text(text)
    ensure_dagster_home()
    err = capsys.readouterr().err
    assert "lacks settings" in err and "BookRunCoordinator" in err, err
    assert (home / "dagster.yaml").read_text() == text  # the owner's: not rewritten


def test_a_link_to_an_earlier_copy_is_not_replaced(home, tmp_path, capsys):
    shared = tmp_path / "shared.yaml"
    shutil.copy(OLD, shared)
    (home / "dagster.yaml").symlink_to(shared)
    ensure_dagster_home()
    assert (home / "dagster.yaml").is_symlink()
    assert shared.read_bytes() == OLD.read_bytes()
    assert "lacks settings" in capsys.readouterr().err


def test_the_right_settings_with_other_comments_and_broken_yaml(home, capsys):
    (home / "dagster.yaml").write_text(
        "# ours\ntelemetry:\n  enabled: false  # no\n" + REQUIRED_SNIPPET + "# end\n"
    )
    ensure_dagster_home()
    assert capsys.readouterr().err == ""
    (home / "dagster.yaml").write_text("a: [unclosed\n")
    assert review_home_config(home).notice == ""  # the same


def test_a_home_that_is_a_file(tmp_path, monkeypatch):
    (tmp_path / "home").write_text("")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    with pytest.raises(SettingsError, match="is a file"):
        ensure_dagster_home()


@pytest.mark.timeout(30)  # a read of the FIFO waited forever
@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_a_home_file_that_is_not_a_regular_file_is_named_not_read(home, kind):
    """A FIFO (or a link to /dev/zero) at the path hung every command reading it."""
    import os

    path = home / "dagster.yaml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()
    with pytest.raises(SettingsError, match=r"dagster\.yaml is a .*, not a file: move it aside"):
        ensure_dagster_home()


def test_an_earlier_copy_in_a_home_that_cannot_be_written_is_named(home, monkeypatch):
    """A read-only home (as root cannot be made one, its writes are refused here): exit 2
    naming the home and the file that could not be written; the owner's file untouched."""
    import pathlib

    shutil.copy(OLD, home / "dagster.yaml")
    real = pathlib.Path.write_bytes

    def refused(self, data):
        if self.parent == home:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, data)

    monkeypatch.setattr(pathlib.Path, "write_bytes", refused)
    with pytest.raises(SettingsError, match=r"DAGSTER_HOME=.*dagster\.yaml\..*: Permission denied"):
        ensure_dagster_home()
    assert (home / "dagster.yaml").read_bytes() == OLD.read_bytes()
    assert sorted(p.name for p in home.iterdir()) == ["dagster.yaml"]

"""The README states the defaults the code has: its configuration table against
:class:`~rag_pipeline.config.Settings`, and the freshness settings (books sensor interval,
the daemon's dequeue interval) against the code, ``dagster.yaml`` and Dagster itself."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from dagster import DagsterInstance
from dagster._daemon.sensor import MIN_INTERVAL_LOOP_TIME

from rag_pipeline.config import DEFAULT_SENSOR_INTERVAL_S, Settings, _variable
from rag_pipeline_tests.conftest import REPO

README = (REPO / "README.md").read_text()
_ROW = re.compile(r"^\| (`[A-Z_]+`(?:, `[A-Z_]+`)*) \| ([^|]+) \|", re.MULTILINE)
_FIELD_OF = {_variable(name): name for name in Settings.model_fields}


def _documented_defaults() -> list[tuple[str, str]]:
    """(variable, default cell) of each configuration row whose defaults are one per variable."""
    out = []
    for variables, defaults in _ROW.findall(README):
        names = re.findall(r"`([A-Z_]+)`", variables)
        values = [v.strip() for v in defaults.split(", ")]
        if len(values) == len(names):
            out.extend(zip(names, values, strict=True))
    return out


def _literal(cell: str) -> Any:
    """The value a default cell states, or None for a description (``unset``, ``see ...``)."""
    if cell.startswith("`") and cell.endswith("`"):
        return cell.strip("`")
    if mib := re.fullmatch(r"(\d+) MiB", cell):
        return int(mib.group(1)) * 1024 * 1024
    try:
        return float(cell)
    except ValueError:
        return None


def test_the_configuration_table_states_the_settings_defaults() -> None:
    checked = []
    for variable, cell in _documented_defaults():
        field = _FIELD_OF.get(variable)
        stated = _literal(cell)
        if field is None or stated is None:
            continue
        default = Settings.model_fields[field].default
        actual = float(default) if isinstance(stated, float) else default
        if isinstance(stated, str):
            # a flag is written as the value to set: `0` / `1`
            actual = str(int(default)) if isinstance(default, bool) else str(default)
        assert actual == stated, f"README says {variable} defaults to {cell}, the code {default}"
        checked.append(variable)
    assert "RAG_SENSOR_INTERVAL_S" in checked and len(checked) >= 20, checked


def test_the_books_sensor_ticks_on_every_pass_of_the_sensor_daemon() -> None:
    # The daemon skips a sensor whose last tick started less than its interval ago; that tick
    # started a little after the previous pass began, so only an interval below the pass
    # ticks on every pass.
    assert DEFAULT_SENSOR_INTERVAL_S < MIN_INTERVAL_LOOP_TIME
    assert Settings.model_fields["sensor_interval_s"].default == DEFAULT_SENSOR_INTERVAL_S
    assert f"every {MIN_INTERVAL_LOOP_TIME} s" in README


def _dequeue_interval_s(config: dict[str, Any]) -> int:
    return int(config["run_coordinator"]["config"]["dequeue_interval_seconds"])


def test_dagster_reads_the_dequeue_interval_the_readme_states(tmp_path: Path) -> None:
    config = yaml.safe_load((REPO / "dagster.yaml").read_text())
    stated = re.search(r"within (\d+) s\s+\(`dequeue_interval_seconds`", README)
    assert stated, "the README states the dequeue interval"
    assert _dequeue_interval_s(config) == int(stated.group(1)) == 1
    shutil.copy(REPO / "dagster.yaml", tmp_path / "dagster.yaml")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DAGSTER_HOME", str(tmp_path))
        with DagsterInstance.get() as instance:  # Dagster validates the option's name
            assert instance.run_coordinator.dequeue_interval_seconds == 1  # type: ignore[attr-defined]

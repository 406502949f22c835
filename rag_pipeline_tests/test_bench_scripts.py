"""Every benchmark script still imports against the current code (they run rarely, by hand,
so an API change would otherwise break them silently)."""

from __future__ import annotations

import importlib.util

import pytest

from rag_pipeline_tests.conftest import REPO

SCRIPTS = sorted((REPO / "bench").glob("*.py"))


def test_there_are_benchmark_scripts():
    assert len(SCRIPTS) >= 5


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_benchmark_script_imports(script, monkeypatch):
    monkeypatch.syspath_prepend(str(script.parent))  # as `python bench/x.py` has it
    spec = importlib.util.spec_from_file_location(f"bench_{script.stem}", script)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # runs the imports; main() is behind __name__ == "__main__"
    if '__name__ == "__main__"' in script.read_text():  # a script, not a shared module
        assert callable(getattr(module, "main", None)), f"{script.name} has no main()"

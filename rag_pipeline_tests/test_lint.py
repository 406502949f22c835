"""Style is part of the build: ruff (line length 100) over the code, tests and benchmarks."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rag_pipeline_tests.conftest import REPO

TARGETS = ["rag_pipeline", "rag_pipeline_tests", "bench"]


def ruff() -> str:
    found = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(found).exists():
        pytest.skip("ruff is not installed (it is in the dev extra)")
    return found


@pytest.mark.integration
def test_ruff_lint():
    proc = subprocess.run([ruff(), "check", *TARGETS], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.integration
def test_ruff_format():
    proc = subprocess.run(
        [ruff(), "format", "--check", *TARGETS], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_pure_modules_never_import_dagster():
    """Dagster stays at the edge: only defs/, resources/ and definitions.py may import it."""
    allowed = {"defs", "resources", "definitions.py"}
    offenders = []
    for path in (REPO / "rag_pipeline").rglob("*.py"):
        rel = path.relative_to(REPO / "rag_pipeline")
        if rel.parts[0] in allowed:
            continue
        text = path.read_text()
        if "import dagster" in text or "from dagster" in text:
            offenders.append(str(rel))
    assert offenders == []


@pytest.mark.slow
@pytest.mark.integration
def test_type_check_is_clean():
    """mypy, strict, over rag_pipeline/ (configured in pyproject.toml)."""
    pytest.importorskip("mypy", reason="mypy is not installed (it is in the dev extra)")
    proc = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr

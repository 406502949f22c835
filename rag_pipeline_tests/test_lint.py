"""Style is part of the build: ruff (line length 100) over the code, tests and benchmarks."""

import ast
import re
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
    """Dagster stays at the edge: only defs/ (its one home) and definitions.py may import it,
    and the old launcher name kept for dagster.yaml copies (the resources are plain objects
    built from the settings)."""
    allowed = {"defs", "definitions.py", "orchestration"}
    offenders = []
    for path in (REPO / "rag_pipeline").rglob("*.py"):
        rel = path.relative_to(REPO / "rag_pipeline")
        if rel.parts[0] in allowed:
            continue
        text = path.read_text()
        if "import dagster" in text or "from dagster" in text:
            offenders.append(str(rel))
    assert offenders == []
    old_names = REPO / "rag_pipeline" / "orchestration"
    assert {p.name for p in old_names.glob("*.py")} == {"__init__.py", "launcher.py"}


#: the harness that runs the definitions (from the CLI, or as the run launcher dagster.yaml
#: names); the rest of defs/ is the definitions and the helpers they are built from
HARNESS_MODULES = {
    "runner.py",
    "live.py",
    "reaper.py",
    "instance.py",
    "partition_marker.py",
    "launcher.py",
}


def test_the_definitions_never_import_the_harness_that_runs_them():
    """defs/ is the Dagster layer's one home; within it no arrow runs from a definition module
    to the harness (the runner builds on the definitions, never the other way round)."""
    defs = REPO / "rag_pipeline" / "defs"
    assert {p.name for p in defs.glob("*.py")} >= HARNESS_MODULES
    harness = "|".join(name.removesuffix(".py") for name in sorted(HARNESS_MODULES))
    back = [
        f"{path.name}:{n}"
        for path in sorted(defs.glob("*.py"))
        if path.name not in HARNESS_MODULES
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.match(rf"\s*from rag_pipeline\.defs(\.({harness})\b| import ({harness})\b)", line)
    ]
    assert back == []


#: the one module allowed to import ``dagster._*`` (each name there says why)
DAGSTER_PRIVATE = Path("rag_pipeline/defs/_dagster_private.py")


def _private_dagster_imports(path: Path) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            modules = [node.module or ""]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        else:
            continue
        if any(m.startswith("dagster._") for m in modules):
            lines.append(node.lineno)
    return lines


def test_no_private_dagster_import_outside_its_one_adapter_module():
    offenders = [
        f"{path.relative_to(REPO)}:{line}"
        for path in sorted((REPO / "rag_pipeline").rglob("*.py"))
        if path.relative_to(REPO) != DAGSTER_PRIVATE
        for line in _private_dagster_imports(path)
    ]
    assert offenders == [], "import these through " + str(DAGSTER_PRIVATE)
    assert _private_dagster_imports(REPO / DAGSTER_PRIVATE)  # the check finds what it looks for


def test_the_documented_dagster_tags_we_spell_are_dagsters():
    """Tags spelled as Dagster's docs do (no public constant): pinned to Dagster's own."""
    from dagster._core.execution.plan.resume_retry import ReexecutionStrategy
    from dagster._core.storage.tags import PARTITION_NAME_TAG, RETRY_STRATEGY_TAG

    from rag_pipeline.defs import runs

    assert runs.PARTITION_TAG == PARTITION_NAME_TAG
    assert {RETRY_STRATEGY_TAG: ReexecutionStrategy.ALL_STEPS.value} == runs.RETRY_ALL_STEPS


def _package_sources() -> list[Path]:
    return sorted((REPO / "rag_pipeline").rglob("*.py"))


def test_run_tags_are_spelled_once():
    """Each run tag is a string in one place (its constant); everything else names it."""
    from rag_pipeline.defs import runs

    tags = [runs.BOOK_TAG, runs.TRIGGER_TAG, runs.CHECKS_TAG, runs.PARTITION_TAG]
    tags.append(runs.RETRY_STRATEGY_TAG)
    found: dict[str, list[str]] = {tag: [] for tag in tags}
    for path in _package_sources():
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for tag in tags:
                if f'"{tag}"' in line:
                    found[tag].append(f"{path.relative_to(REPO)}:{n}")
    assert {tag: len(where) for tag, where in found.items()} == dict.fromkeys(tags, 1), found


def test_asset_and_op_names_are_not_spelled_where_the_objects_serve():
    """An asset key or op name as a string literal in a call (AssetKey("chunks"),
    output_for_node("qdrant_points"), asset_key="documents"), a comparison, or an "ops" run
    config: the objects' ``.key`` / ``.op.name`` say it. The one place left is an asset's own
    check specs (``AssetCheckSpec(asset=...)`` in its decorator, before the asset exists; a
    book asset's check names its asset by the function it decorates)."""
    from rag_pipeline.defs.assets import ingestion_assets
    from rag_pipeline.defs.collection import qdrant_collection
    from rag_pipeline.defs.jobs import purge_book_points

    names = {a.key.to_user_string() for a in [*ingestion_assets, qdrant_collection]}
    names.add(purge_book_points.name)
    offenders = []
    for path in _package_sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            values: list[ast.expr] = []
            if isinstance(node, ast.Call):
                own_spec = getattr(node.func, "id", None) == "AssetCheckSpec"
                values += node.args
                values += [k.value for k in node.keywords if not (own_spec and k.arg == "asset")]
            elif isinstance(node, ast.Compare):
                values += [node.left, *node.comparators]
            elif isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values, strict=True):
                    if isinstance(key, ast.Constant) and key.value == "ops":
                        values += getattr(value, "keys", [])
            offenders += [
                f"{path.relative_to(REPO)}:{v.lineno} {v.value!r}"
                for v in values
                if isinstance(v, ast.Constant) and v.value in names
            ]
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

"""The check badge on ``documents`` in the asset graph while a run launched from the UI waits
and starts (issue 44.6): computed from the webserver's GraphQL answer the way the UI (Dagster
1.13) draws it, for a run created and submitted through the same GraphQL mutation the UI's
Materialize button sends, on an instance set up from the repository's ``dagster.yaml``."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rag_pipeline_tests.helpers import Cli
from rag_pipeline_tests.ui_badge import CHECKS, node_badge

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]

LAUNCH = """mutation Launch($p: ExecutionParams!) { launchPipelineExecution(executionParams: $p) {
 __typename ... on LaunchRunSuccess { run { runId status } } ... on PythonError { message } } }"""

ASSETS = ["source_files", "documents", "chunks", "chunk_embeddings", "qdrant_points"]


class Graphql:
    """The webserver's GraphQL schema over this test's instance and the repository's
    workspace (its code location in a code server, as ``dg dev`` runs it)."""

    def __init__(self) -> None:
        from dagster import DagsterInstance
        from dagster._core.workspace.context import WorkspaceProcessContext
        from dagster._core.workspace.load_target import WorkspaceFileTarget

        self.instance = DagsterInstance.get()
        self.cli: Cli | None = None
        self.workspace = WorkspaceProcessContext(
            self.instance, WorkspaceFileTarget(paths=[str(REPO / "workspace.yaml")])
        )

    def __call__(self, query: str, **variables: Any) -> Any:
        from dagster._core.definitions.partitions.context import partition_loading_context
        from dagster_graphql.test.utils import execute_dagster_graphql

        request = self.workspace.create_request_context()
        with partition_loading_context(dynamic_partitions_store=self.instance):
            result = execute_dagster_graphql(request, query, variables)
        assert not result.errors, result.errors
        return result.data

    def badge(self, asset: str = "documents") -> str:
        node = self(CHECKS, path=[asset])["assetNodeOrError"]
        return node_badge(node["assetChecksOrError"]["checks"])

    def materialize(self, book: str) -> dict[str, Any]:
        """What the UI's Materialize button sends for one partition of the ingestion assets:
        the implicit asset job with every check of the selected assets."""
        location = self.workspace.create_request_context().get_code_location("rag_pipeline")
        (name,) = location.get_repositories()
        checks = [
            {"assetKey": {"path": list(key.asset_key.path)}, "name": key.name}
            for key in location.get_repository(name).asset_graph.asset_check_keys
            if key.asset_key.path[-1] in ASSETS
        ]
        params = {
            "mode": "default",
            "selector": {
                "repositoryLocationName": "rag_pipeline",
                "repositoryName": name,
                "pipelineName": "__ASSET_JOB",
                "assetSelection": [{"path": [a]} for a in ASSETS],
                "assetCheckSelection": checks,
            },
            "executionMetadata": {"tags": [{"key": "dagster/partition", "value": book}]},
        }
        launched = self(LAUNCH, p=params)["launchPipelineExecution"]
        assert launched["__typename"] == "LaunchRunSuccess", launched
        return launched["run"]

    def close(self) -> None:
        self.workspace.__exit__(None, None, None)


@pytest.fixture
def graphql(tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Two books (alpha with a broken file) whose partitions are added (what the books
    sensor's first tick does before their first run), none ingested; the GraphQL schema."""
    from dagster import DagsterInstance

    from rag_pipeline.defs.partitions import BOOKS_PARTITIONS_NAME

    for book in ("alpha", "beta"):
        (data_dir / book).mkdir()
        (data_dir / book / "one.md").write_text(f"# {book}\n\nText about {book} and robots.\n")
    (data_dir / "alpha" / "broken.md").write_text("---\ntitle: [unclosed\n---\n# x\n")
    cli = Cli(tmp_path, data_dir)
    home = Path(cli.env["DAGSTER_HOME"])
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")  # what `make` sets up
    for key, value in cli.env.items():
        monkeypatch.setenv(key, value)
    with DagsterInstance.get() as instance:
        instance.add_dynamic_partitions(BOOKS_PARTITIONS_NAME, ["alpha", "beta"])
    # one schema per test: a second in this process would leave the first's code server
    # running past its Popen object (a ResourceWarning)
    schema = Graphql()
    schema.cli = cli
    yield schema
    schema.close()


def test_the_badge_before_any_evaluation_and_while_a_ui_launched_run_waits(graphql, data_dir):
    """Before any book's parse_errors was evaluated, Dagster 1.13's asset graph draws
    documents' check with the green ✓ of a passed one beside "0 / 1 Passed": its node icon is
    red, yellow or a gray dot only for a failed, warned or skipped check, and green for
    anything else, "not evaluated" included, while the GraphQL answer says the truth (no
    result, no partition status); no public API gives a check a neutral state without a
    result or an ended run that planned it (README, the UI section; if this part fails,
    Dagster changed the drawing: update the README).

    Then a run the UI launches plans parse_errors; until its documents step evaluates the
    book again (queued here: no daemon), the asset graph says what is known, never a red ✕
    or a green ✓ beside "0 / 1 Passed": yellow while a book has broken files, green once none
    has."""
    node = graphql(CHECKS, path=["documents"])["assetNodeOrError"]
    (check,) = node["assetChecksOrError"]["checks"]
    assert check["executionForLatestMaterialization"] is None
    assert not any(check["partitionStatuses"].values()), check
    assert graphql.badge() == "green ✓ 0 / 1 Passed"

    graphql.cli("ingest")  # the first evaluation: from here the badge says what is known
    assert graphql.badge() == "yellow ⚠ 0 / 1 Passed"
    run = graphql.materialize("beta")
    assert run["status"] == "QUEUED"
    assert type(graphql.instance.run_coordinator).__name__ == "BookRunCoordinator"
    assert graphql.badge() == "yellow ⚠ 0 / 1 Passed"

    graphql.instance.run_coordinator.cancel_run(run["runId"])

    (data_dir / "alpha" / "broken.md").unlink()
    graphql.cli("ingest")
    assert graphql.badge() == "green ✓ 1 / 1 Passed"
    run = graphql.materialize("beta")
    assert graphql.badge() == "green ✓ 1 / 1 Passed"
    graphql.instance.run_coordinator.cancel_run(run["runId"])

"""The retrieval parameters are declared once (rag_pipeline/retrieve/params.py): the CLI's
options and the query service's parameters are built from that one declaration, and the
one-value rule is the same function for both."""

import click
import pytest

from rag_pipeline.retrieve.params import BOOK, CONTEXT_PARAMS, SEARCH_PARAMS, repeated


def _cli_options(command: click.Command) -> dict[str, click.Option]:
    return {p.name: p for p in command.params if isinstance(p, click.Option) and p.name}


def _http_params(path: str) -> dict[str, dict]:
    from rag_pipeline.config import load_settings
    from rag_pipeline.recipes.lazy import LazyRecipe
    from rag_pipeline.serve.app import create_app

    settings = load_settings(embedder="hash", qdrant_path=":memory:")
    app = create_app(settings, LazyRecipe(settings.embedding(), settings.chunking()))
    return {p["name"]: p for p in app.openapi()["paths"][path]["get"]["parameters"]}


@pytest.mark.parametrize(
    ("command", "path", "params"),
    [("search", "/search", SEARCH_PARAMS), ("context", "/context/{chunk_id}", CONTEXT_PARAMS)],
)
def test_the_cli_and_the_service_take_the_declared_parameters(command, path, params):
    from rag_pipeline.cli import main

    options = _cli_options(main.commands[command])
    http = _http_params(path)
    for p in params:
        option, query = options[p.name], http[p.name]
        assert option.opts == [p.flag] and option.multiple == p.repeatable, p.name
        assert (option.default or None) == (None if p.repeatable else p.default), p.name
        # its values read by the declaration's one rule (bounds, choices, the type's text)
        assert getattr(option.type, "param", None) is p, p.name
        schema = query["schema"]
        assert schema.get("default") == (None if p.repeatable else p.default), p.name
        assert (schema.get("minimum"), schema.get("maximum")) == (p.minimum, p.maximum), p.name
        enum = schema.get("enum") or [a["const"] for a in schema.get("anyOf", []) if "const" in a]
        assert (tuple(enum) or None) == p.choices, p.name
        assert ("array" in str(schema)) == p.repeatable, p.name
    # nothing beside the declaration (the query text, the book, --json and the path)
    assert set(options) - {p.name for p in params} == {"book_id", "as_json"}
    assert set(http) - {p.name for p in params} <= {"q", BOOK.name, "chunk_id"}


@pytest.mark.parametrize(
    ("given", "single", "expected"),
    [
        (["book", "limit", "book"], {"book", "limit"}, ("book", 2)),
        (["where", "where", "book"], {"book"}, None),
        (["limit", "mode", "limit", "limit", "mode"], {"limit", "mode"}, ("limit", 3)),
        ([], {"book"}, None),
    ],
)
def test_the_one_value_rule(given, single, expected):
    assert repeated(given, single) == expected


def test_the_one_value_rule_is_applied_by_both_interfaces():
    """A single-valued parameter given twice: the CLI exits 2 naming the option, the service
    answers 400 naming the parameter; a repeatable one given twice is taken."""
    from fastapi.testclient import TestClient

    from rag_pipeline.config import load_settings
    from rag_pipeline.recipes.lazy import LazyRecipe
    from rag_pipeline.serve.app import create_app

    settings = load_settings(embedder="hash", qdrant_path=":memory:")
    app = create_app(settings, LazyRecipe(settings.embedding(), settings.chunking()))
    with TestClient(app) as client:
        twice = client.get(
            "/search", params=[("q", "x"), ("book", "a"), ("limit", 2), ("limit", 3)]
        )
        assert twice.status_code == 400 and "'limit' is given 2 times" in twice.json()["detail"]
        where = [("where", "module=m"), ("where", "lesson=2")]
        many = client.get("/search", params=[("q", "x"), ("book", "a"), *where])
        assert many.status_code == 200
        path = client.get("/context/abc", params={"book": "a", "chunk_id": "b"})
        assert path.status_code == 400 and "path parameter" in path.json()["detail"]
    from click.testing import CliRunner

    from rag_pipeline.cli import main

    done = CliRunner().invoke(main, ["search", "x", "--book", "a", "--limit", "2", "--limit", "3"])
    assert done.exit_code == 2 and "--limit is given 2 times" in done.output

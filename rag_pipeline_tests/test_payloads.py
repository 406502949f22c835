"""The payload format is a contract (existing indexes must still be read), written once.

The key sets below are spelled out on purpose: a rename in ``rag_pipeline/schema.py`` must
fail here, loudly, before it silently orphans every point already stored.
"""

import ast

import pytest

from rag_pipeline import schema
from rag_pipeline.models import Chunk, DocumentMeta, FileError
from rag_pipeline.recipes.recipe import LineageInfo
from rag_pipeline.schema import (
    CHUNK_FIELDS,
    DOCUMENT_FIELDS,
    DOCUMENT_META_FIELDS,
    HIT_FIELDS,
    LINEAGE_FIELDS,
    PAYLOAD_INDEXES,
    PAYLOAD_KEYS,
    DocumentOutcome,
    chunk_payload,
    document_payload,
)
from rag_pipeline_tests.conftest import REPO

NOW = "2024-05-01T12:00:00+00:00"
META = DocumentMeta("Intro", "m1", 2, 3, 1, "B1", ("robots", "ros"), "About robots")
LINEAGE = LineageInfo("hash-embedder", 8, "bm25-en-avg42", "sig-1", "0.9.0", "run-1")
CHUNK = Chunk(
    "c-0", "book", "m1/intro.md", "fh", "doc-1", "ch", "Some text.", "Start", 0, 2, None, "c-1",
    3, META,
)  # fmt: skip

PINNED_CHUNK = {
    "record_type": "chunk",
    "book_id": "book",
    "source_file": "m1/intro.md",
    "source_file_hash": "fh",
    "parent_doc_id": "doc-1",
    "content_hash": "ch",
    "text": "Some text.",
    "title": "Intro",
    "section_title": "Start",
    "chunk_index": 0,
    "total_chunks": 2,
    "prev_chunk_id": None,
    "next_chunk_id": "c-1",
    "token_count": 3,
    "module": "m1",
    "chapter": 2,
    "lesson": 3,
    "hardware_tier": 1,
    "proficiency_level": "B1",
    "tags": ["robots", "ros"],
    "embedding_model": "hash-embedder",
    "embedding_dim": 8,
    "sparse_model": "bm25-en-avg42",
    "signature": "sig-1",
    "pipeline_version": "0.9.0",
    "run_id": "run-1",
    "indexed_at": NOW,
    "source_revision": None,
    "source_version": None,
}
PINNED_DOCUMENT_KEYS = [
    "record_type",
    "book_id",
    "source_file",
    "source_file_hash",
    "parent_doc_id",
    "status",
    "total_chunks",
    "serving_previous_version",
    "error",
    "error_stage",
    "parse_version",
    "read_options",
    "warnings",
    "embedding_model",
    "embedding_dim",
    "signature",
    "pipeline_version",
    "run_id",
    "indexed_at",
    "source_revision",
    "source_version",
]
PINNED_DOCUMENT_META_KEYS = [
    "title",
    "module",
    "chapter",
    "lesson",
    "hardware_tier",
    "proficiency_level",
    "tags",
    "description",
    "frontmatter",
]


@pytest.fixture(autouse=True)
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schema, "_now", lambda: NOW)


def test_chunk_payload_is_pinned():
    """Keys, their order and their values: the stored format of a chunk."""
    payload = chunk_payload(CHUNK, LINEAGE)
    assert list(payload) == list(PINNED_CHUNK)
    assert payload == PINNED_CHUNK
    assert tuple(PINNED_CHUNK) == CHUNK_FIELDS


def test_document_record_of_a_parsed_file_is_pinned():
    outcome = DocumentOutcome("m1/intro.md", "fh", "ok", 2, META, {"title": "Intro"}, None, ("w",))
    payload = document_payload("book", outcome, LINEAGE)
    assert list(payload) == PINNED_DOCUMENT_KEYS + PINNED_DOCUMENT_META_KEYS
    assert payload["record_type"] == "document"
    assert payload["serving_previous_version"] is False
    assert payload["warnings"] == ["w"]
    assert payload["frontmatter"] == {"title": "Intro"}
    assert payload["tags"] == ["robots", "ros"]
    assert (
        tuple(PINNED_DOCUMENT_KEYS),
        tuple(PINNED_DOCUMENT_META_KEYS),
    ) == (DOCUMENT_FIELDS, DOCUMENT_META_FIELDS)


def test_document_record_of_a_failed_file_is_pinned():
    """A file that failed, with chunks of its last good version: no metadata, the error."""
    error = FileError("book", "m1/bad.md", "parse", "bad frontmatter")
    outcome = DocumentOutcome("m1/bad.md", "fh2", "error", 4, error=error)
    payload = document_payload("book", outcome, LINEAGE)
    assert list(payload) == PINNED_DOCUMENT_KEYS
    assert payload["serving_previous_version"] is True
    assert (payload["error"], payload["error_stage"]) == ("bad frontmatter", "parse")


def test_every_key_has_one_constant_and_every_field_list_names_known_keys():
    """The name constants and the typed payloads agree; indexes and ``--json`` fields name
    only fields that are written."""
    assert {key: getattr(schema, key.upper(), None) for key in PAYLOAD_KEYS} == {
        key: key for key in PAYLOAD_KEYS
    }
    assert set(PAYLOAD_INDEXES) <= set(CHUNK_FIELDS)
    assert set(HIT_FIELDS) <= set(CHUNK_FIELDS)
    assert set(LINEAGE_FIELDS) <= set(CHUNK_FIELDS)


# -- no payload key spelled outside the schema --------------------------------------------------

#: the modules where payload keys are spelled
SCHEMA_MODULES = {"rag_pipeline/schema.py"}
#: (file, key) pairs where a literal equal to a payload key is not a payload key; each says why
NOT_PAYLOAD_KEYS = {
    # the named groups of RAG_PATH_PATTERNS (a settings contract), not payload fields
    ("rag_pipeline/config.py", "module"),
    ("rag_pipeline/config.py", "chapter"),
    ("rag_pipeline/config.py", "lesson"),
    ("rag_pipeline/sources/crawl.py", "module"),
    ("rag_pipeline/sources/crawl.py", "chapter"),
    ("rag_pipeline/sources/crawl.py", "lesson"),
    # dagster.yaml's run_coordinator entry (Dagster's configuration format)
    ("rag_pipeline/dagster_yaml.py", "module"),
    # frontmatter keys of the source files (the input format's contract)
    ("rag_pipeline/ingest/parse.py", "tags"),
    # the OpenAI API's error body
    ("rag_pipeline/embed/openai.py", "error"),
    # JSON Schema's "title" in the query service's OpenAPI document (OpenAPI's format)
    ("rag_pipeline/serve/app.py", "title"),
    # the ingest report's --json fields (a CLI contract; a book's status, not a payload's)
    ("rag_pipeline/ingest/report.py", "status"),
    ("rag_pipeline/ingest/report.py", "run_id"),
    ("rag_pipeline/ingest/report.py", "warnings"),
    # plan --json's top-level fields (a CLI contract: the recipe's model, the plan's warnings)
    ("rag_pipeline/cli/ingest.py", "embedding_model"),
    ("rag_pipeline/cli/ingest.py", "warnings"),
    # plan --json's per-book model, eval --compare's recipe fields (CLI contracts)
    ("rag_pipeline/ingest/plan.py", "embedding_model"),
    ("rag_pipeline/cli/evaluation.py", "embedding_model"),
    ("rag_pipeline/cli/evaluation.py", "signature"),
    # Dagster metadata: column names of the UI's tables and entry names of a materialization
    # (what a person reads on the asset's page, not payload reads)
    ("rag_pipeline/defs/assets.py", "embedding_model"),
    ("rag_pipeline/defs/book_metadata.py", "status"),
    ("rag_pipeline/defs/book_metadata.py", "warnings"),
    ("rag_pipeline/defs/book_metadata.py", "embedding_model"),
    ("rag_pipeline/defs/book_metadata.py", "signature"),
    # the purge op's run config field (a Launchpad contract)
    ("rag_pipeline/defs/jobs.py", "book_id"),
    # the service's /health body (an HTTP contract)
    ("rag_pipeline/serve/app.py", "status"),
    ("rag_pipeline/serve/app.py", "embedding_model"),
    ("rag_pipeline/serve/app.py", "sparse_model"),
    # a BEIR corpus's own fields (the dataset's format, not a payload)
    ("rag_pipeline/evaluation/beir.py", "title"),
    ("rag_pipeline/evaluation/beir.py", "text"),
    # eval --json's field (a CLI contract, the name of the sparse model the run used)
    ("rag_pipeline/evaluation/metrics.py", "sparse_model"),
}
#: calls whose first argument names a payload field
_FIELD_CALLS = {"get", "pop", "setdefault", "Match", "MatchAny", "Range"}


def _key(node: ast.AST | None) -> list[ast.Constant]:
    return [node] if isinstance(node, ast.Constant) and node.value in PAYLOAD_KEYS else []


def _keys(node: ast.AST | None) -> list[ast.Constant]:
    """``node`` if it is a payload key literal, or the payload-key literals of a sequence."""
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return [k for e in node.elts for k in _key(e)]
    return _key(node)


class _SpelledKeys(ast.NodeVisitor):
    """Payload keys spelled where a payload key is meant: a subscript, a dict key, the field of
    ``.get`` / a store condition / ``counts_by``, a ``fields=`` list, a list of field names."""

    def __init__(self) -> None:
        self.found: list[ast.Constant] = []

    def visit_Assign(self, node: ast.Assign) -> None:
        if not any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            self.generic_visit(node)  # ``__all__`` names functions, not fields

    def visit_Subscript(self, node: ast.Subscript) -> None:
        self.found += _key(node.slice)
        self.generic_visit(node)

    def visit_Dict(self, node: ast.Dict) -> None:
        self.found += [k for key in node.keys for k in _key(key)]
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name in _FIELD_CALLS and node.args:
            self.found += _key(node.args[0])
        if name == "counts_by" and len(node.args) > 1:
            self.found += _key(node.args[1])
        self.found += [k for kw in node.keywords if kw.arg == "fields" for k in _keys(kw.value)]
        self.generic_visit(node)

    def visit_List(self, node: ast.List | ast.Tuple | ast.Set) -> None:
        keys = _keys(node)
        if len(node.elts) > 1 and len(keys) == len(node.elts):
            self.found += keys  # a spelled-out list of field names
        self.generic_visit(node)

    visit_Tuple = visit_Set = visit_List


def spelled_keys(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, key) of every payload key spelled in ``tree`` where a key is meant, in order."""
    visitor = _SpelledKeys()
    visitor.visit(tree)
    return sorted({(c.lineno, c.col_offset, c.value) for c in visitor.found})


def _exempt(rel: str) -> bool:
    return rel in SCHEMA_MODULES


def test_no_payload_key_is_spelled_outside_the_schema():
    offenders = [
        f"{rel}:{line}: {key!r}"
        for path in sorted((REPO / "rag_pipeline").rglob("*.py"))
        if not _exempt(rel := path.relative_to(REPO).as_posix())
        for line, _, key in spelled_keys(ast.parse(path.read_text(), filename=rel))
        if (rel, key) not in NOT_PAYLOAD_KEYS
    ]
    assert offenders == [], "payload keys spelled outside the schema (use its constants):\n" + (
        "\n".join(offenders)
    )


def test_the_scan_finds_a_spelled_key():
    """The scan itself: each place a payload key may be spelled is found."""
    source = "\n".join(
        [
            'p["source_file"]',
            'p.get("chunk_index")',
            '{"title": 1}',
            'Match("module", "m")',
            'store.counts_by(where, "embedding_model")',
            'store.scroll(where, fields=["status"])',
            'FIELDS = ("tags", "lesson")',
            'o.status == "error"',  # a value, not a key
            '_Block("text", body)',  # a kind, not a key
        ]
    )
    found = [(line, key) for line, _, key in spelled_keys(ast.parse(source))]
    assert found == [
        (1, "source_file"),
        (2, "chunk_index"),
        (3, "title"),
        (4, "module"),
        (5, "embedding_model"),
        (6, "status"),
        (7, "tags"),
        (7, "lesson"),
    ]


def test_every_exemption_is_still_needed():
    """An exemption that hides nothing (its file moved, its literal gone) is dropped."""
    for rel in SCHEMA_MODULES:
        assert (REPO / rel).exists(), rel
    hidden = {
        (rel, key)
        for rel in {rel for rel, _ in NOT_PAYLOAD_KEYS}
        for _, _, key in spelled_keys(ast.parse((REPO / rel).read_text()))
    }
    assert NOT_PAYLOAD_KEYS - hidden == set()

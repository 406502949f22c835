import hashlib

import pytest

from rag_pipeline.models import FileError, ParsedDocument, PathMeta, document_id
from rag_pipeline.parse import parse_document
from rag_pipeline_tests.conftest import CORPUS


def parse(data: bytes, name: str = "doc.md", meta: PathMeta = PathMeta(), **kwargs):  # noqa: B008
    return parse_document("book", name, data, hashlib.sha256(data).hexdigest(), meta, **kwargs)


def fixture(rel: str) -> bytes:
    return (CORPUS / rel).read_bytes()


def test_crlf_file_is_normalized():
    data = fixture("physical-ai/crlf-version-compatibility.md")
    assert b"\r\n" in data
    doc = parse(data)
    assert isinstance(doc, ParsedDocument)
    assert "\r" not in doc.body
    assert doc.meta.title  # from frontmatter


def test_bom_is_stripped_and_title_read():
    data = fixture("powershell/Write-Host.md")
    assert data.startswith(b"\xef\xbb\xbf")
    doc = parse(data)
    assert isinstance(doc, ParsedDocument)
    assert doc.meta.title == "Write-Host"
    assert doc.frontmatter["Module Name"] == "Microsoft.PowerShell.Utility"


def test_invalid_yaml_frontmatter_is_a_per_file_error():
    result = parse(fixture("powershell/ForEach-Object.md"), "ForEach-Object.md")
    assert isinstance(result, FileError)
    assert result.source_file == "ForEach-Object.md"
    assert result.stage == "parse"
    assert result.reason.startswith("invalid YAML frontmatter:")
    assert "line" in result.reason
    assert result.source_file_hash  # recorded so an unchanged bad file is not retried


def test_missing_frontmatter_takes_title_from_first_heading():
    doc = parse(fixture("physical-ai/no-frontmatter-page-03b.md"))
    assert isinstance(doc, ParsedDocument)
    assert doc.frontmatter == {}
    assert doc.meta.title.startswith("Module 1, Chapter 1")


def test_mdx_with_jsx_and_cefr_level():
    doc = parse(fixture("physical-ai/cefr-jsx-what-is-ros2.md"), meta=PathMeta(None, 1, 1))
    assert isinstance(doc, ParsedDocument)
    assert doc.meta.title == "What is ROS 2?"
    assert doc.meta.proficiency_level == "A2"  # from cefr_level
    assert doc.meta.chapter == 1 and doc.meta.lesson == 1
    assert doc.meta.hardware_tier == 1  # empty hardware_prerequisites
    assert "<PersonalizedLesson" in doc.body


def test_mdx_file_parses():
    doc = parse(fixture("physical-ai/mdx-page-20.mdx"), "x.mdx")
    assert isinstance(doc, ParsedDocument)
    assert doc.body.strip()


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"# Title\x00\x01\x02binary", "binary content (NUL bytes)"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "binary content (NUL bytes)"),
        (b"# caf\xe9 au lait", "not valid UTF-8: byte 0xe9 at offset 5"),
        (b"\x01\x02\x03\x04\x05\x06\x07\x08 junk" * 10, "binary content (mostly control"),
        (b"---\ntitle: [unclosed\n---\nbody", "invalid YAML frontmatter"),
        (b"---\n- a\n- b\n---\nbody", "frontmatter is not a key/value mapping"),
    ],
)
def test_bad_input_becomes_an_error_naming_the_reason(data, reason):
    result = parse(data, "bad.md")
    assert isinstance(result, FileError)
    assert result.source_file == "bad.md"
    assert reason in result.reason


def test_empty_file_is_an_empty_document():
    doc = parse(b"")
    assert isinstance(doc, ParsedDocument)
    assert doc.is_empty
    assert doc.meta.title == "Doc"


@pytest.mark.parametrize(
    ("frontmatter", "field", "expected"),
    [
        ("proficiency_level: Beginner", "proficiency_level", "beginner"),
        ("cefr_level: b1", "proficiency_level", "B1"),
        ("cefr_entry_level: A2", "proficiency_level", "A2"),
        ("hardware_tier: 3", "hardware_tier", 3),
        ("hardware_tier: 'tier 2'", "hardware_tier", 2),
        ("hardware_prerequisites: ['NVIDIA RTX 4070 GPU']", "hardware_tier", 2),
        ("hardware_prerequisites: ['Jetson Orin Nano', 'RealSense D435i']", "hardware_tier", 3),
        ("hardware_prerequisites: ['Unitree G1 humanoid robot']", "hardware_tier", 4),
        ("tags: [ros2, week-3, ros2]", "tags", ("ros2", "week-3")),
        ("tags: 'a, b'", "tags", ("a", "b")),
        ("chapter: 'Chapter 4'", "chapter", 4),
        ("module: module-02-sim", "module", "module-02-sim"),
    ],
)
def test_frontmatter_normalization(frontmatter, field, expected):
    doc = parse(f"---\n{frontmatter}\n---\n# T\n\nbody".encode())
    assert getattr(doc.meta, field) == expected


def test_frontmatter_beats_path_metadata_and_path_fills_gaps():
    doc = parse(b"---\nchapter: 9\n---\n# T\n", meta=PathMeta("module-1", 2, 3))
    assert (doc.meta.module, doc.meta.chapter, doc.meta.lesson) == ("module-1", 9, 3)


def test_default_hardware_tier_is_configurable():
    assert parse(b"# T", default_hardware_tier=None).meta.hardware_tier is None
    assert parse(b"# T", default_hardware_tier=2).meta.hardware_tier == 2


def test_dates_in_frontmatter_become_strings():
    doc = parse(b"---\nms.date: 2026-01-18\nupdated: 2026-01-18T10:00:00\n---\nbody")
    assert doc.frontmatter["ms.date"] == "2026-01-18"
    assert doc.frontmatter["updated"].startswith("2026-01-18T10:00")


@pytest.mark.parametrize(
    ("name", "body", "title"),
    [
        ("01-what-is-ros2.md", "no heading here", "What is ros2"),
        ("x.md", "```\n# not a heading\n```\n\nSetext Title\n============\n", "Setext Title"),
        ("x.md", "---\ntitle: ''\n---\n## Second level\n", "Second level"),
    ],
)
def test_title_fallbacks(name, body, title):
    assert parse(body.encode(), name).meta.title == title


def test_document_id_is_stable_and_per_book():
    doc = parse(b"# T", "a/b.md")
    assert doc.parent_doc_id == document_id("book", "a/b.md")
    assert document_id("book", "a/b.md") != document_id("other", "a/b.md")

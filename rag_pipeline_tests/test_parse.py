import hashlib

import pytest

from rag_pipeline.ingest.parse import parse_document
from rag_pipeline.models import FileError, ParsedDocument, PathMeta, document_id
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


# -- hostile frontmatter: bounded, never fatal to the book ------------------------------------


def parse_text(text: str | bytes):
    data = text.encode() if isinstance(text, str) else text
    return parse_document("b", "x.md", data, "h")


def alias_bomb(levels: int, fanout: int = 9) -> str:
    lines = ["---", "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for level in range(1, levels + 1):
        refs = ", ".join(f"*a{level - 1}" for _ in range(fanout))
        lines.append(f"a{level}: &a{level} [{refs}]")
    return "\n".join([*lines, "title: boom", "---", "# Body", ""])


@pytest.mark.parametrize("levels", [4, 7, 9])
def test_a_yaml_alias_bomb_is_refused_at_once(levels):
    import time

    started = time.perf_counter()
    result = parse_text(alias_bomb(levels))
    # a guard against expansion (9 levels expanded: minutes and gigabytes), not a speed target:
    # milliseconds on a quiet machine, seconds on one the whole suite loads
    assert time.perf_counter() - started < 10.0
    assert isinstance(result, FileError)
    assert "aliases" in result.reason or "expands to more than" in result.reason


def test_a_recursive_yaml_anchor_is_a_per_file_error():
    result = parse_text("---\na: &a [*a]\ntitle: x\n---\n# Body\n")
    assert isinstance(result, FileError) and "refers to itself" in result.reason


def test_deep_and_huge_frontmatter_are_refused():
    deep = "---\nx: " + "[" * 200 + "]" * 200 + "\n---\nbody\n"
    assert "nested deeper" in parse_text(deep).reason
    huge = "---\ntitle: " + "y" * 70_000 + "\n---\nbody\n"
    assert "larger than 64 KiB" in parse_text(huge).reason


def test_a_few_aliases_are_fine():
    doc = parse_text("---\nbase: &b {tier: 2}\nother: *b\ntitle: Shared\n---\n# Body\n")
    assert isinstance(doc, ParsedDocument) and doc.frontmatter["other"] == {"tier": 2}


@pytest.mark.parametrize(
    ("frontmatter", "field", "expected", "warned"),
    [
        ("chapter: [1, 2]", "chapter", None, "'chapter'"),
        ("hardware_tier: abc", "hardware_tier", 1, "used the default 1"),
        ("lesson: {a: 1}", "lesson", None, "'lesson'"),
        ("title: [a, b]", "title", "Body", "'title'"),
        ("tags: {a: 1}", "tags", (), "'tags'"),
        ("chapter: 99999999999999999999999", "chapter", None, "'chapter'"),
        ("chapter: Chapter 3", "chapter", 3, None),
    ],
)
def test_wrong_frontmatter_types_keep_the_file_with_a_warning(frontmatter, field, expected, warned):
    doc = parse_text(f"---\n{frontmatter}\n---\n# Body\n\ntext\n")
    assert isinstance(doc, ParsedDocument)
    assert getattr(doc.meta, field) == expected
    if warned:
        assert any(warned in w for w in doc.warnings), doc.warnings
    else:
        assert not doc.warnings


def test_nul_bytes_after_the_head_are_removed_with_a_warning():
    doc = parse_text(b"# Title\n\n" + b"x" * 9000 + b"\x00tail\x00\n")
    assert isinstance(doc, ParsedDocument) and "\x00" not in doc.body
    assert doc.warnings == ("2 NUL characters removed from the text",)


@pytest.mark.parametrize(
    "data",
    [
        b"---\n" + b"\xff" * 10 + b"\n---\n",
        "---\ntitle: \ud800\n---\n".encode("utf-8", "surrogatepass"),
        b"+++\ntitle = [\n+++\nbody",
        b"---\n!!python/object/apply:os.system ['true']\n---\n",
        b"---\n: : :\n---\n",
    ],
)
def test_every_bad_frontmatter_is_an_error_never_an_exception(data):
    result = parse_text(data)
    assert isinstance(result, FileError | ParsedDocument)


TEXT = "---\ntitle: Café\n---\n# Heading\n\nSome text.\n"


@pytest.mark.parametrize(
    ("bom", "codec", "name"),
    [
        (b"\xff\xfe", "utf-16-le", "UTF-16 (little-endian)"),
        (b"\xfe\xff", "utf-16-be", "UTF-16 (big-endian)"),
        (b"\xff\xfe\x00\x00", "utf-32-le", "UTF-32 (little-endian)"),
        (b"\x00\x00\xfe\xff", "utf-32-be", "UTF-32 (big-endian)"),
    ],
)
def test_utf16_and_utf32_with_a_bom_are_decoded_with_a_warning(bom, codec, name):
    data = bom + TEXT.replace("\n", "\r\n").encode(codec)
    doc = parse(data)
    assert isinstance(doc, ParsedDocument), doc
    assert doc.meta.title == "Café"
    assert doc.body == parse(TEXT.encode()).body  # exactly what the UTF-8 file gives
    assert doc.source_file_hash == hashlib.sha256(data).hexdigest()  # of the raw bytes
    assert doc.warnings == (f"{name} encoded with a byte-order mark: decoded (UTF-8 is preferred)",)


def test_utf16_without_a_bom_and_broken_utf16_are_named():
    no_bom = parse(TEXT.encode("utf-16-le"), "w.md")
    assert isinstance(no_bom, FileError)
    assert "looks like UTF-16 without a byte-order mark" in no_bom.reason
    broken = parse(b"\xff\xfe#\x00 \x00\x00\xd8", "w.md")  # a lone surrogate
    assert isinstance(broken, FileError)
    assert broken.reason.startswith("not valid UTF-16 (little-endian):")


@pytest.mark.parametrize("where", [0, 7, 20])
def test_a_few_nul_bytes_anywhere_are_removed_with_a_warning(where):
    text = b"# Title\n\nSome ordinary text here.\n"
    data = text[:where] + b"\x00" + text[where:]
    doc = parse(data)
    assert isinstance(doc, ParsedDocument), doc
    assert "\x00" not in doc.body and "\x00" not in doc.meta.title
    assert doc.warnings == ("1 NUL characters removed from the text",)
    assert doc.source_file_hash == hashlib.sha256(data).hexdigest()


def test_a_stray_nul_in_a_tiny_file_is_removed_not_binary():
    doc = parse(b"# N\n\nx\x00y\n")
    assert isinstance(doc, ParsedDocument) and doc.body == "# N\n\nxy\n"


def test_mostly_nul_text_is_still_binary():
    result = parse(b"# T\n" + b"\x00" * 4000 + b"text\n" * 100)
    assert isinstance(result, FileError) and "binary content (NUL bytes)" in result.reason


@pytest.mark.parametrize(
    ("data", "what"),
    [
        (b"", "0 bytes"),
        (b" \n\t\n", "only whitespace"),
        (b"---\ntitle: Only metadata\n---\n", "only frontmatter"),
        (b"---\ntitle: Only metadata\n---\n\n  \n", "only frontmatter"),
    ],
)
def test_empty_documents_are_kept_with_a_warning(data, what):
    doc = parse(data)
    assert isinstance(doc, ParsedDocument) and doc.is_empty
    assert doc.warnings == (f"empty document ({what}): nothing to index",)


def test_unclosed_frontmatter_is_indexed_as_text_with_a_warning():
    doc = parse(b"---\ntitle: never closed\n\n# Heading\n\ntext\n")
    assert isinstance(doc, ParsedDocument)
    assert doc.frontmatter == {} and doc.body.startswith("---\ntitle: never closed")
    assert doc.warnings == (
        "frontmatter is not closed (no second '---' line): the whole file is indexed as text",
    )


@pytest.mark.parametrize(
    "frontmatter",
    [
        "x: " + "[" * 5000 + "]" * 5000,
        "x: " + "{a: " * 3000 + "1" + "}" * 3000,
        "x:\n" + "".join(" " * i + "- \n" for i in range(1, 300)),
    ],
)
def test_deeply_nested_frontmatter_is_refused_fast_and_clearly(frontmatter):
    import time

    started = time.perf_counter()
    result = parse_text(f"---\n{frontmatter}\n---\n# Body\n")
    assert time.perf_counter() - started < 10.0  # a guard against blow-up, as above
    assert isinstance(result, FileError)
    assert result.reason == "frontmatter is nested deeper than 32 levels"


def test_deeply_nested_json_frontmatter_is_a_clear_error():
    result = parse_text("{\n" + '"x": ' + "[" * 5000 + "]" * 5000 + "\n}\n# Body\n")
    assert isinstance(result, FileError), result
    assert "nested deeper" in result.reason


_YAML_ERRORS = {
    # name: (file lines, the line's text where the error is)
    "unclosed bracket on line 2": (["---", "title: [unclosed", "---", "body"], "title: ["),
    "bad key on line 3": (["---", "title: a", "bad key: : x", "---", "body"], "bad key"),
    "indented key on line 4": (["---", "title: a", "author: b", "  c: d", "---"], "  c: d"),
    "tab on line 1 of a long block": (
        ["---", "\tx: 1", "a: 1", "b: 2", "c: 3", "---", "body"],
        "\tx: 1",
    ),
    "error on the last line": (
        ["---", *(f"k{i}: {i}" for i in range(12)), "- item", "---", "body"],
        "- item",
    ),
    "unclosed quote after blank lines": (["---", "", "", 'title: "x', "---", "b"], 'title: "x'),
    "unclosed brace with blank lines after": (["---", "a: {b: c", "", "", "---", "b"], "a: {b"),
    "undefined alias": (["---", "a: 1", "b: *nowhere", "---", "body"], "b: *nowhere"),
    "delimiter with trailing spaces": (["---   ", "", "a: 1", "b: [", "---", "body"], "b: ["),
}
_ENCODINGS = {
    "LF": lambda text: text.encode(),
    "CRLF": lambda text: text.replace("\n", "\r\n").encode(),
    "BOM and CRLF": lambda text: b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode(),
    "UTF-16 with BOM": lambda text: text.encode("utf-16"),
    "CR only": lambda text: text.replace("\n", "\r").encode(),
}


@pytest.mark.parametrize("encoding", list(_ENCODINGS))
@pytest.mark.parametrize("case", list(_YAML_ERRORS))
def test_yaml_error_names_the_line_of_the_file_it_is_on(case, encoding):
    """The reported line is the 1-based line an editor opens the file at (issue 44 item 8)."""
    lines, bad = _YAML_ERRORS[case]
    expected = next(i for i, line in enumerate(lines, 1) if line.startswith(bad))
    result = parse(_ENCODINGS[encoding]("\n".join(lines) + "\n"), "bad.md")
    assert isinstance(result, FileError), result
    assert result.reason.startswith("invalid YAML frontmatter:")
    assert f"(line {expected})" in result.reason or f"(line {expected}:" in result.reason, (
        result.reason
    )


def test_yaml_error_in_a_real_file_names_its_line():
    data = fixture("powershell/ForEach-Object.md")
    bad = data.decode("utf-8-sig").splitlines().index("  - %") + 1
    result = parse(data, "ForEach-Object.md")
    assert isinstance(result, FileError)
    assert result.reason.endswith(f"(line {bad})"), result.reason


def test_frontmatter_after_blank_lines_is_body_text():
    """python-frontmatter only reads a delimiter on line 1: a '---' block after blank lines is
    Markdown (a rule and a paragraph), so its YAML errors are never reported."""
    doc = parse(b"\n\n---\ntitle: [unclosed\n---\nbody\n")
    assert isinstance(doc, ParsedDocument)
    assert doc.frontmatter == {}

"""Hostile names in the Dagster layer: book data (file names, section titles, error messages)
shown as markdown in the UI, and folder names used as dynamic partition keys and run tags."""

from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from dagster import (
    DagsterInstance,
    MarkdownMetadataValue,
    RunsFilter,
    SkipReason,
    materialize,
)
from markdown_it import MarkdownIt

from rag_pipeline.defs.assets import ingestion_assets
from rag_pipeline.defs.location import fixed_resources
from rag_pipeline.defs.metadata import (
    escape_markdown,
    link,
    markdown_list,
    markdown_rows,
    markdown_table,
)
from rag_pipeline.defs.partitions import BOOKS_PARTITIONS_NAME
from rag_pipeline.defs.runs import (
    BOOK_KEY_VALUE,
    BOOK_TAG,
    PARTITION_TAG,
    book_key,
    book_runs_path,
)
from rag_pipeline.defs.sensors import read_cursor
from rag_pipeline.ingest.pipeline import IngestPipeline
from rag_pipeline.models import InvalidBookIdError, validate_book_id
from rag_pipeline.sources.scan import clear_scan_cache
from rag_pipeline_tests.conftest import hash_settings, step_failure

#: file names that markdown would render as a link, an image, HTML, a table cell, emphasis,
#: a heading or a list, were they not escaped
HOSTILE_NAMES = (
    "x](http:evil)[y.md",
    "![i](evil.png).md",
    "<img src=x onerror=alert(1)>.md",
    "|pipe|.md",
    "**bold**.md",
    "__under__.md",
    "~~struck~~.md",
    "`code`.md",
    "# heading.md",
    "1. numbered.md",
    "- dash.md",
    "&lt;entity.md",
    "back\\slash.md",
)

#: the UI's markdown: CommonMark with inline HTML, GFM tables and strikethrough
_RENDER = MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])


def rendered_as_text(markdown: str) -> str:
    """The HTML the UI would render ``markdown`` as, asserting it holds no element that
    book data could have made (a link, an image, raw HTML, emphasis, code, a heading)."""
    html = _RENDER.render(markdown)
    for tag in (
        "<a ",
        "<img",
        "<strong",
        "<em>",
        "<s>",
        "<del>",
        "<code",
        "<h1",
        "<ol",
        "<ul>\n<li>\n<ul",
    ):
        assert tag not in html, (tag, markdown, html)
    return html


def escaped_html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_a_hostile_name_in_a_markdown_list_renders_as_its_text(name):
    html = rendered_as_text(markdown_list([name]).value)
    assert escaped_html(name) in html


def test_a_hostile_cell_stays_in_its_cell_and_reads_back():
    rows = [
        {"book": name, "why": name, "runs": link(name, "/runs?q=a b(c)")} for name in HOSTILE_NAMES
    ]
    value = markdown_table(rows, ("book", "why", "runs"))
    html = _RENDER.render(value.value)
    # one link per row (the runs column's), every other cell text
    assert html.count("<a ") == len(HOSTILE_NAMES) and "<img" not in html
    assert html.count("<tr>") == len(HOSTILE_NAMES) + 1  # no row split by a '|'
    assert markdown_rows(value) == [{"book": n, "why": n, "runs": n} for n in HOSTILE_NAMES]


@pytest.mark.parametrize(
    "name", ["1. Intro.md", "10) ten.md", "3.5", "1.basics", "-3", "# x", "2024-01-01 notes.md"]
)
def test_a_name_opening_like_a_block_shows_exactly_its_text(name):
    """A name that opens like a numbered item, a heading or a list shows as itself, no
    backslash in sight (one before a digit is no escape in CommonMark: it showed)."""
    html = rendered_as_text(markdown_list([name]).value)
    assert f"<li>{escaped_html(name)}</li>" in html, html
    cell = _RENDER.render(markdown_table([{"book": name}], ("book",)).value)
    assert f"<td>{escaped_html(name)}</td>" in cell, cell


def test_escaping_keeps_a_plain_name_readable():
    assert escape_markdown("chapter-1.md") == "chapter-1.md"
    # digits then a hyphen open no block: a run id or a dated name is kept as it is (a run id
    # of 8 digits first, 2% of them, once failed to match its own link)
    for text in ("34661958-a4eb-445f-9bfa-b33a76fa6051", "2024-01-01 notes.md", "7+8=15"):
        assert escape_markdown(text) == text
    assert escape_markdown("1. one") == "1\\. one" and escape_markdown("- x") == "\\- x"
    assert escape_markdown("line\nbreak") == "line\\\\x0abreak"  # one line, control shown


#: run ids (uuid4: 8-4-4-4-12 hex digits) of the forms that chance gives a few times in a
#: hundred and a text rule may take for something else: digits first (a numbered item, a
#: number), a leading zero, a float's exponent, no digit at all
ODD_RUN_IDS = [
    "34661958-a4eb-445f-9bfa-b33a76fa6051",
    "01234567-8901-4234-8567-890123456789",
    "1e234567-1e34-4e67-8e90-123456789012",
    "0e000000-0000-4000-8000-000000000000",
    "abcdefab-cdef-4abc-adef-abcdefabcdef",
    "12345678-1234-4123-9123-123456789012",
]


@pytest.mark.parametrize("run_id", ODD_RUN_IDS)
def test_a_run_id_of_any_form_links_to_its_run_in_the_collection_table(run_id):
    """The collection table's last run is the run's id linking to its page, read back as the
    id, whatever hex digits chance gave it (an id of 8 digits first once showed escaped)."""
    from rag_pipeline.defs.collection import _linked

    row = _linked({"book": "b", "last_run": run_id})
    value = markdown_table([row], ("book", "last_run"))
    assert f"[{run_id}](/runs/{run_id})" in value.value
    assert f'<a href="/runs/{run_id}">{run_id}</a>' in _RENDER.render(value.value)
    assert markdown_rows(value) == [{"book": "b", "last_run": run_id}]


@pytest.fixture
def hostile_book(data_dir: Path, tmp_path: Path) -> tuple[Any, DagsterInstance]:
    book = data_dir / "hostile"
    book.mkdir()
    (book / "ok.md").write_text("# Fine\n\nSome text that parses.\n")
    for name in HOSTILE_NAMES:
        # empty: listed by name in empty_files ('/' makes a folder: the name is the path)
        (book / name).parent.mkdir(parents=True, exist_ok=True)
        (book / name).write_text("")
    (book / "broken [x](evil).md").write_bytes(b"---\ntitle: [oops\n---\nbody")
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(BOOKS_PARTITIONS_NAME, ["hostile"])
    resources = fixed_resources(IngestPipeline.from_settings(hash_settings(data_dir, tmp_path)))
    return resources, instance


def test_hostile_file_names_in_a_runs_metadata_render_as_text(hostile_book):
    resources, instance = hostile_book
    result = materialize(
        ingestion_assets, partition_key="hostile", instance=instance, resources=resources
    )
    assert result.success
    markdowns = [
        value.value
        for event in result.get_asset_materialization_events()
        for value in event.materialization.metadata.values()
        if isinstance(value, MarkdownMetadataValue)
    ] + [
        value.value
        for check in result.get_asset_check_evaluations()
        for value in check.metadata.values()
        if isinstance(value, MarkdownMetadataValue)
    ]
    shown = "\n".join(rendered_as_text(text) for text in markdowns)
    for name in HOSTILE_NAMES:
        assert escaped_html(name) in shown, name


#: folder names Dagster's partition UI or its range syntax mishandles (a comma, brackets, '*',
#: '|', '...'), spaces at an end, past the 128-character limit, and a pair of unicode
#: normalization twins (é composed and decomposed: two folders, one name on screen)
HOSTILE_BOOK_IDS = (
    "a,b",
    "a[1]",
    "a*",
    "a|b",
    "...",
    " lead",
    "trail ",
    "x" * 129,
    "caf\u00e9",
    "cafe\u0301",
)


def test_hostile_folder_names_are_refused_by_name_never_listed_as_books(data_dir, tmp_path):
    for book_id in HOSTILE_BOOK_IDS:
        (data_dir / book_id).mkdir()
        (data_dir / book_id / "a.md").write_text("# A\n\ntext\n")
    listing = IngestPipeline.from_settings(hash_settings(data_dir, tmp_path)).source.list_books()
    assert listing.book_ids == ()
    # a folder whose name starts with '.' is hidden, never a book: skipped without a word
    shown = [b for b in HOSTILE_BOOK_IDS if not b.startswith(".")]
    assert sorted(e.book_id for e in listing.rejected) == sorted(shown)
    assert all(e.reason.startswith("invalid book id") for e in listing.rejected)


@pytest.mark.parametrize("book_id", HOSTILE_BOOK_IDS, ids=lambda b: ascii(b)[:20])
def test_a_hostile_partition_added_by_hand_fails_its_run_with_the_reason(
    data_dir, tmp_path, book_id
):
    """A partition the sensor never adds (the UI's "Add partition", a script): its run fails
    at once saying why, before any stage reads or writes anything."""
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(BOOKS_PARTITIONS_NAME, [book_id])
    resources = fixed_resources(IngestPipeline.from_settings(hash_settings(data_dir, tmp_path)))
    result = materialize(
        ingestion_assets,
        partition_key=book_id,
        instance=instance,
        resources=resources,
        raise_on_error=False,
    )
    assert not result.success
    error = step_failure(result)
    assert "invalid book id" in error and "not a book this pipeline can ingest" in error, error
    assert "rag_pipeline/ingest" not in error and "rag_pipeline/recipes" not in error, error


@pytest.mark.parametrize("length", [63, 64, 128])
def test_a_long_book_id_tags_its_run_with_compliant_keys_and_the_runs_link_finds_it(
    data_dir, tmp_path, write_book, length
):
    """A book id of up to 128 characters is a partition key and the value of ``rag/book``;
    its ``rag-book/`` key stays within Dagster's 63 characters a tag key section may hold
    (a longer one is deprecated: a warning each RunRequest, an error in a later Dagster),
    and the runs filter and link find its runs by it."""
    from rag_pipeline_tests.test_sensors import Harness

    book_id = ("A" + "b._-" * 32)[: length - 3] + "x_9"
    assert len(validate_book_id(book_id)) == length
    write_book(book_id, {"a.md": "# A\n\nSome text.\n"})
    clear_scan_cache()
    harness = Harness(data_dir)
    requested = harness.tick().run_requests  # a non-compliant key warns: an error here
    assert [r.tags[BOOK_TAG] for r in requested] == [book_id]
    assert all(len(k.split("/")[-1]) <= 63 for k in requested[0].tags)
    resources = fixed_resources(IngestPipeline.from_settings(hash_settings(data_dir, tmp_path)))
    result = materialize(
        ingestion_assets,
        partition_key=book_id,
        instance=harness.instance,
        resources=resources,
        tags=requested[0].tags,
    )
    assert result.success
    tags = harness.instance.get_run_by_id(result.run_id).tags
    assert tags[BOOK_TAG] == book_id and tags[PARTITION_TAG] == book_id
    key = book_key(book_id)
    assert key in requested[0].tags and len(key.split("/")[-1]) <= 63
    found = harness.instance.get_runs(RunsFilter(tags={key: BOOK_KEY_VALUE}))
    assert [run.run_id for run in found] == [result.run_id]
    # the runs link carries that key whole, nothing markdown or a URL would cut
    assert unquote(book_runs_path(book_id).split("q[0]=", 1)[1]) == f"tag:{key}=yes"
    # ids that share their first 60 characters keep keys of their own
    assert book_key(book_id[:-1] + "8") != key or length <= 63


def test_a_hostile_partition_added_by_hand_is_deleted_by_the_sensor_without_a_purge_run(
    data_dir, write_book
):
    """The store refuses an invalid id, so such a partition holds no points: the sensor
    deletes it (saying why) rather than request a purge run that could only fail."""
    from rag_pipeline_tests.test_sensors import Harness

    clear_scan_cache()
    write_book("alpha", {"a.md": "# A"})
    harness = Harness(data_dir)
    assert [r.job_name for r in harness.tick().run_requests] == ["ingest_books"]
    harness.instance.add_dynamic_partitions(BOOKS_PARTITIONS_NAME, ["a,b", "cafe\u0301"])
    result = harness.tick()
    assert not isinstance(result, SkipReason), result
    assert result.run_requests == []
    assert harness.partitions == ["alpha"]
    assert "a,b" not in read_cursor(harness.cursor)[0]


def test_a_refused_non_ascii_character_is_named_by_its_code_point():
    """A combining accent printed alone is invisible or sticks to the quote: the reason
    names the code point, so é composed and decomposed read differently."""
    with pytest.raises(InvalidBookIdError, match=r"U\+0301 COMBINING ACUTE ACCENT"):
        validate_book_id("cafe\u0301")
    with pytest.raises(InvalidBookIdError, match=r"U\+00E9 LATIN SMALL LETTER E WITH ACUTE"):
        validate_book_id("caf\u00e9")


def test_a_hostile_data_folder_path_stays_in_its_cell_of_the_collection_table(tmp_path):
    """The book table's ``source`` cell holds the data folder's path: a '|' there split the
    row, and brackets or '*' made a link or emphasis of it."""
    from rag_pipeline.defs.collection import qdrant_collection

    data_dir = tmp_path / "b|o**k [s](x) <i>"
    (data_dir / "alpha").mkdir(parents=True)
    (data_dir / "alpha" / "a.md").write_text("# A\n\nSome text.\n")
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(BOOKS_PARTITIONS_NAME, ["alpha"])
    resources = fixed_resources(IngestPipeline.from_settings(hash_settings(data_dir, tmp_path)))
    materialize(ingestion_assets, partition_key="alpha", instance=instance, resources=resources)
    result = materialize([qdrant_collection], instance=instance, resources=resources)
    (event,) = result.get_asset_materialization_events()
    table = event.materialization.metadata["book_table"]
    html = _RENDER.render(table.value.split("\n\n")[0])  # the table, not its legend
    assert html.count("<tr>") == 2 and html.count("<a ") == 2  # last_run and runs links
    assert "<strong" not in html and "<i>" not in html and "<em>" not in html
    (row,) = markdown_rows(table)
    assert str(data_dir) in str(row["source"])


def test_a_run_of_one_long_book_id_is_named_as_one_book():
    """Its rag/book value and its cut rag-book/ key are one book, not two."""
    from rag_pipeline.defs.runs import one_book_tags, run_started_line

    book_id = "A" + "b" * 127
    line = run_started_line("0" * 36, "ingest_books", one_book_tags(book_id))
    assert book_id in line and "more" not in line and book_key(book_id)[9:] not in line, line

import hashlib
import itertools
import random
import re

import pytest
from markdown_it import MarkdownIt

from rag_pipeline.chunking import ChunkBudget, chunk_document
from rag_pipeline.chunking.markdown import CHUNKER_VERSION
from rag_pipeline.chunking.packing import (
    _enforce_limit,
    _fit,
    _pack,
    _pack_lines,
    _pack_section,
    _Piece,
    _Unit,
)
from rag_pipeline.chunking.structure import (
    _COUNT_CALL_CHARS,
    _blocks,
    _BoundedCalls,
    _count,
    _cut,
    _fences,
    _Header,
    _heading_paths,
    _md,
    _runs,
    _sections,
)
from rag_pipeline.config import ChunkingConfig
from rag_pipeline.embed.base import TokenCounter
from rag_pipeline.ingest.parse import parse_document
from rag_pipeline.models import DocumentMeta, ParsedDocument, compose_embed_text
from rag_pipeline_tests.conftest import CORPUS, section

FIXTURE_FILES = sorted(p for p in CORPUS.rglob("*") if p.suffix in (".md", ".mdx"))
FENCE = re.compile(r"^\s*(```|~~~)")


def parse(body: str, name: str = "doc.md", title: str | None = None) -> ParsedDocument:
    text = (f"---\ntitle: {title}\n---\n" if title else "") + body
    data = text.encode()
    doc = parse_document("book", name, data, hashlib.sha256(data).hexdigest())
    assert isinstance(doc, ParsedDocument)
    return doc


def budget_for(tokenizer, **overrides) -> ChunkBudget:
    return ChunkBudget.for_tokenizer(ChunkingConfig(**overrides), tokenizer)


def fences_balanced(text: str) -> bool:
    return sum(1 for line in text.split("\n") if FENCE.match(line)) % 2 == 0


def assert_chain(chunks):
    assert [c.chunk_index for c in chunks] == list(range(len(chunks)))
    assert all(c.total_chunks == len(chunks) for c in chunks)
    for i, c in enumerate(chunks):
        assert c.prev_chunk_id == (chunks[i - 1].id if i else None)
        assert c.next_chunk_id == (chunks[i + 1].id if i + 1 < len(chunks) else None)
    assert len({c.id for c in chunks}) == len(chunks)


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=lambda p: p.name)
@pytest.mark.parametrize("embedder_name", ["hash_embedder", "local_embedder"])
def test_real_files_respect_the_model_limit_and_keep_fences_whole(path, embedder_name, request):
    embedder = request.getfixturevalue(embedder_name)
    data = path.read_bytes()
    doc = parse_document("book", path.name, data, hashlib.sha256(data).hexdigest())
    if not isinstance(doc, ParsedDocument):
        pytest.skip(f"{path.name} is a parse-error fixture")
    budget = budget_for(embedder.tokenizer)
    chunks = chunk_document(doc, embedder.tokenizer, budget)
    assert chunks
    assert_chain(chunks)
    tokenizer = embedder.tokenizer
    exact = tokenizer.count([c.embed_text for c in chunks])
    for c, n in zip(chunks, exact, strict=True):
        assert n + tokenizer.special_tokens == c.token_count <= budget.limit
        assert fences_balanced(c.text), c.text
        assert c.text.strip()


def test_limit_follows_the_embedder(hash_embedder, local_embedder):
    assert budget_for(local_embedder.tokenizer).limit == 256  # MiniLM reads 256 tokens
    assert budget_for(hash_embedder.tokenizer).limit == 512
    b = budget_for(hash_embedder.tokenizer)
    assert (b.target, b.minimum, b.overlap) == (400, 100, 60)


def test_splits_on_level_two_headings_and_keeps_heading_path(hash_embedder):
    body = (
        "# Guide\n\nIntro "
        + "word " * 120
        + "\n\n"
        + section("Install", 2, 60)
        + "\n### On Linux\n\n"
        + "apt " * 30
        + "\n\n"
        + section("Usage", 2, 60)
    )
    chunks = chunk_document(
        parse(body, title="Guide"), hash_embedder.tokenizer, budget_for(hash_embedder.tokenizer)
    )
    titles = [c.section_title for c in chunks]
    assert titles[0] is None  # the h1 equals the document title, so it is not repeated
    assert "Install" in titles
    assert any(t and t.startswith("Usage") for t in titles)
    assert all(
        c.text.lstrip().startswith(("## ", "# "))
        for c in chunks
        if c.section_title in ("Install", "Usage")
        and c.chunk_index
        in {titles.index("Install"), titles.index("Usage") if "Usage" in titles else -1}
    )


def test_small_sections_merge_instead_of_standing_alone(hash_embedder):
    body = "".join(f"## S{i}\n\nshort text {i}.\n\n" for i in range(8))
    chunks = chunk_document(
        parse(body), hash_embedder.tokenizer, budget_for(hash_embedder.tokenizer)
    )
    assert len(chunks) == 1
    assert all(f"## S{i}" in chunks[0].text for i in range(8))


def test_long_section_is_split_with_overlap(hash_embedder):
    sentences = " ".join(f"Sentence number {i} talks about topic {i}." for i in range(200))
    chunks = chunk_document(
        parse(f"## Long\n\n{sentences}\n", title="Doc"),
        hash_embedder.tokenizer,
        budget_for(hash_embedder.tokenizer, target_tokens=120, max_tokens=150),
    )
    assert len(chunks) > 3
    for before, after in itertools.pairwise(chunks):
        first_sentence = after.text.split(". ")[0]
        assert first_sentence in before.text  # the next chunk repeats the tail of the previous
        assert after.section_title == "Long"


def test_zero_overlap(hash_embedder):
    sentences = " ".join(f"Sentence {i} is here." for i in range(300))
    chunks = chunk_document(
        parse(f"## Long\n\n{sentences}\n"),
        hash_embedder.tokenizer,
        budget_for(hash_embedder.tokenizer, target_tokens=100, max_tokens=120, overlap=0.0),
    )
    words = " ".join(c.text.replace("## Long", "") for c in chunks).split()
    assert words.count("Sentence") == 300


def test_huge_code_block_is_cut_into_fenced_pieces(hash_embedder):
    code = "\n".join(f"    result_{i} = compute(value_{i}, factor={i})" for i in range(3000))
    body = f"## Code\n\nBefore.\n\n```python\n{code}\n```\n\nAfter.\n"
    budget = budget_for(hash_embedder.tokenizer)
    chunks = chunk_document(parse(body), hash_embedder.tokenizer, budget)
    code_chunks = [c for c in chunks if "result_" in c.text]
    assert len(code_chunks) > 10
    for c in code_chunks:
        assert fences_balanced(c.text)
        assert "```python" in c.text
        assert c.token_count <= budget.limit
    restored = [line for c in code_chunks for line in c.text.split("\n") if "result_" in line]
    assert len(set(restored)) == 3000  # every line kept, none cut in half


def test_code_block_is_never_split_when_it_fits(hash_embedder):
    code = "\n".join(f"x{i} = {i}" for i in range(60))
    body = section("Before", 4, 50) + f"\n```python\n{code}\n```\n\n" + section("After", 4, 50)
    chunks = chunk_document(
        parse(body), hash_embedder.tokenizer, budget_for(hash_embedder.tokenizer)
    )
    holders = [c for c in chunks if "x0 = 0" in c.text]
    assert len(holders) == 1 and "x59 = 59" in holders[0].text


def test_huge_table_keeps_its_header_in_every_piece(hash_embedder):
    rows = "\n".join(f"| key{i} | value {i} with words | {i} |" for i in range(600))
    body = f"## Table\n\n| Key | Value | N |\n|-----|-------|---|\n{rows}\n"
    chunks = chunk_document(
        parse(body), hash_embedder.tokenizer, budget_for(hash_embedder.tokenizer)
    )
    table_chunks = [c for c in chunks if "| key" in c.text]
    assert len(table_chunks) > 3
    for c in table_chunks:  # the delimiter row is compacted; the header repeats in each piece
        assert "| Key | Value | N |\n| --- | --- | --- |" in c.text
    keys = {m for c in table_chunks for m in re.findall(r"\| (key\d+) \|", c.text)}
    assert len(keys) == 600


def test_code_nested_in_a_list_item_keeps_fences(hash_embedder):
    code = "\n".join(f"   step_{i}()" for i in range(400))
    body = f"## Steps\n\n1. Run this:\n\n   ```bash\n{code}\n   ```\n\n2. Done.\n"
    chunks = chunk_document(
        parse(body), hash_embedder.tokenizer, budget_for(hash_embedder.tokenizer)
    )
    assert len(chunks) > 1
    assert all(fences_balanced(c.text) for c in chunks)


def test_deep_nesting_and_one_enormous_line(hash_embedder):
    nested = "".join("  " * d + f"- level {d} item\n" for d in range(60))
    long_line = " ".join(f"token{i}" for i in range(5000))
    chunks = chunk_document(
        parse(f"## Deep\n\n{nested}\n\n{long_line}\n"),
        hash_embedder.tokenizer,
        budget_for(hash_embedder.tokenizer),
    )
    budget = budget_for(hash_embedder.tokenizer)
    assert all(c.token_count <= budget.limit for c in chunks)
    words = {w for c in chunks for w in re.findall(r"token\d+", c.text)}
    assert len(words) == 5000


def test_ids_are_stable_and_content_addressed(hash_embedder):
    body = section("A", 3, 80) + section("B", 3, 80) + section("C", 3, 80)
    budget = budget_for(hash_embedder.tokenizer, target_tokens=200, max_tokens=250)
    first = chunk_document(parse(body), hash_embedder.tokenizer, budget)
    again = chunk_document(parse(body), hash_embedder.tokenizer, budget)
    assert [c.id for c in first] == [c.id for c in again]
    edited = chunk_document(
        parse(body.replace("bw1x3 ", "CHANGED ")), hash_embedder.tokenizer, budget
    )
    unchanged_a = [c.content_hash for c in first if c.section_title == "A"]
    assert unchanged_a == [c.content_hash for c in edited if c.section_title == "A"]
    assert {c.content_hash for c in first} != {c.content_hash for c in edited}
    for c in first:
        assert c.content_hash == hashlib.sha256(c.embed_text.encode()).hexdigest()


def test_repeated_text_gets_distinct_ids(hash_embedder):
    repeated = section("Same", 2, 120)
    chunks = chunk_document(
        parse(repeated * 3),
        hash_embedder.tokenizer,
        budget_for(hash_embedder.tokenizer, target_tokens=200, max_tokens=260),
    )
    hashes = [c.content_hash for c in chunks]
    assert len(set(hashes)) < len(hashes)  # the same text recurs
    assert len({c.id for c in chunks}) == len(chunks)  # but every point id is unique


def test_embed_text_carries_title_and_section(hash_embedder):
    chunks = chunk_document(
        parse(section("Setup", 1, 20), title="Robot Guide"),
        hash_embedder.tokenizer,
        budget_for(hash_embedder.tokenizer),
    )
    assert chunks[0].embed_text.startswith("Robot Guide > Setup\n\n")
    assert compose_embed_text("T", None, "x") == "T\n\nx"


def test_empty_and_whitespace_documents_have_no_chunks(hash_embedder):
    budget = budget_for(hash_embedder.tokenizer)
    assert chunk_document(parse(""), hash_embedder.tokenizer, budget) == []
    assert chunk_document(parse("\n\n   \n"), hash_embedder.tokenizer, budget) == []


def test_heading_only_document_is_one_chunk(hash_embedder):
    chunks = chunk_document(
        parse("# Only a title\n"), hash_embedder.tokenizer, budget_for(hash_embedder.tokenizer)
    )
    assert len(chunks) == 1


@pytest.mark.parametrize(
    "lines",
    [
        ["intro", "```", "a", "```", "after", "more"],  # the middle line closes a bare fence
        ["intro", "```python", "a", "```", "after", "more"],
        ["```", "a", "b", "c", "d", "```"],  # every cut falls inside the only fence
        ["x", "y", "```", "a", "b", "```"],  # a cut falls on an opener
        ["~~~", "a", "~~~", "```", "b", "```"],
        ["````", "a", "```", "b", "````", "c"],  # a shorter fence inside a longer one
        ["```", "a", "b", "c"],  # never closed
        ["  ```bash", "  a", "  b", "  ```", "  c"],  # indented, as in a list item
    ],
)
def test_packing_lines_never_leaves_a_fence_open(lines, hash_embedder):
    tokenizer = hash_embedder.tokenizer
    lines = [line if FENCE.match(line) else line + " word" * 9 for line in lines]
    pieces = _pack_lines(lines, 30, tokenizer, "text")
    assert len(pieces) > 1
    for piece in pieces:
        assert all(f.end is not None for f in _fences(piece.text.split("\n"))), piece.text
        assert tokenizer.count([piece.text])[0] <= piece.tokens <= 30
    kept = [line for p in pieces for line in p.text.split("\n")]
    assert all(line in kept for line in lines)  # nothing dropped


@pytest.mark.parametrize("edit", ["shorter", "longer"])
def test_editing_a_small_section_leaves_the_next_sections_chunks_alone(hash_embedder, edit):
    """A small section before one that gets split must not shift that section's split points."""
    budget = budget_for(hash_embedder.tokenizer, target_tokens=120, max_tokens=150)
    big = section("Big", 6, 40, seed="g")
    after = section("After", 4, 40, seed="a")

    def chunk(small_words: int) -> list:
        small = "## Small\n\n" + " ".join(f"small{i}" for i in range(small_words)) + ".\n"
        return chunk_document(
            parse(small + big + after, title="T"), hash_embedder.tokenizer, budget
        )

    before = chunk(30)
    edited = chunk(15 if edit == "shorter" else 45)
    known = {c.content_hash for c in before}
    changed = [c for c in edited if c.content_hash not in known]
    assert len(changed) == 1 and "## Small" in changed[0].text
    assert [c.text for c in before if "## Small" not in c.text] == [
        c.text for c in edited if "## Small" not in c.text
    ]


# -- v3: headings travel with their body, headers are cut to fit, nothing exceeds the limit --

_MD = MarkdownIt("commonmark").enable("table")


def top_level(text: str) -> list[tuple[str, str]]:
    """(token type, heading text) of each top-level block of ``text``, as markdown-it reads it."""
    tokens = _MD.parse(text)
    return [
        (t.type, tokens[i + 1].content.strip() if t.type == "heading_open" else "")
        for i, t in enumerate(tokens)
        if t.level == 0 and t.nesting != -1
    ]


def assert_headings_travel_with_their_body(doc: ParsedDocument, chunks) -> None:
    """No chunk ends with a heading, except the last one of a document that itself ends with
    headings (there is no body for them to travel with); a chunk that opens with headings has
    a heading path that ends with the last of them (an h1 equal to the title is left out)."""
    blocks = top_level(doc.body)
    ends_with_heading = bool(blocks) and blocks[-1][0] == "heading_open"
    for c in chunks:
        opened = top_level(c.text)
        if opened and opened[-1][0] == "heading_open":
            assert ends_with_heading and c.chunk_index == len(chunks) - 1, c.text[-300:]
        lead = None
        for kind, text in opened:
            if kind != "heading_open":
                break
            lead = text
        if lead and lead.lower() != doc.meta.title.strip().lower():
            assert (c.section_title or "").endswith(lead), (c.section_title, c.text[:300])


def assert_within_limit(chunks, tokenizer, budget) -> None:
    exact = tokenizer.count([c.embed_text for c in chunks])
    for c, n in zip(chunks, exact, strict=True):
        assert n + tokenizer.special_tokens == c.token_count <= budget.limit
        assert c.text.strip()


def test_version_is_bumped_for_the_new_cuts():
    assert CHUNKER_VERSION == "3"


def test_the_chunkers_version_is_the_recipes_and_the_chunks_assets_in_one_place(hash_embedder):
    """A recipe cuts with its chunker, whose version is part of the recipe's signature and
    tag; the chunks asset's code version is the default chunker's. A recipe of the default
    chunker keeps the signature indexes recorded before the chunker interface (nothing is
    embedded again by an upgrade)."""
    from dataclasses import replace

    from rag_pipeline.chunking import DEFAULT_CHUNKER, Chunker
    from rag_pipeline.defs.assets import chunks as chunks_asset
    from rag_pipeline.recipes.recipe import IndexRecipe

    recipe = IndexRecipe.build(hash_embedder, ChunkingConfig())
    assert recipe.chunker is DEFAULT_CHUNKER and recipe.signature == "0e3ffbf24f7f5394"
    assert chunks_asset.code_versions_by_key[chunks_asset.key] == DEFAULT_CHUNKER.version

    class OneChunk(Chunker):
        version = "one-chunk-1"

        def chunk(self, doc, tokenizer, budget):  # type: ignore[no-untyped-def]
            return chunk_document(doc, tokenizer, budget)[:1]

    other = replace(recipe, chunker=OneChunk())
    assert other.signature != recipe.signature
    assert other.tag()["chunker_version"] == "one-chunk-1"
    doc = parse("# A\n\n" + section("One", 3, 80) + section("Two", 3, 80))
    assert len(other.chunker.chunk(doc, hash_embedder.tokenizer, other.budget)) == 1


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=lambda p: p.name)
@pytest.mark.parametrize("embedder_name", ["hash_embedder", "local_embedder"])
def test_real_files_never_end_a_chunk_with_a_heading(path, embedder_name, request):
    tokenizer = request.getfixturevalue(embedder_name).tokenizer
    data = path.read_bytes()
    doc = parse_document("book", path.name, data, hashlib.sha256(data).hexdigest())
    if not isinstance(doc, ParsedDocument):
        pytest.skip(f"{path.name} is a parse-error fixture")
    # a small target makes many more chunk boundaries, so many more chances to orphan a heading
    for budget in (budget_for(tokenizer), budget_for(tokenizer, target_tokens=60, min_tokens=20)):
        chunks = chunk_document(doc, tokenizer, budget)
        assert_headings_travel_with_their_body(doc, chunks)
        assert_within_limit(chunks, tokenizer, budget)


def generated_doc(seed: int) -> str:
    """Headings of every level (some without a body), prose, code, tables and lists of every
    size; every word is unique so that nothing lost goes unnoticed."""
    rng = random.Random(seed)
    serial = itertools.count()

    def words(n: int) -> str:
        return " ".join(f"w{next(serial)}" for _ in range(n))

    parts = []
    for i in range(rng.randint(2, 40)):
        parts.append("#" * rng.randint(1, 6) + f" H{i} {words(rng.choice([0, 1, 4]))}")
        for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
            r = rng.random()
            if r < 0.55:
                sentences = [words(rng.randint(3, 12)) + "." for _ in range(rng.randint(1, 30))]
                parts.append(" ".join(sentences))
            elif r < 0.75:
                code = "\n".join(words(rng.randint(1, 8)) for _ in range(rng.choice([2, 30, 120])))
                parts.append(f"```text\n{code}\n```")
            elif r < 0.87:
                rows = [f"| {words(2)} | {words(rng.randint(1, 9))} |" for _ in range(40)]
                parts.append("| A | B |\n|---|---|\n" + "\n".join(rows[: rng.randint(1, 40)]))
            else:
                parts.append("\n".join(f"- {words(rng.randint(2, 10))}" for _ in range(9)))
    return "\n\n".join(parts) + "\n"


@pytest.mark.parametrize("seed", range(40))
def test_generated_documents_keep_headings_with_their_body(seed, hash_embedder, local_embedder):
    body = generated_doc(seed)
    doc = parse(body, title="Generated")
    cases = [(hash_embedder.tokenizer, dict(target_tokens=80, max_tokens=100, min_tokens=25))]
    if seed % 4 == 0:
        cases += [(hash_embedder.tokenizer, {}), (local_embedder.tokenizer, {})]
    for tokenizer, overrides in cases:
        budget = budget_for(tokenizer, **overrides)
        chunks = chunk_document(doc, tokenizer, budget)
        assert_chain(chunks)
        assert_within_limit(chunks, tokenizer, budget)
        assert_headings_travel_with_their_body(doc, chunks)
        assert all(fences_balanced(c.text) for c in chunks)
        seen = {w for c in chunks for w in re.findall(r"\bw\d+\b", c.text)}
        assert seen == set(re.findall(r"\bw\d+\b", body))  # nothing lost


def test_a_sub_heading_at_a_split_point_starts_the_next_chunk(hash_embedder):
    """The case that orphaned headings in v2: a chunk nearly full, then a small heading whose
    body does not fit in it."""
    budget = budget_for(hash_embedder.tokenizer, target_tokens=120, max_tokens=150)
    body = section("Guide", 2, 45) + "\n### Details\n\n" + " ".join(["detail"] * 60) + ".\n"
    chunks = chunk_document(parse(body, title="T"), hash_embedder.tokenizer, budget)
    assert len(chunks) == 2
    assert "### Details" not in chunks[0].text
    assert chunks[1].text.startswith("### Details\n\ndetail")
    assert chunks[1].section_title == "Guide > Details"


def test_every_chunk_of_a_split_subsection_names_it(hash_embedder):
    budget = budget_for(hash_embedder.tokenizer, target_tokens=100, max_tokens=120)
    sentences = " ".join(f"Sentence {i} is about the install." for i in range(120))
    body = f"## Install\n\n### Linux\n\n#### Debian\n\n{sentences}\n"
    chunks = chunk_document(parse(body, title="Guide"), hash_embedder.tokenizer, budget)
    assert len(chunks) > 3
    assert {c.section_title for c in chunks} == {"Install > Linux > Debian"}
    assert chunks[0].text.startswith("## Install\n\n### Linux\n\n#### Debian\n\nSentence 0")


def test_headings_that_end_the_document_join_the_last_chunk(hash_embedder):
    body = section("Use", 1, 30) + "\n## See also\n\n### Nothing here\n"
    chunks = chunk_document(
        parse(body), hash_embedder.tokenizer, budget_for(hash_embedder.tokenizer)
    )
    assert len(chunks) == 1
    assert chunks[0].text.endswith("## See also\n\n### Nothing here")


@pytest.mark.parametrize("embedder_name", ["hash_embedder", "local_embedder"])
def test_a_huge_title_is_cut_to_fit(embedder_name, request):
    tokenizer = request.getfixturevalue(embedder_name).tokenizer
    budget = budget_for(tokenizer)
    title = " ".join(f"title{i}" for i in range(5000))
    doc = parse(section("Setup", 3, 40), title=title)
    chunks = chunk_document(doc, tokenizer, budget)
    assert chunks
    assert_within_limit(chunks, tokenizer, budget)
    for c in chunks:
        assert c.meta.title.startswith("title0 title1") and c.meta.title.endswith("…")
        assert tokenizer.count([c.meta.title])[0] <= budget.limit // 8
        assert tokenizer.count([compose_embed_text(c.meta.title, c.section_title, "")])[0] <= (
            budget.limit // 4
        )
        assert c.section_title == "Setup"
        assert c.embed_text.startswith(c.meta.title + " > Setup\n\n")
    assert doc.meta.title == title  # the document keeps its title; its chunks embed a cut one


@pytest.mark.parametrize("embedder_name", ["hash_embedder", "local_embedder"])
def test_a_huge_heading_is_cut_in_the_path_and_kept_whole_in_the_text(embedder_name, request):
    tokenizer = request.getfixturevalue(embedder_name).tokenizer
    budget = budget_for(tokenizer)
    heading = " ".join(f"head{i}" for i in range(3000))
    body = (
        f"## Intro\n\nHello.\n\n### {heading}\n\nBody of the huge heading.\n\n"
        "#### Small\n\nMore text " + "more " * 450 + "\n"
    )
    chunks = chunk_document(parse(body, title="T"), tokenizer, budget)
    assert_within_limit(chunks, tokenizer, budget)
    for c in chunks:
        header = compose_embed_text(c.meta.title, c.section_title, "")
        assert tokenizer.count([header])[0] <= budget.limit // 4
    words = {w for c in chunks for w in re.findall(r"head\d+", c.text)}
    assert len(words) == 3000  # the heading itself is all there, in the chunks' text
    holder = next(c for c in chunks if "Body of the huge heading" in c.text)
    assert holder.section_title.startswith("head0 head1") and holder.section_title.endswith("…")
    assert "head2999" in holder.text  # the end of the heading travels with its body
    small = next(c for c in chunks if "More text" in c.text)
    assert small.section_title == "… > Small"  # outer names give way first


def test_long_heading_paths_give_way_from_the_outside(hash_embedder):
    tokenizer = hash_embedder.tokenizer
    budget = budget_for(tokenizer, max_tokens=64, target_tokens=64, min_tokens=0)  # share 16
    header = _Header("Doc", tokenizer, budget)
    assert header.path(()) is None
    assert header.path(("A", "B")) == "A > B"
    names = (
        "One two three four five six",
        "Seven eight nine ten eleven twelve thirteen fourteen",
        "Fifteen sixteen",
        "Seventeen",
    )
    assert header.path(names) == "… > Fifteen sixteen > Seventeen"
    # "Doc >" takes 2 of the 16 tokens, the mark 1
    assert header.path(("one " * 40,)) == " ".join(["one"] * 13) + "…"
    for path in (header.path(names), header.path(("one " * 40,)), header.path(names[-1:])):
        assert tokenizer.count([header.text(path, "")])[0] <= 16


def test_cut_marks_the_cut_and_fits(local_embedder):
    tokenizer = local_embedder.tokenizer
    assert _cut("short title", 10, tokenizer) == "short title"
    for text in ("word " * 500, "数" * 900, "🙂" * 400, "x" * 100_000, "!" * 5000, "\u200b" * 999):
        cut = _cut(text, 12, tokenizer)
        assert tokenizer.count([cut])[0] <= 12
        assert cut == text or (cut.endswith("…") and text.startswith(cut[:-1].rstrip()))


def adversarial_docs() -> dict[str, tuple[str | None, str]]:
    big = " ".join(f"w{i}" for i in range(20000))
    code = "\n".join(f"x{i} = {i}" for i in range(3000))
    return {
        "huge title": ("T " * 5000, "## A\n\ntext here.\n"),
        "huge title without spaces": ("T" * 100_000, "text\n"),
        "huge heading": (None, "## " + big + "\n\nbody text.\n"),
        "huge h1 equal to the title": (None, "# " + big + "\n\nbody.\n"),
        "six huge levels": (
            None,
            "".join("#" * (i % 6 + 1) + f" h{i} " * 400 + "\n" for i in range(12)) + "\nbody\n",
        ),
        "200 nested headings": (None, "".join("#" * (i % 6 + 1) + f" h{i}\n" for i in range(200))),
        "200 headings with bodies": (
            None,
            "".join("#" * (i % 6 + 1) + f" h{i}\n\nbody {i}.\n\n" for i in range(200)),
        ),
        "200 nested quotes": (None, "> " * 200 + "# deep\n\n" + "> " * 200 + "text\n"),
        "200 nested lists": (None, "".join("  " * d + f"- item {d}\n" for d in range(200))),
        "one 100k-character line": (None, "x " * 50_000),
        "one 100k-character word": (None, "y" * 100_000),
        "lines of punctuation": (None, "\n".join("!?.,;:" * 50 for _ in range(200))),
        "one line of punctuation": (None, "!" * 100_000),
        "unclosed fence": (None, "## Code\n\n```python\n" + code),
        "unclosed fence, one long line": (None, "```\n" + "z " * 40_000),
        "fence with a huge info string": (None, "```" + "info" * 5000 + "\ncode\n```\n"),
        "fence with a long info string": (None, "```py " + "i " * 3000 + "\n" + "c\n" * 500),
        "unclosed fence in a list": (None, "- x\n\n  ````\n" + "  l q q q q q\n" * 600),
        "table with a gigantic cell": (None, "| a | b |\n|---|---|\n| " + "cell " * 20_000 + "|"),
        "table with a gigantic header": (
            None,
            "| " + " | ".join(f"h{i}" for i in range(3000)) + " |\n|" + "---|" * 3000 + "\n",
        ),
        "CJK": (None, "## 标题\n\n" + "数据处理" * 20_000 + "\n"),
        "CJK title": ("标题" * 3000, "正文" * 100),
        "Hangul heading": (None, "## " + "한" * 3000 + "\n\nbody\n"),
        "emoji": (None, "# 🙂\n\n" + "👩‍👩‍👧‍👦" * 20_000),
        "zero-width characters": (None, "\u200b" * 100_000 + "\n\n## \u200b\u200b\n\nx\u200d"),
        "zero-width title": ("\u200b" * 100_000, "x"),
        "lone surrogates": ("t\ud800", "## h\udfff\n\nbody \ud83d text\n"),
        "control characters": (None, "\x00\x01\x02 text \x7f\n## \x0b\n\nx"),
        "setext headings": (None, ("Title " * 3000 + "\n=====\n\n") * 3 + "text\n"),
        "empty headings": (None, "#\n\n##\n\n###\n\ntext\n"),
        "only headings": (None, "# a\n## b\n### c\n"),
        "many tiny sections": (None, "".join(f"## S{i}\n\nt{i}.\n\n" for i in range(2000))),
        "shuffled fences": (None, "~~~\n```\ncode\n~~~\n```\nstill\n```\n" * 300),
    }


ADVERSARIAL = adversarial_docs()


@pytest.mark.parametrize("name", list(ADVERSARIAL))
@pytest.mark.parametrize("embedder_name", ["hash_embedder", "local_embedder"])
def test_adversarial_documents_fit_the_limit(name, embedder_name, request):
    tokenizer = request.getfixturevalue(embedder_name).tokenizer
    title, body = ADVERSARIAL[name]
    doc = ParsedDocument("book", "doc.md", "h", "p", DocumentMeta(title=title or "Doc"), body)
    for budget in (budget_for(tokenizer), budget_for(tokenizer, max_tokens=16, min_tokens=0)):
        chunks = chunk_document(doc, tokenizer, budget)
        assert chunks
        assert_chain(chunks)
        valid = [c.embed_text.encode("utf-8", "replace").decode() for c in chunks]
        for c, n in zip(chunks, tokenizer.count(valid), strict=True):
            assert n + tokenizer.special_tokens == c.token_count <= budget.limit
            assert c.text.strip()


@pytest.mark.parametrize("seed", range(30))
def test_chunk_document_never_raises(seed, hash_embedder, local_embedder):
    rng = random.Random(seed)
    alphabet = [*"#`~|>-*_=[]()!.\n\n\n  \t1aZé", "数", "🙂", "\u200b", "\x00", "\ud800"]

    def text(n: int) -> str:
        return "".join(rng.choice(alphabet) for _ in range(n))

    doc = ParsedDocument(
        "book", "doc.md", "h", "p", DocumentMeta(title=text(rng.randint(0, 300))), text(4000)
    )
    for tokenizer in (hash_embedder.tokenizer, local_embedder.tokenizer):
        budget = budget_for(tokenizer, max_tokens=rng.choice([16, 64, 512]), min_tokens=0)
        chunks = chunk_document(doc, tokenizer, budget)
        assert all(c.token_count <= budget.limit for c in chunks)


# -- the pure steps -------------------------------------------------------------------------


def blocks_of(body: str, tokenizer) -> list:
    return _count(_blocks(body), tokenizer)


def test_runs_lead_each_block_with_the_headings_above_it(hash_embedder):
    blocks = blocks_of(
        "intro\n\n# A\n\n## B\n\ntext\n\n```\ncode\n```\n\n### C\n", hash_embedder.tokenizer
    )
    runs = _runs(blocks)
    assert [([h.title for h in r.headings], r.content and r.content.kind) for r in runs] == [
        ([], "text"),
        (["A", "B"], "text"),
        ([], "fence"),
        (["C"], None),  # headings that end the document
    ]
    assert _sections(runs, split_level=2) == [[0], [1, 2, 3]]
    assert _sections(runs, split_level=3) == [[0], [1, 2], [3]]
    assert _heading_paths(runs, "A") == [(), ("B",), ("B",), ("B", "C")]
    assert _heading_paths(runs, "Other") == [(), ("A", "B"), ("A", "B"), ("A", "B", "C")]


def test_a_bodiless_heading_opens_the_section_of_the_heading_below_it(hash_embedder):
    runs = _runs(blocks_of("## A\n\ntext\n\n#### Empty\n\n## B\n\nmore\n", hash_embedder.tokenizer))
    assert [[h.title for h in r.headings] for r in runs] == [["A"], ["Empty", "B"]]
    assert _sections(runs, 2) == [[0], [1]]


def units_of(texts, tokens=10, path="P", lead=()):
    return [_Unit(t, tokens, path, "text", t, lead=i in lead) for i, t in enumerate(texts)]


def test_pack_section_repeats_prose_tails_but_not_before_a_heading(hash_embedder):
    tokenizer = hash_embedder.tokenizer
    budget = ChunkBudget(target=40, limit=60, minimum=0, overlap=6)
    header = _Header("T", tokenizer, budget)
    soft = header.room("P").soft
    first = "One two three. Four five six. Seven eight nine."
    units = [
        _Unit(first, soft - 5, "P", "text", first),
        _Unit("Next words.", soft - 10, "P", "text", "Next words."),
        _Unit("### H\n\nBody.", 10, "P", "text", "Body.", lead=True),
    ]
    pieces = _pack_section(units, header, tokenizer, budget)
    assert [p.text for p in pieces] == [
        first,
        "Seven eight nine.\n\nNext words.",  # the tail of the first chunk comes again
        "### H\n\nBody.",  # a chunk opening with a heading repeats nothing
    ]
    assert [p.starts_with_overlap for p in pieces] == [False, True, False]


def test_pack_merges_a_small_section_forward_only_when_the_next_fits_whole(hash_embedder):
    tokenizer = hash_embedder.tokenizer
    budget = ChunkBudget(target=100, limit=120, minimum=30, overlap=0)
    header = _Header("T", tokenizer, budget)
    soft = header.room("P").soft
    small, fits, big = units_of(["small"]), units_of(["fits"], 40), units_of(["b1", "b2"], soft - 5)
    merged = _pack([small, fits], header, tokenizer, budget)
    assert [p.text for p in merged] == ["small\n\nfits"]
    # merged into a section that gets split, its length would move that section's split points
    alone = _pack([units_of(["before"], 50), small, big], header, tokenizer, budget)
    assert [p.text for p in alone] == ["before\n\nsmall", "b1", "b2"]  # joins the one before


def test_enforce_limit_is_pure_and_exact(local_embedder):
    tokenizer = local_embedder.tokenizer
    budget = budget_for(tokenizer)
    header = _Header("Title", tokenizer, budget)
    long_text = "\n\n".join(" ".join(f"p{i}w{j}" for j in range(60)) for i in range(12))
    pieces = (_Piece("short text", "S", 3), _Piece(long_text, "S", 10))
    out = _enforce_limit(pieces, header, tokenizer, budget)
    assert pieces == (_Piece("short text", "S", 3), _Piece(long_text, "S", 10))  # untouched
    assert len(out) > 2
    exact = tokenizer.count([header.text(p.path, p.text) for p in out])
    assert [n + tokenizer.special_tokens for n in exact] == [p.tokens for p in out]
    assert all(p.tokens <= budget.limit for p in out)


def test_fit_ends_with_every_part_within_a_non_additive_measure(hash_embedder):
    tokenizer = hash_embedder.tokenizer
    text = "```\n" + "\n".join(" ".join(f"c{i}x{j}" for j in range(9)) for i in range(50)) + "\n```"

    def measure(t: str) -> int:  # every part costs more than the sum of its lines
        return tokenizer.count([t])[0] + 5 + len(t) // 40

    parts = _fit(text, measure, 60, tokenizer)
    assert all(n == measure(t) <= 60 for t, n in parts)
    assert all(fences_balanced(t) for t, _ in parts)
    words = [w for t, _ in parts for w in re.findall(r"c\d+x\d+", t)]
    assert words == re.findall(r"c\d+x\d+", text)  # in order, nothing lost or repeated
    # no line, no space: cut mid-word, still every part within the limit and nothing lost
    parts = _fit("x" * 1000, len, 7, tokenizer)
    assert all(n == len(t) <= 7 for t, n in parts)
    assert "".join(t for t, _ in parts) == "x" * 1000


@pytest.mark.parametrize(
    "text",
    [
        "```\na\n```",
        "````\n```\n````",  # a shorter fence does not close a longer one
        "~~~\n```\n~~~",  # nor one of the other character
        "```py\ncode\n```   ",  # trailing spaces after a closer
        "``` a`b\nnot a fence",  # a backtick info string has no backtick
        "```\nnever closed",
        "   ```\nindented\n   ```",
        "text\n~~~~\nx\n~~~~~\nafter",
    ],
)
def test_fences_follow_commonmark(text):
    expected = [t.map for t in _MD.parse(text) if t.type == "fence"]
    found = _fences(text.split("\n"))
    assert [f.start for f in found] == [start for start, _ in expected]
    for fence, (_, end) in zip(found, expected, strict=True):
        # markdown-it's map ends after the closer, or at the end of the text when unclosed
        assert (fence.end + 1 if fence.end is not None else len(text.split("\n"))) == end


@pytest.mark.parametrize("embedder_name", ["hash_embedder", "local_embedder"])
def test_white_space_is_bounded_as_well_as_tokens(embedder_name, request):
    """A list nested 1,500 deep is ~2 tokens a line and megabytes of indentation: chunks
    stay within 32 characters per token of the limit, and every item is kept."""
    tokenizer = request.getfixturevalue(embedder_name).tokenizer
    budget = budget_for(tokenizer)
    nested = "".join("  " * i + f"- item{i}\n" for i in range(1500))
    chunks = chunk_document(parse(f"# Lists\n\n{nested}"), tokenizer, budget)
    assert max(len(c.text) for c in chunks) <= budget.limit * 32
    assert_within_limit(chunks, tokenizer, budget)
    assert_chain(chunks)
    assert {w for c in chunks for w in re.findall(r"item\d+", c.text)} == {
        f"item{i}" for i in range(1500)
    }


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=lambda p: p.name)
def test_real_files_are_far_from_the_character_bound(path, local_embedder):
    """The character bound never touches ordinary text (so it needed no CHUNKER_VERSION)."""
    tokenizer = local_embedder.tokenizer
    budget = budget_for(tokenizer)
    doc = parse_document("b", path.name, path.read_bytes(), "h")
    if not isinstance(doc, ParsedDocument):
        pytest.skip(f"{path.name} is a bad-input fixture: {doc.reason}")
    chunks = chunk_document(doc, tokenizer, budget)
    assert all(len(c.text) <= budget.limit * 32 // 2 for c in chunks)


class CountingTokenizer(TokenCounter):
    """A tokenizer that records the characters it is given in each call: the work chunking
    costs, which unlike its time does not depend on the machine."""

    def __init__(self, tokenizer: TokenCounter) -> None:
        self._tokenizer = tokenizer
        self.special_tokens = tokenizer.special_tokens
        self.max_input_tokens = tokenizer.max_input_tokens
        self.calls: list[int] = []

    def count(self, texts):
        self.calls.append(sum(len(t) for t in texts))
        return self._tokenizer.count(texts)

    def split(self, text, max_tokens):
        self.calls.append(len(text))
        return self._tokenizer.split(text, max_tokens)


def large_table(rows: int) -> str:
    cells = "\n".join(
        f"| {i} | item-{i * 7919 % 10**6} | {i / 7:.6f} | row {i} |" for i in range(rows)
    )
    return f"## Data\n\n| id | name | value | note |\n| --- | --- | --- | --- |\n{cells}\n"


def large_paragraph(sentences: int) -> str:
    return " ".join(f"Sentence {i} has a few more words." for i in range(sentences)) + "\n"


def large_line(words: int) -> str:
    return " ".join(f"word{i}" for i in range(4 * words)) + "\n"  # no sentence to cut at


@pytest.mark.parametrize("make", [large_table, large_paragraph, large_line])
def test_chunking_a_large_block_costs_work_linear_in_its_size(make, hash_embedder):
    """Twice the rows (or sentences) cost at most 2.2x the characters tokenized and the calls,
    and no call grows with the block: a tokenizer holds every token of a call at once, and one
    huge text takes it more than linear time (a 10 MB table took 1.9 GB)."""

    def work(size: int) -> CountingTokenizer:
        tokenizer = CountingTokenizer(hash_embedder.tokenizer)
        chunks = chunk_document(parse(make(size)), tokenizer, budget_for(tokenizer))
        if make is large_table:
            assert all("| id | name | value | note |\n| --- |" in c.text for c in chunks)
        assert_within_limit(chunks, hash_embedder.tokenizer, budget_for(tokenizer))
        return tokenizer

    small, large = work(8_000), work(16_000)
    assert sum(large.calls) <= 2.2 * sum(small.calls)
    assert len(large.calls) <= 2.2 * len(small.calls)
    assert max(large.calls) <= _COUNT_CALL_CHARS < len(make(16_000)) // 2


def test_tables_are_parsed_without_their_cells():
    """Only a table's opening and closing tokens are kept, whatever its rows (they were a dozen
    a row); where it starts and ends, and the blocks around it, are as markdown-it has them."""
    body = "text\n| a | b |\n| - | - |\n| 1 | 2 |\n| 3 | 4 |\n\n# After\n\n- | x |\n  | - |\n"
    tokens = [(t.type, t.map, t.level) for t in _md.parse(body)]
    assert [t for t in tokens if t[0].startswith("table")] == [
        ("table_open", [1, 5], 0),
        ("table_close", None, 0),
        ("table_open", [8, 10], 2),
        ("table_close", None, 2),
    ]
    full = MarkdownIt("commonmark").enable("table").disable(["inline", "text_join"])
    inside, outside = 0, []  # the full parse's tokens but those within a table
    for t in full.parse(body):
        inside -= t.type == "table_close"
        if not inside:
            outside.append((t.type, t.map, t.level))
        inside += t.type == "table_open"
    assert tokens == outside


@pytest.mark.parametrize("embedder_name", ["hash_embedder", "local_embedder"])
def test_a_large_text_is_split_in_pieces_as_it_would_be_whole(embedder_name, request):
    tokenizer = request.getfixturevalue(embedder_name).tokenizer
    text = " ".join(f"w{i}, x{i % 7}.\n" if i % 50 == 0 else f"word{i}" for i in range(60_000))
    for max_tokens in (1, 37, 256):
        assert _BoundedCalls(tokenizer).split(text, max_tokens) == tokenizer.split(text, max_tokens)

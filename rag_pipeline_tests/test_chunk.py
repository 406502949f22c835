import hashlib
import itertools
import re

import pytest

from rag_pipeline.chunk import ChunkBudget, chunk_document
from rag_pipeline.config import ChunkingConfig
from rag_pipeline.ingest.parse import parse_document
from rag_pipeline.models import ParsedDocument, compose_embed_text
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
        ["```", "a", "b", "c", "d", "```"],  # the cut falls inside the only fence
        ["x", "y", "```", "a", "b", "```"],  # the cut falls on an opener
        ["~~~", "a", "~~~", "```", "b", "```"],
    ],
)
def test_halving_never_leaves_a_fence_open(lines, hash_embedder):
    from rag_pipeline.chunk import _halve

    halves = _halve("\n".join(lines), hash_embedder.tokenizer, room=1000)
    assert len(halves) == 2
    assert all(fences_balanced(h) for h in halves), halves
    kept = [line for h in halves for line in h.split("\n")]
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

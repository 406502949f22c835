"""ProgressLog: time left from the tokens left and a smoothed rate."""

import re

import pytest

from rag_pipeline.ingest.progress import ProgressLog


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def seconds_left(line: str) -> float:
    match = re.search(r"about (?:(\d+)m)?(\d+)s left", line)
    assert match, line
    return int(match.group(1) or 0) * 60 + int(match.group(2))


@pytest.mark.parametrize("tokens_per_s", [500.0, 4000.0])
def test_time_left_counts_tokens_when_short_texts_go_first(tokens_per_s):
    """900 chunks of 50 tokens, then 100 of 250 (texts are embedded shortest first) at a
    steady token rate: when the short ones are done, 25,000 of 70,000 tokens are left. A rate in
    chunks would say 100 chunks at 20 chunks/s: 5 s instead of 25 s (at 1,000 tokens/s)."""
    lengths = [50] * 900 + [250] * 100
    clock, lines = Clock(), []
    progress = ProgressLog("embedding", lines.append, clock=clock, every_s=0.0)
    total_tokens = sum(lengths)
    done_tokens = 0
    for i in range(0, len(lengths), 20):  # batches of 20
        batch = sum(lengths[i : i + 20])
        clock.now += batch / tokens_per_s
        done_tokens += batch
        progress(i + 20, len(lengths), done_tokens, total_tokens)
    at_900 = next(line for line in lines if line.startswith("embedding: 900/1000"))
    expected = (total_tokens - 45_000) / tokens_per_s
    assert seconds_left(at_900) == pytest.approx(expected, rel=0.05, abs=1)
    assert "done in" in lines[-1]


def test_the_rate_follows_a_slowdown_smoothly():
    """The machine gets 4x slower half way: the estimate moves to the new rate within about a
    minute, not at once on one slow batch, and not never."""
    clock, lines = Clock(), []
    progress = ProgressLog("embedding", lines.append, clock=clock, every_s=0.0)
    done = 0
    for step in range(400):
        clock.now += 1.0 if step < 200 else 4.0
        done += 10
        progress(done, 10_000, done, 10_000)
    first_slow = seconds_left(lines[200])
    later = seconds_left(lines[-1])
    fast_estimate = (10_000 - 2_010) / 10.0
    assert first_slow < 1.5 * fast_estimate  # one slow batch does not swing it 4x
    assert later == pytest.approx((10_000 - 4_000) / 2.5, rel=0.1)  # settled on the new rate


def test_without_tokens_it_counts_in_its_unit_and_logs_at_its_interval():
    clock, lines = Clock(), []
    progress = ProgressLog("embedding", lines.append, clock=clock, every_s=10.0)
    for done in range(1, 101):
        clock.now += 1.0
        progress(done, 100)
    assert len(lines) == 10  # every 10 s, and the last call
    assert seconds_left(lines[0]) == 90 and lines[-1].endswith("done in 1m40s")


def test_a_local_embedder_reports_its_tokens_shortest_first():
    from rag_pipeline.embed.hashing import HashEmbedder

    embedder = HashEmbedder()
    embedder.batch_size = 10
    texts = [" ".join(["word"] * n) for n in (40, 3, 12, 7, 25)] * 20
    calls = []
    embedder.embed(texts, progress=lambda *args: calls.append(args))
    assert calls[-1][:2] == (100, 100)
    tokens_total = sum(embedder.tokenizer.count(texts))
    assert calls[-1][2:] == (tokens_total, tokens_total)
    # batches go shortest first: the first batch holds fewer tokens than its share of texts
    done, total, tokens_done, _ = calls[0]
    assert tokens_done / tokens_total < done / total

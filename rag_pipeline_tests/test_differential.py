"""The short differential check (see :mod:`rag_pipeline_tests.differential`): a seeded
random sequence of file operations, each followed by ``rag-pipeline ingest`` in a real
process; ``plan`` says every book is unchanged after each, and the index equals clean builds.
``bench/differential.py`` runs the long sequences (figures in docs/benchmarks.md)."""

from __future__ import annotations

import pytest

from rag_pipeline_tests.differential import Differential

pytestmark = [pytest.mark.slow, pytest.mark.integration]

#: a sequence of 13 kinds of operation that today's code passes and the code before issue 26
#: failed (a swap of two files of one size and time, at step 24)
SEED, STEPS = 1, 24


def test_incremental_ingest_equals_a_clean_build_after_random_changes(tmp_path):
    differential = Differential(tmp_path, SEED)
    outcome = differential.run(STEPS, compare_every=4)
    print(f"differential seed {SEED}: {outcome}")
    assert len(outcome.operations) >= 12, outcome.operations  # most kinds were exercised
    assert outcome.comparisons >= 5
    assert not outcome.failures, outcome.failures
    assert not outcome.plan_disagreements, outcome.plan_disagreements
    assert not outcome.divergences, outcome.divergences

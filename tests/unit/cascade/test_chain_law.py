"""Chains' output follows the target's law over long horizons: every token, every pair.

Each configuration generates HORIZON = 8 tokens many times with a fixed seed and compares the
law of every position (V + 1 cells, END included) and of every adjacent pair with the target
alone's exact law (exact.py's recursion), by chi-square; the smallest p-value, Bonferroni-
corrected for the 15 tests, must stay above ALPHA. The configurations use what short tests
cannot: full draft lengths at every level (3-5, so bugs at block position 3 and later show),
several cycles per generation (rollback between them), an intermediate level whose bonus
token is used without a draft stop ([1, 4]: the middle level verifies one proposal per block
and emits its bonus), EOS inside the horizon, temperature != 1 without filters, levels
whose rows have different (padded) lengths, and the suffix drafter at the bottom of two and
three levels, alone and reading a cross-request memory.

Two tiers of the same tests:
- fast (make test-fast): FAST_RUNS generations, seconds each. Detects a bias of about
  0.03-0.05 in a cell of probability 0.2 at one position (the gross cascade bugs of
  scripts/mutants.py: wrong distribution passed upward, unwarped levels, wrong rows).
- slow (marker slow): SLOW_RUNS generations; about 4x finer (0.01 in such a cell).
test_rejection_power.py is the slow tier's power against rare errors on the rejection path.

The seeds are fixed, so each test is deterministic; a correct cascade fails one with
probability ~ALPHA per seed. Seed 11 did so once (3-level-bonus at 3,000 runs, tokens 5-6,
corrected p = 2.7e-4): 200,000 runs of that configuration then gave every test p > 0.03, and
40 other seeds had the corrected minimum below 0.05 as often as chance says (1 and 4 of 40).
"""

from __future__ import annotations

import numpy as np
import pytest

from specrouter.drafters.memory import MemoryScope, SuffixMemory
from specrouter.drafters.ngram import NgramDrafter
from specrouter.drafters.suffix import SuffixDrafter
from specrouter.backends.synthetic import SyntheticBackend
from specrouter.cascade.chain import Chain
from specrouter.cascade.sampling import SamplingParams

from .test_sampling_exactness import BelowHalf
from .exact import marginal_pvalues, sample_outputs, target_law, worst

ALPHA = 1e-3
HORIZON = 8
FAST_RUNS = 3_000
SLOW_RUNS = 40_000
PROMPT = [1, 2, 3, 1, 2]


def family(vocab: int = 6, eos: int | None = None, vocabs: tuple[int, int, int] | None = None):
    """Target, mid and small of one family; vocabs gives (small, mid, target) row lengths."""
    v_small, v_mid, v_target = vocabs or (vocab, vocab, vocab)
    target = SyntheticBackend("target", vocab=v_target, eos_id=eos)
    mid = SyntheticBackend("mid", vocab=v_mid, model_seed=2, noise=0.8, eos_id=eos)
    small = SyntheticBackend("small", vocab=v_small, model_seed=3, noise=1.5, eos_id=eos)
    return target, mid, small


def configuration(name: str) -> tuple[Chain, SamplingParams]:
    if name == "2-level-filters":
        target, mid, small = family()
        return Chain([small, target], [5]), SamplingParams(temperature=0.8, top_k=4)
    if name == "3-level-bonus":
        target, mid, small = family()
        return Chain([small, mid, target], [1, 4]), SamplingParams(temperature=1.0)
    if name == "3-level-stop-eos":
        target, mid, small = family(eos=5)
        return Chain([small, mid, target], [4, 3], draft_stop=BelowHalf()), SamplingParams(temperature=0.7)
    if name == "4-level-ngram":
        target, mid, small = family()
        return Chain([NgramDrafter(max_ngram=2), small, mid, target], [3, 3, 4]), SamplingParams(temperature=1.0, top_p=0.9)
    if name == "padded-eos":
        # small has 5 rows' worth of logits, mid 8, the target 7: drafts that never propose
        # the target's last tokens, and a mid level that proposes tokens the target lacks.
        target, mid, small = family(eos=4, vocabs=(5, 8, 7))
        return Chain([small, mid, target], [3, 3]), SamplingParams(temperature=1.0)
    if name == "2-level-suffix":
        target, mid, small = family()
        return Chain([SuffixDrafter(), target], [6]), SamplingParams(temperature=1.0)
    if name == "3-level-suffix-eos":
        # the suffix index grows with the committed tokens over several cycles; the middle
        # level's accepted tokens are a tail it reads without indexing
        target, mid, small = family(eos=5)
        return Chain([SuffixDrafter(), small, target], [5, 3]), SamplingParams(temperature=0.8, top_k=4)
    if name == "2-level-memory":
        target, mid, small = family()
        return Chain([remembering(), target], [6]), SamplingParams(temperature=1.0)
    if name == "3-level-memory-eos":
        target, mid, small = family(eos=5)
        return Chain([remembering(), small, target], [5, 3]), SamplingParams(temperature=0.8, top_k=4)
    raise KeyError(name)


def remembering() -> SuffixDrafter:
    """A suffix drafter reading a cross-request memory of other texts over the same tokens,
    which holds longer matches than the request's own text most of the time (its proposals
    then come from the memory)."""
    rng = np.random.default_rng(5)
    memory = SuffixMemory(20_000)
    for _ in range(300):
        memory.add(rng.integers(0, 6, size=int(rng.integers(6, 40))).tolist())
    return SuffixDrafter().with_memory(memory, MemoryScope())


CONFIGURATIONS = ["2-level-filters", "3-level-bonus", "3-level-stop-eos", "4-level-ngram", "padded-eos",
                  "2-level-suffix", "3-level-suffix-eos", "2-level-memory", "3-level-memory-eos"]


def check(name: str, runs: int, seed: int) -> None:
    chain, params = configuration(name)
    law = target_law(chain.target, PROMPT, params, HORIZON)
    outputs = sample_outputs(chain, PROMPT, params, HORIZON, runs, seed)
    test, pvalue = worst(marginal_pvalues(law, outputs))
    assert pvalue > ALPHA, f"{name}: {test} deviates from the target's law (corrected p = {pvalue:.2e})"


@pytest.mark.parametrize("name", CONFIGURATIONS)
def test_chain_law_fast(name):
    check(name, FAST_RUNS, seed=12)


@pytest.mark.slow
@pytest.mark.parametrize("name", CONFIGURATIONS)
def test_chain_law_slow(name):
    check(name, SLOW_RUNS, seed=13)

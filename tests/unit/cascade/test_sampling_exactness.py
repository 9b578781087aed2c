"""The output of a chain follows the target's (warped) distribution exactly.

For synthetic models the exact distribution of the first three generated tokens is
enumerated from the target's tables; 50,000 generations per configuration are
compared with it by a chi-square test at significance ALPHA with a fixed seed.
Outcomes of probability zero (cut by top-k / top-p) must never occur at all.
A cascade whose residual step is broken on purpose (resampling from the full p after
a rejection, as one published cascade does) must fail the same test.

Detection limit, computed: up to 216 cells, so 50% power at ALPHA needs a noncentrality of
~70, a chi-square distance sum((p' - p)^2 / p) of ~1.4e-3 between the output's law p' and the
target's over the three tokens. Three tokens see at most two proposals per block; the
long-horizon laws, the exact block laws and the rejection-path sentinel are in
tests/unit/cascade/.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.stats import chisquare

from specrouter.drafters.ngram import NgramDrafter
from specrouter.backends.synthetic import SyntheticBackend
from specrouter.cascade.chain import Chain
from specrouter.cascade.sampling import SamplingParams, warp
from specrouter.engine import generate

ALPHA = 1e-3  # significance level of the goodness-of-fit test
RUNS = 50_000
N_TOKENS = 3
VOCAB = 6
PROMPT = [1, 2, 3, 1, 2]

pytestmark = pytest.mark.slow


def make_models():
    """Target plus three drafts of decreasing quality (noise = distance from the target)."""
    target = SyntheticBackend("target", vocab=VOCAB, noise=0.0)
    mid = SyntheticBackend("mid", vocab=VOCAB, model_seed=2, noise=0.8)
    small = SyntheticBackend("small", vocab=VOCAB, model_seed=3, noise=1.5)
    tiny = SyntheticBackend("tiny", vocab=VOCAB, model_seed=4, noise=2.5)
    return target, mid, small, tiny


def exact_distribution(target: SyntheticBackend, params: SamplingParams) -> dict[tuple[int, ...], float]:
    probs = {}
    for seq in itertools.product(range(VOCAB), repeat=N_TOKENS):
        p = 1.0
        for i, token in enumerate(seq):
            p *= warp(target.logits_for(PROMPT + list(seq[:i])), params)[token]
            if p == 0:
                break
        probs[seq] = p
    return probs


def empirical_counts(chain: Chain, params: SamplingParams, seed: int, runs: int = RUNS,
                     **kw) -> dict[tuple[int, ...], int]:
    rng = np.random.default_rng(seed)
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(runs):
        out = tuple(generate(chain, PROMPT, params, N_TOKENS, rng=rng, **kw).token_ids)
        counts[out] = counts.get(out, 0) + 1
    return counts


def goodness_of_fit(exact: dict, counts: dict, runs: int = RUNS) -> float:
    """p-value of a chi-square test; cells with expected count < 5 are pooled into one."""
    impossible = [seq for seq, c in counts.items() if exact.get(seq, 0.0) == 0.0]
    assert not impossible, f"outcomes of probability zero were generated: {impossible[:5]}"
    observed, expected = [], []
    pooled_obs = pooled_exp = 0.0
    for seq, p in exact.items():
        if p == 0:
            continue
        if p * runs >= 5:
            observed.append(counts.get(seq, 0))
            expected.append(p * runs)
        else:
            pooled_obs += counts.get(seq, 0)
            pooled_exp += p * runs
    if pooled_exp:
        observed.append(pooled_obs)
        expected.append(pooled_exp)
    expected = np.array(expected) * (sum(observed) / sum(expected))
    return chisquare(observed, expected).pvalue


def output_pvalue(chain: Chain, params: SamplingParams, **kw) -> float:
    """The goodness-of-fit p-value of RUNS outputs of `chain` (seed 1234) against its target's law."""
    return goodness_of_fit(exact_distribution(chain.target, params), empirical_counts(chain, params, seed=1234, **kw))


class BelowHalf:
    """A draft stop that ends the draft after a token drawn with probability below 1/2: it
    depends on the drawn token itself, which must not bias the output (chain docstring)."""

    def more(self, confidences):
        return confidences[-1] >= 0.5

    def learn(self, confidences, n_accepted):
        pass


def chains():
    target, mid, small, tiny = make_models()
    return {
        "2-level": Chain([small, target], [3]),
        "2-level-stop": Chain([small, target], [3], draft_stop=BelowHalf()),
        "3-level-stop": Chain([small, mid, target], [3, 2], draft_stop=BelowHalf()),
        "3-level": Chain([small, mid, target], [2, 3]),
        "4-level": Chain([tiny, small, mid, target], [2, 2, 3]),
        "4-level-ngram": Chain([NgramDrafter(max_ngram=2), small, mid, target], [2, 2, 3]),
    }


CASES = [
    ("2-level", SamplingParams(temperature=1.0)),
    ("2-level", SamplingParams(temperature=1.0, top_k=3, top_p=0.9)),
    ("2-level-stop", SamplingParams(temperature=1.0)),
    ("3-level-stop", SamplingParams(temperature=0.8, top_p=0.9)),
    ("3-level", SamplingParams(temperature=1.0, top_k=4)),
    ("3-level", SamplingParams(temperature=1.0, top_p=0.8)),
    ("4-level", SamplingParams(temperature=1.0)),
    ("4-level", SamplingParams(temperature=0.7, top_k=4, top_p=0.9)),
    ("4-level-ngram", SamplingParams(temperature=1.0, top_p=0.9)),
]


@pytest.mark.parametrize(("name", "params"), CASES, ids=[f"{n}-{p}" for n, p in CASES])
def test_chain_output_follows_target_distribution(name, params):
    pvalue = output_pvalue(chains()[name], params)
    assert pvalue > ALPHA, f"{name}: output deviates from the target distribution (p = {pvalue:.2e})"


def test_broken_residual_is_detected():
    """Resampling from the full p after a rejection skews the output: the test must see it."""

    def full_p_instead_of_residual(p, q, proposed):
        return p

    pvalue = output_pvalue(chains()["3-level"], SamplingParams(temperature=1.0), residual_fn=full_p_instead_of_residual)
    assert pvalue < 1e-6, f"a broken residual went unnoticed (p = {pvalue:.2e})"

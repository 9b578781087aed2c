"""The slow tier's power against rare errors on the rejection path, and its calibration.

A target whose next-token row is the same after every context (order 0) generates i.i.d.
tokens, so a lossless chain's output is i.i.d. too: the counts of ALL emitted tokens of all
runs are exactly multinomial(tokens, p), and the disjoint adjacent pairs (tokens 2j, 2j + 1)
multinomial(pairs, p x p). Pooling every position gives ~16 draws per generation instead of
one, which is what buys the power; the rows are chosen to make rejections frequent and the
residual far from p:

    p = (0.5, 0.3, 0.2) (target), q = (0.9, 0.05, 0.05) (draft): rejection probability
    beta = 1 - sum min(p, q) = 0.4, residual r = (0, 0.625, 0.375).

A bug that samples a fraction eps of corrections from the full p instead of r moves each
token's law by eps * beta * (p - r), a chi-square noncentrality of eps^2 * beta^2 *
sum (p - r)^2 / p = 4.0e-4 * (eps / 0.05)^2 per token. At SLOW_RUNS x HORIZON = 640,000 tokens
(about 1/5 of them bonus tokens, which carry no bias) that is ~200 for eps = 5%: detected
for sure (a trial on the 2-level chain: p = 2e-35). Detection limit of the slow tier: 50%
power at eps ~ 1.5% (noncentrality 14 at ALPHA / 2, 2 degrees of freedom); a trial at 1.2%
went unnoticed (p = 0.45). The fast tier (FAST_RUNS, 13x fewer tokens) detects eps = 5% about
half the time (a trial: p = 0.01): that is not its job. The 3-level chain is weaker (its
middle row is closer to the target's, so its corrections move less).
Blind spot by construction: every row is the same, so a bug that picks the wrong row (wrong
position, wrong context) is invisible here; test_chain_law.py covers those.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

from specrouter.backends.synthetic import SyntheticBackend
from specrouter.cascade.chain import Chain
from specrouter.cascade.sampling import SamplingParams
from specrouter.cascade.verify import residual
from specrouter.engine import generate

ALPHA = 1e-3
HORIZON = 16
FAST_RUNS = 3_000
SLOW_RUNS = 40_000
P_TARGET = (0.5, 0.3, 0.2)
Q_DRAFT = (0.9, 0.05, 0.05)
Q_MID = (0.3, 0.6, 0.1)


class FixedRow(SyntheticBackend):
    """A model whose next-token distribution is `probs` after every context."""

    def __init__(self, name: str, probs: tuple[float, ...]) -> None:
        super().__init__(name, vocab=len(probs), order=0)
        self._row = np.log(np.asarray(probs, dtype=np.float64))

    def logits_for(self, context) -> np.ndarray:
        return self._row


def chain(name: str) -> Chain:
    target, draft = FixedRow("target", P_TARGET), FixedRow("draft", Q_DRAFT)
    if name == "2-level":
        return Chain([draft, target], [4])
    return Chain([draft, FixedRow("mid", Q_MID), target], [3, 4])


def pooled_pvalue(ch: Chain, runs: int, seed: int, residual_fn=residual) -> float:
    """The smaller of the two pooled tests' p-values (tokens; disjoint pairs), Bonferroni x 2."""
    rng = np.random.default_rng(seed)
    p = np.asarray(P_TARGET)
    v = len(p)
    singles, pairs = np.zeros(v), np.zeros(v * v)
    params = SamplingParams(temperature=1.0)
    for _ in range(runs):
        tokens = np.asarray(generate(ch, [0], params, HORIZON, rng=rng, residual_fn=residual_fn).token_ids)
        singles += np.bincount(tokens, minlength=v)
        pairs += np.bincount(tokens[0::2] * v + tokens[1::2], minlength=v * v)
    p_single = chisquare(singles, p * singles.sum()).pvalue
    p_pairs = chisquare(pairs, np.outer(p, p).ravel() * pairs.sum()).pvalue
    return min(1.0, 2 * min(p_single, p_pairs))


def full_p_mixture(eps: float, seed: int = 99):
    """A residual step that returns the full p for a fraction eps of corrections."""
    draws = np.random.default_rng(seed)
    return lambda p, q, x: p if draws.random() < eps else residual(p, q, x)


@pytest.mark.parametrize("name", ["2-level", "3-level"])
def test_pooled_tokens_follow_the_target_fast(name):
    assert pooled_pvalue(chain(name), FAST_RUNS, seed=3) > ALPHA


@pytest.mark.slow
@pytest.mark.parametrize("name", ["2-level", "3-level"])
def test_pooled_tokens_follow_the_target_slow(name):
    assert pooled_pvalue(chain(name), SLOW_RUNS, seed=4) > ALPHA


@pytest.mark.slow
def test_power_calibration_five_percent_full_p_is_detected():
    """The slow tier's sentinel rejects a cascade in which 5% of corrections come from the
    full p (a rare form of the classic residual bug), at the same runs and seed as above."""
    pvalue = pooled_pvalue(chain("2-level"), SLOW_RUNS, seed=4, residual_fn=full_p_mixture(0.05))
    assert pvalue < ALPHA, f"a 5% full-p mixture went unnoticed (p = {pvalue:.2e})"

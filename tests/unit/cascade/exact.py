"""Exact reference laws for the exactness tests, and the goodness-of-fit test against them.

A synthetic target (backends/synthetic.py) is a Markov chain of order `order`: its next-token
row depends on the last `order` tokens only. So the law of the k-th generated token under the
target alone, and the joint law of tokens (k, k + 1), follow from a forward recursion over
those short states, for any horizon, with no sampling at all:

    alive_0 = {last tokens of the prompt: 1}
    alive_{k+1}(s') = sum_s alive_k(s) * P(c | s)       s' = (s + c)[-order:], c not EOS
    P(token k = c) = sum_s alive_{k-1}(s) * P(c | s)     P(token k = END) = 1 - sum_s alive_k(s)

where P(. | s) is the target's warped row (temperature, top-k, top-p) and END stands for "the
generation ended at an EOS before position k" (EOS is not emitted, as generate() does).
A chain's output must follow exactly these laws; `marginal_pvalues` compares the output of many
seeded generations with them, position by position (V + 1 cells) and pair by pair ((V + 1)^2
cells): few cells per test is what gives the chi-square its power against small biases.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import chisquare

from specrouter.backends.synthetic import SyntheticBackend
from specrouter.cascade.chain import Chain
from specrouter.cascade.sampling import SamplingParams, warp
from specrouter.engine import generate


@dataclass(frozen=True)
class TargetLaw:
    """Exact law of a generation of `horizon` tokens by the target alone. Index n_vocab is END."""

    single: np.ndarray  # (horizon, n_vocab + 1): P(token k = c), k = 0-based position
    pairs: np.ndarray  # (horizon - 1, n_vocab + 1, n_vocab + 1): P(token k = a, token k + 1 = b)

    @property
    def end(self) -> int:
        return self.single.shape[1] - 1


def target_law(target: SyntheticBackend, prompt: Sequence[int], params: SamplingParams, horizon: int) -> TargetLaw:
    """The forward recursion of the module docstring (states keep at least the last token, so
    a pair's first token is the state's last)."""
    vocab, width = target.n_vocab, max(target.order, 1)
    end = vocab
    single = np.zeros((horizon, vocab + 1))
    pairs = np.zeros((max(horizon - 1, 0), vocab + 1, vocab + 1))
    alive: dict[tuple[int, ...], float] = {tuple(prompt[-width:]): 1.0}
    ended = 0.0
    for k in range(horizon):
        nxt: dict[tuple[int, ...], float] = {}
        ending = 0.0
        for state, mass in alive.items():
            row = warp(target.logits_for(list(state)), params)
            for c in np.flatnonzero(row):
                c, m = int(c), mass * row[c]
                if c in target.eos_ids:
                    ending += m
                    c = end
                else:
                    key = (state + (c,))[-width:]
                    nxt[key] = nxt.get(key, 0.0) + m
                single[k, c] += m
                if k > 0:
                    pairs[k - 1, state[-1], c] += m
        single[k, end] += ended
        if k > 0:
            pairs[k - 1, end, end] += ended
        ended += ending
        alive = nxt
    return TargetLaw(single, pairs)


def sample_outputs(chain: Chain, prompt: Sequence[int], params: SamplingParams, horizon: int, runs: int,
                   seed: int, **kw) -> np.ndarray:
    """(runs, horizon) token ids of seeded generations, END (= the target's n_vocab) after an EOS."""
    rng = np.random.default_rng(seed)
    end = chain.target.n_vocab
    out = np.full((runs, horizon), end, dtype=np.int64)
    for r in range(runs):
        tokens = generate(chain, prompt, params, horizon, rng=rng, **kw).token_ids
        out[r, : len(tokens)] = tokens
    return out


def chi_square_pvalue(expected: np.ndarray, observed: np.ndarray) -> float:
    """Goodness of fit of counts to exact probabilities (same shape). An outcome of
    probability zero that occurs fails at once (an assertion, not a p-value); cells expected
    fewer than 5 times are pooled into one."""
    expected, observed = expected.ravel(), observed.ravel()
    impossible = np.flatnonzero((expected <= 0) & (observed > 0))
    assert not impossible.size, f"outcomes of probability zero occurred: cells {impossible[:5].tolist()}"
    runs = observed.sum()
    exp = expected * runs
    big = exp >= 5
    obs_cells, exp_cells = list(observed[big]), list(exp[big])
    small = (~big) & (expected > 0)
    if small.any():
        obs_cells.append(observed[small].sum())
        exp_cells.append(exp[small].sum())
    if len(obs_cells) < 2:
        return 1.0
    exp_cells = np.array(exp_cells) * (sum(obs_cells) / sum(exp_cells))
    return float(chisquare(obs_cells, exp_cells).pvalue)


def marginal_pvalues(law: TargetLaw, outputs: np.ndarray) -> dict[str, float]:
    """One p-value per position (token k) and per adjacent pair (k, k + 1)."""
    horizon = outputs.shape[1]
    cells = law.end + 1
    invalid = np.flatnonzero((outputs < 0) | (outputs > law.end))
    assert not invalid.size, f"token ids outside the target's vocabulary: {np.unique(outputs.ravel()[invalid])[:5]}"
    pvalues = {}
    for k in range(horizon):
        counts = np.bincount(outputs[:, k], minlength=cells)
        pvalues[f"token {k + 1}"] = chi_square_pvalue(law.single[k], counts)
    for k in range(horizon - 1):
        counts = np.bincount(outputs[:, k] * cells + outputs[:, k + 1], minlength=cells * cells)
        pvalues[f"tokens {k + 1},{k + 2}"] = chi_square_pvalue(law.pairs[k], counts)
    return pvalues


def worst(pvalues: dict[str, float]) -> tuple[str, float]:
    """The smallest p-value, Bonferroni-corrected for the number of tests (capped at 1)."""
    name = min(pvalues, key=pvalues.get)
    return name, min(1.0, pvalues[name] * len(pvalues))

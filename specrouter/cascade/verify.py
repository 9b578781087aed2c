"""Verification of proposed tokens: pure functions of (proposals, distributions, rng).

Speculative sampling (Leviathan et al. 2023): a proposal x ~ q is accepted with
probability min(1, p(x)/q(x)); on rejection the verifier samples from the residual
norm(max(p - q, 0)); if all proposals are accepted, one bonus token is sampled from
the verifier's distribution at the next position. The emitted tokens follow p exactly.

A deterministic proposer (n-gram) has q = one-hot(x): acceptance is p(x) and the
residual is p with x removed, renormalised.

Greedy verification works on argmax ids only: accept while the proposal equals the
verifier's argmax, then append the verifier's argmax at the first mismatch (or the bonus).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specrouter.cascade.sampling import sample
from specrouter.ops.rows import ops_of


def verify_greedy(proposals: Sequence[int], verifier_argmax: Sequence[int]) -> tuple[int, int]:
    """Return (number accepted, the verifier's next token). len(verifier_argmax) == len(proposals) + 1."""
    for i, token in enumerate(proposals):
        if token != verifier_argmax[i]:
            return i, int(verifier_argmax[i])
    return len(proposals), int(verifier_argmax[len(proposals)])


def residual(p: np.ndarray, q: np.ndarray | None, proposed: int) -> np.ndarray:
    """norm(max(p - q, 0)), with q = one-hot(proposed) when q is None: the residual of the
    rows' kind (ops/rows_numpy.py is the reference). p and q may have different lengths
    (padded vocabularies): the missing tail is probability zero."""
    return ops_of(p).residual(p, q, proposed)


def verify_sampled(
    proposals: Sequence[int],
    proposal_probs: Sequence[np.ndarray] | None,
    verifier_probs: Sequence[np.ndarray],
    rng: np.random.Generator,
    residual_fn=residual,
) -> tuple[int, int]:
    """Speculative sampling over a run of proposals.

    proposal_probs[i] is q at position i (None for a deterministic proposer);
    verifier_probs[i] is p at position i, with one extra row for the bonus token.
    residual_fn exists so a test can break the residual step on purpose.

    The probabilities the acceptance tests read are gathered first, all at once (one
    transfer for rows kept on a device); the uniforms are drawn one by one, in position
    order: one per acceptance test (a proposal q gives no mass is rejected without one), then
    the residual's or the bonus token's sample.
    """
    k = len(proposals)
    p_at = ops_of(verifier_probs).at(verifier_probs[:k], proposals) if k else []
    q_at = [1.0] * k if proposal_probs is None or not k else ops_of(proposal_probs).at(proposal_probs[:k], proposals)
    for i, token in enumerate(proposals):
        p, p_x, q_x = verifier_probs[i], p_at[i], q_at[i]
        q_row = None if proposal_probs is None else proposal_probs[i]
        # Accept with probability min(1, p/q); written as u * q < p to avoid dividing by q.
        if q_x > 0 and rng.random() * q_x < p_x:
            continue
        return i, sample(residual_fn(p, q_row, token), rng)
    return len(proposals), sample(verifier_probs[len(proposals)], rng)


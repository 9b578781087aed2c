"""Verification rules, checked exactly (enumerating the randomness where it matters)."""

import numpy as np
import pytest

from specrouter.cascade.sampling import SamplingParams, sample, warp
from specrouter.cascade.verify import residual, verify_greedy, verify_sampled
from specrouter.errors import InvalidParameterError


def test_greedy_accepts_longest_matching_prefix_then_appends_argmax():
    assert verify_greedy([5, 6, 7], [5, 6, 9, 1]) == (2, 9)
    assert verify_greedy([5, 6, 7], [4, 6, 7, 1]) == (0, 4)
    assert verify_greedy([5, 6, 7], [5, 6, 7, 1]) == (3, 1)  # bonus token
    assert verify_greedy([], [3]) == (0, 3)


def test_residual_is_normalised_positive_part_of_p_minus_q():
    p = np.array([0.5, 0.3, 0.2])
    q = np.array([0.2, 0.6, 0.2])
    np.testing.assert_allclose(residual(p, q, 1), [1.0, 0.0, 0.0])
    # Deterministic proposer: q is one-hot at the proposed token.
    np.testing.assert_allclose(residual(p, None, 0), [0.0, 0.6, 0.4])


def test_residual_pads_shorter_vocabulary_with_zero_probability():
    p = np.array([0.5, 0.3, 0.2, 0.0])  # padded verifier vocabulary
    q = np.array([0.1, 0.1, 0.8])
    np.testing.assert_allclose(residual(p, q, 2), [0.4 / 0.6, 0.2 / 0.6, 0.0, 0.0])


def _one_step(p, q, bonus, draws, seed=0):
    """Empirical laws of one proposal x ~ q verified by p: the emitted token, and the bonus
    token (sampled from the next row, `bonus`) given that x was accepted."""
    rng = np.random.default_rng(seed)
    emitted, bonuses = np.zeros(len(p)), np.zeros(len(bonus))
    for _ in range(draws):
        x = sample(q, rng)
        n_acc, nxt = verify_sampled([x], [q], [p, bonus], rng)
        emitted[x if n_acc == 1 else nxt] += 1
        if n_acc == 1:
            bonuses[nxt] += 1
    return emitted / draws, bonuses / bonuses.sum(), int(bonuses.sum())


def test_one_step_of_speculative_sampling_emits_p_and_the_bonus_from_the_next_row():
    """A statistical smoke test (cascade/test_block_closed_form.py checks the exact law)."""
    p = np.array([0.1, 0.6, 0.3])
    q = np.array([0.5, 0.2, 0.3])
    bonus = np.array([0.7, 0.1, 0.2])
    emitted, bonuses, accepted = _one_step(p, q, bonus, draws=200_000)
    # 200k draws: standard error <= sqrt(0.25 / 200k) = 0.0011 per cell, so 0.006 is > 5 sigma.
    np.testing.assert_allclose(emitted, p, atol=0.006)
    # ~120k accepted (1 - TV = 0.6): standard error <= sqrt(0.25 / 120k) = 0.0014, so 0.0075 is > 5 sigma.
    assert accepted > 115_000
    np.testing.assert_allclose(bonuses, bonus, atol=0.0075)


def test_acceptance_rate_equals_one_minus_total_variation():
    p = np.array([0.1, 0.6, 0.3])
    q = np.array([0.5, 0.2, 0.3])
    expected = np.minimum(p, q).sum()  # 0.6
    rng = np.random.default_rng(1)
    accepted = sum(verify_sampled([sample(q, rng)], [q], [p, p], rng)[0] for _ in range(50_000))
    assert abs(accepted / 50_000 - expected) < 0.01


def test_deterministic_proposal_accepted_with_probability_p_of_x():
    p = np.array([0.25, 0.75])
    rng = np.random.default_rng(2)
    outcomes = [verify_sampled([0], None, [p, p], rng) for _ in range(40_000)]
    accepted = sum(n for n, _ in outcomes)
    assert abs(accepted / 40_000 - 0.25) < 0.01
    assert all(nxt == 1 for n, nxt in outcomes if n == 0)  # rejection never re-emits 0


def test_warp_top_k_and_top_p_keep_the_right_tokens():
    logits = np.log(np.array([0.05, 0.4, 0.3, 0.15, 0.1]))
    np.testing.assert_allclose(warp(logits, SamplingParams(temperature=1.0, top_k=2)), [0, 4 / 7, 3 / 7, 0, 0])
    # top_p = 0.8 keeps 0.4 + 0.3 + 0.15 (the smallest set reaching 0.8).
    np.testing.assert_allclose(
        warp(logits, SamplingParams(temperature=1.0, top_p=0.8)), [0, 0.4 / 0.85, 0.3 / 0.85, 0.15 / 0.85, 0]
    )
    assert warp(logits, SamplingParams()).tolist() == [0, 1, 0, 0, 0]


def test_top_p_on_a_large_vocabulary_matches_the_full_sort():
    rng = np.random.default_rng(3)
    for scale in (0.1, 3.0):  # flat (nucleus beyond the fast path's candidates) and peaked
        logits = rng.normal(size=20_000) * scale
        fast = warp(logits, SamplingParams(temperature=1.0, top_p=0.9))
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        order = np.argsort(-probs)
        keep = order[: np.searchsorted(np.cumsum(probs[order]), 0.9) + 1]
        ref = np.zeros_like(probs)
        ref[keep] = probs[keep]
        np.testing.assert_allclose(fast, ref / ref.sum(), rtol=1e-9, atol=1e-15)


def test_float32_logits_warp_like_float64_on_a_qwen_sized_vocabulary():
    # llama.cpp and torch hand over float32 rows; warp takes their exponentials in float32.
    logits = (np.random.default_rng(4).normal(size=151_936) * 3).astype(np.float32)
    for params in (SamplingParams(temperature=0.7), SamplingParams(temperature=1.3, top_k=50),
                   SamplingParams(temperature=0.7, top_p=0.9)):
        fast, ref = warp(logits, params), warp(logits.astype(np.float64), params)
        assert fast.dtype == np.float64 and abs(fast.sum() - 1.0) < 1e-12
        np.testing.assert_array_equal(fast > 0, ref > 0)  # the same support (top-k/top-p cuts)
        np.testing.assert_allclose(fast, ref, rtol=1e-5, atol=0)


def test_sampling_on_a_large_vocabulary_is_the_inverse_cdf_of_the_same_uniform():
    # Blocks first, then one block: the token whose CDF interval holds the uniform, as a
    # single cumulative sum over the whole vocabulary finds it.
    rng = np.random.default_rng(5)
    probs = warp(rng.normal(size=151_936) * 2, SamplingParams(temperature=1.0, top_k=3000))
    draws, twin = np.random.default_rng(6), np.random.default_rng(6)
    cdf = np.cumsum(probs)
    for _ in range(3000):
        token = sample(probs, draws)
        assert probs[token] > 0
        assert token == min(int(np.searchsorted(cdf, twin.random() * cdf[-1], side="right")), len(probs) - 1)
    # Mass only in the last token of a block and the first of the next: block edges are right.
    edge = np.zeros(10_000)
    edge[[1023, 1024]] = 0.5
    hits = np.bincount([sample(edge, draws) for _ in range(4000)], minlength=10_000)
    assert hits.sum() == hits[1023] + hits[1024] and abs(hits[1023] / 4000 - 0.5) < 0.05


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -0.1}, "temperature must be >= 0"),
        ({"top_p": 0.0}, "top_p must be in (0, 1]"),
        ({"top_p": 1.5}, "top_p must be in (0, 1]"),
        ({"top_k": -1}, "top_k must be an integer >= 0"),
    ],
)
def test_invalid_sampling_parameters_are_refused(kwargs, message):
    with pytest.raises(InvalidParameterError, match=message.replace("(", r"\(").replace(")", r"\)")):
        SamplingParams(**kwargs)


def test_tiny_temperature_is_the_argmax_not_nan():
    probs = warp(np.array([1.0, 3.0, 2.0, 3.0 - 1e-3]), SamplingParams(temperature=1e-308))
    assert probs.tolist() == [0.0, 1.0, 0.0, 0.0]

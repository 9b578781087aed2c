"""Penalties and biases (cascade/penalties.py) under speculation: the transformation itself on
exact numbers; greedy output of every chain equal to the penalised target alone's; sampled
output of chains of depth 2 and 3 following the penalised target's law exactly (chi-square
against the law enumerated from the synthetic target's rows); a cascade that penalises a row
by the committed text only, forgetting the tokens drafted before it in the block, fails the
same test (the test's power against the bug it exists for)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from specrouter.backends.synthetic import SyntheticBackend
from specrouter.cascade.chain import Chain
from specrouter.cascade.penalties import History, penalize
from specrouter.cascade.sampling import SamplingParams, warp
from specrouter.drafters.ngram import NgramDrafter
from specrouter.engine import generate
from specrouter.errors import InvalidParameterError, InvalidTokenIdError

from .test_sampling_exactness import ALPHA, goodness_of_fit

VOCAB = 6
PROMPT = [1, 2, 3, 1, 2]
N_TOKENS = 3
#: Generations per case: up to 216 cells, so 50% power at ALPHA needs a chi-square distance of
#: ~3.5e-3 between the output's law and the target's (committed-only counts: p = 0.0 at 10,000).
RUNS = 20_000


def models():
    target = SyntheticBackend("target", vocab=VOCAB)
    mid = SyntheticBackend("mid", vocab=VOCAB, model_seed=2, noise=0.8)
    small = SyntheticBackend("small", vocab=VOCAB, model_seed=3, noise=1.5)
    return target, mid, small


def chains():
    target, mid, small = models()
    return {"2-level": Chain([small, target], [3]),
            "3-level": Chain([small, mid, target], [2, 3]),
            "n-gram 3-level": Chain([NgramDrafter(max_ngram=2), mid, target], [3, 2])}


def penalised_row(target, prefix, params):
    return penalize(target.logits_for(prefix), prefix, params, History(PROMPT))


# The transformation ----------------------------------------------------------------------

def test_bias_then_repetition_then_frequency_and_presence_on_exact_numbers():
    row = np.array([2.0, -1.0, 0.5, 3.0, -2.0, 1.0])
    prompt = [0, 1]
    history = History(prompt)
    history.sync(prompt + [3, 3])  # committed output: token 3 twice
    prefix = prompt + [3, 3, 5]  # and token 5 drafted in this block
    params = SamplingParams(logit_bias=((2, 1.5), (4, -100.0)), repetition_penalty=2.0, frequency_penalty=0.5,
                            presence_penalty=0.25)
    got = penalize(row, prefix, params, history)
    # token 0: prompt -> 2 / 2; 1: prompt -> -1 * 2; 2: bias only -> 2.0; 3: output x2 -> 3 / 2 - 0.5 * 2 - 0.25;
    # 4: bias -> -102 (never seen); 5: drafted once -> 1 / 2 - 0.5 - 0.25
    assert got.tolist() == [1.0, -2.0, 2.0, 0.25, -102.0, -0.25]
    assert row.tolist() == [2.0, -1.0, 0.5, 3.0, -2.0, 1.0]  # the caller's row is untouched


def test_presence_and_frequency_count_the_output_only_and_the_history_never_shrinks():
    history = History([4, 4, 4])
    assert history.counts([4, 4, 4]) == {}
    assert history.counts([4, 4, 4, 2, 4]) == {2: 1, 4: 1}
    history.sync([4, 4, 4, 2])
    assert history.counts([4, 4, 4, 2, 2]) == {2: 2} and history.output == {2: 1}
    with pytest.raises(ValueError, match="never shrinks"):
        history.sync([4, 4, 4])


def test_min_p_keeps_the_tokens_at_least_min_p_times_as_likely_as_the_top_one():
    row = np.log(np.array([0.5, 0.3, 0.1, 0.06, 0.04]))
    probs = warp(row, SamplingParams(temperature=1.0, min_p=0.15))
    assert np.flatnonzero(probs).tolist() == [0, 1, 2]  # 0.1 >= 0.15 * 0.5 > 0.06
    assert probs[:3] == pytest.approx(np.array([0.5, 0.3, 0.1]) / 0.9)


@pytest.mark.parametrize(("kw", "message"), [
    ({"min_p": 1.5}, "min_p must be in [0, 1]"),
    ({"frequency_penalty": 2.5}, "frequency_penalty must be in [-2.0, 2.0]"),
    ({"presence_penalty": float("nan")}, "presence_penalty must be in [-2.0, 2.0]"),
    ({"repetition_penalty": 0.0}, "repetition_penalty must be in [0.001, 1000]"),
    ({"repetition_penalty": 5e-324}, "repetition_penalty must be in [0.001, 1000]"),
    ({"repetition_penalty": 1000.5}, "repetition_penalty must be in [0.001, 1000]"),
    ({"logit_bias": ((3, 101.0),)}, "logit_bias values must be in [-100, 100]"),
    ({"logit_bias": ((-1, 1.0),)}, "logit_bias keys must be token ids >= 0"),
])
def test_bad_values_are_refused(kw, message):
    with pytest.raises(InvalidParameterError, match=message.replace("[", r"\[").replace("]", r"\]")):
        SamplingParams(**kw)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_extreme_repetition_penalties_keep_a_biased_row_a_distribution(dtype):
    """A tiny penalty divides a positive logit by it: the smallest accepted keeps it finite."""
    row = np.array([30.0, -30.0, 5.0, 0.0, 1.0, 2.0], dtype=dtype)
    history = History([0, 1, 2])
    for r in (1e-3, 1e3):
        params = SamplingParams(temperature=1.0, repetition_penalty=r, logit_bias=((0, 100.0), (1, -100.0)))
        out = penalize(row, [0, 1, 2], params, history)
        assert np.isfinite(out).all()
        probs = warp(out, params)
        assert np.isfinite(probs).all() and probs.sum() == pytest.approx(1.0)
        assert int(np.argmax(probs)) == (0 if r < 1 else 5)  # 130 / r on top, or 2 above 130 / 1000


def test_a_bias_on_a_token_outside_the_vocabulary_is_refused():
    target, _, small = models()
    with pytest.raises(InvalidTokenIdError, match="logit_bias token id 6 is outside the vocabulary"):
        generate(Chain([small, target], [3]), PROMPT, SamplingParams(logit_bias=((6, 1.0),)), 4)


# Greedy -------------------------------------------------------------------------------------

GREEDY = {
    "bias": SamplingParams(logit_bias=((0, 2.5), (3, -100.0))),
    "repetition": SamplingParams(repetition_penalty=3.0),
    "frequency+presence": SamplingParams(frequency_penalty=1.2, presence_penalty=0.8),
    "all": SamplingParams(logit_bias=((5, 1.0),), repetition_penalty=1.5, frequency_penalty=0.6, presence_penalty=0.4),
}


@pytest.mark.parametrize("params", GREEDY.values(), ids=GREEDY.keys())
@pytest.mark.parametrize("name", ["2-level", "3-level", "n-gram 3-level"])
def test_greedy_equals_the_penalised_target_alone(name, params):
    chain = chains()[name]
    target = chain.target
    expected: list[int] = []
    for _ in range(40):  # the penalised target alone, one argmax at a time
        expected.append(int(np.argmax(penalised_row(target, PROMPT + expected, params))))
    r = generate(chain, PROMPT, params, 40)
    assert r.token_ids == expected
    assert r.token_ids != generate(chain, PROMPT, SamplingParams(), 40).token_ids  # the penalty changed the text
    if params is GREEDY["bias"]:
        assert 3 not in r.token_ids


# Sampling -----------------------------------------------------------------------------------

SAMPLED = {
    "frequency+presence": SamplingParams(temperature=1.0, frequency_penalty=1.5, presence_penalty=1.0),
    "repetition,top_k": SamplingParams(temperature=0.9, repetition_penalty=2.5, top_k=4),
    "bias,min_p": SamplingParams(temperature=1.0, logit_bias=((0, 2.0), (4, -3.0)), min_p=0.1),
    "all,top_p": SamplingParams(temperature=1.1, top_p=0.9, frequency_penalty=-1.0, presence_penalty=1.5,
                                repetition_penalty=1.3, logit_bias=((2, 1.0),)),
}


def penalised_law(target, params) -> dict[tuple[int, ...], float]:
    """The exact law of the first N_TOKENS tokens of the penalised target alone."""
    law = {}
    for seq in itertools.product(range(VOCAB), repeat=N_TOKENS):
        p = 1.0
        for i, token in enumerate(seq):
            prefix = PROMPT + list(seq[:i])
            p *= warp(penalised_row(target, prefix, params), params)[token]
            if p == 0:
                break
        law[seq] = p
    return law


def counts_of(chain, params, seed, runs=RUNS) -> dict[tuple[int, ...], int]:
    rng = np.random.default_rng(seed)
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(runs):
        out = tuple(generate(chain, PROMPT, params, N_TOKENS, rng=rng).token_ids)
        counts[out] = counts.get(out, 0) + 1
    return counts


@pytest.mark.slow
@pytest.mark.parametrize("params", SAMPLED.values(), ids=SAMPLED.keys())
@pytest.mark.parametrize("name", ["2-level", "3-level", "n-gram 3-level"])
def test_sampled_output_follows_the_penalised_targets_law(name, params):
    chain = chains()[name]
    law = penalised_law(chain.target, params)
    unpenalised = penalised_law(chain.target, SamplingParams(temperature=params.temperature))
    assert sum(abs(law[s] - unpenalised[s]) for s in law) > 0.2  # the penalties move the law a lot
    pvalue = goodness_of_fit(law, counts_of(chain, params, seed=2024), RUNS)
    assert pvalue > ALPHA, f"{name}: output deviates from the penalised target's law (p = {pvalue:.2e})"


@pytest.mark.slow
def test_penalising_by_the_committed_text_only_is_detected(monkeypatch):
    """The bug the contract rules out: a row's counts ignore the tokens drafted before it in
    its block. The same test must reject it."""
    params = SAMPLED["frequency+presence"]
    chain = chains()["2-level"]
    law = penalised_law(chain.target, params)
    monkeypatch.setattr(History, "counts", lambda self, prefix: self.output)
    pvalue = goodness_of_fit(law, counts_of(chain, params, seed=2024), RUNS)
    assert pvalue < ALPHA, f"committed-only counts went unnoticed (p = {pvalue:.2e})"

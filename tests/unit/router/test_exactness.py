"""Switching chains between cycles keeps the output exactly the target's.

Greedy: token for token equal to the target alone, whether the real router or a
scripted one that changes chain every cycle chooses. Sampling (slow): the distribution
of the first tokens matches the target's exactly while the chain changes every cycle
by a rule of the history (any such adapted choice must keep the output exact).
"""

import numpy as np
import pytest

from specrouter.drafters.ngram import NgramDrafter
from specrouter.backends.synthetic import SyntheticBackend
from specrouter.cascade.chain import Chain
from specrouter.cascade.sampling import SamplingParams
from specrouter.engine import generate

from ..router_synth import ScriptedRouter, linear, make_router

GREEDY = SamplingParams()


def family(vocab=8, eos_id=None):
    target = SyntheticBackend("target", vocab=vocab, eos_id=eos_id, latency=linear(0.05, 0.004), params_b=7)
    mid = SyntheticBackend("mid", vocab=vocab, model_seed=2, noise=0.6, eos_id=eos_id,
                           latency=linear(0.012, 0.002), params_b=1)
    small = SyntheticBackend("small", vocab=vocab, model_seed=3, noise=1.2, eos_id=eos_id,
                             latency=linear(0.003, 0.0005), params_b=0.1)
    return target, mid, small


def rotating_chains(target, mid, small):
    ngram = NgramDrafter(max_ngram=2)
    return [
        Chain([target], []),
        Chain([small, target], [3]),
        Chain([ngram, small, mid, target], [2, 2, 3]),
        Chain([mid, target], [5]),
        Chain([ngram, target], [4]),
        Chain([small, mid, target], [1, 4]),
    ]


@pytest.mark.parametrize("eos_id", [None, 3])
def test_greedy_output_with_a_chain_switch_every_cycle_equals_the_target_alone(eos_id):
    target, mid, small = family(eos_id=eos_id)
    alone = generate(Chain([target], []), [1, 2, 3], GREEDY, 120)
    router = ScriptedRouter(target, rotating_chains(target, mid, small))
    routed = generate(router, [1, 2, 3], GREEDY, 120)
    assert routed.token_ids == alone.token_ids and routed.finish_reason == alone.finish_reason
    assert len(routed.chains_used) >= min(4, routed.cycles)  # it really switched
    # level statistics add up per model over all chains, cheapest first
    by_name = {s.name: s for s in routed.levels}
    assert by_name["target"].forwards == routed.cycles
    if eos_id is None:
        assert [s.name for s in routed.levels] == ["ngram", "small", "mid", "target"]


def test_greedy_output_of_the_router_equals_the_target_alone():
    target, mid, small = family()
    alone = generate(Chain([target], []), [1, 2, 3], GREEDY, 300)
    clock = lambda: sum(m.simulated_seconds for m in (target, mid, small))  # noqa: E731
    routed = generate(make_router(target, [small, mid]), [1, 2, 3], GREEDY, 300, clock=clock)
    assert routed.token_ids == alone.token_ids
    assert len(routed.chains_used) >= 2


def test_observing_a_cycle_changes_nothing_it_computes():
    """Same chain, same seed: with the router's observer attached the sampled tokens are identical."""
    target, mid, small = family()
    chain = Chain([NgramDrafter(), small, mid, target], [2, 2, 3])
    params = SamplingParams(temperature=0.8, top_p=0.95)
    plain = generate(chain, [1, 2, 3], params, 80, rng=np.random.default_rng(7))
    watched = generate(ScriptedRouter(target, [chain]), [1, 2, 3], params, 80, rng=np.random.default_rng(7))
    assert watched.token_ids == plain.token_ids
    assert [s.as_dict() | {"seconds": 0} for s in watched.levels] == [s.as_dict() | {"seconds": 0} for s in plain.levels]


@pytest.mark.slow
def test_sampling_distribution_with_a_chain_switch_every_cycle():
    from ..cascade.test_sampling_exactness import PROMPT, RUNS, exact_distribution, goodness_of_fit, make_models

    target, mid, small, tiny = make_models()
    ngram = NgramDrafter(max_ngram=2)
    router = ScriptedRouter(target, [
        Chain([small, mid, target], [2, 3]),
        Chain([target], []),
        Chain([tiny, small, mid, target], [2, 2, 3]),
        Chain([ngram, small, target], [2, 2]),
        Chain([mid, target], [1]),
    ])
    params = SamplingParams(temperature=1.0, top_p=0.9)
    exact = exact_distribution(target, params)
    rng = np.random.default_rng(4321)
    counts: dict[tuple[int, ...], int] = {}
    switched = 0
    for _ in range(RUNS):
        r = generate(router, PROMPT, params, 3, rng=rng)
        counts[tuple(r.token_ids)] = counts.get(tuple(r.token_ids), 0) + 1
        switched += len(r.chains_used) > 1
    assert switched > RUNS // 4  # many generations changed chain mid-sequence
    pvalue = goodness_of_fit(exact, counts)
    assert pvalue > 1e-3, f"switching chains skews the output distribution (p = {pvalue:.2e})"

"""Which models a batch step calls (engine/phase.py): the choice of InPhase exactly, its
wait bound in a running scheduler, and what it saves: the same tokens in fewer calls."""

from __future__ import annotations

import numpy as np
import pytest

from specrouter.backends.synthetic import SyntheticBackend
from specrouter.cascade.chain import Chain
from specrouter.cascade.sampling import SamplingParams
from specrouter.engine import generate
from specrouter.engine.batch import BatchScheduler, Finished, SeqRequest
from specrouter.engine.phase import InPhase, ServeAll
from specrouter.errors import InvalidParameterError

from ..router_synth import linear, simulated_clock


def test_serve_all_calls_every_waited_model():
    assert ServeAll().pick({"d": [0, 3], "t": [1]}) == {"d", "t"}
    assert ServeAll().pick({}) == set()


def test_in_phase_calls_the_model_most_sequences_wait_on_and_the_ones_waited_on_long_enough():
    policy = InPhase(max_wait=2)
    assert policy.pick({"d": [0, 0, 1], "t": [1]}) == {"d"}  # 3 against 1; t has waited 1 < 2
    assert policy.pick({"d": [0, 0, 1], "t": [2]}) == {"d", "t"}  # t's sequence waited 2 steps: due
    assert policy.pick({"d": [0], "t": [1]}) == {"t"}  # a tie: the longest wait
    assert policy.pick({"d": [0], "t": [0]}) == {"d"}  # a tie both ways: the first seen
    assert policy.pick({"t": [0], "d": [0]}) == {"t"}
    assert policy.pick({"d": [5]}) == {"d"}
    assert policy.pick({}) == set()
    assert InPhase(max_wait=0).pick({"d": [0, 0], "t": [0]}) == {"d", "t"}  # 0: every model, every step


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1"])
def test_in_phase_refuses_a_wait_that_is_not_a_step_count(bad):
    with pytest.raises(InvalidParameterError, match="max_wait must be an integer >= 0"):
        InPhase(bad)


class _Recorded:
    """A policy that records the largest wait it was shown and the steps that called several models."""

    def __init__(self, inner) -> None:
        self.inner, self.longest, self.steps, self.several = inner, 0, 0, 0

    def pick(self, waits):
        self.longest = max([self.longest, *(w for ws in waits.values() for w in ws)])
        called = self.inner.pick(waits)
        self.steps, self.several = self.steps + 1, self.several + (len(called) > 1)
        return called


def _serve(policy, params: SamplingParams):
    """8 requests of a 2-level chain (3 draft tokens), one joining per step, so that their
    cycles start out of phase; calls priced GPU-like (a fixed cost per call, a little per token)."""
    target = SyntheticBackend("target", vocab=16, params_b=1.5, latency=linear(0.010, 0.0005))
    small = SyntheticBackend("small", vocab=16, model_seed=3, noise=1.2, params_b=0.1, latency=linear(0.008, 0.0002))
    chain = Chain([small, target], [3])
    clock = simulated_clock([target, small])
    scheduler = BatchScheduler(lambda r: chain, max_batch=8, clock=clock, phases=policy)
    out, step = {}, 0
    while step < 8 or scheduler.n_active or scheduler.n_waiting:
        if step < 8:
            scheduler.add(str(step), SeqRequest([1, 2, step], params, 40))
        for e in scheduler.step():
            if isinstance(e, Finished):
                out[e.request_id] = e.result.token_ids
        step += 1
    return out, small.decode_calls + target.decode_calls, clock()


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.8, seed=3)], ids=["greedy", "sampled"])
def test_in_phase_writes_the_same_tokens_in_fewer_calls_and_waits_at_most_max_wait(params):
    """Each sequence's tokens are what it writes alone (greedy, and seeded sampling: a
    sequence's random stream is its own, whatever the order of the calls). Served in phase,
    the 8 sequences step together after the first cycles: measured, 164 calls (75 of 89
    steps calling both models) become 97 (5 of 92) with max_wait 1, and 1.86 simulated s
    become 1.23; no sequence waits more than max_wait steps."""
    chain_alone = Chain([SyntheticBackend("small", vocab=16, model_seed=3, noise=1.2, params_b=0.1),
                         SyntheticBackend("target", vocab=16, params_b=1.5)], [3])
    alone = {str(i): generate(chain_alone, [1, 2, i], params, 40, rng=np.random.default_rng(params.seed)).token_ids
             for i in range(8)}
    every = _Recorded(ServeAll())
    tokens, calls_all, seconds_all = _serve(every, params)
    assert tokens == alone and every.longest == 0
    for max_wait in (1, 3):
        phased = _Recorded(InPhase(max_wait))
        tokens, calls, seconds = _serve(phased, params)
        assert tokens == alone
        assert 1 <= phased.longest <= max_wait  # some sequences were held back, never beyond the bound
        assert calls < 0.7 * calls_all and seconds < 0.8 * seconds_all, (calls, calls_all, seconds, seconds_all)
        assert phased.several < 0.1 * phased.steps < every.several


def test_the_scheduler_keeps_batches_in_phase_by_default():
    assert isinstance(BatchScheduler(lambda r: None).phases, InPhase)

"""The draft stop: when a drafting model ends its draft on its own confidence, and what the
cascade and the router do with it (exactness under sampling: test_sampling_exactness)."""

import pytest

from specrouter.backends.synthetic import SyntheticBackend
from specrouter.cascade.chain import Chain
from specrouter.cascade.sampling import SamplingParams
from specrouter.engine import generate
from specrouter.router.config import DEFAULT_CONFIG
from specrouter.router.draft_stop import ConfidenceStop, confidence_bin
from specrouter.router.policy.predictor import closed_form_two_level

from ..router_synth import PROMPT, ScriptedRouter, linear, make_router

CENTERS, PRIOR_COUNT = DEFAULT_CONFIG.stop_centers, DEFAULT_CONFIG.stop_prior_count
DRAFT_GRID = DEFAULT_CONFIG.draft_grid

GREEDY = SamplingParams()
KEY = ("greedy", "d", "t")


def stop_with(rate=0.9, cap=16, worth=0.15, draft=0.022, verify=lambda n: 1.0):
    stop = ConfidenceStop()
    stop.configure(KEY, rate, cap, worth, draft, verify)
    return stop


def test_confident_drafts_go_on_to_the_cap():
    stop = stop_with()
    assert all(stop.more([0.999] * n) for n in range(1, 16))
    assert not stop.more([0.999] * 16)  # the cap


def test_an_unconfident_token_ends_the_draft_when_going_on_costs_more_than_it_is_worth():
    # Two tokens at 0.2 (calibrated 0.2 each, before any data): reach 0.995 * 0.2 * 0.2 ~ 0.04;
    # 13 more tokens would be worth 0.15 * 0.04 * (0.9 + ... + 0.9^13) ~ 0.04 s and cost 0.29 s.
    stop = stop_with()
    assert stop.more([0.999, 0.2])  # reach 0.2: one more is worth 0.15 * 0.2 * 0.9 = 0.027 > 0.022
    assert not stop.more([0.999, 0.2, 0.2])


def test_every_continuation_is_weighed_not_only_the_next_token():
    # Verifying 3 tokens costs what 9 do (an fp32 target on a CPU): after one token, one more
    # loses (0.022 + 0.37 s for 0.13 s of worth) but seven more gain (0.154 + 0.17 s for 0.41 s).
    costs = {1: 0.37, 2: 0.74, 3: 1.11, 4: 0.97, 5: 0.95, 6: 0.93, 7: 0.92, 8: 0.91, 9: 0.91}
    stop = stop_with(cap=8, worth=0.15, verify=lambda n: costs[n])
    assert stop.more([0.999])
    myopic = stop_with(cap=2, worth=0.15, verify=lambda n: costs[n])
    assert not myopic.more([0.999])


def test_calibration_learns_per_confidence_bin_up_to_the_first_rejection():
    stop = stop_with()
    stop.learn([0.95, 0.4, 0.995], n_accepted=1)  # accepted, rejected, never reached
    bins = stop.calibration[KEY]
    assert bins[confidence_bin(0.95)].mean == pytest.approx((CENTERS[4] * PRIOR_COUNT + 1) / (PRIOR_COUNT + 1))
    assert bins[confidence_bin(0.4)].mean == pytest.approx(CENTERS[1] * PRIOR_COUNT / (PRIOR_COUNT + 1))
    assert bins[confidence_bin(0.995)].mean == CENTERS[5]
    # a session shares the calibration, not the configuration
    twin = stop.session()
    assert twin.calibration is stop.calibration and twin.cap == 0


class Recorder(ScriptedRouter):
    """Runs one chain and keeps what every verification was asked for."""

    def __init__(self, target, chain):
        super().__init__(target, [chain])
        self.blocks = []

    def on_verify(self, proposer, verifier, proposals, q, p, n_accepted, requested, match=0):
        self.blocks.append((len(proposals), n_accepted, requested))


class AfterTwo:
    def __init__(self):
        self.learnt = []

    def more(self, confidences):
        return len(confidences) < 2

    def learn(self, confidences, n_accepted):
        self.learnt.append((len(confidences), n_accepted))


def test_a_stopped_draft_keeps_greedy_output_and_is_no_rejection_to_the_estimator():
    target = SyntheticBackend("t", vocab=8, latency=linear(0.05, 0.004), params_b=7)
    draft = SyntheticBackend("d", vocab=8, model_seed=3, noise=0.8, latency=linear(0.003, 0.0005), params_b=1)
    alone = generate(Chain([target], []), PROMPT, GREEDY, 60)
    stop = AfterTwo()
    recorder = Recorder(target, Chain([draft, target], [5], draft_stop=stop))
    routed = generate(recorder, PROMPT, GREEDY, 60)
    assert routed.token_ids == alone.token_ids
    assert {n for n, _, _ in recorder.blocks[:-1]} == {2}  # ended after two tokens (the last: by the room)
    assert all(requested == n for n, _, requested in recorder.blocks)  # asked for what it drafted
    assert [(n, a) for n, a, _ in recorder.blocks] == stop.learnt


def test_the_router_scores_a_stopping_draft_at_its_planned_length_and_caps_it_at_the_grid():
    target = SyntheticBackend("t", latency=linear(0.05, 0.004), params_b=7)
    draft = SyntheticBackend("d", latency=lambda n: 0.005, params_b=1)
    per_k = {k: closed_form_two_level(0.8, k, draft.latency, target.latency) for k in DRAFT_GRID}
    routers = {}
    for stop in (True, False):
        router = routers[stop] = make_router(target, [draft], use_ngram=False, confidence_stop=stop)
        router.acceptance.set_global("d", "t", 0.8, count=1000, mode="greedy")
        routers[stop, "chain"] = router.choose(len(PROMPT), 1000, {"t": len(PROMPT), "d": len(PROMPT)}, PROMPT)
        assert str(router.current) == f"d -> t [{min(per_k, key=per_k.get)}]"  # chosen at its planned length
    stopping, plain = routers[True, "chain"], routers[False, "chain"]
    assert stopping.draft_lengths == [max(DRAFT_GRID)] and stopping.draft_stop is routers[True].draft_stop
    assert routers[True].draft_stop.cap == max(DRAFT_GRID) and routers[True].draft_stop.stopping
    assert routers[True].draft_stop.rate == pytest.approx(0.8)
    assert routers[True].draft_stop.worth == pytest.approx(per_k[min(per_k, key=per_k.get)], rel=0.05)
    assert plain.draft_lengths == [min(per_k, key=per_k.get)] and plain.draft_stop is None


def test_a_probe_drafts_its_planned_length_without_stopping():
    stop = ConfidenceStop()
    stop.configure(KEY, 0.9, 3, 0.15, 0.022, lambda n: 1.0, stopping=False)
    assert stop.more([0.01]) and stop.more([0.01, 0.01]) and not stop.more([0.01] * 3)

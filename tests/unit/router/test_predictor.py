"""Predictor (expected seconds per committed token) and acceptance estimator."""

import functools

import numpy as np
import pytest

from specrouter.drafters.ngram import NgramDrafter
from specrouter.cascade.chain import Chain
from specrouter.cascade.sampling import SamplingParams
from specrouter.engine import generate
from specrouter.router.estimates.acceptance import AcceptanceEstimator, pair_score, position_scores
from specrouter.router.policy.predictor import ChainSpec, closed_form_two_level, expected_tokens, predict

from ..router_synth import PROMPT, ScriptedRouter, family, rows_cost_simulated_time, simulated_clock


def test_expected_tokens_per_block():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.8, 4) == pytest.approx((1 - 0.8**5) / 0.2)


@pytest.mark.parametrize(("a", "k"), [(0.5, 1), (0.8, 4), (0.9, 8), (0.3, 3)])
def test_two_levels_match_the_closed_form(a, k):
    # A draft whose cost does not depend on n: its catch-up token is free, so the
    # engine-exact prediction must equal the textbook formula.
    t_draft, t_target = (lambda n: 0.01), (lambda n: 0.05 + 0.004 * n)
    costs = {"d": t_draft, "t": t_target}
    p = predict(ChainSpec(("d", "t"), (k,)), lambda name, n: costs[name](n), lambda j, i: a)
    assert p.seconds_per_token == pytest.approx(closed_form_two_level(a, k, t_draft, t_target))


def test_target_alone_and_the_last_token():
    cost = lambda name, n: 0.05 + 0.01 * n  # noqa: E731
    assert predict(ChainSpec(("t",)), cost, lambda j, i: 0.9).seconds_per_token == pytest.approx(0.06)
    # With room for one token the target takes no proposals: it runs alone.
    assert predict(ChainSpec(("d", "t"), (4,)), cost, lambda j, i: 0.9, room=1).seconds_per_token == pytest.approx(0.06)


def test_a_middle_level_runs_blocks_until_it_has_its_draft_length():
    # Perfect acceptance: level 1 needs ceil(n / (k + 1)) blocks of k proposals (truncated).
    costs = {"d": 0.001, "m": 0.01, "t": 0.1}
    p = predict(ChainSpec(("d", "m", "t"), (2, 6)), lambda name, n: costs[name] * n, lambda j, i: 1.0)
    # mid: blocks of 2 proposals give 3 tokens -> 2 blocks for 6 tokens, each feeding 3 (+1 catch-up in the first)
    draft = 2 * (1 * 0.001 + 1 * 0.001 * 2)  # per block: 1 forward of 1 token, then 1 of 2 (catch-up)
    mid = 0.01 * (3 + 1) + 0.01 * 3
    target = 0.1 * 7
    assert p.tokens_per_cycle == pytest.approx(7.0)
    assert p.cycle_seconds == pytest.approx(draft + mid + target)


#: The model-free level of these chains (a lookup: one call whatever n, no forward per token).
LOOKUPS = frozenset({"ngram"})


def _equation_cycle(spec, cost, rate, fill, row, lookups):
    """A cycle's expected seconds by the module docstring's equations as written: C(r) with its
    sum over every block size g, recursively (what the predictor computes in O(n) per level)."""
    names, ks = spec.names, spec.draft_lengths

    def dist(a, m):  # P(G = g), g = 1..m + 1
        return [a ** (g - 1) * (1 - a) for g in range(1, m + 1)] + [a**m]

    def produce(i, n):
        a0 = rate(names[0], names[1])
        if i == 0:
            one, two = cost(names[0], 1), cost(names[0], 2)
            return cost(names[0], n) if names[0] in lookups else (n - 1) * one + (1 - a0**n) * one + a0**n * two + n * row
        k, a, f = ks[i - 1], rate(names[i - 1], names[i]), fill(names[i - 1], names[i])

        def block(m, catch_up):
            return produce(i - 1, m) + cost(names[i], f * m + 1 + catch_up) + (f * m + 1) * row

        @functools.cache
        def missing(r):
            return 0.0 if r == 0 else block(min(k, r), 0.0) + sum(
                p * missing(max(r - g, 0)) for g, p in enumerate(dist(a, min(k, r)), 1))

        return block(min(k, n), rate(names[i], names[i + 1]) ** n) + sum(
            p * missing(max(n - g, 0)) for g, p in enumerate(dist(a, min(k, n)), 1))

    top, m = len(names) - 1, ks[-1]
    fed = fill(names[top - 1], names[top]) * m + 1
    return produce(top - 1, m) + cost(names[top], fed) + fed * row


@pytest.mark.parametrize("seed", range(4))
def test_deep_chains_cost_what_the_equations_say(seed):
    """predict()'s sliding-window recursion for a middle level's blocks equals the docstring's
    equations summed term by term (to rounding), on 3- and 4-level chains, rates 0, 1 and between,
    partial fills, the n-gram at the bottom or not, draft lengths 1 to 64."""
    rng = np.random.default_rng(seed)
    for _ in range(40):
        depth = int(rng.integers(2, 4))
        names = (("ngram",) if rng.random() < 0.5 else ("d",)) + ("m1", "m2")[: depth - 1] + ("t",)
        ks = tuple(int(rng.choice([1, 2, 3, 5, 8, 16, 64])) for _ in range(depth))
        base, slope = {n: rng.uniform(1e-3, 0.1) for n in names}, {n: rng.uniform(0, 1e-2) for n in names}
        rates = {(j, i): float(rng.choice([0.0, 1.0, rng.random(), rng.random()])) for j, i in zip(names, names[1:])}
        fills = {(j, i): float(rng.choice([1.0, rng.random()])) for j, i in zip(names, names[1:])}
        row = float(rng.choice([0.0, 5e-4]))
        spec = ChainSpec(names, ks)
        args = (lambda name, n: base[name] + slope[name] * n, lambda j, i: rates[(j, i)], lambda j, i: fills[(j, i)])
        got = predict(spec, *args, row=row, lookups=LOOKUPS)
        assert got.cycle_seconds == pytest.approx(_equation_cycle(spec, *args, row, LOOKUPS), rel=1e-12)
        assert got.tokens_per_cycle == pytest.approx(sum(rates[names[-2], "t"] ** j for j in range(ks[-1] + 1)), rel=1e-12)


class _Observer(ScriptedRouter):
    """Plain means over the whole run (the router's own estimates weigh recent data more)."""

    def __init__(self, target, chain, greedy):
        super().__init__(target, [chain])
        self.greedy = greedy
        self.scores, self.fills = {}, {}

    def on_verify(self, proposer, verifier, proposals, q, p, n_accepted, requested, match=0):
        pair = (proposer, verifier)
        self.scores.setdefault(pair, []).extend(position_scores(proposals, q, p, self.greedy, requested, n_accepted))
        self.fills.setdefault(pair, []).append(len(proposals) / requested)

    def rate(self, proposer, verifier):
        return float(np.mean(self.scores[(proposer, verifier)]))

    def fill(self, proposer, verifier):
        return float(np.mean(self.fills[(proposer, verifier)]))


def _simulated_run(levels: str, lengths: list[int], target, mid, small):
    """Sampled generation over a fixed chain: the observer (plain-mean acceptance), the
    simulated seconds per token, the chain's spec and the models' costs as the predictor takes them."""
    by_name = {"ngram": NgramDrafter(), "small": small, "mid": mid}
    chain = Chain([by_name[n] for n in levels.split(",")] + [target], lengths)
    observer = _Observer(target, chain, greedy=False)
    models = [target, mid, small]
    clock = simulated_clock(models)
    before = clock()
    r = generate(observer, PROMPT, SamplingParams(temperature=1.0), 1500, rng=np.random.default_rng(1), clock=clock)
    costs = {m.name: m.latency for m in models}
    cost = lambda name, n: 0.0 if name == "ngram" else costs[name](n)  # noqa: E731
    return observer, (clock() - before) / len(r.token_ids), ChainSpec(tuple(chain.names), tuple(lengths)), cost


@pytest.mark.parametrize(("levels", "lengths"), [
    ("small", [4]), ("mid", [6]), ("small,mid", [2, 4]), ("ngram,small,mid", [2, 2, 3]), ("ngram,small", [2, 5]),
])
def test_prediction_matches_simulated_time_per_token(levels, lengths):
    """Under sampling, the prediction from measured acceptance is within 10% of what the
    synthetic models' simulated clocks show (the i.i.d. model is an approximation)."""
    observer, measured, spec, cost = _simulated_run(levels, lengths, *family())
    assert predict(spec, cost, observer.rate, observer.fill, lookups=LOOKUPS).seconds_per_token == pytest.approx(
        measured, rel=0.10)


@pytest.mark.parametrize(("levels", "lengths"), [("small", [4]), ("ngram", [3]), ("ngram,small,mid", [2, 2, 3])])
def test_prediction_counts_the_python_work_per_logits_row(monkeypatch, levels, lengths):
    """A row costs 3 ms here (a 150k-vocabulary row under sampling costs ~0.5 ms on a CPU):
    the prediction with that row cost matches the simulated time as closely as without
    rows, and one that leaves the rows out is more than 10% off."""
    target, mid, small = family()
    rows_cost_simulated_time(monkeypatch, target, 0.003)
    observer, measured, spec, cost = _simulated_run(levels, lengths, target, mid, small)
    assert predict(spec, cost, observer.rate, observer.fill, row=0.003, lookups=LOOKUPS).seconds_per_token == pytest.approx(
        measured, rel=0.10)
    assert predict(spec, cost, observer.rate, observer.fill, lookups=LOOKUPS).seconds_per_token < 0.9 * measured
    assert predict(ChainSpec(("target",)), cost, observer.rate, row=0.003).seconds_per_token == pytest.approx(
        target.latency(1) + 0.003)


def test_acceptance_scores():
    p = np.array([0.5, 0.3, 0.2])
    q = np.array([0.2, 0.3, 0.5])
    assert pair_score(0, q, p, greedy=False) == pytest.approx(0.2 + 0.3 + 0.2)  # 1 - TV
    assert pair_score(1, None, p, greedy=False) == pytest.approx(0.3)  # one-hot q: p(x)
    assert pair_score(2, None, 2, greedy=True) == 1.0 and pair_score(2, None, 0, greedy=True) == 0.0
    assert pair_score(0, q, np.array([0.5, 0.3, 0.2, 0.0]), greedy=False) == pytest.approx(0.7)  # padded vocab


def test_acceptance_estimates_shrink_per_request_toward_global_and_use_triangle_priors():
    est = AcceptanceEstimator(default=0.4, shrink=16)
    est.start_request(greedy=True)
    assert est.rate("a", "c") == 0.4  # nothing known: the default prior
    est.observe("a", "b", [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1, 1], requested=4, n_accepted=4)
    # Greedy rows are argmaxes: position 2 rejects; positions 3 and 4 are not scored.
    est.observe("b", "c", [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 1, 1], requested=4, n_accepted=2)
    assert est.rate("a", "b") == 1.0 and est.rate("b", "c") == pytest.approx(2 / 3)
    assert est.prior("a", "c", ["a", "b", "c"]) == pytest.approx(2 / 3)  # a_ac >= a_ab + a_bc - 1
    est.start_request(greedy=True)  # a new request starts from the global estimate ...
    assert est.rate("b", "c") == pytest.approx(2 / 3)
    est.observe("b", "c", [1] * 16, [1] * 16, [0] * 17, requested=16, n_accepted=0)  # ... and moves to its own data
    # A block rejected at its first position is one observation, not sixteen.
    assert est.request[("b", "c")].count == 1
    w = 1 / (1 + 16)
    assert est.rate("b", "c") == pytest.approx(w * 0.0 + (1 - w) * est.global_[("greedy", "b", "c")].mean)
    # An n-gram that found nothing counts one rejection at the first missing position.
    est.observe("ngram", "c", [], None, [1], requested=4, n_accepted=0)
    assert est.rate("ngram", "c") == 0.0 and est.fill("ngram", "c") == 0.0


def test_blocks_are_scored_up_to_their_first_rejection():
    """The rate is the chance of going on from a reached position: positions after a
    rejection (the draft continuing a wording the verifier did not take) do not count,
    so under greedy the estimate is accepted / (accepted + rejections), the i.i.d.
    model's maximum-likelihood rate, whatever the draft's later tokens do."""
    est = AcceptanceEstimator()
    est.start_request(greedy=True)
    est.observe("d", "t", [5] * 8, None, [5] * 9, requested=8, n_accepted=8)  # all 8 accepted
    est.observe("d", "t", [5] * 8, None, [5, 5, 7, 7, 7, 7, 7, 7, 7], requested=8, n_accepted=2)
    assert est.global_[("greedy", "d", "t")].mean == pytest.approx(10 / 11)
    assert est.global_[("greedy", "d", "t")].count == 11
    # An n-gram that gave 2 of 4 and had both accepted ends like a rejection at the third.
    assert position_scores([3, 4], None, [3, 4, 9], True, requested=4, n_accepted=2) == [1.0, 1.0, 0.0]
    # Sampling: 1 - TV at the reached positions only (here the accepted first and the rejected second).
    p = np.array([[0.5, 0.5], [0.9, 0.1], [0.2, 0.8]])
    q = np.array([[0.5, 0.5], [0.1, 0.9], [0.5, 0.5]])
    assert position_scores([0, 1, 0], q, p, False, requested=3, n_accepted=1) == pytest.approx([1.0, 0.2])


def test_the_cautious_rate_is_the_estimate_less_its_noise():
    est = AcceptanceEstimator()
    est.start_request(greedy=True)
    assert est.cautious("d", "t") == 0.0  # nothing observed: a prior is no evidence
    est.observe_scores("d", "t", [1.0, 1.0])  # two lucky scores
    assert est.rate("d", "t") == 1.0 and est.cautious("d", "t") < 0.6
    rng = np.random.default_rng(0)
    est.observe_scores("d", "t", list((rng.random(400) < 0.75).astype(float)))  # many, at 0.75
    est.start_request(greedy=True)  # a new request starts from the global estimate: ~200 scores' noise
    fresh_gap = est.rate("d", "t") - est.cautious("d", "t")
    assert 0.01 < fresh_gap < 0.05
    est.observe_scores("d", "t", list((rng.random(40) < 0.75).astype(float)))
    # The request's own estimate, which follows its text, remembers ~19 positions: noisier.
    own_gap = est.rate("d", "t") - est.cautious("d", "t")
    assert 0.06 < own_gap < 0.12
    # A persisted estimate (mean and count only) is as noisy as 0/1 scores of its mean.
    seeded = AcceptanceEstimator()
    seeded.set_global("d", "t", 0.75, count=400, mode="greedy")
    seeded.start_request(greedy=True)
    assert seeded.rate("d", "t") - seeded.cautious("d", "t") == pytest.approx(fresh_gap, abs=0.01)
    # The bold rate mirrors it: as far above the estimate (weighed against the prior) as the
    # cautious one is below.
    bold, cautious = seeded.bold("d", "t"), seeded.cautious("d", "t")
    assert bold - seeded.rate("d", "t") > 0.01 and (bold + cautious) / 2 == pytest.approx(seeded.rate("d", "t"), abs=0.01)
    assert AcceptanceEstimator().bold("d", "t") == AcceptanceEstimator().rate("d", "t")  # no data: the rate


@pytest.mark.parametrize("seed", range(6))
def test_the_estimate_table_equals_the_estimates_one_at_a_time(seed):
    """table() is what rate(), cautious(), bold() and count() give pair by pair, to the last
    bit, whatever is observed: global data or not, per-request data (some aged), triangle
    priors through observed middles (or none), greedy or sampled, seeded estimates."""
    rng = np.random.default_rng(seed)
    names = ["ngram:a", "ngram:b", "s", "m", "t"]
    est = AcceptanceEstimator(default=0.3 + 0.1 * seed, shrink=8)
    est.start_request(greedy=bool(seed % 2))
    # s -> t is never observed and s -> m, m -> t always are: its prior is a triangle bound.
    observed = [("s", "m"), ("m", "t"), *((j, i) for j in names for i in names
                                          if j != i and (j, i) not in {("s", "m"), ("m", "t"), ("s", "t")}
                                          and rng.random() < 0.5)]
    # Data of the other mode is no observation: s -> t stays unobserved in this mode, ngram:a -> s too.
    observed = [pair for pair in observed if pair != ("ngram:a", "s")]
    for j, i in (("s", "t"), ("ngram:a", "s")):
        est.set_global(j, i, 0.9, count=50.0, mode="sampled" if seed % 2 else "greedy")
    for j, i in observed[: len(observed) // 2]:
        est.set_global(j, i, float(rng.random()), count=float(rng.integers(1, 300)))
    for step in range(40):
        j, i = observed[rng.integers(len(observed))]
        est.observe_scores(j, i, list(rng.random(int(rng.integers(1, 6))) < rng.random()))
        est.advance(int(rng.integers(0, 40)))  # some pairs sit out long enough to age
        if step == 20:
            est.start_request(greedy=bool(seed % 2))  # a second request: per-request data anew
    pairs = [("s", "m"), ("s", "t"), ("m", "t"), *((k, m) for k in names[:2] for m in names[2:])]
    for z in (0.5, 1.0):
        table = est.table(pairs, names, z)
        assert table.rate == {(j, i): est.rate(j, i, names) for j, i in pairs}
        assert table.cautious == {(j, i): est.cautious(j, i, names, z) for j, i in pairs}
        assert table.bold == {(j, i): est.bold(j, i, names, z) for j, i in pairs}
        assert table.count == {(j, i): est.count(j, i) for j, i in pairs}
    assert est.count("s", "t") == 0 and est.prior("s", "t", names) != est.default
    assert table.rate[("s", "t")] == est.prior("s", "t", names)


def test_a_detected_change_restarts_the_request_estimate_at_its_window_weight():
    est = AcceptanceEstimator()
    est.start_request(greedy=True)
    est.observe_scores("d", "t", [1.0] * 30)
    est.observe_scores("d", "t", [0.0] * 3)  # three misses: the window 1,1,1,0,0,0 departs
    r = est.request[("d", "t")]
    assert r.mean == 0.5 and r.count == 6.0  # restarted there, weighing as its six scores
    est.observe_scores("d", "t", [0.0] * 3)
    assert r.mean == pytest.approx(3 / 9) and r.count == 9.0  # then the plain mean of what followed
    g = est.global_[("greedy", "d", "t")].mean
    assert est.rate("d", "t") == pytest.approx(9 / 17 * 3 / 9 + 8 / 17 * g)


def test_a_pair_that_runs_every_cycle_does_not_age_however_long_its_blocks():
    est = AcceptanceEstimator()
    est.start_request(greedy=True)
    for _ in range(5):  # 16-token blocks: 13 committed tokens a cycle, more than STRETCH
        est.observe_scores("d", "t", [1.0] * 12 + [0.0])
        est.advance(13)
    r = est.request[("d", "t")]
    assert r.returns == 0 and r.weight_at(est.position) == r.count
    est.advance(32)  # then it sits out 32 tokens: half its weight (STALE_HALF_LIFE)
    assert r.weight_at(est.position) == pytest.approx(r.count / 2)

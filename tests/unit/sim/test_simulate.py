"""The trace-driven simulator on synthetic models: a trace recorded from them, replayed on
the same costs, performs the real run's forwards (so its simulated time is the real run's,
exactly) and the router makes the real run's choices; the roofline's arithmetic; traces
that do not fit are refused."""

import statistics

import numpy as np
import pytest

from specrouter.backends.synthetic import SyntheticBackend
from specrouter.cascade.chain import Chain
from specrouter.cascade.sampling import SamplingParams
from specrouter.drafters.suffix import SuffixDrafter
from specrouter.engine import generate
from specrouter.errors import InvalidParameterError
from specrouter.router import AcceptanceEstimator, CostProfile, OnlineCosts
from specrouter.router.build import build_router
from specrouter.router.estimates.costs import LONG_CONTEXT, PROFILED_CONTEXT
from specrouter.router.policy.pacing import ChoicePacing
from specrouter.sim.host import HostCosts
from specrouter.sim.roofline import DEVICES, Device, device, roofline_profile
from specrouter.sim.simulate import (ALONE, AUTO, ChainChoice, Replay, SimulationError, candidate_chains,
                                     decode_seconds,
                                     predict)
from specrouter.sim.trace import Trace, record

SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
COSTS = {"target": (0.050, 0.004), "draft": (0.010, 0.002)}  # fixed + per token, seconds
#: A draft cheap enough that the router drafts with it (and its length policy cuts blocks).
CHEAP = {"target": (0.050, 0.004), "draft": (0.003, 0.0005)}


def profile(costs=COSTS) -> CostProfile:
    return CostProfile({m: {n: a + b * n for n in SIZES} for m, (a, b) in costs.items()})


def models(p: CostProfile, eos: int | None = None):
    """A target and a draft priced by the profile (eos None: every answer runs to max_tokens)."""
    target = SyntheticBackend("target", vocab=12, latency=lambda n: p.seconds("target", n), params_b=1.5, eos_id=eos)
    draft = SyntheticBackend("draft", vocab=12, model_seed=2, noise=0.8, latency=lambda n: p.seconds("draft", n),
                             params_b=0.5, eos_id=eos)
    return target, draft


def prompts(n: int = 4):
    rng = np.random.default_rng(3)
    return [("even" if i % 2 == 0 else "odd", f"p{i}", [int(t) for t in rng.integers(0, 12, 30)]) for i in range(n)]


@pytest.fixture(scope="module")
def trace() -> Trace:
    target, draft = models(profile())
    return record(target, [draft], prompts(), max_tokens=40)


def real_run(method_of, p: CostProfile, n: int = 4, eos: int | None = None, make=models):
    """The first n prompts through the method made of fresh synthetic models (`make`): per
    prompt (token ids, simulated seconds, chain labels per cycle)."""
    target, draft = make(p, eos)
    method = method_of(target, draft)
    clock = lambda: target.simulated_seconds + draft.simulated_seconds  # noqa: E731
    out = []
    for _, _, prompt in prompts(n):
        start = clock()
        r = generate(method, prompt, SamplingParams(), 40, clock=clock)
        out.append((r.token_ids, clock() - start, labels(r)))
    return out


def labels(r):
    return [r.chains_used[i] for i in r.chains_per_cycle]


def simulated(replay: Replay, method):
    out = []
    for i, request in enumerate(replay.trace.requests):
        prompt, answer = replay.play(i)
        start = replay.clock()
        r = generate(method, prompt, SamplingParams(), replay.trace.max_tokens, clock=replay.clock)
        assert r.token_ids == answer
        out.append((replay.clock() - start, labels(r)))
    return out


def test_the_trace_holds_the_targets_greedy_answer_and_the_drafts_tokens_along_it(trace):
    target, draft = models(profile())
    for request in trace.requests:
        assert request.answer == generate(Chain([target], []), request.prompt, SamplingParams(), 40).token_ids
        context = request.prompt + request.answer
        for j in range(len(request.answer) + 1):
            row = draft.logits_for(context[: len(request.prompt) + j])
            assert request.tracks["draft"].argmax[j] == int(np.argmax(row))
            assert request.tracks["draft"].confidence[j] == pytest.approx(np.exp(row.max()) / np.exp(row).sum(),
                                                                          abs=1e-6)


@pytest.mark.parametrize("eos", [None, 11], ids=["max_tokens", "eos"])
@pytest.mark.parametrize(("names", "ks"), [(("draft", "target"), (1,)), (("draft", "target"), (3,)),
                                           (("draft", "target"), (8,)), (("suffix", "draft", "target"), (2, 6))])
def test_a_fixed_chain_costs_in_simulation_exactly_what_the_real_run_cost(names, ks, eos):
    # Three levels too: every context the draft sees as a verifier is on the path or on
    # its own greedy continuation after a wrong token (its branch), which the track holds.
    p = profile()
    target, draft = models(p, eos)
    trace = record(target, [draft], prompts(6), max_tokens=40, branch_tokens=16)
    real = real_run(lambda t, d: Chain([{"draft": d, "target": t}.get(n) or SuffixDrafter() for n in names],
                                       list(ks)), p, 6, eos)
    replay = Replay(trace, p, price_prompt=True)
    sim = simulated(replay, replay.chain(ChainChoice(names, ks)))
    assert [r[0] for r in real] == [r.answer for r in trace.requests]
    assert [s for s, _ in sim] == pytest.approx([s for _, s, _ in real], rel=1e-12)


@pytest.mark.parametrize("price_prompt", [False, True])
@pytest.mark.parametrize(("names", "ks"), [(("target",), ()), (("draft", "target"), (3,)), (("suffix", "target"), (8,)),
                                           (("suffix", "draft", "target"), (2, 6))])
def test_timed_from_the_first_streamed_text_a_replay_costs_what_the_real_run_did(names, ks, price_prompt):
    """What a validation compares: the first cycle (the prompt's prefill, a draft's catch-up on
    it, and whatever that cycle drafted and verified) is outside both sides' time, so the
    replay times a fixed chain exactly as the real run does, whether it prices the prompt or
    not; its full `seconds` price that cycle's tokens (after the prompt, unless priced)."""
    p = profile()
    target, draft = models(p)
    trace = record(target, [draft], prompts(6), max_tokens=40, branch_tokens=16)
    target, draft = models(p)
    clock = lambda: target.simulated_seconds + draft.simulated_seconds  # noqa: E731
    chain = Chain([{"draft": draft, "target": target}.get(n) or SuffixDrafter() for n in names], list(ks))
    real = [decode_seconds(chain, prompt, 40, clock)[0] for _, _, prompt in prompts(6)]
    replay = Replay(trace, p, price_prompt=price_prompt)
    runs = replay.run(replay.chain(ChainChoice(names, ks)))
    assert [r.streamed_seconds for r in runs] == pytest.approx(real, rel=1e-12)
    assert min(real) > 0 and all(r.seconds > r.streamed_seconds for r in runs)
    if names == ("target",) and not price_prompt:  # its first cycle: one forward of the prompt's last token
        assert [r.seconds - r.streamed_seconds for r in runs] == pytest.approx([p.seconds("target", 1)] * 6)


class Attending(SyntheticBackend):
    """A synthetic model whose every forward also pays for the context before it, as its
    profile's context table prices it (what a CPU forward does: docs/simulation.md)."""

    def __init__(self, *args, profile: CostProfile, **kw) -> None:
        super().__init__(*args, **kw)
        self.profile = profile

    def decode(self, seq, tokens, pos, n_logits):
        out = super().decode(seq, tokens, pos, n_logits)
        self.simulated_seconds += self.profile.context_seconds(self.name, len(tokens), pos)
        return out


def attending(p: CostProfile, eos: int | None = None):
    target = Attending("target", vocab=12, latency=lambda n: p.seconds("target", n), params_b=1.5, eos_id=eos,
                       profile=p)
    draft = Attending("draft", vocab=12, model_seed=2, noise=0.8, latency=lambda n: p.seconds("draft", n),
                      params_b=0.5, eos_id=eos, profile=p)
    return target, draft


def with_context(p: CostProfile) -> CostProfile:
    """p and context tables: a forward of n tokens after c cached tokens costs 20 (target) or
    5 (draft) microseconds more per token per cached token beyond the profiled context."""
    slope = {"target": 2e-5, "draft": 5e-6}
    return CostProfile(p.tables, context_tables={m: {n: s + slope[m] * n * (LONG_CONTEXT - PROFILED_CONTEXT)
                                                     for n, s in t.items()} for m, t in p.tables.items()})


@pytest.mark.parametrize(("names", "ks"), [(("target",), ()), (("draft", "target"), (3,)),
                                           (("suffix", "draft", "target"), (2, 6))])
def test_a_forward_pays_for_its_context_in_simulation_exactly_what_it_paid_for_real(names, ks):
    p = with_context(profile())
    target, draft = attending(p)
    trace = record(target, [draft], prompts(6), max_tokens=40, branch_tokens=16)
    real = real_run(lambda t, d: Chain([{"draft": d, "target": t}.get(n) or SuffixDrafter() for n in names],
                                       list(ks)), p, 6, make=attending)
    replay = Replay(trace, p, price_prompt=True)
    sim = simulated(replay, replay.chain(ChainChoice(names, ks)))
    assert [s for s, _ in sim] == pytest.approx([s for _, s, _ in real], rel=1e-12)
    flat = Replay(trace, profile(), price_prompt=True)  # the same costs after the profiled context only
    cheaper = simulated(flat, flat.chain(ChainChoice(names, ks)))
    assert all(s > c for (s, _), (c, _) in zip(sim, cheaper, strict=True))


def test_a_batched_call_pays_each_sequences_context_beside_the_calls_cost(trace):
    p = with_context(profile())
    target = Replay(trace, p, price_prompt=True).target
    a, b = target.new_sequence(), target.new_sequence()
    first, second = trace.requests[0].prompt + [1] * 60, trace.requests[1].prompt
    target.decode_batch([(a, first, 0, 1), (b, second, 0, 1)])
    before = target.simulated_seconds
    target.decode_batch([(a, [1, 2], len(first), 2), (b, [3], len(second), 1)])
    context = p.context_seconds("target", 2, len(first)) + p.context_seconds("target", 1, len(second))
    assert context > 0
    assert target.simulated_seconds - before == pytest.approx(p.seconds("target", 3 / 2, 2) + context, rel=1e-12)


def test_without_price_prompt_a_forward_pays_the_context_before_its_priced_tokens():
    p = with_context(profile())
    target, draft = attending(p)
    rng = np.random.default_rng(5)
    long = record(target, [draft], [("g", "long", [int(t) for t in rng.integers(0, 12, 60)])], max_tokens=10)
    replay = Replay(long, p)
    prompt, answer = replay.play(0)
    seq = replay.target.new_sequence()
    replay.target.decode(seq, prompt + answer[:5], 0, 1)  # priced: the prompt's last token and 5 more
    assert replay.target.simulated_seconds == pytest.approx(p.seconds("target", 6)
                                                            + p.context_seconds("target", 6, 59), rel=1e-12)


def test_the_context_costs_what_the_two_tables_say_linearly_in_between_and_beyond():
    p = CostProfile({"m": {1: 0.030, 16: 0.250}}, context_tables={"m": {1: 0.040, 16: 0.350}})
    span = LONG_CONTEXT - PROFILED_CONTEXT
    assert p.context_seconds("m", 1, PROFILED_CONTEXT) == 0.0 and p.context_seconds("m", 1, 0) == 0.0
    assert p.context_seconds("m", 1, LONG_CONTEXT) == pytest.approx(0.010, rel=1e-12)
    assert p.context_seconds("m", 16, PROFILED_CONTEXT + span / 2) == pytest.approx(0.050, rel=1e-12)
    assert p.seconds_after("m", 16, PROFILED_CONTEXT + 2 * span) == pytest.approx(0.450, rel=1e-12)
    assert p.seconds_after("m", 4, LONG_CONTEXT) == pytest.approx(0.030 + 0.220 * 3 / 15 + 0.010 + 0.090 * 3 / 15)
    assert CostProfile({"m": {1: 0.03}}).context_seconds("m", 1, 4000) == 0.0  # no context table
    again = CostProfile.from_dict(p.as_dict())
    assert again.context_tables == p.context_tables and again.tables == p.tables
    assert "context" not in CostProfile({"m": {1: 0.03}}).as_dict()
    with pytest.raises(ValueError, match="its context tables were timed after 512 tokens, not 1024"):
        CostProfile.from_dict({**p.as_dict(), "context": {"tokens": 512, "models": {"m": {"1": 0.04}}}})


def test_without_price_prompt_the_prompt_costs_one_token_per_model_that_reads_it(trace):
    p = profile()
    priced, unpriced = Replay(trace, p, price_prompt=True), Replay(trace, p)
    choice = ChainChoice(("draft", "target"), (4,))
    full = simulated(priced, priced.chain(choice))
    part = simulated(unpriced, unpriced.chain(choice))
    for (a, _), (b, _), request in zip(full, part, trace.requests):
        n = len(request.prompt)
        # The first forward of each model feeds the prompt (and the draft its first proposal).
        extra = sum(p.seconds(m, n - 1 + more) - p.seconds(m, more) for m, more in (("target", 1 + 4), ("draft", 1)))
        assert a - b == pytest.approx(extra, rel=1e-9)


@pytest.mark.parametrize("eos", [None, 11], ids=["max_tokens", "eos"])
@pytest.mark.parametrize("drafts", [[], ["draft"]], ids=["lookup", "lookup and model"])
def test_the_router_makes_in_simulation_the_real_runs_choices_at_the_same_cost(drafts, eos):
    # One router for all requests in both (it learns from each): its choices, cycle by
    # cycle, and the time of every request are the real run's. With the model, the router
    # drafts with it and its confidence stop cuts blocks: the tracks' confidences and
    # branches (what it drafts after a wrong token) make those blocks the real ones. With
    # an EOS most answers end early (the router's horizon learns their lengths).
    p = profile(CHEAP)
    target, draft = models(p, eos)
    trace = record(target, [draft][: len(drafts)], prompts(8), max_tokens=40, branch_tokens=32)
    assert sum(r.eos for r in trace.requests) >= (6 if eos is not None else 0)

    def router(t, d):
        return build_router(t, [d][: len(drafts)], OnlineCosts(p), AcceptanceEstimator(), lookup="suffix")

    real = real_run(router, p, 8, eos)
    replay = Replay(trace, p, price_prompt=True)
    sim = simulated(replay, replay.router("suffix"))
    assert [choices for _, choices in sim] == [choices for _, _, choices in real]
    used = {tuple(chain) for _, choices in sim for chain, _ in choices}
    assert ("suffix", "target") in used and (("draft", "target") in used) == bool(drafts)
    assert [seconds for seconds, _ in sim] == pytest.approx([seconds for _, seconds, _ in real], rel=1e-12)


def test_a_router_that_believes_other_costs_makes_the_real_runs_choices_on_that_machine():
    # A validation prices its replay by the machine as the real runs saw it, while the real
    # router started from a profile timed before them (Replay's belief). Here the router
    # believes the draft 10x dearer than it is: in the real run and in the replay alike it
    # chooses from that belief, refines from the forwards it times on the machine, and
    # every request costs the machine's time; with the machine's own costs it chooses otherwise.
    machine = profile(CHEAP)
    belief = profile({"target": CHEAP["target"], "draft": (0.03, 0.005)})
    target, draft = models(machine)
    trace = record(target, [draft], prompts(8), max_tokens=40, branch_tokens=32)

    def router(t, d):
        return build_router(t, [d], OnlineCosts(belief), AcceptanceEstimator(), lookup="suffix")

    real = real_run(router, machine, 8)
    replay = Replay(trace, machine, price_prompt=True, belief=belief)
    assert replay.router("suffix").costs.profile.tables == belief.tables
    sim = simulated(replay, replay.router("suffix"))
    assert [choices for _, choices in sim] == [choices for _, _, choices in real]
    assert [seconds for seconds, _ in sim] == pytest.approx([seconds for _, seconds, _ in real], rel=1e-12)
    knowing = Replay(trace, machine, price_prompt=True)
    assert knowing.router("suffix").costs.profile.tables == machine.tables
    assert [choices for _, choices in simulated(knowing, knowing.router("suffix"))] != [choices for _, choices in sim]
    # A fixed chain chooses nothing: what the router believes does not touch its runs.
    chain = ChainChoice(("suffix", "draft", "target"), (2, 6))
    a, b = simulated(replay, replay.chain(chain)), simulated(knowing, knowing.chain(chain))
    assert [choices for _, choices in a] == [choices for _, choices in b]
    assert [seconds for seconds, _ in a] == pytest.approx([seconds for seconds, _ in b], rel=1e-12)
    with pytest.raises(SimulationError, match="the router's profile has no table for draft"):
        Replay(trace, machine, belief=CostProfile({"target": {1: 0.05}}))


def test_a_branch_is_what_the_draft_proposes_after_its_wrong_token(trace):
    _, draft = models(profile())
    request = trace.requests[0]
    track = request.tracks["draft"]
    assert not request.eos and track.branches  # (an answer cut at max_tokens: no branch after its end)
    assert all(track.argmax[q] != request.answer[q] for q in track.branches)
    assert all(track.argmax[q] == request.answer[q] for q in range(len(request.answer)) if q not in track.branches)
    for q, (tokens, confidences) in track.branches.items():
        context = request.prompt + request.answer[:q] + [track.argmax[q]]
        for t, c in zip(tokens, confidences):
            row = draft.logits_for(context)
            assert (t, c) == (int(np.argmax(row)), pytest.approx(np.exp(row.max()) / np.exp(row).sum(), abs=1e-6))
            context.append(t)
        assert len(tokens) == trace.branch_tokens - 1


def test_a_saved_trace_loads_equal_and_a_bad_file_is_refused_clearly(trace, tmp_path):
    trace.save(tmp_path / "t.json")
    assert Trace.load(tmp_path / "t.json") == trace
    (tmp_path / "bad.json").write_text('{"format": 1, "target": "t"}')
    with pytest.raises(InvalidParameterError, match="is not a trace"):
        Trace.load(tmp_path / "bad.json")
    with pytest.raises(InvalidParameterError, match="cannot read the trace"):
        Trace.load(tmp_path / "missing.json")
    with pytest.raises(InvalidParameterError, match="expected the drafts"):
        Trace(trace.target, ["draft", "other"], trace.params_b, trace.requests, trace.max_tokens)


def test_a_profile_without_a_traced_model_is_refused(trace):
    with pytest.raises(SimulationError, match="no table for draft"):
        Replay(trace, CostProfile({"target": {1: 0.05}}))


def test_predict_compares_every_method_with_the_target_alone_per_group(trace):
    p = profile(CHEAP)
    chains = [ChainChoice(("draft", "target"), (k,)) for k in (2, 8)] + [ChainChoice(("suffix", "draft", "target"),
                                                                                      (2, 4))]
    out = predict(trace, p, chains=chains)
    assert set(out.speedup) == {ALONE, AUTO, *(c.label for c in chains)}
    assert out.speedup[ALONE] == {"even": 1.0, "odd": 1.0, "all": 1.0}
    # Per group the median of alone's time over the method's per request; 'all' the sums' ratio
    replay = Replay(trace, p)
    alone = replay.run(replay.chain(ChainChoice(("target",), ())))
    for c in chains:
        runs = replay.run(replay.chain(c))
        ratios = [a.seconds / r.seconds for a, r in zip(alone, runs)]
        assert out.speedup[c.label]["even"] == pytest.approx(np.median(ratios[0::2]), abs=1e-3)
        assert out.speedup[c.label]["all"] == round(sum(a.seconds for a in alone) / sum(r.seconds for r in runs), 3)
        assert out.drafted[c.label]["all"] == 1.0  # a fixed chain drafts in every cycle
    assert out.drafted[ALONE]["all"] == 0.0
    two = [c.label for c in chains[:2]]
    assert out.best["best 2-level"]["all"] == max(two, key=lambda m: out.speedup[m]["all"])
    assert out.best["best 3-level"]["all"] == chains[2].label


def test_candidate_chains_cover_two_and_three_levels_with_drafts_in_order_of_size(trace):
    chains = candidate_chains(trace, "suffix")
    names = {c.names for c in chains}
    assert names == {("suffix", "target"), ("draft", "target"), ("suffix", "draft", "target")}
    assert all(len(c.draft_lengths) == c.depth - 1 for c in chains)


def test_the_roofline_is_memory_bound_for_one_token_and_compute_bound_for_many():
    dev = Device("test", bandwidth_gb_s=1000, peak_tflops=100, overhead_ms=2.0)
    # 1.5e9 parameters at 2 bytes: 3 GB at 1000 GB/s = 3 ms; 2 * 1.5e9 FLOP per token at 100 TFLOP/s = 0.03 ms
    assert dev.seconds(1.5, 1) == pytest.approx(0.002 + 0.003)
    assert dev.seconds(1.5, 100) == pytest.approx(0.002 + 0.003)  # the bounds meet at 100 tokens
    assert dev.seconds(1.5, 400) == pytest.approx(0.002 + 0.012)
    table = roofline_profile(dev, {"m": 1.5}).tables["m"]
    assert table[1] == table[64] == pytest.approx(0.005)
    assert device("h200", overhead_ms=0.5).overhead_ms == 0.5 and device("h100") is DEVICES["h100"]
    with pytest.raises(InvalidParameterError, match="unknown device"):
        device("tpu")
    with pytest.raises(InvalidParameterError, match="bandwidth and peak"):
        Device("x", 0, 1)


class SyntheticPool:
    """What validate() asks of a pool: the trace's models by name (fresh, no latency)."""

    def __init__(self) -> None:
        self.target, self.draft = models(profile())

    def model(self, name: str):
        return {"target": self.target, "draft": self.draft}[name]


def pooled(alone, runs) -> float:
    """The validation's 'all': the target alone's time over the method's, each summed over the
    requests, from the first streamed text."""
    return round(sum(a.streamed_seconds for a in alone) / sum(r.streamed_seconds for r in runs), 3)


def timed_machine(pool: SyntheticPool):
    """The machine's rounds timed on the pool's models' simulated clock: each round times
    exactly the profile's costs (COSTS at the profiled sizes)."""
    from specrouter.sim.machine import InterleavedProfile

    return InterleavedProfile([pool.draft, pool.target],
                              clock=lambda: pool.target.simulated_seconds + pool.draft.simulated_seconds)


def test_validation_sets_real_runs_beside_the_simulation_on_the_machine_timed_between_them(trace):
    from specrouter.router.estimates.profiler import PROFILE_NS
    from specrouter.sim.validate import validate

    pool = SyntheticPool()
    out = validate(trace, pool, lookup="suffix", repeats=2, machine=timed_machine(pool))
    assert set(out.groups) == set(out.fixed) == {"even", "odd", "all"}
    for checks in (out.groups, out.fixed):  # greedy: the same text
        assert [checks[g].same_text for g in ("even", "odd", "all")] == ["4/4", "4/4", "8/8"]
    # One round before the first request and one after each; the machine is their medians.
    assert out.rounds == 1 + len(trace.requests)
    machine = CostProfile.from_dict(out.machine)
    for m in ("target", "draft"):
        assert machine.tables[m] == pytest.approx({n: profile().seconds(m, n) for n in PROFILE_NS}, rel=1e-9)
    upfront = CostProfile.from_dict(out.profile)  # what the router took (timed on the wall clock)
    assert upfront.tables != machine.tables
    before = predict(trace, upfront, "suffix", price_prompt=True)
    # Each group's fixed chain is the up-front simulation's best of any depth there, timed as validated.
    fixed = [c.label for c in candidate_chains(trace, "suffix")]
    assert set(before.streamed) == {ALONE, AUTO, *fixed}
    for g in ("even", "odd"):
        assert out.chains[g] == max(fixed, key=lambda m: before.streamed[m][g])
    by_label = {c.label: c for c in candidate_chains(trace, "suffix")}
    chains = [by_label[label] for label in dict.fromkeys(out.chains.values())]
    simulated = predict(trace, machine, "suffix", chains, price_prompt=True, belief=upfront)
    # Timed as the real runs are, from the first streamed text, every token priced, on the
    # machine; the router starting from the up-front profile. Per group the median per
    # request; 'all' pooled: the target alone's time over the method's, summed over requests.
    groups = ("even", "odd")
    assert {g: out.groups[g].simulated for g in groups} == {g: simulated.streamed[AUTO][g] for g in groups}
    assert {g: c.drafted_simulated for g, c in out.groups.items()} == simulated.drafted[AUTO]
    assert {g: out.groups[g].simulated_upfront for g in groups} == {g: before.streamed[AUTO][g] for g in groups}
    for which, prediction in ((lambda c: c.simulated, simulated), (lambda c: c.simulated_upfront, before)):
        assert which(out.groups["all"]) == pooled(prediction.runs[ALONE], prediction.runs[AUTO])
        by_group = [(a, r) for g in groups for a, r in zip(prediction.runs[ALONE], prediction.runs[out.chains[g]],
                                                           strict=True) if a.group == g]
        assert which(out.fixed["all"]) == pooled(*zip(*by_group))
    for g in groups:
        best = out.chains[g]
        assert out.fixed[g].simulated == simulated.streamed[best][g]
        assert out.fixed[g].simulated_upfront == before.streamed[best][g]
        assert out.fixed[g].drafted_simulated == simulated.drafted[best][g]
    checks = [*out.groups.values(), *out.fixed.values()]
    assert all(0 <= c.drafted_measured <= 1 for c in checks)
    assert out.ok == all(abs(c.simulated / c.measured - 1) <= 0.10 for checks in (out.groups, out.fixed)
                         for g, c in checks.items() if g != "all")
    assert all(c.error_upfront == c.simulated_upfront / c.measured - 1 for c in checks)
    # Per request, auto then the group's chain: the group's figures are their medians.
    assert [(r.id, r.method) for r in out.requests] == [
        (q.id, m) for q in trace.requests for m in (AUTO, out.chains[q.group])]
    for checks, rows in ((out.groups, [r for r in out.requests if r.method == AUTO]),
                         (out.fixed, [r for r in out.requests if r.method != AUTO])):
        assert all(r.measured == round(r.alone_seconds / r.seconds, 3) for r in rows)
        assert checks["all"].measured == round(sum(r.alone_seconds for r in rows) / sum(r.seconds for r in rows), 3)
    for g in ("even", "odd"):
        rows = [r for r in out.requests if r.group == g and r.method == AUTO]
        assert statistics.median(r.measured for r in rows) == pytest.approx(out.groups[g].measured, abs=1e-3)
        assert statistics.median(r.simulated for r in rows) == pytest.approx(out.groups[g].simulated, abs=1e-3)
        assert all(r.same_text == "2/2" for r in rows)
        assert all(0 <= r.drafted_measured <= 1 and 0 <= r.drafted_simulated <= 1 for r in rows)
    # A fixed chain drafts in every cycle, measured and simulated.
    assert all(r.drafted_measured == r.drafted_simulated == 1 for r in out.requests if r.method != AUTO)
    saved = out.as_dict()
    assert saved["groups"]["all"]["error_upfront"] == round(out.groups["all"].error_upfront, 4)
    assert (saved["machine"], saved["rounds"], saved["ok"]) == (out.machine, out.rounds, out.ok)


def test_a_validation_passes_on_its_groups_whatever_all_says():
    """`ok`: every group within max_error, auto's and the fixed chain's; the overall figure is
    shown, not checked (sim/validate.py: why)."""
    from specrouter.sim.validate import GroupCheck, Validation

    def check(error: float) -> GroupCheck:
        return GroupCheck(2.0, 2.0 * (1 + error), "1/1", 0.5, 0.5, 2.0)

    def validation(auto: dict[str, float], fixed: dict[str, float]) -> Validation:
        return Validation({g: check(e) for g, e in auto.items()}, 0.10, {}, {}, 1,
                          {g: check(e) for g, e in fixed.items()})

    within = {"even": 0.09, "odd": -0.09}
    assert validation({**within, "all": 0.5}, {**within, "all": -0.4}).ok
    assert not validation({**within, "odd": 0.11, "all": 0.0}, {**within, "all": 0.0}).ok
    assert not validation({**within, "all": 0.0}, {**within, "even": -0.11, "all": 0.0}).ok


def test_validation_prices_the_engines_own_work_as_the_replay_does(trace):
    """With `host`, the simulated side of every check is the replay with that host work: auto's
    and each group's fixed chain's (and 'all', each request by its group's chain)."""
    from specrouter.sim.validate import validate

    host = HostCosts(per_call=0.002, per_row=0.001, per_choice=0.003)
    pool = SyntheticPool()
    out = validate(trace, pool, lookup="suffix", host=host, machine=timed_machine(pool))
    machine, upfront = CostProfile.from_dict(out.machine), CostProfile.from_dict(out.profile)
    priced = predict(trace, machine, "suffix", price_prompt=True, host=host, belief=upfront)
    free = predict(trace, machine, "suffix", price_prompt=True, belief=upfront)
    assert {g: out.groups[g].simulated for g in ("even", "odd")} == {g: priced.streamed[AUTO][g] for g in ("even", "odd")}
    assert priced.streamed[AUTO] != free.streamed[AUTO]
    assert out.groups["all"].simulated == pooled(priced.runs[ALONE], priced.runs[AUTO])
    for g in ("even", "odd"):
        assert out.fixed[g].simulated == priced.streamed[out.chains[g]][g]
    # 'all': every request by its group's chain, replayed with that host work, pooled.
    replay = Replay(trace, machine, price_prompt=True, host=host)
    alone = replay.run(replay.chain(ChainChoice(("target",), ())))
    by_label = {c.label: c for c in candidate_chains(trace, "suffix")}
    by_group = [(a, r) for g in ("even", "odd")
                for a, r in zip(alone, replay.run(replay.chain(by_label[out.chains[g]])), strict=True) if a.group == g]
    assert out.fixed["all"].simulated == pooled(*zip(*by_group))


@pytest.mark.parametrize(("names", "ks"), [(("target",), ()), (("draft", "target"), (3,)),
                                           (("suffix", "draft", "target"), (2, 6))])
def test_host_costs_add_their_price_per_call_and_row_to_every_forward(trace, names, ks):
    # A profile a + b n per forward plus the engine's c per call and r per row is the profile
    # (a + c) + (b + r) n: the same runs, to the rounding.
    host = HostCosts(per_call=0.0007, per_row=0.0003)
    shifted = {m: (a + host.per_call, b + host.per_row) for m, (a, b) in COSTS.items()}
    with_host = Replay(trace, profile(), price_prompt=True, host=host)
    folded = Replay(trace, profile(shifted), price_prompt=True)
    choice = ChainChoice(names, ks)
    a, b = simulated(with_host, with_host.chain(choice)), simulated(folded, folded.chain(choice))
    assert [s for s, _ in a] == pytest.approx([s for s, _ in b], rel=1e-12)
    assert min(s for s, _ in a) > 0


def test_a_batched_call_pays_the_host_once_per_sequence_and_once_per_row(trace):
    host = HostCosts(per_call=0.0007, per_row=0.0003)
    replay = Replay(trace, profile(), price_prompt=True, host=host)
    target = replay.target
    (p0, _), (p1, _) = replay.play_all()[:2]
    a, b = target.new_sequence(), target.new_sequence()
    before = target.simulated_seconds
    target.decode_batch([(a, p0, 0, 1), (b, p1[:10], 0, 1)])
    n = len(p0) + 10
    assert target.simulated_seconds - before == pytest.approx(profile().seconds("target", n / 2, 2) + 2 * 0.0007
                                                              + 0.0003 * n, rel=1e-12)


@pytest.mark.parametrize("bad", [-1e-3, 1.0, True, "1"])
def test_host_costs_out_of_range_are_refused_clearly(bad):
    with pytest.raises(InvalidParameterError, match="host per_row must be seconds in"):
        HostCosts(per_row=bad)
    with pytest.raises(InvalidParameterError, match="host per_choice must be seconds in"):
        HostCosts(per_choice=bad)
    with pytest.raises(InvalidParameterError, match="host per_reuse must be seconds in"):
        HostCosts(per_reuse=bad)
    parsed = HostCosts.parse_ms("0.075,0.015")
    assert (parsed.per_call, parsed.per_row, parsed.per_choice, parsed.per_reuse) == pytest.approx(
        (0.075e-3, 0.015e-3, 0, 0), rel=1e-15)
    assert HostCosts.parse_ms("0.075,0.015,1.2").per_choice == pytest.approx(1.2e-3, rel=1e-15)
    assert HostCosts.parse_ms("0.075,0.015,1.2").label() == "0.075 ms per call + 0.015 ms per row + 1.2 ms per router choice"
    assert HostCosts.parse_ms("0.075,0.015,1.2,0.03").per_reuse == pytest.approx(0.03e-3, rel=1e-15)
    assert HostCosts.parse_ms("0.075,0.015,1.2,0.03").label().endswith("1.2 ms per router choice + 0.03 ms per reused choice")
    for text in ("0.075", "a,b", "1,2,3,4,5", "1,2,x"):
        with pytest.raises(InvalidParameterError, match="host costs must be 'CALL_MS,ROW_MS', 'CALL_MS,ROW_MS,CHOICE_MS' "
                                                        "or 'CALL_MS,ROW_MS,CHOICE_MS,REUSE_MS'"):
            HostCosts.parse_ms(text)


def test_a_routers_choices_are_priced_outside_its_forwards_and_cycles(trace):
    # Each choice advances the clock before the router chooses: the router learns nothing of
    # it (the same choices, cycle by cycle), and every request takes per_choice longer per
    # cycle but its first (which feeds the prompt: no choice is deliberated there). A fixed
    # chain chooses nothing and pays nothing.
    # (Without pacing: every other choice deliberates, priced or not; the next test paces them.)
    choice = 0.004
    free = Replay(trace, profile(), price_prompt=True)
    priced = Replay(trace, profile(), price_prompt=True, host=HostCosts(per_choice=choice))
    a, b = free.run(free.router("suffix", ChoicePacing(0))), priced.run(priced.router("suffix", ChoicePacing(0)))
    assert [(r.id, r.cycles, r.drafted_cycles) for r in a] == [(r.id, r.cycles, r.drafted_cycles) for r in b]
    assert 0 < sum(r.drafted_cycles for r in a) < sum(r.cycles for r in a)  # it routed: drafted, not always
    assert [r.seconds for r in b] == pytest.approx([r.seconds + choice * (r.cycles - 1) for r in a], rel=1e-12)
    assert priced.choices_seconds == pytest.approx(choice * sum(r.cycles - 1 for r in a), rel=1e-12)
    fixed = ChainChoice(("suffix", "draft", "target"), (2, 6))
    assert [r.seconds for r in priced.run(priced.chain(fixed))] == pytest.approx(
        [r.seconds for r in free.run(free.chain(fixed))], rel=1e-12)  # (the clock's offset rounds the last bit)
def test_a_paced_router_reuses_decisions_where_its_choice_is_dear_and_pays_each_kind(trace):
    """A choice priced at 10 ms against cycles of ~60 ms (every = 4: a choice may take 5% of
    them): the pacing reuses decisions in over a quarter of the cycles (a request's first
    choice, after the cycle that feeds its prompt, and its last cycles deliberate; these
    requests are a few cycles long) (each charged its own price, exactly; the prompt's cycle
    as a reuse), the answers stay the recorded ones (run() checks), and the run is faster
    than the same router deliberating every cycle. Priced at nothing, a choice never pays to skip."""
    host = HostCosts(per_choice=0.010, per_reuse=0.0002)
    paced, unpaced = Replay(trace, profile(), price_prompt=True, host=host), Replay(trace, profile(), True, host)
    router = paced.router("suffix")
    a, b = paced.run(router), unpaced.run(unpaced.router("suffix", ChoicePacing(0)))
    cycles = sum(r.cycles for r in a)
    pacing = router.pacing
    prompts = len(a)  # one cycle each feeds the prompt: not a choice of the pacing's
    assert pacing.deliberated + pacing.reused == cycles - prompts, (pacing.deliberated, pacing.reused, cycles)
    assert pacing.reused > cycles / 4
    assert paced.choices_seconds == pytest.approx(0.010 * pacing.deliberated + 0.0002 * (pacing.reused + prompts),
                                                  rel=1e-12)
    assert sum(r.seconds for r in a) < sum(r.seconds for r in b)
    free = Replay(trace, profile(), price_prompt=True)
    router = free.router("suffix")
    runs = free.run(router)
    assert router.pacing.reused == 0 and router.pacing.deliberated == sum(r.cycles - 1 for r in runs)



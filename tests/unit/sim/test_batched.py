"""Batches in simulation (sim/batched.py): the real batch scheduler over replayed models
performs the forwards a real synthetic batch run performs, at the same cost, with a fixed
chain and with the router; the replay tells the batch's sequences apart by their prompts."""

import pytest

from specrouter.cascade.chain import Chain
from specrouter.drafters.suffix import SuffixDrafter
from specrouter.engine.batch import BatchScheduler, Failed, Finished, SeqRequest
from specrouter.errors import InvalidParameterError
from specrouter.router import AcceptanceEstimator, OnlineCosts
from specrouter.router.build import build_router
from specrouter.router.frozen import FrozenRoutes
from specrouter.router.policy.pacing import ChoicePacing
from specrouter.sim.batched import BatchRun, copies_for, predict_batches, serve
from specrouter.sim.host import HostCosts
from specrouter.sim.roofline import Device, roofline_profile
from specrouter.sim.simulate import ALONE, AUTO, ChainChoice, Replay, SimulationError
from specrouter.sim.trace import record
from tests.unit.sim.test_simulate import CHEAP, models, profile, prompts


def real_batch(method_of, p, n_prompts: int, batch: int, copies: int, eos=None) -> BatchRun:
    """The prompts (copies times over, round-robin) through a real batch scheduler over fresh
    synthetic models priced by p: what serve() must reproduce."""
    target, draft = models(p, eos)
    plan = method_of(target, draft)
    clock = lambda: target.simulated_seconds + draft.simulated_seconds  # noqa: E731
    scheduler = BatchScheduler(lambda _: plan(), max_batch=batch, clock=clock, prefill_share=None)
    for c in range(copies):
        for _, rid, prompt in prompts(n_prompts):
            scheduler.add(f"{c}/{rid}", SeqRequest(prompt, max_tokens=40))
    tokens = cycles = drafted = 0
    while scheduler.n_active or scheduler.n_waiting:
        for event in scheduler.step():
            assert not isinstance(event, Failed), event.error
            if isinstance(event, Finished):
                r = event.result
                tokens, cycles = tokens + len(r.token_ids), cycles + r.cycles
                drafted += sum(len(r.chains_used[i][0]) > 1 for i in r.chains_per_cycle)
    return BatchRun(batch, copies * n_prompts, tokens, clock(), cycles, drafted)


@pytest.mark.parametrize("eos", [None, 11], ids=["max_tokens", "eos"])
@pytest.mark.parametrize("batch", [2, 3, 8])
@pytest.mark.parametrize(("names", "ks"), [(("draft", "target"), (4,)), (("suffix", "draft", "target"), (2, 6))])
def test_a_fixed_chain_in_a_simulated_batch_costs_what_the_real_batch_cost(names, ks, batch, eos):
    p = profile()
    target, draft = models(p, eos)
    trace = record(target, [draft], prompts(5), max_tokens=40, branch_tokens=16)
    copies = copies_for(batch, 5)

    def chain(t, d):
        return lambda: Chain([{"draft": d, "target": t}.get(n) or SuffixDrafter() for n in names], list(ks))

    real = real_batch(chain, p, 5, batch, copies, eos)
    replay = Replay(trace, p, price_prompt=True)
    sim = serve(replay, lambda: replay.chain(ChainChoice(names, ks)), batch)
    assert (sim.sequences, sim.tokens, sim.cycles, sim.drafted_cycles) == (real.sequences, real.tokens, real.cycles,
                                                                           real.drafted_cycles)
    assert sim.seconds == pytest.approx(real.seconds, rel=1e-12)
    # A batch is cheaper per token than one sequence at a time (the fixed cost is shared).
    one = serve(replay, lambda: replay.chain(ChainChoice(names, ks)), 1, copies)
    assert one.tokens == sim.tokens and one.seconds > sim.seconds


@pytest.mark.parametrize("eos", [None, 11], ids=["max_tokens", "eos"])
def test_the_router_in_a_simulated_batch_costs_what_the_real_batch_cost(eos):
    # One router whose sessions share its estimates, the sessions priced at the batch's size:
    # the same choices cycle by cycle give the same cycles, drafting cycles and seconds.
    p = profile(CHEAP)
    target, draft = models(p, eos)
    trace = record(target, [draft], prompts(6), max_tokens=40, branch_tokens=32)

    def sessions(t, d):
        return build_router(t, [d], OnlineCosts(p), AcceptanceEstimator(), lookup="suffix").session

    real = real_batch(sessions, p, 6, 4, copies_for(4, 6), eos)
    replay = Replay(trace, p, price_prompt=True)
    sim = serve(replay, replay.router("suffix").session, 4)
    assert 0 < real.drafted_cycles < real.cycles  # it drafted, and not in every cycle
    assert (sim.tokens, sim.cycles, sim.drafted_cycles) == (real.tokens, real.cycles, real.drafted_cycles)
    assert sim.seconds == pytest.approx(real.seconds, rel=1e-12)


def test_in_a_simulated_batch_every_sequence_pays_its_routers_choices_one_after_another():
    # The batch's sequences choose one after another on the host: a step of B routed sequences
    # pays B choices, outside every forward (the same choices, the same cycles). A request's
    # first cycle feeds its prompt: no choice is deliberated there (priced as a reuse: nothing).
    p = profile(CHEAP)
    target, draft = models(p)
    trace = record(target, [draft], prompts(6), max_tokens=40, branch_tokens=32)
    free, priced = Replay(trace, p, price_prompt=True), Replay(trace, p, price_prompt=True,
                                                               host=HostCosts(per_choice=0.002))
    # Sessions that price from the costs as profiled (FrozenRoutes: no clock moves them), so
    # the host's time cannot change a choice: a live session learns a per-forward overhead from
    # cycle windows that hold the other sequences' choices, and a close call may then flip.
    a = serve(free, FrozenRoutes(free.router("suffix", ChoicePacing(0))).session, 4)
    b = serve(priced, FrozenRoutes(priced.router("suffix", ChoicePacing(0))).session, 4)
    assert (a.tokens, a.cycles, a.drafted_cycles) == (b.tokens, b.cycles, b.drafted_cycles)
    assert b.seconds == pytest.approx(a.seconds + 0.002 * (a.cycles - a.sequences), rel=1e-12)
    alone = ChainChoice((trace.target,), ())
    assert serve(priced, lambda: priced.chain(alone), 4).seconds == pytest.approx(
        serve(free, lambda: free.chain(alone), 4).seconds, rel=1e-12)


def test_without_price_prompt_a_batch_does_not_pay_its_prompts():
    p = profile()
    target, draft = models(p)
    trace = record(target, [draft], prompts(4), max_tokens=40)
    alone = ChainChoice(("target",), ())
    priced, unpriced = Replay(trace, p, price_prompt=True), Replay(trace, p)
    full = serve(priced, lambda: priced.chain(alone), 4, copies=1)
    part = serve(unpriced, lambda: unpriced.chain(alone), 4, copies=1)
    # The first step feeds all four prompts in one call (30 tokens each, 29 of them unpriced).
    extra = p.seconds("target", 4 * 30) - p.seconds("target", 4 * 1)
    assert full.seconds - part.seconds == pytest.approx(extra, rel=1e-9)


def test_a_run_that_does_not_commit_the_recorded_answer_is_an_error():
    p = profile()
    target, draft = models(p)
    trace = record(target, [draft], prompts(3), max_tokens=40)
    replay = Replay(trace, p)
    # The draft replayed as if it were the target writes its own text, not the recorded one.
    with pytest.raises(SimulationError, match="did not commit the recorded answer"):
        serve(replay, lambda: Chain([replay.drafts[0]], []), 2)
    with pytest.raises(InvalidParameterError, match="at least 1"):
        serve(replay, lambda: replay.chain(ChainChoice(("target",), ())), 0)


def test_scripts_played_together_need_prompts_that_tell_them_apart():
    p = profile()
    target, draft = models(p)
    trace = record(target, [draft], prompts(2), max_tokens=8)
    first = trace.requests[0]
    clash = type(first)("even", "clash", first.prompt + [1, 2], first.answer, first.eos, first.tracks)
    replay = Replay(type(trace)(trace.target, trace.drafts, trace.params_b, [first, clash], 8), p)
    with pytest.raises(ValueError, match="do not start with another's"):
        replay.play_all()


def test_predict_batches_compares_every_method_with_the_target_alone_at_each_batch():
    p = profile(CHEAP)
    target, draft = models(p)
    trace = record(target, [draft], prompts(4), max_tokens=40)
    chains = [ChainChoice(("draft", "target"), (k,)) for k in (2, 6)] + [ChainChoice(("suffix", "draft", "target"),
                                                                                      (2, 4))]
    out = predict_batches(trace, p, (1, 4), chains=chains)
    replay = Replay(trace, p)
    for b in (1, 4):
        alone = serve(replay, lambda: replay.chain(ChainChoice(("target",), ())), b)
        assert out.speedup[b][ALONE] == 1.0 and set(out.speedup[b]) == {ALONE, AUTO, *(c.label for c in chains)}
        for c in chains:
            run = serve(replay, lambda c=c: replay.chain(c), b)
            assert out.speedup[b][c.label] == round(run.tokens_per_second / alone.tokens_per_second, 3)
            assert out.drafted[b][c.label] == 1.0
        two = [c.label for c in chains[:2]]
        assert out.best[b]["best 2-level"] == max(two, key=lambda m: out.speedup[b][m])
        assert out.best[b]["best 3-level"] == chains[2].label
    with pytest.raises(InvalidParameterError, match="batch sizes"):
        predict_batches(trace, p, (0,), chains=[])


def test_the_roofline_profile_holds_the_crossover_so_a_batch_is_priced_on_the_right_side():
    dev = Device("test", bandwidth_gb_s=1000, peak_tflops=100, overhead_ms=2.0)
    assert dev.crossover() == pytest.approx(100)  # 2 bytes * 100 TFLOP/s / (2 * 1000 GB/s)
    p = roofline_profile(dev, {"m": 1.5})
    for n in (64, 100, 150, 400, 3000):  # a batch of sequences: hundreds of tokens in one call
        assert p.seconds("m", n) == pytest.approx(dev.seconds(1.5, n), rel=1e-12)
    # a batch of 8 sequences of 16 tokens costs one forward of 128 (the router's pricing too)
    assert p.seconds("m", 16, 8) == pytest.approx(dev.seconds(1.5, 128), rel=1e-12)

"""Trace-forced mode with the real models (backends/forced.py, sim/forced.py): the q4 0.5B and
1.5B compute every forward the engine asks of them while the committed first-turn trace
decides the rows, and the run commits the recorded answers with the router's decisions, cycle
by cycle (chain and draft lengths), those of the simulator's replay of the same trace on the
same fixed costs (a router's state frozen, router/frozen.py: priced from costs no timing
moves, no probes). A batch of both requests runs the simulator's steps.

Kept short: the two requests of the trace whose answers end at EOS within 64 tokens.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

from specrouter.cascade.sampling import SamplingParams
from specrouter.engine import generate
from specrouter.router.estimates.costs import CostProfile
from specrouter.router.frozen import FrozenRoutes
from specrouter.sim.batched import serve
from specrouter.sim.forced import ForcedReplay
from specrouter.sim.simulate import ChainChoice, Replay
from specrouter.sim.trace import Trace

from .conftest import SMALL, TARGET

TRACE = Path(__file__).resolve().parents[2] / "benchmarks/results/simulation-2026-12-03-epyc-trace.json"
REQUESTS = ("HumanEval/0", "HumanEval/1")  # 61 and 28 tokens, both ended at EOS
#: A CPU's costs (fixed + per token, seconds) at which the router drafts with the 0.5B.
COSTS = {TARGET: (0.060, 0.004), SMALL: (0.012, 0.0015)}


def short_trace() -> Trace:
    trace = Trace.load(TRACE)
    return dataclasses.replace(trace, requests=[r for r in trace.requests if r.id in REQUESTS])


def fixed_profile() -> CostProfile:
    return CostProfile({m: {n: a + b * n for n in (1, 2, 4, 8, 16, 32, 64, 128)} for m, (a, b) in COSTS.items()})


def warmed(replay: Replay) -> FrozenRoutes:
    """The state of a router that served the trace once on the simulated clock (it has learned
    that the 0.5B pays, which a fresh frozen router, running no probes, would never try), frozen."""
    router = replay.router()
    for i in range(len(replay.trace.requests)):
        prompt, _ = replay.play(i)
        generate(router, prompt, SamplingParams(), replay.trace.max_tokens, clock=replay.clock)
    replay.play(None)
    return FrozenRoutes(router)


def routed(replay: Replay, state: FrozenRoutes) -> list[tuple[list[int], list[int], list, list]]:
    """Each request under a session of the frozen `state` routing replay's models (decisions from
    tokens alone): per request the committed tokens, the recorded answer (both compact), the
    chain of every cycle and per level its forwards, proposals and accepted proposals (where
    the draft stop cut a block)."""
    frozen = copy.copy(state)
    frozen.router = replay.router()  # the same frozen estimates and costs, these models (same names)
    out = []
    for i in range(len(replay.trace.requests)):
        prompt, answer = replay.play(i)
        r = generate(frozen.session(), prompt, SamplingParams(), replay.trace.max_tokens, clock=replay.clock)
        out.append((r.token_ids, answer, [r.chains_used[c] for c in r.chains_per_cycle],
                    [(s.name, s.forwards, s.proposed, s.accepted) for s in r.levels]))
    replay.play(None)
    return out


def test_forced_real_models_commit_the_trace_and_route_as_its_simulation(pool):
    trace, profile = short_trace(), fixed_profile()
    assert [len(r.answer) for r in trace.requests] == [61, 28] and all(r.eos for r in trace.requests)
    simulated = Replay(trace, profile)
    state = warmed(simulated)
    forced = ForcedReplay(trace, profile, {TARGET: pool.model(TARGET), SMALL: pool.model(SMALL)})
    got, expected = routed(forced, state), routed(simulated, state)
    ids = forced.target.replay.vocabulary.ids
    for (tokens, answer, *decisions), (_, _, *simulated), request in zip(got, expected, trace.requests, strict=True):
        assert tokens == answer and [ids[t] for t in tokens] == request.answer
        assert decisions == simulated
    used = {tuple(names) for _, _, chains, _ in got for names, _ in chains}
    assert (SMALL, TARGET) in used and ("suffix", SMALL, TARGET) in used
    assert all(m.live_sequences == 0 for m in forced.models)


def test_a_forced_batch_of_real_models_runs_the_simulators_steps(pool):
    trace, profile = short_trace(), fixed_profile()
    forced = ForcedReplay(trace, profile, {TARGET: pool.model(TARGET), SMALL: pool.model(SMALL)})
    simulated = Replay(trace, profile, price_prompt=True)
    choice = ChainChoice(("suffix", SMALL, TARGET), (3, 4))
    ran = serve(forced, lambda: forced.chain(choice), 2, copies=1)  # SimulationError unless both commit their answers
    sim = serve(simulated, lambda: simulated.chain(choice), 2, copies=1)
    assert ran.complete and ran.tokens == 61 + 28
    assert (ran.tokens, ran.cycles, ran.drafted_cycles, ran.steps) == (sim.tokens, sim.cycles, sim.drafted_cycles,
                                                                       sim.steps)

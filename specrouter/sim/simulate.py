"""Trace-driven simulation: the real engine, router and cascade over a trace's recorded
requests (backends/replay.py), on a simulated clock priced by a cost profile.

Every model of the trace becomes a ReplayBackend whose forward of n tokens after c cached
tokens costs profile.seconds_after(model, n, c) (the context priced where the profile has a
context table: costs.py); the clock is the sum of all models' simulated seconds (one
device, forwards one after another). A method (the target alone, a fixed chain, or the
router) generates each request greedily with the trace's max_tokens (the router's choices
depend on the room left) and must commit exactly the recorded answer (else SimulationError): its
simulated time is then what that run would cost on the machine the profile describes,
counted exactly as the engine performed its forwards (the same accounting as a synthetic
run with those latencies). The prompt is not priced unless asked (`price_prompt`): the
decode is what a method changes; a draft's catch-up on the prompt is unpriced likewise
(the router still weighs that catch-up from the profile when it decides, as it does for real).
A run is also timed as a real one can time its decode (Run.streamed_seconds, decode_seconds:
from its first streamed text, so its whole first cycle is out, prompt, catch-up, and the
block drafted and verified with it); the validation compares that (validate.py). The two
part most for long blocks on short answers: a fixed suffix [32] chain's first cycle, one
33-token forward, is a large share of the few forwards a short code edit takes
(docs/journal.md, "The simulator on the copy workloads").

Not simulated unless asked: the host work (the cascade's own, ~0.1 ms per greedy token,
docs/simulation.md, and the router's choice per cycle, benchmarks/router_work.py: `host`
prices both, sim/host.py; off by default). Not simulated: sampling (greedy only), batches
(here one request at a time; batched.py serves them B at a time through the batch scheduler),
and the off-path behaviour of intermediate verifiers (backends/replay.py). A model-free
lookup costs what the profile's lookup_seconds says, not charged to the clock.

The router starts with the profile's costs as its profile (what it would have measured
on that machine; or another profile, `belief`: what a real router measured before a
machine that then ran otherwise) and fresh acceptance estimates, refines its costs from the
forwards it times on the simulated clock, and serves the trace's requests in order (warm
after the first, as a server's router is).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from specrouter.backends.replay import ReplayBackend, Vocabulary
from specrouter.cascade.chain import Chain
from specrouter.cascade.sampling import SamplingParams
from specrouter.drafters import DEFAULT_LOOKUP, MODEL_FREE
from specrouter.engine import generate_stream
from specrouter.engine.chain_router import ChainRouter
from specrouter.engine.request import GenerationResult
from specrouter.errors import SpecRouterError
from specrouter.router.build import build_router
from specrouter.router.config import DEFAULT_CONFIG, RouterConfig
from specrouter.router.estimates.acceptance import AcceptanceEstimator
from specrouter.router.estimates.costs import CostProfile, OnlineCosts
from specrouter.router.policy.pacing import ChoicePacing
from specrouter.router.session import Router
from specrouter.sim.host import NO_HOST, HostCosts, PricedChoices
from specrouter.sim.trace import Trace


ALONE = "target alone"
AUTO = "auto"


class SimulationError(SpecRouterError):
    """A simulated run did not reproduce the recorded answer, or the profile lacks a model."""


@dataclass(frozen=True)
class ChainChoice:
    """A fixed chain by level names (model-free drafters by their names), target last."""

    names: tuple[str, ...]
    draft_lengths: tuple[int, ...]

    @property
    def label(self) -> str:
        return " -> ".join(self.names) + (f" [{','.join(map(str, self.draft_lengths))}]" if self.draft_lengths else "")

    @property
    def depth(self) -> int:
        return len(self.names)

    def build(self, models: Sequence) -> Chain:
        """The chain over `models` (backends, found by name), a fresh drafter for each model-free level."""
        by_name = {m.name: m for m in models}
        return Chain([MODEL_FREE[n]() if n in MODEL_FREE else by_name[n] for n in self.names], list(self.draft_lengths))


@dataclass(frozen=True)
class Run:
    """One method over one request, simulated."""

    group: str
    id: str
    seconds: float  # every forward but the prompt's tokens (the module docstring)
    tokens: int
    cycles: int
    drafted_cycles: int  # cycles whose chain drafted (more than the target alone)
    streamed_seconds: float  # from the first streamed text to the end (decode_seconds: as a real run is timed)


class Replay:
    """The trace's models replayed, each priced by `profile`, sharing one vocabulary; a
    router's costs start from `belief` (default: `profile`, the machine as the router would
    have measured it; a validation passes the profile the real router took, and prices the
    replay by the machine as it was while the real runs ran: validate.py)."""

    def __init__(self, trace: Trace, profile: CostProfile, price_prompt: bool = False, host: HostCosts = NO_HOST,
                 belief: CostProfile | None = None, config: RouterConfig = DEFAULT_CONFIG) -> None:
        """config: the tuning of the routers it builds (router())."""
        belief = profile if belief is None else belief
        for which, costs in (("cost profile", profile), ("router's profile", belief)):
            missing = [m for m in (trace.target, *trace.drafts) if m not in costs.tables]
            if missing:
                raise SimulationError(f"the {which} has no table for {', '.join(missing)}")
        self.trace, self.profile, self.belief, self.config = trace, profile, belief, config
        scripts = [r.script for r in trace.requests]
        tracks = {d: [r.tracks[d] for r in trace.requests] for d in trace.drafts}
        vocabulary = Vocabulary.of(scripts, tracks.values(), trace.eos_ids)

        self.host = host
        self.choices_seconds = 0.0  # the routers' choices so far (host.per_choice / per_reuse each), on the clock

        def backend(name: str) -> ReplayBackend:
            return ReplayBackend(name, scripts, latency=lambda n: profile.seconds(name, n) + host.seconds(1, n),
                                 params_b=trace.params_b[name], tracks=tracks.get(name), vocabulary=vocabulary,
                                 price_prompt=price_prompt,
                                 batch_latency=lambda n, b: profile.seconds(name, n / b, b) + host.seconds(b, n),
                                 context_latency=lambda n, c: profile.context_seconds(name, n, c))

        self.target = backend(trace.target)
        self.drafts = [backend(d) for d in trace.drafts]
        self.models = [*self.drafts, self.target]

    def clock(self) -> float:
        return sum(m.simulated_seconds for m in self.models) + self.choices_seconds

    def priced(self, method: Chain | ChainRouter) -> Chain | ChainRouter:
        """`method` as it runs in the replay: a router's choices priced at host.per_choice
        and per_reuse (sim/host.py), a fixed chain as it is (it chooses nothing)."""
        if isinstance(method, Chain) or not (self.host.per_choice or self.host.per_reuse):
            return method
        return PricedChoices(method, self.host.per_choice, self.charge, self.host.per_reuse)

    def charge(self, seconds: float) -> None:
        """Host seconds spent outside every forward (a router's choice) advance the clock."""
        self.choices_seconds += seconds

    def play(self, index: int | None) -> tuple[list[int], list[int]]:
        for m in self.drafts:
            m.play(index)
        return self.target.play(index)

    def play_all(self) -> list[tuple[list[int], list[int]]]:
        """Make every request current at once (a batch, batched.py); per request its (prompt, answer)."""
        indices = range(len(self.trace.requests))
        for m in self.drafts:
            m.play_many(indices)
        return self.target.play_many(indices)

    def chain(self, choice: ChainChoice) -> Chain:
        return choice.build(self.models)

    def router(self, lookup: str = DEFAULT_LOOKUP, pacing: ChoicePacing | None = None) -> Router:
        """pacing: how often its sessions deliberate (default: as the config's pacing_fraction says)."""
        c = self.config
        return build_router(self.target, self.drafts, OnlineCosts(self.belief, config=c), AcceptanceEstimator(config=c),
                            lookup=lookup, pacing=pacing, config=c)

    def run(self, method: Chain | Router) -> list[Run]:
        """`method` over every request in order (SimulationError where its text is not the recorded one)."""
        runs = []
        method = self.priced(method)
        for i, request in enumerate(self.trace.requests):
            prompt, answer = self.play(i)
            start = self.clock()
            streamed, r = decode_seconds(method, prompt, self.trace.max_tokens, self.clock)
            if r.token_ids != answer:
                raise SimulationError(f"{request.id}: the simulated run did not commit the recorded answer")
            runs.append(Run(request.group, request.id, self.clock() - start, len(answer), r.cycles, drafted_cycles(r),
                            streamed))
        self.play(None)
        return runs


def decode_seconds(method: Chain | ChainRouter, prompt: Sequence[int], max_tokens: int,
                   clock: Callable[[], float] = time.perf_counter) -> tuple[float, GenerationResult]:
    """A greedy generation of `method` after `prompt`, timed on `clock` from its first
    streamed text to its end, and its result. What a real run can time of the decode alone:
    the first cycle (the prompt's prefill and whatever that cycle drafted and verified with
    it, and the tokens it committed) is before the first text, on either side of a validation."""
    first = None
    for item in generate_stream(method, prompt, SamplingParams(), max_tokens, clock=clock):
        if first is None:
            first = clock()
    assert isinstance(item, GenerationResult) and first is not None
    return clock() - first, item


def drafted_cycles(r: GenerationResult) -> int:
    """The cycles whose chain drafted (more than the target alone)."""
    drafting = [len(chain) > 1 for chain, _ in r.chains_used]
    return sum(drafting[i] for i in r.chains_per_cycle)


#: Draft lengths tried for fixed chains: per block of a model-free drafter, of a model draft,
#: and per pair (level 0, level 1) of a three-level chain. Past 6, a draft of k is verified
#: in k + 1 tokens, a size the profiler times (as in the router's grid: RouterConfig.draft_grid).
LOOKUP_LENGTHS = (2, 3, 7, 15, 31, 63)
MODEL_LENGTHS = (1, 2, 3, 4, 6, 8, 11, 15)
PAIR_LENGTHS = tuple((a, b) for a in (1, 2, 3, 7) for b in (3, 7, 15) if b >= a)


def candidate_chains(trace: Trace, lookup: str = DEFAULT_LOOKUP) -> list[ChainChoice]:
    """Every fixed chain of two or three levels over the trace's models and the lookup
    drafter, draft models in order of size, on the grids above."""
    drafts = sorted(trace.drafts, key=lambda d: trace.params_b[d])
    out = [ChainChoice((lookup, trace.target), (k,)) for k in LOOKUP_LENGTHS]
    out += [ChainChoice((d, trace.target), (k,)) for d in drafts for k in MODEL_LENGTHS]
    lower = [lookup, *drafts]
    for j, mid in enumerate(drafts):
        for first in lower[: j + 1]:
            out += [ChainChoice((first, mid, trace.target), ks) for ks in PAIR_LENGTHS]
    return out


@dataclass(frozen=True)
class Prediction:
    """Per method, per group: the median over requests of the target alone's simulated time
    over the method's; over every request ('all'), the target alone's time over the method's,
    each summed (pooled: sim/validate.py says why); and the method's share of drafting cycles."""

    speedup: dict[str, dict[str, float]]
    drafted: dict[str, dict[str, float]]
    best: dict[str, dict[str, str]]  # 'best 2-level' / 'best 3-level' -> group -> chain label
    #: The same medians over the times from each run's first streamed text (Run.streamed_seconds).
    streamed: dict[str, dict[str, float]] = field(default_factory=dict)
    #: Per method, its run of every request, in the trace's order.
    runs: dict[str, list[Run]] = field(default_factory=dict)


def speedups(alone: Sequence[Run], runs: Sequence[Run], groups: Sequence[str],
             seconds: Callable[[Run], float] = lambda r: r.seconds) -> dict[str, float]:
    """Per group the median per request of alone's seconds over the method's; 'all': alone's
    seconds over the method's, each summed over every request (pooled)."""
    ratios = {(a.group, a.id): seconds(a) / seconds(r) for a, r in zip(alone, runs, strict=True)}
    out = {g: statistics.median(v for (group, _), v in ratios.items() if group == g) for g in groups}
    out["all"] = sum(seconds(a) for a in alone) / sum(seconds(r) for r in runs)
    return {g: round(v, 3) for g, v in out.items()}


def predict(trace: Trace, profile: CostProfile, lookup: str = DEFAULT_LOOKUP,
            chains: Sequence[ChainChoice] | None = None, price_prompt: bool = False,
            progress: Callable[[str], None] | None = None, host: HostCosts = NO_HOST,
            belief: CostProfile | None = None, config: RouterConfig = DEFAULT_CONFIG) -> Prediction:
    """The target alone, every fixed chain of `chains` (default: candidate_chains) and the
    router, each over the whole trace on `profile` (plus the engine's own work as `host`
    prices it; the router's costs from `belief`, default `profile`: Replay); the best fixed
    chain of each depth per group is the one with the highest median speed-up there (chosen
    with hindsight). `config`: the router's tuning."""
    replay = Replay(trace, profile, price_prompt, host, belief, config)
    groups = trace.groups
    alone = replay.run(replay.chain(ChainChoice((trace.target,), ())))
    results: dict[str, list[Run]] = {ALONE: alone}
    fixed = list(chains if chains is not None else candidate_chains(trace, lookup))
    for choice in fixed:
        if progress is not None:
            progress(choice.label)
        results[choice.label] = replay.run(replay.chain(choice))
    if progress is not None:
        progress(AUTO)
    results[AUTO] = replay.run(replay.router(lookup))
    speedup = {m: speedups(alone, runs, groups) for m, runs in results.items()}
    streamed = {m: speedups(alone, runs, groups, lambda r: r.streamed_seconds) for m, runs in results.items()}
    drafted = {m: {g: round(sum(r.drafted_cycles for r in runs if g in ("all", r.group))
                            / max(1, sum(r.cycles for r in runs if g in ("all", r.group))), 3)
                   for g in (*groups, "all")} for m, runs in results.items()}
    best = {}
    for d in (2, 3):
        labels = [c.label for c in fixed if c.depth == d]
        if labels:
            best[f"best {d}-level"] = {g: max(labels, key=lambda m: speedup[m][g]) for g in (*groups, "all")}
    return Prediction(speedup, drafted, best, streamed, results)

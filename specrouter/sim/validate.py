"""Validation: the simulator's speed-ups against this machine's real runs of the same requests.

The simulation runs first, on this machine's profile (measured now, PROFILE_REPEATS forwards
per size, fitted non-decreasing in n): every fixed chain and auto over the trace, which
names each group's best fixed chain (of any depth, with hindsight, on the times validated:
Prediction.streamed). Then, for every request of the trace, for real on the loaded models:
the target alone, then `repeats` times auto, the group's best fixed chain and the target
alone again (greedy, the trace's max_tokens; decode time from the first streamed text to the
end: simulate.decode_seconds, which times the simulated runs the same way, so the first
cycle, with the prefill and whatever it drafted, is outside both). The replay prices every
token fed (price_prompt): after the first cycle a prompt token is fed only by a draft model
that joins mid-request and catches up on it, which the real run pays too. The router is
fresh (no saved estimates), takes that same profile, and serves the requests in order, as
the simulated one does. Per method (auto, the best fixed chain; the target alone is 1 on
both sides), per group and overall: the median per request of the target alone's time over
the method's, measured and simulated, and the simulation's relative error (`ok` when every
error is within `max_error`); and the share of the method's cycles that drafted, measured
and simulated (where they part for auto, the router chose otherwise).

What a real run has that the simulation does not (simulate.py's list) shows up here as
error: the Python work per cycle, this machine's timing noise (the target alone's two runs
of one request differ by up to 30% on the 2-core EPYC of docs/copy-drafting.md: use
--repeats on a noisy machine), near-ties that make a real run write another text.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from specrouter.cascade.chain import Chain
from specrouter.drafters import DEFAULT_LOOKUP
from specrouter.engine.request import GenerationResult
from specrouter.router import auto_router
from specrouter.router.profiler import load_or_profile
from specrouter.sim.host import NO_HOST, HostCosts
from specrouter.sim.simulate import (ALONE, AUTO, ChainChoice, Prediction, candidate_chains, decode_seconds,
                                     drafted_cycles, predict)
from specrouter.sim.trace import Trace

MAX_ERROR = 0.10
#: Forwards timed per size for the profile both sides take (the router's default, 3, left
#: entries of one machine 5-15% apart between two profiles, and the replay's machine is
#: its profile); fitted non-decreasing in n. Batch tables are not measured (batch 1 here).
PROFILE_REPEATS = 9
#: What both sides time (a report says it; results from before it timed otherwise).
TIMED = ("from each run's first streamed text to its end, on both sides (the first cycle, with the prefill, "
         "outside both); the replay prices every token fed after it")
#: The method validated beside auto: the best fixed chain of each group.
FIXED = "best fixed chain"


@dataclass(frozen=True)
class GroupCheck:
    measured: float  # median per request of the target alone's decode time over the method's
    simulated: float
    same_text: str  # real runs of the method that wrote the recorded answer, of all
    drafted_measured: float  # share of the method's cycles whose chain drafted, real runs
    drafted_simulated: float

    @property
    def error(self) -> float:
        return self.simulated / self.measured - 1


@dataclass(frozen=True)
class Validation:
    groups: dict[str, GroupCheck]  # auto, per group and 'all'
    max_error: float
    profile: dict  # the profile both used (CostProfile.as_dict)
    #: The best fixed chain per group (the simulation's, with hindsight), per group and 'all'.
    fixed: dict[str, GroupCheck] = field(default_factory=dict)
    chains: dict[str, str] = field(default_factory=dict)  # group -> that chain's label

    @property
    def ok(self) -> bool:
        return all(abs(g.error) <= self.max_error for g in [*self.groups.values(), *self.fixed.values()])


@dataclass
class _Runs:
    """One method's real runs: per group, the ratios per request, texts right, cycles."""

    ratios: dict[str, list[float]] = field(default_factory=dict)
    same: dict[str, list[bool]] = field(default_factory=dict)
    cycles: dict[str, list[int]] = field(default_factory=dict)  # drafted, all

    def add(self, request, r: GenerationResult) -> None:
        self.same.setdefault(request.group, []).append(r.token_ids == request.answer)
        counts = self.cycles.setdefault(request.group, [0, 0])
        counts[0] += drafted_cycles(r)
        counts[1] += r.cycles

    def checks(self, speedup: dict[str, float], drafted: dict[str, float]) -> dict[str, GroupCheck]:
        ratios = {**self.ratios, "all": [r for rs in self.ratios.values() for r in rs]}
        same = {**self.same, "all": [s for ss in self.same.values() for s in ss]}
        cycles = {**self.cycles, "all": [sum(c[0] for c in self.cycles.values()), sum(c[1] for c in self.cycles.values())]}
        return {g: GroupCheck(round(statistics.median(rs), 3), speedup[g], f"{sum(same[g])}/{len(same[g])}",
                              round(cycles[g][0] / max(1, cycles[g][1]), 3), drafted[g])
                for g, rs in ratios.items()}


def validate(trace: Trace, pool, lookup: str = DEFAULT_LOOKUP, repeats: int = 1, max_error: float = MAX_ERROR,
             progress: Callable[[str], None] | None = None, host: HostCosts = NO_HOST) -> Validation:
    """Real runs of the trace's requests on `pool`'s models against the simulation (module
    docstring); `host`: the engine's own work as the simulation prices it (sim/host.py)."""
    target = pool.model(trace.target)
    models = [*(pool.model(d) for d in trace.drafts), target]
    with tempfile.TemporaryDirectory() as fresh:  # no saved estimates; the profile measured once, here
        profile = load_or_profile(models, Path(fresh), progress=progress is not None, repeats=PROFILE_REPEATS,
                                  batches=()).nondecreasing()
        given = Path(fresh) / "profile.json"  # the router takes exactly these costs
        given.write_text(json.dumps(profile.as_dict()))
        simulated = predict(trace, profile, lookup, price_prompt=True, host=host)
        by_label = {c.label: c for c in candidate_chains(trace, lookup)}
        chains = {g: by_label[best_fixed(simulated, g)] for g in trace.groups}
        fixed = {g: c.build(models) for g, c in chains.items()}
        router = auto_router(pool, trace.target, [*trace.drafts, trace.target], profile_dir=Path(fresh),
                             progress=False, lookup=lookup, profile_file=given)
        alone = Chain([target], [])
        runs = {AUTO: _Runs(), FIXED: _Runs()}
        for request in trace.requests:
            if progress is not None:
                progress(f"{request.group} {request.id}")
            n = trace.max_tokens
            alone_runs = [decode_seconds(alone, request.prompt, n)[0]]
            seconds: dict[str, list[float]] = {AUTO: [], FIXED: []}
            for _ in range(repeats):
                for method, generator in ((AUTO, router), (FIXED, fixed[request.group])):
                    took, r = decode_seconds(generator, request.prompt, n)
                    seconds[method].append(took)
                    runs[method].add(request, r)
                alone_runs.append(decode_seconds(alone, request.prompt, n)[0])
            for method, took in seconds.items():
                runs[method].ratios.setdefault(request.group, []).append(statistics.mean(alone_runs)
                                                                         / statistics.mean(took))
    fixed_speedup = {g: simulated.streamed[c.label][g] for g, c in chains.items()}
    fixed_speedup["all"], fixed_drafted_all = _pooled(simulated, chains)
    fixed_drafted = {g: simulated.drafted[c.label][g] for g, c in chains.items()}
    fixed_drafted["all"] = fixed_drafted_all
    return Validation(runs[AUTO].checks(simulated.streamed[AUTO], simulated.drafted[AUTO]), max_error,
                      profile.as_dict(), runs[FIXED].checks(fixed_speedup, fixed_drafted),
                      {g: c.label for g, c in chains.items()})


def best_fixed(simulated: Prediction, group: str) -> str:
    """The label of the fixed chain of any depth with the highest simulated speed-up on
    `group`, timed from the first streamed text (as validated)."""
    fixed = [m for m in simulated.streamed if m not in (ALONE, AUTO)]
    return max(fixed, key=lambda m: simulated.streamed[m][group])


def _pooled(simulated: Prediction, chains: dict[str, ChainChoice]) -> tuple[float, float]:
    """Over every request, each run by its group's fixed chain (as 'all' is measured), from the
    simulation's own runs: the median of the target alone's time over the chain's (from the
    first streamed text), and the share of drafting cycles."""
    ratios, drafted, cycles = [], 0, 0
    for group, choice in chains.items():
        for a, r in zip(simulated.runs[ALONE], simulated.runs[choice.label], strict=True):
            if r.group == group:
                ratios.append(a.streamed_seconds / r.streamed_seconds)
                drafted, cycles = drafted + r.drafted_cycles, cycles + r.cycles
    return round(statistics.median(ratios), 3), round(drafted / max(1, cycles), 3)

"""Validation: the simulator's speed-ups against this machine's real runs of the same requests.

First the up-front simulation, on the profile measured now (PROFILE_REPEATS forwards per
size, fitted non-decreasing in n: what the real router takes): every fixed chain and auto
over the trace, which names each group's best fixed chain (of any depth, on the times
validated: Prediction.streamed). Then, for every request of the trace, for real on the
loaded models: the target alone, then `repeats` times auto, the group's best fixed chain
and the target alone again (greedy, the trace's max_tokens; decode time from the first
streamed text to the end: simulate.decode_seconds, which times the simulated runs the same
way, so the first cycle, with the prefill and whatever it drafted, is outside both). The
router is fresh (no saved estimates), takes the up-front profile, and serves the requests in
order, as the simulated one does. Before the first request and after each, one round of the
machine's profile is timed (sim/machine.py): the machine as it was while the real runs ran.

The simulation validated then replays the target alone, auto and the chains run, priced by
that machine, its router starting from the up-front profile as the real one did (Replay's
belief): a profile timed in one sitting before the runs prices the minute it was timed in,
not the runs (sim/machine.py says why). The replay prices every token fed
(price_prompt): after the first cycle a prompt token is fed only by a draft model that joins
mid-request and catches up on it, which the real run pays too.

Per method (auto, the best fixed chain; the target alone is 1 on both sides), per group: the
median per request of the target alone's time over the method's (per dataset, the median),
measured, simulated on the machine and simulated up front, and the simulation's relative
error; and the share of the method's cycles that drafted, measured and simulated (where they
part for auto, the router chose otherwise). Overall ('all'): the target alone's time over
the method's, each summed over every request (pooled), shown beside the groups and not
checked. `ok` when every group's error on the machine, auto's and its fixed chain's, is
within `max_error`: neither aggregate over groups measures the simulation's error. A median
over requests of groups as far apart as documents (near 1x) and code editing (several times)
lands between the two clusters and moves with a request or two; a pooled ratio is dominated
by the slowest requests, and for the fixed chains (each group's own: no one chain) those are
a long-draft chain over a real text that left the recorded one, which the replay, on the
recorded text, cannot see (docs/journal.md, "The simulator on the copy workloads").

What a real run has that the simulation does not (simulate.py's list) shows up here as
error: the Python work per cycle, this machine's timing noise (two runs of one request can
differ by tens of percent on a shared 2-core CPU, docs/journal.md: use --repeats on a noisy
machine), near-ties that make a real run write another text.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specrouter.cascade.chain import Chain
from specrouter.drafters import DEFAULT_LOOKUP
from specrouter.engine.request import GenerationResult
from specrouter.router import auto_router
from specrouter.router.config import DEFAULT_CONFIG, RouterConfig
from specrouter.router.estimates.profile_cache import load_or_profile
from specrouter.sim.host import NO_HOST, HostCosts
from specrouter.sim.machine import InterleavedProfile
from specrouter.sim.simulate import (ALONE, AUTO, Prediction, candidate_chains, decode_seconds,
                                     drafted_cycles, predict, speedups)
from specrouter.sim.trace import Trace

MAX_ERROR = 0.10
#: Forwards timed per size for the profile both sides take (more than the router's default,
#: 3: the replay's machine is its profile, and a median of few forwards moves with the
#: machine's noise); fitted non-decreasing in n. Batch tables are not measured (batch 1 here).
PROFILE_REPEATS = 9
#: What both sides time, as a report states it (results compare only where it matches).
TIMED = ("from each run's first streamed text to its end, on both sides (the first cycle, with the prefill, "
         "outside both); the replay prices every token fed after it")
#: The method validated beside auto: the best fixed chain of each group.
FIXED = "best fixed chain"
#: What 'all' is, as a report states it (results compare only where it matches).
OVERALL = "the target alone's time over the method's, each summed over every request (pooled)"


@dataclass(frozen=True)
class GroupCheck:
    measured: float  # median per request of the target alone's decode time over the method's ('all': pooled)
    simulated: float  # on the machine timed between the real runs
    same_text: str  # real runs of the method that wrote the recorded answer, of all
    drafted_measured: float  # share of the method's cycles whose chain drafted, real runs
    drafted_simulated: float
    simulated_upfront: float  # on the profile timed before the runs (which the router took)

    @property
    def error(self) -> float:
        return self.simulated / self.measured - 1

    @property
    def error_upfront(self) -> float:
        return self.simulated_upfront / self.measured - 1


@dataclass(frozen=True)
class RequestCheck:
    """One request of one method: the target alone's decode time over the method's, measured
    (means over the repeats) and simulated on the machine; where the group's median comes from."""

    group: str
    id: str
    method: str  # auto, or the label of the group's fixed chain
    measured: float
    simulated: float
    same_text: str  # real runs of the method on it that wrote the recorded answer, of all
    drafted_measured: float  # share of its cycles whose chain drafted, over the real runs
    drafted_simulated: float
    alone_seconds: float  # measured: the target alone's mean decode time (the ratio's numerator)
    seconds: float  # measured: the method's mean decode time


@dataclass(frozen=True)
class Validation:
    groups: dict[str, GroupCheck]  # auto, per group and 'all'
    max_error: float
    profile: dict  # the up-front profile both routers took (CostProfile.as_dict)
    machine: dict  # the profile timed between the real runs, which priced the replay validated
    rounds: int  # of the machine's profile
    #: The best fixed chain per group (the up-front simulation's, with hindsight), per group and 'all'.
    fixed: dict[str, GroupCheck] = field(default_factory=dict)
    chains: dict[str, str] = field(default_factory=dict)  # group -> that chain's label
    requests: list[RequestCheck] = field(default_factory=list)  # in the trace's order, auto then the fixed chain

    @property
    def ok(self) -> bool:
        """Every group's error within max_error, auto's and the fixed chain's ('all' is not
        checked: the module docstring)."""
        return all(abs(g.error) <= self.max_error for checks in (self.groups, self.fixed)
                   for name, g in checks.items() if name != "all")

    def as_dict(self) -> dict:
        """What a result file keeps: every check with its errors, the chains, both profiles."""
        def checks(of: dict[str, GroupCheck]) -> dict:
            return {g: {**asdict(c), "error": round(c.error, 4), "error_upfront": round(c.error_upfront, 4)}
                    for g, c in of.items()}
        return {"max_error": self.max_error, "ok": self.ok, "overall": OVERALL,
                "groups": checks(self.groups), "fixed": checks(self.fixed),
                "chains": self.chains, "profile": self.profile, "machine": self.machine, "rounds": self.rounds,
                "requests": [asdict(r) for r in self.requests]}


@dataclass(frozen=True)
class _Measured:
    """One request of one method over its real runs."""

    index: int  # in the trace
    group: str
    alone_seconds: float  # the target alone's mean decode time
    seconds: float  # the method's mean decode time
    runs: int
    same: int  # runs that wrote the recorded answer
    drafted: int  # cycles whose chain drafted, over the runs
    cycles: int

    @property
    def ratio(self) -> float:
        return self.alone_seconds / self.seconds

    @classmethod
    def of(cls, index: int, request, alone: list[float], done: list[tuple[float, GenerationResult]]) -> _Measured:
        return cls(index, request.group, statistics.mean(alone), statistics.mean(t for t, _ in done), len(done),
                   sum(r.token_ids == request.answer for _, r in done), sum(drafted_cycles(r) for _, r in done),
                   sum(r.cycles for _, r in done))


def _checks(rows: list[_Measured], speedup: dict[str, float], drafted: dict[str, float],
            upfront: dict[str, float]) -> dict[str, GroupCheck]:
    """Per group the median of the requests' ratios, and overall ('all') the pooled ratio
    (module docstring); their texts and drafting cycles, beside the simulated figures."""
    groups = {g: [r for r in rows if r.group == g] for g in dict.fromkeys(r.group for r in rows)}
    pooled = sum(r.alone_seconds for r in rows) / sum(r.seconds for r in rows)
    return {g: GroupCheck(round(pooled if g == "all" else statistics.median(r.ratio for r in rs), 3), speedup[g],
                          f"{sum(r.same for r in rs)}/{sum(r.runs for r in rs)}",
                          round(sum(r.drafted for r in rs) / max(1, sum(r.cycles for r in rs)), 3), drafted[g], upfront[g])
            for g, rs in {**groups, "all": rows}.items()}


def validate(trace: Trace, pool, lookup: str = DEFAULT_LOOKUP, repeats: int = 1, max_error: float = MAX_ERROR,
             progress: Callable[[str], None] | None = None, host: HostCosts = NO_HOST,
             machine: InterleavedProfile | None = None, config: RouterConfig = DEFAULT_CONFIG) -> Validation:
    """Real runs of the trace's requests on `pool`'s models against the simulation (module
    docstring); `host`: the engine's own work as the simulation prices it (sim/host.py);
    `machine`: what times the rounds between the runs (default: every model's forwards on
    the wall clock; tests pass one on a simulated clock); `config`: the router's tuning, the
    real one's and the replayed one's."""
    target = pool.model(trace.target)
    models = [*(pool.model(d) for d in trace.drafts), target]
    machine = machine or InterleavedProfile(models)
    with tempfile.TemporaryDirectory() as fresh:  # no saved estimates; the profile measured once, here
        profile = load_or_profile(models, Path(fresh), progress=progress is not None, repeats=PROFILE_REPEATS,
                                  batches=()).nondecreasing()
        given = Path(fresh) / "profile.json"  # the router takes exactly these costs
        given.write_text(json.dumps(profile.as_dict()))
        upfront = predict(trace, profile, lookup, price_prompt=True, host=host, config=config)
        by_label = {c.label: c for c in candidate_chains(trace, lookup)}
        chains = {g: by_label[best_fixed(upfront, g)] for g in trace.groups}
        fixed = {g: c.build(models) for g, c in chains.items()}
        router = auto_router(pool, trace.target, [*trace.drafts, trace.target], profile_dir=Path(fresh),
                             progress=False, lookup=lookup, profile_file=given, config=config)
        alone = Chain([target], [])
        measured: dict[str, list[_Measured]] = {AUTO: [], FIXED: []}
        machine.round()
        for i, request in enumerate(trace.requests):
            if progress is not None:
                progress(f"{request.group} {request.id}")
            n = trace.max_tokens
            alone_runs = [decode_seconds(alone, request.prompt, n)[0]]
            done: dict[str, list[tuple[float, GenerationResult]]] = {AUTO: [], FIXED: []}
            for _ in range(repeats):
                for method, generator in ((AUTO, router), (FIXED, fixed[request.group])):
                    done[method].append(decode_seconds(generator, request.prompt, n))
                alone_runs.append(decode_seconds(alone, request.prompt, n)[0])
            for method, runs in done.items():
                measured[method].append(_Measured.of(i, request, alone_runs, runs))
            machine.round()
    timed = machine.profile()
    simulated = predict(trace, timed, lookup, list(dict.fromkeys(chains.values())), price_prompt=True, host=host,
                        belief=profile, config=config)
    replayed = simulated.runs

    def request_check(m: _Measured, label: str) -> RequestCheck:
        alone_run, run = replayed[ALONE][m.index], replayed[label][m.index]
        return RequestCheck(m.group, trace.requests[m.index].id, label, round(m.ratio, 3),
                            round(alone_run.streamed_seconds / run.streamed_seconds, 3), f"{m.same}/{m.runs}",
                            round(m.drafted / max(1, m.cycles), 3), round(run.drafted_cycles / max(1, run.cycles), 3),
                            m.alone_seconds, m.seconds)

    requests = [request_check(m, label) for a, f in zip(measured[AUTO], measured[FIXED], strict=True)
                for m, label in ((a, AUTO), (f, chains[f.group].label))]

    labels = {g: c.label for g, c in chains.items()}

    def fixed_checks(prediction: Prediction) -> tuple[dict[str, float], dict[str, float]]:
        speedup = {g: prediction.streamed[label][g] for g, label in labels.items()}
        drafted = {g: prediction.drafted[label][g] for g, label in labels.items()}
        speedup["all"], drafted["all"] = _pooled(prediction, labels)
        return speedup, drafted

    return Validation(_checks(measured[AUTO], simulated.streamed[AUTO], simulated.drafted[AUTO], upfront.streamed[AUTO]),
                      max_error, profile.as_dict(), timed.as_dict(), machine.rounds,
                      _checks(measured[FIXED], *fixed_checks(simulated), fixed_checks(upfront)[0]),
                      labels, requests)


def best_fixed(simulated: Prediction, group: str) -> str:
    """The label of the fixed chain of any depth with the highest simulated speed-up on
    `group`, timed from the first streamed text (as validated)."""
    fixed = [m for m in simulated.streamed if m not in (ALONE, AUTO)]
    return max(fixed, key=lambda m: simulated.streamed[m][group])


def _pooled(simulated: Prediction, labels: dict[str, str]) -> tuple[float, float]:
    """Over every request, each run by its group's fixed chain (`labels`: group -> its label;
    as 'all' is measured), from the simulation's own runs: the target alone's time over the
    chains', each summed over the requests (from the first streamed text: pooled, as the
    module docstring says why), and the share of drafting cycles."""
    alone, runs = zip(*[(a, r) for group, label in labels.items()
                        for a, r in zip(simulated.runs[ALONE], simulated.runs[label], strict=True) if r.group == group])
    return (speedups(alone, runs, (), lambda r: r.streamed_seconds)["all"],
            round(sum(r.drafted_cycles for r in runs) / max(1, sum(r.cycles for r in runs)), 3))

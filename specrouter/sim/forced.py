"""Trace-forced runs: the real engine over real forwards whose rows a trace decides, timed
on the wall clock, beside the simulator's prediction of the same runs.

`ForcedReplay` is a Replay (simulate.py) whose models are ForcedBackends (backends/forced.py)
over real backends, one per model of the trace (same names): the engine, the batch
scheduler and the router run for real and every forward is paid on the real models (random
weights of the real shapes, on a device the trace's models do not fit), while what is
drafted, accepted and committed is what the trace's models did. Every method must still
commit the recorded answer (else SimulationError). Its clock is the wall clock.

`compare` runs, per batch size, the target alone, the best fixed 2-level and 3-level chains
(the simulator's choice on `profile` at that batch, with hindsight) and auto, each through
the batch scheduler as batched.serve serves a trace (its requests queued copies_for times,
B sequences at a time), once forced and timed, once simulated on `profile`; the simulated
run prices the prompts (the forced run pays its prefill) and, where the forced run was cut at
its time limit, runs the same number of scheduler steps, so both sides count the same work
(for the target alone and fixed chains the same forwards: the trace decides every step; auto
decides from its own timings on each side). Measured over predicted milliseconds per token is
then what the profile misses: the engine's host work, this mode's own (backends/forced.py),
forwards whose cost the profile's tables interpolate, and noise.

`measure_profile` times a profile of the real backends themselves (router/estimates/profiler.py:
single forwards, and batched ones up to the largest batch), for a device no profile exists of.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

from specrouter.backends.base import Backend
from specrouter.backends.forced import ForcedBackend
from specrouter.cascade.chain import Chain
from specrouter.drafters import DEFAULT_LOOKUP
from specrouter.engine.chain_router import ChainRouter
from specrouter.errors import InvalidParameterError
from specrouter.router.config import DEFAULT_CONFIG, RouterConfig
from specrouter.router.estimates.costs import CostProfile
from specrouter.router.estimates.profiler import PROFILE_NS, profile_batches, profile_model
from specrouter.sim.batched import BATCHES, BatchPrediction, BatchRun, predict_batches, serve
from specrouter.sim.host import NO_HOST, HostCosts
from specrouter.sim.simulate import ALONE, AUTO, ChainChoice, Replay, candidate_chains
from specrouter.sim.trace import Trace

#: The roles compared at each batch size, in order (the two best chains: the prediction's).
ROLES = (ALONE, "best 2-level", "best 3-level", AUTO)
#: Sizes a measured profile times beyond the router's (PROFILE_NS): the prompts' forwards.
PROMPT_NS = (96, 128, 192, 256, 384, 512)


class ForcedReplay(Replay):
    """The trace's models as ForcedBackends over `real` (by model name) and the replay's rows,
    timed on `clock` (default the wall clock); auto's router starts from `profile`'s costs
    and refines them from the forwards it times."""

    def __init__(self, trace: Trace, profile: CostProfile, real: Mapping[str, Backend],
                 config: RouterConfig = DEFAULT_CONFIG, clock: Callable[[], float] = time.perf_counter) -> None:
        missing = [m for m in (trace.target, *trace.drafts) if m not in real]
        if missing:
            raise InvalidParameterError(f"no real backend for {', '.join(missing)}")
        super().__init__(trace, profile, config=config)
        self.target = ForcedBackend(real[trace.target], self.target)
        self.drafts = [ForcedBackend(real[d.name], d) for d in self.drafts]
        self.models = [*self.drafts, self.target]
        self._clock = clock

    def clock(self) -> float:
        return self._clock()


@dataclass(frozen=True)
class ForcedRun:
    """One method at one batch size: forced and timed (`measured`), and simulated over the
    same steps (`predicted`)."""

    batch: int
    role: str  # one of ROLES
    method: str  # the chain's label (ALONE, AUTO or a fixed chain's)
    measured: BatchRun
    predicted: BatchRun

    @property
    def ratio(self) -> float:
        """Measured over predicted milliseconds per token (nan where either committed none)."""
        return ms_per_token(self.measured) / ms_per_token(self.predicted)

    def as_dict(self) -> dict:
        return {"batch": self.batch, "role": self.role, "method": self.method, "complete": self.measured.complete,
                "measured": run_dict(self.measured), "predicted": run_dict(self.predicted),
                "ratio": round(self.ratio, 4) if math.isfinite(self.ratio) else None}


def ms_per_token(run: BatchRun) -> float:
    return 1e3 * run.seconds / run.tokens if run.tokens else math.nan


def run_dict(run: BatchRun) -> dict:
    ms = ms_per_token(run)
    return {**asdict(run), "ms_per_token": round(ms, 4) if math.isfinite(ms) else None}


@dataclass(frozen=True)
class Comparison:
    """The prediction that chose the chains, and every run, in order."""

    prediction: BatchPrediction
    runs: list[ForcedRun]

    def as_dict(self) -> dict:
        p = self.prediction
        per_batch = {k: {str(b): v for b, v in getattr(p, k).items()}
                     for k in ("tokens_per_second", "speedup", "drafted", "best")}
        return {"prediction": per_batch, "runs": [r.as_dict() for r in self.runs]}


Plan = Callable[[], Chain | ChainRouter]


def plans(replay: Replay, chains: Mapping[str, ChainChoice], lookup: str) -> Callable[[str], Plan]:
    """For a method's label, what makes a request's chain or router session over `replay`'s
    models (auto: a fresh router per call of the result, its sessions sharing it)."""
    def plan(label: str) -> Plan:
        if label == AUTO:
            return replay.router(lookup).session
        choice = ChainChoice((replay.trace.target,), ()) if label == ALONE else chains[label]
        return lambda: replay.chain(choice)
    return plan


def compare(trace: Trace, profile: CostProfile, real: Mapping[str, Backend], batches: Sequence[int] = BATCHES,
            time_limit: float | None = None, lookup: str = DEFAULT_LOOKUP, chains: Sequence[ChainChoice] | None = None,
            host: HostCosts = NO_HOST, config: RouterConfig = DEFAULT_CONFIG,
            progress: Callable[[str], None] | None = None, done: Callable[[Comparison], None] | None = None,
            clock: Callable[[], float] = time.perf_counter, warmup_steps: int = 3) -> Comparison:
    """The module docstring's comparison: per batch size, each of ROLES forced (each run cut
    once `time_limit` seconds of `clock` have passed; None: never) and simulated; `chains`:
    the fixed chains the best are chosen from (default candidate_chains); host: the engine's
    work the prediction prices (sim/host.py); `done(so far)` after every run (a caller saves
    there what a run cut short would lose). First, `warmup_steps` steps of each method at
    the largest batch, not counted (a device's first forwards of a shape allocate)."""
    fixed = list(chains if chains is not None else candidate_chains(trace, lookup))
    by_label = {c.label: c for c in fixed}
    say = progress or (lambda _: None)
    say("predicting every chain")
    prediction = predict_batches(trace, profile, batches, lookup, fixed, price_prompt=True, host=host, config=config)
    simulated = Replay(trace, profile, price_prompt=True, host=host, config=config)
    forced = ForcedReplay(trace, profile, real, config, clock)
    sim_plan, forced_plan = plans(simulated, by_label, lookup), plans(forced, by_label, lookup)

    def methods(b: int) -> dict[str, str]:  # role -> label, in the order of ROLES
        return {ALONE: ALONE, **prediction.best[b], AUTO: AUTO}

    largest = max(batches)
    for label in dict.fromkeys(methods(largest).values()):
        say(f"warming up: {label}")
        serve(forced, forced_plan(label), largest, max_steps=warmup_steps)
    out = Comparison(prediction, [])
    for b in batches:
        for role, label in methods(b).items():
            say(f"batch {b}: {role} ({label})")
            deadline = None if time_limit is None else clock() + time_limit
            measured = serve(forced, forced_plan(label), b, deadline=deadline)
            predicted = serve(simulated, sim_plan(label), b, max_steps=None if measured.complete else measured.steps)
            out.runs.append(ForcedRun(b, role, label, measured, predicted))
            if done is not None:
                done(out)
    return out


def measure_profile(models: Sequence[Backend], batches: Sequence[int] = BATCHES, repeats: int = 5,
                    batch_ns: Sequence[int] = (1, 2, 4, 8, 16)) -> CostProfile:
    """A profile of `models` timed here: one sequence's forwards of PROFILE_NS and PROMPT_NS
    tokens, and calls of B sequences (each batch size above 1 of `batches`) of batch_ns
    tokens each; fitted non-decreasing (a device's launch-bound medians jitter)."""
    ns = sorted({*PROFILE_NS, *PROMPT_NS})
    bs = [b for b in batches if b > 1]
    tables = {m.name: profile_model(m, ns, repeats) for m in models}
    batched = {m.name: profile_batches(m, bs, batch_ns, repeats) for m in models} if bs else {}
    return CostProfile(tables, batch_tables=batched).nondecreasing()

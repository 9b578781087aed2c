"""Validation: the simulator's speed-ups against this machine's real runs of the same requests.

For every request of the trace, for real on the loaded models: the target alone, then
`repeats` times auto and the target alone again (greedy, the trace's max_tokens; decode
time from the first streamed token to the end, as the simulation prices no prefill). The
router is fresh (no saved estimates), its profile this machine's (measured now, or the
cache's where valid), and serves the requests in order, as the simulated one does. The
simulation then runs on that same profile. Per group and overall: the median per request
of the target alone's time over auto's, measured and simulated, and the simulation's
relative error (`ok` when every error is within `max_error`); and the share of auto's
cycles that drafted, measured and simulated (where they part, the router chose otherwise).

What a real run has that the simulation does not (simulate.py's list) shows up here as
error: the Python work per cycle, this machine's timing noise (the target alone's two runs
of one request differ by up to 30% on the 2-core EPYC of docs/copy-drafting.md: use
--repeats on a noisy machine), near-ties that make a real run write another text.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specrouter.cascade.chain import Chain
from specrouter.cascade.sampling import SamplingParams
from specrouter.drafters import DEFAULT_LOOKUP
from specrouter.engine import generate_stream
from specrouter.engine.request import GenerationResult
from specrouter.router import auto_router
from specrouter.router.profiler import load_or_profile
from specrouter.sim.simulate import AUTO, drafted_cycles, predict
from specrouter.sim.trace import Trace

MAX_ERROR = 0.10


@dataclass(frozen=True)
class GroupCheck:
    measured: float  # median per request of the target alone's decode time over auto's
    simulated: float
    same_text: str  # real auto runs that wrote the recorded answer, of all
    drafted_measured: float  # share of auto's cycles whose chain drafted, real runs
    drafted_simulated: float

    @property
    def error(self) -> float:
        return self.simulated / self.measured - 1


@dataclass(frozen=True)
class Validation:
    groups: dict[str, GroupCheck]  # per group and 'all'
    max_error: float
    profile: dict  # the profile both used (CostProfile.as_dict)

    @property
    def ok(self) -> bool:
        return all(abs(g.error) <= self.max_error for g in self.groups.values())


def decode_seconds(method, prompt: list[int], max_tokens: int) -> tuple[float, GenerationResult]:
    """Seconds from the first streamed text to the end of the generation, and its result."""
    first = None
    for item in generate_stream(method, prompt, SamplingParams(), max_tokens):
        if first is None:
            first = time.perf_counter()
    assert isinstance(item, GenerationResult)
    return time.perf_counter() - first, item


def validate(trace: Trace, pool, lookup: str = DEFAULT_LOOKUP, repeats: int = 1, max_error: float = MAX_ERROR,
             progress: Callable[[str], None] | None = None) -> Validation:
    """Real runs of the trace's requests on `pool`'s models against the simulation (module docstring)."""
    target = pool.model(trace.target)
    models = [*(pool.model(d) for d in trace.drafts), target]
    with tempfile.TemporaryDirectory() as fresh:  # no saved estimates; the profile measured once, here
        profile = load_or_profile(models, Path(fresh), progress=progress is not None)
        given = Path(fresh) / "profile.json"  # the router takes exactly these costs
        given.write_text(json.dumps(profile.as_dict()))
        router = auto_router(pool, trace.target, [*trace.drafts, trace.target], profile_dir=Path(fresh),
                             progress=False, lookup=lookup, profile_file=given)
        alone = Chain([target], [])
        ratios: dict[str, list[float]] = {}
        same: dict[str, list[bool]] = {}
        cycles: dict[str, list[int]] = {}  # drafted, all
        for request in trace.requests:
            if progress is not None:
                progress(f"{request.group} {request.id}")
            n = trace.max_tokens
            alone_runs = [decode_seconds(alone, request.prompt, n)[0]]
            auto_runs = []
            for _ in range(repeats):
                seconds, r = decode_seconds(router, request.prompt, n)
                auto_runs.append(seconds)
                same.setdefault(request.group, []).append(r.token_ids == request.answer)
                counts = cycles.setdefault(request.group, [0, 0])
                counts[0] += drafted_cycles(r)
                counts[1] += r.cycles
                alone_runs.append(decode_seconds(alone, request.prompt, n)[0])
            ratios.setdefault(request.group, []).append(statistics.mean(alone_runs) / statistics.mean(auto_runs))
    simulated = predict(trace, profile, lookup, chains=[])
    ratios["all"] = [r for rs in ratios.values() for r in rs]
    same["all"] = [s for ss in same.values() for s in ss]
    cycles["all"] = [sum(c[0] for c in cycles.values()), sum(c[1] for c in cycles.values())]
    groups = {g: GroupCheck(round(statistics.median(rs), 3), simulated.speedup[AUTO][g], f"{sum(same[g])}/{len(same[g])}",
                            round(cycles[g][0] / max(1, cycles[g][1]), 3), simulated.drafted[AUTO][g])
              for g, rs in ratios.items()}
    return Validation(groups, max_error, profile.as_dict())

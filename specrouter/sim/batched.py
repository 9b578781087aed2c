"""Batches in simulation: the real batch scheduler (engine/batch.py) serving a trace's
requests, B sequences at a time, on the simulated clock.

The scheduler is the server's: continuous batching (a sequence that ends makes room for the
next waiting one), per step one call of each model it calls (engine/phase.py: by default
the one most sequences wait on) for every sequence waiting on that model, priced as one
forward over all their tokens, profile.seconds(model, sum of their n): a
batch of B sequences verifying k tokens each costs what one forward of B·k tokens costs.
That is how llama.cpp and torch batch on a CPU, and what the roofline (roofline.py) says of
a device, up to the KV cache each sequence reads, which neither the profile nor the roofline
counts (on the Qwen2.5 1.5B in fp16, 28 KB per cached token: 32 sequences of 600 tokens add
about a sixth to its 3 GB of weights). The router runs one session per request over shared
estimates, as in the server, and prices its chains at the batch's size (router/policy/planner.py).

The requests are queued all at once, the trace's requests `copies` times over (round-robin:
the same script may run in several sequences at once; the replay backends give each sequence
the rows of the script its prompt starts with), so a batch of 32 can be filled from a trace
of 12. The router's estimates are shared between copies, as they are between a server's
requests; the cross-request memory is off (as in `Replay.router`), so a copy does not draft
from its twin's answer. Served in that order, the batch drains at the end: the throughput
counts the whole run, drain included. Every sequence must commit its recorded answer (else
SimulationError), so the comparison is between methods that wrote the same tokens.

Throughput is committed tokens over simulated seconds; a method's speed-up at batch B is
its throughput over the target alone's at the same B.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specrouter.cascade.chain import Chain
from specrouter.drafters import DEFAULT_LOOKUP
from specrouter.engine.batch import BatchScheduler, Delta, Failed, Finished, SeqRequest
from specrouter.engine.chain_router import ChainRouter
from specrouter.engine.phase import StepModels
from specrouter.errors import InvalidParameterError
from specrouter.router.config import DEFAULT_CONFIG, RouterConfig
from specrouter.router.estimates.costs import CostProfile
from specrouter.sim.host import NO_HOST, HostCosts
from specrouter.sim.simulate import ALONE, AUTO, ChainChoice, Replay, SimulationError, candidate_chains, drafted_cycles
from specrouter.sim.trace import Trace


#: Batch sizes the prediction reports by default: one request, a small and a large batch.
BATCHES = (1, 8, 32)


@dataclass(frozen=True)
class BatchRun:
    """One method over the queued requests at one batch size, simulated."""

    batch: int
    sequences: int  # requests served to their end
    tokens: int
    seconds: float
    cycles: int
    drafted_cycles: int
    steps: int = 0  # the scheduler's steps
    #: False: cut (serve's deadline or max_steps) before every request had finished; tokens
    #: then counts what was committed by then, cycles those of the requests that finished.
    complete: bool = True

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def copies_for(batch: int, requests: int) -> int:
    """How many times the trace's requests are queued: enough for two batches' worth."""
    return max(1, math.ceil(2 * batch / requests))


def serve(replay: Replay, plan: Callable[[], Chain | ChainRouter], batch: int, copies: int | None = None,
          phases: StepModels | None = None, deadline: float | None = None,
          max_steps: int | None = None) -> BatchRun:
    """The trace's requests (`copies` times over; default copies_for) through a batch
    scheduler of `batch` sequences, each request's chain or router session from `plan()`;
    phases: which models a step calls (engine/phase.py; default the scheduler's). The run
    is cut between steps once the replay's clock reaches `deadline` or after `max_steps`
    steps (None: neither): the same steps of the same methods do the same work (the
    trace decides every fixed chain's step), which is how a cut run is compared."""
    if batch < 1:
        raise InvalidParameterError(f"a batch holds at least 1 sequence, got {batch}")
    requests = replay.trace.requests
    copies = copies or copies_for(batch, len(requests))
    played = replay.play_all()
    scheduler = BatchScheduler(lambda _: replay.priced(plan()), max_batch=batch, clock=replay.clock,
                               prefill_share=None, phases=phases)
    expected = {}
    for c in range(copies):
        for i, (prompt, answer) in enumerate(played):
            rid = f"{c}/{requests[i].id}"
            expected[rid] = answer
            scheduler.add(rid, SeqRequest(prompt, max_tokens=replay.trace.max_tokens))
    start, tokens, cycles, drafted, steps, finished = replay.clock(), 0, 0, 0, 0, 0
    try:
        while scheduler.n_active or scheduler.n_waiting:
            if (deadline is not None and replay.clock() >= deadline) or steps == max_steps:
                break
            steps += 1
            for event in scheduler.step():
                if isinstance(event, Failed):
                    raise SimulationError(f"{event.request_id}: {event.error}") from event.error
                if isinstance(event, Delta):
                    tokens += event.tokens
                if isinstance(event, Finished):
                    r = event.result
                    if r.token_ids != expected[event.request_id]:
                        raise SimulationError(f"{event.request_id}: the simulated run did not commit the recorded answer")
                    finished, cycles, drafted = finished + 1, cycles + r.cycles, drafted + drafted_cycles(r)
        seconds = replay.clock() - start
    finally:
        scheduler.close()
        replay.play(None)
    return BatchRun(batch, finished, tokens, seconds, cycles, drafted, steps, finished == len(expected))


@dataclass(frozen=True)
class BatchPrediction:
    """Per batch size: every method's throughput (tokens/s), its speed-up over the target
    alone's at that batch, and the best fixed chain of each depth (with hindsight)."""

    batches: tuple[int, ...]
    tokens_per_second: dict[int, dict[str, float]]
    speedup: dict[int, dict[str, float]]
    drafted: dict[int, dict[str, float]]  # share of cycles that drafted
    best: dict[int, dict[str, str]]  # batch -> 'best 2-level' / 'best 3-level' -> chain label


def predict_batches(trace: Trace, profile: CostProfile, batches: Sequence[int] = BATCHES,
                    lookup: str = DEFAULT_LOOKUP, chains: Sequence[ChainChoice] | None = None,
                    price_prompt: bool = False, progress: Callable[[str], None] | None = None,
                    phases: StepModels | None = None, host: HostCosts = NO_HOST,
                    config: RouterConfig = DEFAULT_CONFIG) -> BatchPrediction:
    """The target alone, every fixed chain of `chains` (default candidate_chains) and the
    router (one fresh router per batch size, its sessions sharing it) at each batch size;
    phases: which models a scheduler's step calls (default the scheduler's); host: the
    engine's own work per call and row (sim/host.py; default unpriced); config: the router's
    tuning."""
    if not batches or min(batches) < 1:
        raise InvalidParameterError(f"batch sizes must be >= 1, got {list(batches)}")
    fixed = list(chains if chains is not None else candidate_chains(trace, lookup))
    replay = Replay(trace, profile, price_prompt, host, config=config)
    tps, speedup, drafted, best = {}, {}, {}, {}
    for b in batches:
        methods: dict[str, Callable[[], Chain | ChainRouter]] = {ALONE: lambda: replay.chain(ChainChoice((trace.target,), ()))}
        methods.update({c.label: (lambda c=c: replay.chain(c)) for c in fixed})
        router = replay.router(lookup)
        methods[AUTO] = router.session
        runs = {}
        for label, plan in methods.items():
            if progress is not None:
                progress(f"batch {b}: {label}")
            runs[label] = serve(replay, plan, b, phases=phases)
        alone = runs[ALONE].tokens_per_second
        tps[b] = {m: round(r.tokens_per_second, 3) for m, r in runs.items()}
        speedup[b] = {m: round(r.tokens_per_second / alone, 3) for m, r in runs.items()}
        drafted[b] = {m: round(r.drafted_cycles / max(1, r.cycles), 3) for m, r in runs.items()}
        best[b] = {f"best {d}-level": max(labels, key=lambda m: speedup[b][m])
                   for d in (2, 3) if (labels := [c.label for c in fixed if c.depth == d])}
    return BatchPrediction(tuple(batches), tps, speedup, drafted, best)

"""Profiling: measure the wall seconds of one forward over n tokens, per model, on this
machine (the cost model they feed: costs.py; their disk cache: profile_cache.py).

A forward's cost is measured the way the cascade uses it: on top of a cached prefix,
n new tokens with logits for all n (a verifier needs a row per proposal), then the n
positions are removed again. Only a subset of n is timed (costs.py interpolates). The
prefix is PROFILED_CONTEXT tokens; a few sizes are timed again after LONG_CONTEXT tokens
(the context table: what a long conversation adds to every forward, costs.py), where the
model's context holds them.

A measurement is trusted (cached) only when its curve is physical (implausible), its
repeats agree (unsteady) and no other process was busy while it was timed (busy).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from specrouter.backends.base import Backend
from specrouter.drafters import MODEL_FREE
from specrouter.errors import BackendError
from specrouter.router.config import DEFAULT_CONFIG, RouterConfig
from specrouter.router.estimates.costs import LONG_CONTEXT, PROFILED_CONTEXT

#: Timed sizes: dense where the cost curve bends (small n), sparse above, where they are
#: the verification forwards (k + 1 tokens) of the router's coarse draft lengths
#: (RouterConfig.draft_grid, lookup_grid): those are timed, not interpolated.
PROFILE_NS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
#: Batched forwards: B sequences of n tokens each in one call (what serving runs). Few
#: points: between and beyond them the cost is interpolated over B as over n.
PROFILE_BATCHES = (2, 4, 8)
PROFILE_BATCH_NS = (1, 2, 4, 8)
#: Sizes timed again after LONG_CONTEXT cached tokens (the context table).
CONTEXT_NS = (1, 4, 16, 32, 64)
_PREFIX_TEXT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n"


def profile_model(
    backend: Backend,
    ns: Sequence[int] = PROFILE_NS,
    repeats: int = DEFAULT_CONFIG.profile_repeats,
    clock: Callable[[], float] = time.perf_counter,
    bar: tqdm | None = None,
) -> dict[int, float]:
    """Median seconds of a forward over n tokens after a cached prefix, for each n."""
    return {n: statistics.median(t) for n, t in time_forwards(backend, ns, repeats, clock, bar).items()}


def time_forwards(
    backend: Backend,
    ns: Sequence[int] = PROFILE_NS,
    repeats: int = DEFAULT_CONFIG.profile_repeats,
    clock: Callable[[], float] = time.perf_counter,
    bar: tqdm | None = None,
    context: int = PROFILED_CONTEXT,
) -> dict[int, list[float]]:
    """Every timed forward over n tokens after `context` cached tokens (`repeats` per n)."""
    prefix = _prefix_tokens(backend, context)
    filler = _prefix_tokens(backend, max(ns))
    seq = backend.new_sequence()
    try:
        backend.decode(seq, prefix, 0, 1)
        backend.decode(seq, filler[:4], len(prefix), 4)  # warm-up: first calls allocate buffers
        backend.remove(seq, len(prefix))
        # Round-robin over the sizes, not all repeats of one size in a row: a slow stretch
        # of the machine (tens of seconds at a time) then costs each size one sample,
        # which the median drops, instead of bending the curve at the sizes it fell on.
        times: dict[int, list[float]] = {n: [] for n in ns}
        for _ in range(repeats):
            for n in ns:
                start = clock()
                backend.decode(seq, filler[:n], len(prefix), n)
                times[n].append(clock() - start)
                backend.remove(seq, len(prefix))
                if bar is not None:
                    bar.update(1)
        return times
    finally:
        backend.free_sequence(seq)


# Sanity of a profile ----------------------------------------------------------------
def implausible(table: dict[int, float], config: RouterConfig = DEFAULT_CONFIG) -> str | None:
    """Why a cost curve cannot describe a forward (None: it can): a size costs less than the
    config's non_physical_drop times the smallest size timed."""
    ns = sorted(table)
    first = ns[0]
    for n in ns[1:]:
        if table[n] < config.non_physical_drop * table[first]:
            return f"{n} tokens cost {table[n] * 1e3:.1f} ms, less than {first} ({table[first] * 1e3:.1f} ms)"
    return None


def unsteady(times: dict[int, list[float]], config: RouterConfig = DEFAULT_CONFIG) -> str | None:
    """Why repeated timings cannot be trusted (None: they can): the repeats of a size are
    further apart than repeat_spread (the median over sizes). Sizes timed under min_timed
    seconds are left out: the clock and Python dominate them."""
    spreads = [max(t) / min(t) for t in times.values() if len(t) > 1 and min(t) >= config.min_timed]
    if spreads and statistics.median(spreads) > config.repeat_spread:
        return f"repeats of one size differ by {statistics.median(spreads):.2f}x (median over sizes)"
    return None


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds at one moment: of the whole machine (None where /proc/stat is missing)
    and of this process (all its threads, the model's included)."""

    wall: float
    machine: float | None
    own: float


def cpu_sample() -> CpuSample:
    try:
        values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        machine = (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait
    except (OSError, ValueError, IndexError):
        machine = None
    times = os.times()
    return CpuSample(time.monotonic(), machine, times.user + times.system)


def busy(start: CpuSample, end: CpuSample, cores: int | None = None,
         config: RouterConfig = DEFAULT_CONFIG) -> str | None:
    """Why the machine was too busy between the two samples for timings taken then to
    describe the model alone (None: it was not): other processes used more than busy_share
    of its cores (this process's own threads do not count). Spans under min_span: no verdict."""
    wall = end.wall - start.wall
    if start.machine is None or end.machine is None or wall < config.min_span:
        return None
    cores = cores or os.cpu_count() or 1
    others = max(0.0, (end.machine - start.machine) - (end.own - start.own)) / (wall * cores)
    if others > config.busy_share:
        return f"other processes used {others:.0%} of the {cores} cores while it was timed"
    return None


def profile_batches(
    backend: Backend,
    batches: Sequence[int] = PROFILE_BATCHES,
    ns: Sequence[int] = PROFILE_BATCH_NS,
    repeats: int = DEFAULT_CONFIG.profile_repeats,
    clock: Callable[[], float] = time.perf_counter,
    bar: tqdm | None = None,
) -> dict[int, dict[int, float]]:
    """Median seconds of one decode_batch of B sequences x n tokens, each after a cached
    prefix. Batch sizes beyond the backend's free sequence slots are skipped."""
    prefix = _prefix_tokens(backend, PROFILED_CONTEXT)
    filler = _prefix_tokens(backend, max(ns))
    seqs: list[int] = []
    try:
        for _ in range(max(batches)):
            try:
                seqs.append(backend.new_sequence())
            except BackendError:
                break
        backend.decode_batch([(s, prefix, 0, 1) for s in seqs])
        tables: dict[int, dict[int, float]] = {}
        for b in batches:
            if b > len(seqs):
                if bar is not None:
                    bar.update(len(ns) * repeats)
                continue
            tables[b] = {}
            # Untimed first call at this batch's largest shape: it sizes the backend's buffers.
            backend.decode_batch([(s, filler[: max(ns)], len(prefix), max(ns)) for s in seqs[:b]])
            for s in seqs[:b]:
                backend.remove(s, len(prefix))
            for n in ns:
                times = []
                for _ in range(repeats):
                    start = clock()
                    backend.decode_batch([(s, filler[:n], len(prefix), n) for s in seqs[:b]])
                    times.append(clock() - start)
                    for s in seqs[:b]:
                        backend.remove(s, len(prefix))
                    if bar is not None:
                        bar.update(1)
                tables[b][n] = statistics.median(times)
        return tables
    finally:
        for s in seqs:
            backend.free_sequence(s)


def profile_lookups(repeats: int = 20, context_tokens: int = 2048) -> dict[str, float]:
    """Median seconds of one lookup of 8 tokens over a context of context_tokens, per
    model-free drafter."""
    context = [(i * 7919) % 1000 for i in range(context_tokens)]
    out = {}
    for name, kind in MODEL_FREE.items():
        drafter = kind()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            drafter.lookup(context, 8)
            times.append(time.perf_counter() - start)
        out[name] = statistics.median(times)
    return out


def holds_long_context(backend: Backend) -> bool:
    """Whether the model's context holds LONG_CONTEXT cached tokens and the largest of
    CONTEXT_NS after them (where its context table is timed)."""
    return backend.n_ctx > LONG_CONTEXT + max(CONTEXT_NS)


def _prefix_tokens(backend: Backend, n: int) -> list[int]:
    tokens = backend.tokenize(_PREFIX_TEXT, add_special=False) or [0]
    return (tokens * (1 + n // len(tokens)))[:n]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()

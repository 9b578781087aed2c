"""The machine as it was while other work ran: a cost profile timed in rounds between that
work (a validation's real runs), not in one session before it.

Why: a profile is a handful of forwards per size timed in a minute or two, while the real
runs of a validation take half an hour, and a shared CPU's speed drifts between the two: two
such profiles of one machine part by more than the real runs repeat within (docs/journal.md,
"The simulator on the copy workloads"). A replay priced by a profile timed before the runs
therefore validates that minute of the machine, not the half hour the runs saw. Here each
round times one forward of every size of every model (profiler.time_forwards: the same
forward, after the same cached prefix, as the router's profile), and its context sizes after
LONG_CONTEXT tokens where the model's context holds them; the profile is the median of every
size over all rounds, fitted non-decreasing in n (CostProfile.nondecreasing), so a slow
stretch of the machine during one request moves each entry by one sample of many.

Its contract with the work it interleaves with: a round runs between requests, never
during one (it uses the models' sequences and caches, and leaves none behind), and its
own time is not part of any request's.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

from specrouter.backends.base import Backend
from specrouter.router.estimates.costs import LONG_CONTEXT, CostProfile
from specrouter.router.estimates.profiler import CONTEXT_NS, PROFILE_NS, holds_long_context, time_forwards


class InterleavedProfile:
    """Forwards of `backends` timed one round at a time (`round`), gathered into a profile
    (`profile`) of the medians."""

    def __init__(self, backends: Sequence[Backend], ns: Sequence[int] = PROFILE_NS,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.backends, self.ns, self.clock = list(backends), tuple(ns), clock
        self.times: dict[str, dict[int, list[float]]] = {b.name: {n: [] for n in self.ns} for b in self.backends}
        self.context_times: dict[str, dict[int, list[float]]] = {
            b.name: {n: [] for n in CONTEXT_NS} for b in self.backends if holds_long_context(b)}
        self.rounds = 0

    def round(self) -> None:
        """One forward of every size of every model, and of every context size after
        LONG_CONTEXT cached tokens where the model's context holds them."""
        for backend in self.backends:
            for n, t in time_forwards(backend, self.ns, 1, self.clock).items():
                self.times[backend.name][n] += t
            if backend.name in self.context_times:
                for n, t in time_forwards(backend, CONTEXT_NS, 1, self.clock, context=LONG_CONTEXT).items():
                    self.context_times[backend.name][n] += t
        self.rounds += 1

    def profile(self) -> CostProfile:
        """The median of every size over the rounds so far, fitted non-decreasing in n; the
        lookups at their defaults, no batched tables (batch 1). Needs one round at least."""
        if not self.rounds:
            raise ValueError("no round timed yet")

        def medians(times: dict[str, dict[int, list[float]]]) -> dict[str, dict[int, float]]:
            return {m: {n: statistics.median(t) for n, t in table.items()} for m, table in times.items()}

        looped = {b.name for b in self.backends if not b.batches_natively}
        return CostProfile(medians(self.times), looped=looped, context_tables=medians(self.context_times)).nondecreasing()

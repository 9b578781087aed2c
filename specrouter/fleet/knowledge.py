"""What the replicas of a fleet share: acceptance estimates, metrics, liveness.

One FleetKnowledge lives in a Ray actor (deploy.py); every replica pushes a Report every
`sync_seconds` and pulls priors() once, when it starts, so a new or restarted replica
begins with what the fleet has learned instead of exploring from the priors. Per-request
state never leaves its replica.

Pooling the estimates: each replica's report replaces its previous one (a report is that
replica's whole global table, not an increment), and the priors of a pair are the
count-weighted mean of the latest reports that have it, with the summed count capped at
the persist cap (router/estimates/learned.py's pooling, as a loaded file is): enough to start informed,
little enough for the replica's own data to move it. A replica seeded from the priors
reports counts that include them; the cap keeps that from compounding into certainty.
Reports of replicas that died stay (what they learned is not lost with them); metrics and
liveness count only the replicas heard from within `stale_seconds`.

What the fleet learned (learned()): a report also carries the scores its replica observed
itself (AcceptanceEstimator.learned(), cumulative since the replica started, so it too
replaces the previous one); those of all replicas are disjoint, so they pool with counts
added and no cap. That, not the priors (which hold the file the fleet was seeded from), is
what the fleet's save merges into the file (deploy.save_fleet, router/estimates/learned.py).

Cost profiles: a replica that measured its models (router/estimates/profiler.py, under the node's
folder lock, so replicas of one node measure one at a time) shares the cached files per CPU
model; a replica starting on another node with the same CPU model installs those its folder
lacks before it builds its engine, so the fleet measures each (CPU model, model) once. Each
file still carries its full key (threads, model file, kernels): one that does not match the
node is measured again there.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from specrouter.metrics import SpecStats
from specrouter.router.estimates.learned import PairEstimate, pool_estimates


@dataclass(frozen=True)
class Report:
    """One replica's periodic push."""

    replica: str
    #: The Ray node it runs on (node id).
    node: str = ""
    #: Its router's global acceptance estimates (AcceptanceEstimator.snapshot()).
    estimates: list[PairEstimate] = field(default_factory=list)
    #: Its Prometheus exposition (text format).
    metrics: bytes = b""
    #: Whether its service is serving (worker alive, not draining).
    alive: bool = True
    #: The scores it observed itself since it started (AcceptanceEstimator.learned()).
    learned: list[PairEstimate] = field(default_factory=list)
    #: Its speculation counts since it started (server/metrics.Metrics.spec_stats).
    spec: SpecStats = field(default_factory=SpecStats)


class FleetKnowledge:
    """The shared state (one instance in a Ray actor; plain methods, so it is tested without Ray)."""

    def __init__(self, seed: Iterable[PairEstimate] = (), stale_seconds: float = 5.0,
                 clock: Callable[[], float] | None = None) -> None:
        self._clock = clock or time.monotonic
        self.stale_seconds = stale_seconds
        #: Estimates the fleet started from (the head node's saved file), pooled with the reports.
        self._seed = list(seed)
        self._reports: dict[str, Report] = {}
        self._heard: dict[str, float] = {}
        self._profiles: dict[str, dict[str, str]] = {}  # CPU model -> profile file name -> text

    def push(self, report: Report) -> None:
        self._reports[report.replica] = report
        self._heard[report.replica] = self._clock()

    def priors(self) -> list[PairEstimate]:
        """What a replica starting now seeds its router with."""
        return pool_estimates([self._seed, *(r.estimates for r in self._reports.values())])

    def learned(self) -> list[PairEstimate]:
        """The scores every replica observed itself, pooled uncapped (see the module docstring)."""
        return pool_estimates((r.learned for r in self._reports.values()), cap=math.inf)

    def live(self) -> list[Report]:
        """The latest report of each replica heard from within stale_seconds, by replica name."""
        now = self._clock()
        return [self._reports[name] for name in sorted(self._reports)
                if now - self._heard[name] <= self.stale_seconds]

    def serving(self) -> int:
        """Replicas heard from recently that said they serve."""
        return sum(r.alive for r in self.live())

    def add_profiles(self, cpu: str, files: dict[str, str]) -> None:
        """A replica's cached profile files (router/profiler.profile_files), measured on `cpu`."""
        self._profiles.setdefault(cpu, {}).update(files)

    def profiles(self, cpu: str) -> dict[str, str]:
        return dict(self._profiles.get(cpu, {}))

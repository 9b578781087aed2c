"""/metrics of a fleet: each live replica's metrics, with a `replica` label.

Each replica pushes its metrics with its report: its speculation counts as they are
(SpecStats, specrouter/metrics.py) and the rest as its Prometheus exposition
(server/metrics.py). The ingress writes the speculation families from the counts with the
server's own SpecCollector, and parses the other families of the live replicas' expositions
and writes them out again, so every sample is labelled with its replica. Counters then read
as a single server's do once summed over `replica` (e.g. sum by (level) of
specrouter:spec_decode_num_draft_tokens_total). They lag the replicas by at most one report
period (the `[ray]` table's sync_seconds).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from specrouter.fleet.knowledge import Report
from specrouter.server.metrics import SpecCollector

REPLICA_LABEL = "replica"


class _Relabelled:
    """A prometheus_client collector over parsed families (the registry's collect protocol)."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def fleet_exposition(reports: Iterable[Report]) -> bytes:
    """One exposition of every report's metrics, each sample labelled replica=<its name>."""
    reports = list(reports)
    merged: dict[str, Metric] = {}
    for report in reports:
        for family in text_string_to_metric_families(report.metrics.decode()):
            if family.name in SpecCollector.FAMILIES:
                continue  # written from the report's counts below
            into = merged.get(family.name)
            if into is None:
                into = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
            into.samples.extend(s._replace(labels={**s.labels, REPLICA_LABEL: report.replica})
                                for s in family.samples)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SpecCollector(lambda: [((r.replica,), r.spec) for r in reports], (REPLICA_LABEL,)))
    registry.register(_Relabelled(list(merged.values())))
    return generate_latest(registry)

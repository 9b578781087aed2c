"""Prometheus metrics of one server, named like vLLM's where the meaning matches.

Speculation counters move cycle by cycle (the worker adds BatchScheduler.take_spec_counts
after every step to the server's SpecStats, specrouter/metrics.py), so a long request's
drafting shows while it runs; SpecCollector writes them at each scrape, and writes a fleet's
replicas' the same way (fleet/metrics.py). Request counters move when a request ends. The
router's own counters (how often its sessions deliberated or reused a recent decision:
router/policy/pacing.py) stay where the router keeps them and are read at each scrape
(ChoiceCollector), and so do the prefix cache's (PrefixCacheCollector) and the cross-request
suffix memory's size (MemoryCollector). Each Metrics has its own registry, so several
servers (tests) in one process never share counters.
Counters are exposed with prometheus_client's `_total` suffix, as vLLM's are (e.g.
specrouter:spec_decode_num_draft_tokens_total{level="qwen2.5-coder-0.5b"}).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from specrouter.drafters.memory import SuffixMemory
from specrouter.engine.batch import KvUse
from specrouter.engine.prefix_cache import PrefixCacheStats
from specrouter.engine.request import GenerationResult
from specrouter.metrics import SpecStats
from specrouter.router.policy.pacing import ChoicePacing

# vLLM's buckets: from one fast token to a long prompt on a busy CPU.
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0)
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                480.0, 960.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = reg = CollectorRegistry()
        p = "specrouter:"
        self.running = Gauge(p + "num_requests_running", "Requests generating now.", registry=reg)
        self.waiting = Gauge(p + "num_requests_waiting", "Requests queued for a batch slot.", registry=reg)
        self.batch_size = Histogram(p + "batch_size", "Sequences advanced by one scheduler step.",
                                    buckets=(1, 2, 4, 8, 16, 32, 64), registry=reg)
        self.ttft = Histogram(p + "time_to_first_token_seconds", "From arrival to the first streamed text.",
                              buckets=_TTFT_BUCKETS, registry=reg)
        self.itl = Histogram(p + "inter_token_latency_seconds",
                             "Between consecutive text deltas of a request (one delta per cycle: it may hold "
                             "several tokens).", buckets=_ITL_BUCKETS, registry=reg)
        self.e2e = Histogram(p + "e2e_request_latency_seconds", "From arrival to the last token.",
                             buckets=_E2E_BUCKETS, registry=reg)
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens of finished requests.", registry=reg)
        self.generation_tokens = Counter(p + "generation_tokens", "Generated tokens of finished requests.",
                                         registry=reg)
        self.success = Counter(p + "request_success", "Finished requests.", ["finished_reason"], registry=reg)
        self.failure = Counter(p + "request_failure", "Requests that did not finish (queue_full, invalid, "
                               "cancelled, timeout, error, stopped).", ["reason"], registry=reg)
        #: Speculation since the server started, counted cycle by cycle while requests run.
        self.spec_stats = SpecStats()
        reg.register(SpecCollector(lambda: [((), self.spec_stats)]))
        self.kv_sequences = Gauge(p + "kv_sequences", "Sequences holding KV cells in a model now.", ["model"],
                                  registry=reg)
        self.kv_tokens = Gauge(p + "kv_tokens", "Tokens held in a model's KV cache now, all sequences.", ["model"],
                               registry=reg)
        self._kv_models: set[str] = set()
        self.chain_cycles = Counter(p + "spec_decode_chain_cycles", "Cycles run per chain (the router's choices).",
                                    ["chain"], registry=reg)

    def watch_choices(self, pacing: ChoicePacing) -> None:
        """Export the choices of the router whose sessions share `pacing` (once per router)."""
        self.registry.register(ChoiceCollector(pacing))

    def watch_prefix_cache(self, stats: PrefixCacheStats) -> None:
        """Export a scheduler's prefix cache counters (once per scheduler)."""
        self.registry.register(PrefixCacheCollector(stats))

    def watch_memory(self, memory: SuffixMemory) -> None:
        """Export the cross-request suffix memory's size (once per memory)."""
        self.registry.register(MemoryCollector(memory))

    def kv(self, use: Mapping[str, KvUse]) -> None:
        """The live KV use per model (after every scheduler step); a model no sequence holds reads 0."""
        for name in self._kv_models - use.keys():
            self.kv_sequences.labels(name).set(0)
            self.kv_tokens.labels(name).set(0)
        for name, u in use.items():
            self.kv_sequences.labels(name).set(u.sequences)
            self.kv_tokens.labels(name).set(u.tokens)
        self._kv_models |= use.keys()

    def spec(self, counts: SpecStats) -> None:
        """What the levels did since the last call (BatchScheduler.take_spec_counts). The sum
        is a new object: a scrape reads one whole total, never one being added to."""
        self.spec_stats = self.spec_stats + counts

    def finished(self, result: GenerationResult) -> None:
        self.success.labels(result.finish_reason).inc()
        self.prompt_tokens.inc(result.prompt_tokens)
        self.generation_tokens.inc(len(result.token_ids))
        for i, (names, _) in enumerate(result.chains_used):
            self.chain_cycles.labels(",".join(names)).inc(result.chains_per_cycle.count(i))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


#: A SpecCollector's counts: per source, the values of its extra labels (none for one
#: server; a fleet's: the replica's name) and its speculation counts.
SpecSources = Callable[[], Iterable[tuple[tuple[str, ...], SpecStats]]]

#: The speculation families (vLLM's names, after specrouter:spec_decode_): help, labels.
_SPEC_FAMILIES = {
    "num_drafts": ("Blocks a level proposed to the level above it.", ("level",)),
    "num_draft_tokens": ("Tokens a level proposed to the level above it.", ("level",)),
    "num_accepted_tokens": ("Proposed tokens the level above accepted.", ("level",)),
    "num_accepted_tokens_per_pos": ("Blocks whose token at this position (0 first) and all before it were "
                                    "accepted.", ("level", "position")),
    "num_forwards": ("Model calls per level (0 for ngram).", ("level",)),
}


class SpecCollector(Collector):
    """Speculation counts (SpecStats) as counters, per level, read at each scrape: drafts,
    draft tokens, accepted tokens, accepted tokens per draft position and model calls. A
    level's drafting families have a sample once it drafted (the target never does), a
    position once a draft's token there was accepted, its calls once it made one."""

    #: The families it writes (a fleet writes these from its replicas' counts, not their text).
    FAMILIES = tuple(f"specrouter:spec_decode_{name}" for name in _SPEC_FAMILIES)

    def __init__(self, sources: SpecSources, labels: tuple[str, ...] = ()) -> None:
        """labels: the extra labels, after the family's own; each source gives their values."""
        self.sources, self.labels = sources, labels

    def collect(self) -> Iterator[Metric]:
        out = {name: CounterMetricFamily(f"specrouter:spec_decode_{name}", doc, labels=[*own, *self.labels])
               for name, (doc, own) in _SPEC_FAMILIES.items()}
        for values, stats in self.sources():
            for s in stats.values():
                level = [s.name, *values]
                if s.drafts:
                    out["num_drafts"].add_metric(level, s.drafts)
                    out["num_draft_tokens"].add_metric(level, s.proposed)
                    out["num_accepted_tokens"].add_metric(level, s.accepted)
                for j, n in enumerate(s.accepted_per_position):
                    if n:
                        out["num_accepted_tokens_per_pos"].add_metric([s.name, str(j), *values], n)
                if s.forwards:
                    out["num_forwards"].add_metric(level, s.forwards)
        yield from out.values()


class ChoiceCollector(Collector):
    """A router's choices, read off its ChoicePacing at each scrape (the router keeps the
    counts; this only exports them): routed cycles that deliberated or reused a recent
    decision (a fixed chain's cycles choose nothing and count in neither, nor does a request's
    first cycle, which feeds its prompt with the target alone), and the two
    timings that set how often it deliberates (absent until measured)."""

    def __init__(self, pacing: ChoicePacing) -> None:
        self.pacing = pacing

    def collect(self) -> Iterator[Metric]:
        p = self.pacing
        choices = CounterMetricFamily("specrouter:router_choices", "Routed cycles by how their chain was chosen: "
                                      "deliberated (measured, planned, ranked) or reused (a recent decision for "
                                      "the same kind of cycle).", labels=["decision"])
        choices.add_metric(["deliberated"], p.deliberated)
        choices.add_metric(["reused"], p.reused)
        yield choices
        for name, seconds, what in (("router_choice_seconds", p.deliberation, "a deliberation"),
                                    ("router_cycle_seconds", p.cycle, "a routed cycle without its choice")):
            if seconds is not None:
                yield GaugeMetricFamily("specrouter:" + name, f"Exponential average of the seconds {what} took.",
                                        value=seconds)


class PrefixCacheCollector(Collector):
    """The prefix cache's counters (engine/prefix_cache.py), in tokens as vLLM's
    prefix_cache_queries / prefix_cache_hits are: prompt tokens looked up, and of those the
    positions the target took from a finished request's cache."""

    def __init__(self, stats: PrefixCacheStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self.stats
        yield CounterMetricFamily("specrouter:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                                  value=s.queries)
        yield CounterMetricFamily("specrouter:prefix_cache_hits", "Prompt positions the target took from the prefix "
                                  "cache instead of computing them.", value=s.hits)


class MemoryCollector(Collector):
    """The cross-request suffix memory (drafters/memory.py), read at each scrape: the tokens
    it holds (every partition, separators included; at most its budget, the oldest evicted
    beyond it), the tokens ever added, and its budget."""

    def __init__(self, memory: SuffixMemory) -> None:
        self.memory = memory

    def collect(self) -> Iterator[Metric]:
        m = self.memory
        yield GaugeMetricFamily("specrouter:suffix_memory_tokens", "Tokens the cross-request suffix memory holds "
                                "(every partition).", value=len(m))
        yield CounterMetricFamily("specrouter:suffix_memory_added_tokens", "Tokens ever added to the cross-request "
                                  "suffix memory (evicted ones included).", value=m.total)
        yield GaugeMetricFamily("specrouter:suffix_memory_budget_tokens", "Tokens the cross-request suffix memory "
                                "keeps at most.", value=m.budget)

"""The fleet's shared state without Ray: pooled estimates, liveness, relabelled metrics, the
affinity policy."""

from collections import Counter

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specrouter.fleet.affinity import affinity_ranks, rendezvous_order
from specrouter.fleet.knowledge import FleetKnowledge, Report, pool_estimates
from specrouter.fleet.metrics import fleet_exposition
from specrouter.metrics import LevelStats, SpecStats
from specrouter.router.estimates.acceptance import AcceptanceEstimator
from specrouter.router.config import DEFAULT_CONFIG
from specrouter.router.estimates.learned import PairEstimate
from specrouter.server.metrics import Metrics

PERSIST_CAP = DEFAULT_CONFIG.persist_cap


def pair(mean, count, mode="greedy", proposer="small", verifier="target"):
    return PairEstimate(mode, proposer, verifier, mean, count)


def test_pooled_estimates_are_count_weighted_with_the_count_capped():
    pooled = pool_estimates([[pair(0.9, 30), pair(0.5, 10, proposer="mid")],
                             [pair(0.6, 10), pair(0.2, 0, proposer="ngram#4")]])
    assert pooled == [pair(0.5, 10, proposer="mid"), pair((0.9 * 30 + 0.6 * 10) / 40, 40)]
    assert pool_estimates([[pair(1.0, 150)], [pair(0.0, 150)]]) == [pair(0.5, PERSIST_CAP)]


def test_a_replica_report_replaces_its_previous_one_and_the_seed_stays():
    fleet = FleetKnowledge(seed=[pair(0.4, 20)])
    fleet.push(Report("a", estimates=[pair(0.8, 20)]))
    fleet.push(Report("a", estimates=[pair(1.0, 20)]))  # a's whole table now: not added to the first
    assert fleet.priors() == [pair(0.7, 40)]


def test_liveness_counts_recent_serving_replicas_and_dead_ones_keep_their_estimates():
    now = [0.0]
    fleet = FleetKnowledge(stale_seconds=3.0, clock=lambda: now[0])
    fleet.push(Report("a", estimates=[pair(0.9, 10)]))
    fleet.push(Report("b", alive=False))  # draining
    assert [r.replica for r in fleet.live()] == ["a", "b"] and fleet.serving() == 1
    now[0] = 2.0
    fleet.push(Report("b"))
    now[0] = 4.0  # a last heard 4 s ago
    assert [r.replica for r in fleet.live()] == ["b"] and fleet.serving() == 1
    assert fleet.priors() == [pair(0.9, 10)]  # what a learned outlives it


def test_what_the_replicas_learned_pools_uncapped_and_a_report_replaces_its_previous_one():
    fleet = FleetKnowledge(seed=[pair(0.4, 20)])  # the file the fleet started from: not learned here
    fleet.push(Report("a", learned=[pair(1.0, 100)]))
    fleet.push(Report("a", learned=[pair(1.0, 150), pair(0.5, 2, proposer="mid")]))  # cumulative: replaces
    fleet.push(Report("b", learned=[pair(0.0, 50)]))
    assert fleet.learned() == [pair(0.5, 2, proposer="mid"), pair(0.75, 200)]
    fleet.push(Report("b", learned=[pair(0.0, 150)]))  # the sum passes PERSIST_CAP: not capped
    assert fleet.learned() == [pair(0.5, 2, proposer="mid"), pair(0.5, 300)]


def test_estimates_seeded_from_a_snapshot_round_trip_with_the_cap():
    learned = AcceptanceEstimator()
    learned.set_global("small", "target", 0.75, count=500, mode="greedy")
    learned.set_global("ngram#4", "target", 0.5, count=3, mode="sampled")
    fresh = AcceptanceEstimator()
    fresh.seed(learned.snapshot())
    assert sorted(fresh.snapshot(), key=lambda e: e.key) == [PairEstimate("greedy", "small", "target", 0.75, PERSIST_CAP),
                                                              PairEstimate("sampled", "ngram#4", "target", 0.5, 3)]
    fresh.seed([pair(1.5, 10), pair(0.5, -1)])  # out of range: skipped
    assert len(fresh.snapshot()) == 2


def test_fleet_metrics_label_every_sample_with_its_replica():
    a, b = Metrics(), Metrics()
    a.generation_tokens.inc(5)
    b.generation_tokens.inc(7)
    a.spec(SpecStats.of([LevelStats("small", drafts=2)]))
    text = fleet_exposition([Report("a", metrics=a.exposition(), spec=a.spec_stats),
                             Report("b", metrics=b.exposition(), spec=b.spec_stats)]).decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert samples[("specrouter:generation_tokens_total", (("replica", "a"),))] == 5
    assert samples[("specrouter:generation_tokens_total", (("replica", "b"),))] == 7
    assert samples[("specrouter:spec_decode_num_drafts_total", (("level", "small"), ("replica", "a")))] == 2
    assert text.count("# TYPE specrouter:generation_tokens_total counter") == 1  # one family, not one per replica
    assert all("replica" in s.labels for fam in text_string_to_metric_families(text) for s in fam.samples)


def test_fleet_speculation_metrics_are_each_replicas_reported_counts_once():
    a, b = Metrics(), Metrics()
    a.spec(SpecStats.of([LevelStats("small", proposed=9, accepted=5, forwards=9, seconds=0.5, drafts=3,
                                    accepted_per_position=[2, 2, 1]), LevelStats("target", forwards=3)]))
    text_before = a.exposition()  # its text lags its counts: the fleet writes the counts
    a.spec(SpecStats.of([LevelStats("small", proposed=1, accepted=1, forwards=1, drafts=1,
                                    accepted_per_position=[1])]))
    b.spec(SpecStats.of([LevelStats("ngram", proposed=4, accepted=4, drafts=1, accepted_per_position=[1, 1, 1, 1]),
                         LevelStats("small", proposed=2, forwards=2, drafts=1), LevelStats("target", forwards=2)]))
    text = fleet_exposition([Report("a", metrics=text_before, spec=a.spec_stats),
                             Report("b", metrics=b.exposition(), spec=b.spec_stats)]).decode()
    listed = [(s.name.removeprefix("specrouter:spec_decode_num_"), tuple(sorted(s.labels.items())), s.value)
              for fam in text_string_to_metric_families(text) for s in fam.samples
              if s.name.startswith("specrouter:spec_decode_num_")]
    assert len({(n, labels) for n, labels, _ in listed}) == len(listed)  # each sample once

    def on(replica, level, position=None):
        labels = {"level": level, "replica": replica, **({"position": position} if position else {})}
        return tuple(sorted(labels.items()))

    assert sorted(listed) == sorted([
        ("drafts_total", on("a", "small"), 4), ("draft_tokens_total", on("a", "small"), 10),
        ("accepted_tokens_total", on("a", "small"), 6), ("forwards_total", on("a", "small"), 10),
        ("forwards_total", on("a", "target"), 3),
        ("accepted_tokens_per_pos_total", on("a", "small", "0"), 3),
        ("accepted_tokens_per_pos_total", on("a", "small", "1"), 2),
        ("accepted_tokens_per_pos_total", on("a", "small", "2"), 1),
        ("drafts_total", on("b", "ngram"), 1), ("draft_tokens_total", on("b", "ngram"), 4),
        ("accepted_tokens_total", on("b", "ngram"), 4),
        *(("accepted_tokens_per_pos_total", on("b", "ngram", str(j)), 1) for j in range(4)),
        ("drafts_total", on("b", "small"), 1), ("draft_tokens_total", on("b", "small"), 2),
        ("accepted_tokens_total", on("b", "small"), 0), ("forwards_total", on("b", "small"), 2),
        ("forwards_total", on("b", "target"), 2),
    ])


REPLICAS = [f"r{i}" for i in range(5)]


def test_rendezvous_keeps_a_key_on_its_replica_and_moves_only_the_keys_of_one_that_left():
    keys = [f"session-{i}" for i in range(400)]
    before = {k: rendezvous_order(k, REPLICAS)[0] for k in keys}
    assert before == {k: rendezvous_order(k, list(reversed(REPLICAS)))[0] for k in keys}  # order-free
    assert max(Counter(before.values()).values()) < 2 * 400 / 5  # spread
    after = {k: rendezvous_order(k, REPLICAS[1:])[0] for k in keys}
    moved = {k for k in keys if before[k] != after[k]}
    assert moved == {k for k in keys if before[k] == "r0"}


def test_affinity_prefers_the_keys_replica_within_the_slack_only():
    order = rendezvous_order("s", REPLICAS)
    loads = {r: 1 for r in REPLICAS}
    assert affinity_ranks("s", REPLICAS, loads, slack=2) == [order[:1], order[1:]]
    loads[order[0]] = 3  # 2 above the least loaded: still within the slack
    assert affinity_ranks("s", REPLICAS, loads, slack=2) == [order[:1], order[1:]]
    loads[order[0]] = 4  # 3 above
    assert affinity_ranks("s", REPLICAS, loads, slack=2) is None
    unknown = {r: None for r in REPLICAS}  # nothing known: no evidence of imbalance
    assert affinity_ranks("s", REPLICAS, unknown, slack=0) == [order[:1], order[1:]]
    assert affinity_ranks("s", [], {}, slack=2) is None


@pytest.mark.parametrize("slack", [0, 3])
def test_the_imbalance_bound_holds_when_every_request_has_the_same_key(slack):
    """Route 200 requests of one session, each to its first rank unless the policy declines
    (then to the least loaded, as power of two choices at its best): no replica ever carries
    more than slack + 1 above the least loaded."""
    loads = {r: 0 for r in REPLICAS}
    for _ in range(200):
        ranks = affinity_ranks("one session", REPLICAS, loads, slack)
        chosen = ranks[0][0] if ranks is not None else min(loads, key=loads.get)
        loads[chosen] += 1
        assert max(loads.values()) - min(loads.values()) <= slack + 1


def test_profiles_are_shared_per_cpu_model():
    fleet = FleetKnowledge()
    fleet.add_profiles("Xeon", {"m.json": "a"})
    fleet.add_profiles("Xeon", {"m.batch.json": "b"})
    fleet.add_profiles("EPYC", {"m.json": "c"})
    assert fleet.profiles("Xeon") == {"m.json": "a", "m.batch.json": "b"}
    assert fleet.profiles("EPYC") == {"m.json": "c"} and fleet.profiles("Arm") == {}

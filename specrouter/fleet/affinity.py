"""Which replica a request goes to: the one its conversation used before, unless it is busy.

A request may carry an affinity key (server/app.py: the `X-Session-ID` header, else the
body's `prompt_cache_key`, else its `user`, else nothing). Keyed requests prefer one replica, chosen by rendezvous hashing
(highest random weight over the live replicas: the same key picks the same replica while it
lives, and when a replica joins or leaves only the keys that preferred it move), so that
replica's suffix memory and router estimates for that conversation stay warm.

Load bound: the preferred replica is taken only while its ongoing requests (Ray Serve's
queue-length cache) exceed the least loaded replica's by at most `slack`; beyond that the
request is routed as an unkeyed one (power of two choices, the least loaded of two random
replicas). So keyed traffic never makes a replica carry more than `slack` + 1 requests
above the least loaded one, as the router sees them (the cache lags by the requests
routed since a replica last answered). A preferred replica whose queue is full
(max_ongoing_requests) is skipped by Ray Serve, which goes on to the next rank: the
others, in rendezvous order.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence

from ray.serve.request_router import LocalityMixin, MultiplexMixin, PendingRequest, RequestRouter, RunningReplica

#: The keyword argument of EngineReplica.generate that carries the key (None: no affinity).
AFFINITY_KWARG = "affinity"
#: Ongoing requests the preferred replica may carry above the least loaded one.
DEFAULT_SLACK = 2


def rendezvous_order(key: str, replicas: Sequence[str]) -> list[str]:
    """The replicas from most to least preferred for `key` (highest random weight)."""
    def weight(replica: str) -> bytes:
        return hashlib.blake2b(f"{key}\0{replica}".encode(), digest_size=8).digest()
    return sorted(replicas, key=weight, reverse=True)


def affinity_ranks(key: str, replicas: Sequence[str], loads: Mapping[str, int | None],
                   slack: int) -> list[list[str]] | None:
    """[[preferred], [the others, in preference order]], or None when the preferred replica
    is more than `slack` ongoing requests above the least loaded (loads: None where
    unknown; an unknown load is no evidence of imbalance)."""
    if not replicas:
        return None
    order = rendezvous_order(key, replicas)
    known = [n for n in loads.values() if n is not None]
    preferred = loads.get(order[0])
    if preferred is not None and known and preferred - min(known) > slack:
        return None
    return [order[:1], order[1:]]


class AffinityRouter(LocalityMixin, MultiplexMixin, RequestRouter):
    """Ray Serve's request-router extension point with the policy above. Not FIFO: a replica
    found for one request is given to that request (Ray Serve's FIFOMixin hands it to the
    oldest waiting one, which would undo the affinity)."""

    def initialize_state(self, slack: int = DEFAULT_SLACK) -> None:
        self._slack = slack

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        key = pending_request.kwargs.get(AFFINITY_KWARG) if pending_request is not None else None
        if key and candidate_replicas:
            by_id = {r.replica_id.to_full_id_str(): r for r in candidate_replicas}
            loads = {rid: self._replica_queue_len_cache.get(r.replica_id) for rid, r in by_id.items()}
            ranks = affinity_ranks(key, list(by_id), loads, self._slack)
            if ranks is not None:
                return [[by_id[rid] for rid in rank] for rank in ranks if rank]
        return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]

"""A fleet across two Ray nodes on this machine (ray.cluster_utils.Cluster): a node that goes
away takes its replica with it; that replica's requests end cleanly, the others complete, and
the fleet serves on."""

import threading
import time

import openai
import pytest
import ray
from ray import serve
from ray.cluster_utils import Cluster

from specrouter.fleet.affinity import rendezvous_order
from specrouter.fleet.deploy import APP_NAME, start_fleet
from specrouter.server.config import RayConfig, ServeConfig

from ..server_synth import MODEL, MODELS, SynthBuild, reference_text
from .local_ray import connect

pytestmark = pytest.mark.ray

@pytest.fixture(scope="module")
def two_nodes():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    worker = cluster.add_node(num_cpus=2)
    try:
        url = connect(address=cluster.address)
        config = ServeConfig(models=MODELS, ray=RayConfig(enabled=True, replicas=2, sync_seconds=0.3))
        yield cluster, worker, url, start_fleet(SynthBuild(config, sleep=True))
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()


def test_a_node_that_goes_away_ends_its_replicas_requests_cleanly(two_nodes):
    cluster, worker, url, knowledge = two_nodes
    deadline = time.monotonic() + 60
    live = ray.get(knowledge.live.remote())
    while {r.node for r in live} != {cluster.head_node.node_id, worker.node_id}:
        assert time.monotonic() < deadline, "the replicas did not spread over both nodes"
        time.sleep(0.2)
        live = ray.get(knowledge.live.remote())
    # Session keys that prefer the worker's replica and the head's, alternately (fleet/affinity.py;
    # the router knows a replica by its actor's name). Unkeyed, nothing sent any of the six to
    # the worker's, and once all six completed.
    node_of = {f"SERVE_REPLICA::{APP_NAME}#EngineReplica#{r.replica}": r.node for r in live}
    keys: dict[str, list[str]] = {worker.node_id: [], cluster.head_node.node_id: []}
    for j in range(1000):
        preferred = keys[node_of[rendezvous_order(f"node-session-{j}", list(node_of))[0]]]
        if len(preferred) < 3:
            preferred.append(f"node-session-{j}")
    sessions = [key for pair in zip(*keys.values(), strict=True) for key in pair]
    client = openai.OpenAI(api_key="unused", base_url=url + "/v1", max_retries=0, timeout=120)
    outcomes, lock = [], threading.Lock()
    #: Set once a stream's first text arrived (a replica is writing it) or it ended before any.
    streaming = [threading.Event() for _ in range(6)]

    def stream(i: int) -> None:
        prompt = f"node {chr(97 + i)}"
        try:
            chunks = client.completions.create(model=MODEL, prompt=prompt, max_tokens=400, temperature=0, stream=True,
                                               extra_headers={"X-Session-ID": sessions[i]})
            parts = []
            for c in chunks:
                parts.extend(choice.text for choice in c.choices)
                streaming[i].set()
            outcome = "complete" if "".join(parts) == reference_text(prompt, 400) else "wrong text"
        except openai.APIError as exc:
            outcome = "replica lost" if exc.body.get("code") == "replica_lost" else f"other error {exc.body}"
        finally:
            streaming[i].set()
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    # Every stream is on a replica before the node goes.
    assert all(e.wait(60) for e in streaming), "a stream did not start"
    cluster.remove_node(worker, allow_graceful=False)
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a stream hangs"
    assert set(outcomes) <= {"complete", "replica lost"} and "replica lost" in outcomes, outcomes
    r = client.completions.create(model=MODEL, prompt="still here", max_tokens=16, temperature=0)
    assert r.choices[0].text == reference_text("still here", 16)

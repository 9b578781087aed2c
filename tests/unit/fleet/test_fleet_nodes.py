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

from specrouter.fleet.deploy import start_fleet
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
    while {r.node for r in ray.get(knowledge.live.remote())} != {cluster.head_node.node_id, worker.node_id}:
        assert time.monotonic() < deadline, "the replicas did not spread over both nodes"
        time.sleep(0.2)
    client = openai.OpenAI(api_key="unused", base_url=url + "/v1", max_retries=0, timeout=120)
    outcomes, lock = [], threading.Lock()

    def stream(i: int) -> None:
        prompt = f"node {chr(97 + i)}"
        try:
            chunks = client.completions.create(model=MODEL, prompt=prompt, max_tokens=400, temperature=0, stream=True)
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            outcome = "complete" if text == reference_text(prompt, 400) else "wrong text"
        except openai.APIError as exc:
            outcome = "replica lost" if exc.body.get("code") == "replica_lost" else f"other error {exc.body}"
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    cluster.remove_node(worker, allow_graceful=False)
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a stream hangs"
    assert set(outcomes) <= {"complete", "replica lost"} and "replica lost" in outcomes, outcomes
    r = client.completions.create(model=MODEL, prompt="still here", max_tokens=16, temperature=0)
    assert r.choices[0].text == reference_text("still here", 16)

"""`specrouter serve --ray` on a local Ray instance (started once for the module), over the
synthetic pool: 2 engine replicas behind the ingress, driven by the official openai client."""

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import ray
from prometheus_client.parser import text_string_to_metric_families
from ray import serve

from specrouter.errors import ModelFileError
from specrouter.fleet.deploy import APP_NAME, FleetStartError, drain_fleet, save_fleet, start_fleet
from specrouter.router.config import DEFAULT_CONFIG
from specrouter.router.estimates.store import RouterStore
from specrouter.server.config import RayConfig, ServeConfig

from ..server.test_robustness import error_of, sse_data
from ..server_synth import MODEL, MODELS, SynthBuild, build_service, reference_text, running_server
from .local_ray import connect

PERSIST_CAP = DEFAULT_CONFIG.persist_cap

pytestmark = pytest.mark.ray

SYNC = 0.3  # seconds between a replica's reports


@pytest.fixture(scope="module")
def fleet():
    try:
        url = connect(num_cpus=4, include_dashboard=False)
        config = ServeConfig(models=MODELS, ray=RayConfig(enabled=True, replicas=2, sync_seconds=SYNC))
        yield url, start_fleet(SynthBuild(config, sleep=True))
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def client(fleet):
    with openai.OpenAI(api_key="unused", base_url=fleet[0] + "/v1", max_retries=0, timeout=60) as c:
        yield c


def replica_actors() -> dict[str, object]:
    """The engine replicas' actors by replica id."""
    found = {}
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry["name"].startswith(f"SERVE_REPLICA::{APP_NAME}#EngineReplica#"):
            found[entry["name"].rsplit("#", 1)[1]] = ray.get_actor(entry["name"], namespace=entry["namespace"])
    return found


def successes(url: str) -> dict[str, float]:
    """Finished requests per replica, from the fleet's /metrics."""
    counts: dict[str, float] = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in fam.samples:
            if s.name == "specrouter:request_success_total":
                counts[s.labels["replica"]] = counts.get(s.labels["replica"], 0) + s.value
    return counts


def settled_successes(url: str) -> dict[str, float]:
    """successes() once every replica has reported what it finished (two reads, several
    report periods apart, agree)."""
    last = successes(url)
    while True:
        time.sleep(4 * SYNC)
        now = successes(url)
        if now == last:
            return now
        last = now


def wait_for(predicate, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_plain_and_streamed_greedy_text_equal_the_single_process_servers(fleet, client):
    whole = client.completions.create(model=MODEL, prompt="hello there", max_tokens=40, temperature=0)
    assert whole.choices[0].text == reference_text("hello there", 40) and whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 40 and whole.usage.speculation["levels"][-1]["name"] == MODEL
    chat = [{"role": "user", "content": "write letters"}]
    chunks = list(client.chat.completions.create(model=MODEL, messages=chat, max_tokens=30, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reference_text(max_tokens=30, messages=chat)
    assert chunks[-1].usage.completion_tokens == 30
    r = httpx.get(fleet[0] + "/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


BAD_REQUESTS = [
    ("/completions", {"model": "nope", "prompt": "x", "max_tokens": 2}),
    ("/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2, "speculation": {"chain": "zzz"}}),
    ("/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 99}),
    ("/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2, "frobnicate": 1}),
    ("/completions", {"model": MODEL, "prompt": [99999], "max_tokens": 2}),
]


def test_errors_are_the_single_process_servers(fleet):
    service, _ = build_service()
    with running_server(service) as (single, _):
        for path, body in BAD_REQUESTS:
            mine, theirs = (httpx.post(f"{url}/v1{path}", json=body) for url in (fleet[0], single))
            assert (mine.status_code, mine.json()) == (theirs.status_code, theirs.json()), body
            assert mine.status_code in (400, 404)


def test_eight_concurrent_streams_each_get_their_own_text(client):
    prompts = [f"prompt {chr(97 + i)} {'q' * i}" for i in range(8)]

    def stream(prompt: str) -> str:
        chunks = client.completions.create(model=MODEL, prompt=prompt, max_tokens=48, temperature=0, stream=True)
        return "".join(c.choices[0].text for c in chunks if c.choices)

    with ThreadPoolExecutor(8) as pool:
        texts = list(pool.map(stream, prompts))
    assert texts == [reference_text(p, 48) for p in prompts]


def test_the_engine_replicas_run_at_nice_0(fleet):
    """Ray starts its worker processes at nice 15 (below its daemons); a fleet's replicas run
    the models and must not yield to every other process of their node (deploy.SERVE_ENV)."""
    actors = replica_actors()
    assert len(actors) == 2
    assert ray.get([a.__ray_call__.remote(lambda self: os.nice(0)) for a in actors.values()]) == [0, 0]


def test_a_session_stays_on_one_replica_and_metrics_carry_the_replica(fleet, client):
    url = fleet[0]
    before = settled_successes(url)
    for _ in range(6):
        client.completions.create(model=MODEL, prompt="again", max_tokens=4, temperature=0,
                                  extra_headers={"X-Session-ID": "conversation-7"})
    after = settled_successes(url)
    assert len(after) == 2
    assert sorted(after[r] - before.get(r, 0) for r in after) == [0, 6]


def test_on_exit_the_fleet_merges_what_its_replicas_learned_into_the_file(fleet, tmp_path):
    """save_fleet pools the replicas' own scores with the file as it is now: a pair another
    process saved there while the fleet ran stays."""
    knowledge = fleet[1]
    learned = wait_for(lambda: ray.get(knowledge.learned.remote()))
    while True:  # settled: the replicas' latest reports hold every request served so far
        time.sleep(4 * SYNC)
        now = ray.get(knowledge.learned.remote())
        if now == learned:
            break
        learned = now
    file = tmp_path / "acceptance.json"
    file.write_text(json.dumps({"format": 2, "estimates": {"greedy|elsewhere|target": [0.5, 8]}}))
    save_fleet(knowledge, RouterStore(tmp_path))
    saved = json.loads(file.read_text())["estimates"]
    assert saved.pop("greedy|elsewhere|target") == [0.5, 8.0]
    assert saved == {e.key: [pytest.approx(e.mean), min(e.count, PERSIST_CAP)] for e in learned}


def test_replica_death_ends_its_requests_cleanly_others_go_on_and_the_restart_starts_informed(fleet, client):
    url, knowledge = fleet
    replicas = replica_actors()
    assert len(replicas) == 2
    learned = {e.key: e.mean for e in ray.get(knowledge.priors.remote())}
    assert ("greedy|small|target" in learned) or any(k.startswith("greedy|ngram") for k in learned)
    outcomes: list[str] = []
    lock = threading.Lock()

    def run(i: int) -> None:
        """Even i: streamed; odd i: a plain request (its error: a 503 with the same code)."""
        prompt = f"long {chr(97 + i)}"
        try:
            if i % 2:
                r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=400, temperature=0)
                text = r.choices[0].text
            else:
                chunks = client.completions.create(model=MODEL, prompt=prompt, max_tokens=400, temperature=0,
                                                   stream=True)
                text = "".join(c.choices[0].text for c in chunks if c.choices)
            outcome = "complete" if text == reference_text(prompt, 400) else f"wrong text {text!r}"
        except openai.APIStatusError as exc:  # a plain request's error response
            lost = i % 2 and exc.status_code == 503 and exc.body.get("code") == "replica_lost"
            outcome = "replica lost" if lost else f"other error {exc.status_code} {exc.body}"
        except openai.APIError as exc:  # an error event in a stream
            lost = not i % 2 and exc.body.get("code") == "replica_lost"
            outcome = "replica lost" if lost else f"other error {exc.body}"
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # streams running on both replicas
    victim, survivor = sorted(replicas)
    ray.kill(replicas[victim], no_restart=True)
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a stream hangs"
    assert set(outcomes) <= {"complete", "replica lost"}, outcomes
    assert "replica lost" in outcomes and "complete" in outcomes
    # Sent after the kill: served (by the survivor, or the restarted replica).
    for i in range(3):
        r = client.completions.create(model=MODEL, prompt=f"after {i}", max_tokens=16, temperature=0)
        assert r.choices[0].text == reference_text(f"after {i}", 16)
    # Ray Serve restarts the dead replica; the new one seeded its router from the fleet.
    new = wait_for(lambda: [r for r in replica_actors() if r not in replicas])
    priors = {e.key: e.mean for e in ray.get(knowledge.priors.remote())}
    report = wait_for(lambda: [r for r in ray.get(knowledge.live.remote()) if r.replica == new[0]])[0]
    reported = {e.key: e.mean for e in report.estimates}
    assert reported.keys() >= learned.keys()
    # What it reports came from the fleet: it equals the pooled estimate for every pair it did not run.
    agreeing = [k for k in learned if reported[k] == pytest.approx(priors[k], abs=0.05)]
    assert len(agreeing) >= len(learned) // 2, (reported, priors)


def test_a_replica_that_cannot_load_its_models_names_its_node_and_the_file():
    class MissingModel(SynthBuild):
        def engine(self):
            raise ModelFileError("model file /models/absent.gguf is missing (run `specrouter pull`)")

    with pytest.raises(FleetStartError) as info:
        start_fleet(MissingModel(ServeConfig(models=MODELS)), name="broken", route_prefix="/broken")
    text = str(info.value)
    assert "cannot start" in text and "absent.gguf" in text and ray.util.get_node_ip_address() in text


def test_a_drain_refuses_new_requests_and_ends_those_past_the_grace_cleanly(fleet):
    """serve --ray's graceful shutdown (drain_fleet, what SIGTERM runs before the application
    is deleted), as the single-process server's: a request sent while draining gets 503 with
    Retry-After and /health is 503; past the grace period a stream ends with an error event
    then [DONE] and a plain request gets a 503 body, both shutting_down (not replica_lost)."""
    base = fleet[0] + "/draining"
    start_fleet(SynthBuild(ServeConfig(models=MODELS, ray=RayConfig(enabled=True, replicas=1, sync_seconds=SYNC)),
                           sleep=True), name="draining", route_prefix="/draining")
    long = {"model": MODEL, "prompt": "abc", "max_tokens": 480, "speculation": "off"}
    out: dict[str, object] = {}
    streaming = threading.Event()

    def stream():
        with httpx.stream("POST", base + "/v1/completions", timeout=60, json={**long, "stream": True}) as r:
            lines = r.iter_lines()
            first = next(lines)
            streaming.set()
            out["stream"] = sse_data([first, *lines])

    def plain():
        out["plain"] = httpx.post(base + "/v1/completions", timeout=60, json=long)

    try:
        threads = [threading.Thread(target=stream), threading.Thread(target=plain)]
        for t in threads:
            t.start()
        assert streaming.wait(60)
        started = time.monotonic()
        drainer = threading.Thread(target=drain_fleet, args=(1.0, "draining"))
        drainer.start()
        wait_for(lambda: httpx.get(base + "/health").status_code == 503, timeout=10)
        refused = httpx.post(base + "/v1/completions", timeout=60, json={**long, "max_tokens": 2})
        assert error_of(refused, 503)["code"] == "shutting_down" and refused.headers["retry-after"] == "1"
        for t in [*threads, drainer]:
            t.join(timeout=60)
        ended = time.monotonic() - started
    finally:
        serve.delete("draining")
    assert 1.0 <= ended < 1.0 + 10, ended
    data = out["stream"]
    assert data[-1] == "[DONE]" and json.loads(data[-2])["error"]["code"] == "shutting_down"
    assert all("choices" in json.loads(d) for d in data[:-2]) and len(data) > 3  # it streamed, then ended cleanly
    assert error_of(out["plain"], 503)["code"] == "shutting_down"

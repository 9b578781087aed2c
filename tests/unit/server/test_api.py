"""The HTTP API on a real loopback server: the official openai client, raw HTTP for errors."""

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ..server_synth import MODEL, build_engine, build_service, leaked_kv, reference_text, running_server, wait_until

CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "write letters"}]


@pytest.fixture(scope="module")
def engine():
    return build_engine()


@pytest.fixture(scope="module")
def server(engine):
    built, models = engine
    with running_server(built.service) as (url, _):
        yield url, built.service, models


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(api_key="unused", base_url=server[0] + "/v1", max_retries=0) as c:
        yield c


def metric_samples(url: str) -> dict[tuple, float]:
    text = httpx.get(url + "/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list()] == [MODEL]
    r = httpx.get(server[0] + "/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def test_completion_is_the_targets_greedy_text_with_speculative_usage(client):
    r = client.completions.create(model=MODEL, prompt="hello there", max_tokens=40, temperature=0)
    assert r.object == "text_completion" and r.model == MODEL and r.id.startswith("cmpl-")
    assert r.choices[0].text == reference_text("hello there", 40)
    assert r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (11, 40, 51)
    spec = r.usage.speculation
    assert spec["levels"][-1]["name"] == MODEL and spec["cycles"] == sum(c["cycles"] for c in spec["chains_used"])
    assert spec["mean_tokens_per_cycle"] == pytest.approx(40 / spec["cycles"])
    assert all(0 <= lv["accepted"] <= lv["proposed"] for lv in spec["levels"])


def test_streamed_completion_concatenates_to_the_non_streamed_text(client):
    kw = dict(model=MODEL, prompt="stream me", max_tokens=50, temperature=0)
    whole = client.completions.create(**kw)
    chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert "".join(texts) == whole.choices[0].text == reference_text("stream me", 50)
    assert [c.choices[0].finish_reason for c in chunks if c.choices] == [None] * (len(texts) - 1) + ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 50
    assert chunks[-1].usage.speculation["levels"][-1]["name"] == MODEL
    assert len({c.id for c in chunks}) == 1


def test_chat_completion_streamed_and_not(client):
    whole = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=30, temperature=0)
    assert whole.object == "chat.completion" and whole.choices[0].message.role == "assistant"
    assert whole.choices[0].message.content == reference_text(messages=CHAT, max_tokens=30)
    assert whole.usage.completion_tokens == 30 and whole.usage.speculation["cycles"] >= 1
    chunks = list(client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=30, temperature=0,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_max_completion_tokens_and_stop_strings(client):
    full = reference_text(messages=CHAT, max_tokens=30)
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_completion_tokens=7, temperature=0)
    assert r.choices[0].message.content == full[:7]
    stop = full[12:14]
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=30, temperature=0, stop=[stop])
    assert r.choices[0].message.content == full[: full.find(stop)] and r.choices[0].finish_reason == "stop"


def test_token_id_prompt_equals_text_prompt(client):
    ids = [0, 1, 2]  # "abc": the synthetic letters
    assert (client.completions.create(model=MODEL, prompt=ids, max_tokens=12, temperature=0).choices[0].text
            == reference_text("abc", 12))


@pytest.mark.parametrize("speculation,chain", [
    ("off", [MODEL]),
    ({"chain": ["small", "mid", MODEL], "draft_lengths": [2, 3]}, ["small", "mid", MODEL]),
    ({"chain": ["ngram", "mid", MODEL]}, ["ngram", "mid", MODEL]),
])
def test_speculation_extension_picks_the_chain_and_stays_lossless(client, speculation, chain):
    r = client.completions.create(model=MODEL, prompt="speculate", max_tokens=30, temperature=0,
                                  extra_body={"speculation": speculation})
    assert r.choices[0].text == reference_text("speculate", 30)
    spec = r.usage.speculation
    assert spec["chain"] == chain and [lv["name"] for lv in spec["levels"]] == chain
    lengths = speculation["draft_lengths"] if isinstance(speculation, dict) and "draft_lengths" in speculation else [4] * (len(chain) - 1)
    assert spec["draft_lengths"] == lengths and len(spec["chains_used"]) == 1


def test_sampling_with_a_seed_is_reproducible_and_streams_the_same_text(client):
    kw = dict(model=MODEL, prompt="sample", max_tokens=40, temperature=0.9, top_p=0.95, seed=1234,
              extra_body={"speculation": {"chain": ["small", MODEL], "draft_lengths": [3]}})
    a = client.completions.create(**kw).choices[0].text
    b = client.completions.create(**kw).choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(**kw, stream=True))
    assert a == b == streamed and len(a) == 40


def test_metrics_count_requests_tokens_and_speculation(server, client):
    url = server[0]
    before = metric_samples(url)
    r = client.completions.create(model=MODEL, prompt="count", max_tokens=25, temperature=0,
                                  extra_body={"speculation": {"chain": ["small", MODEL], "draft_lengths": [2]}})
    after = metric_samples(url)

    def grew(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0) - before.get(key, 0)

    small = r.usage.speculation["levels"][0]
    assert grew("specrouter:request_success_total", finished_reason="length") == 1
    assert grew("specrouter:generation_tokens_total") == 25 and grew("specrouter:prompt_tokens_total") == 5
    assert grew("specrouter:spec_decode_num_draft_tokens_total", level="small") == small["proposed"] > 0
    assert grew("specrouter:spec_decode_num_accepted_tokens_total", level="small") == small["accepted"]
    per_position = [grew("specrouter:spec_decode_num_accepted_tokens_per_pos_total", level="small", position=str(j))
                    for j in range(3)]
    assert sum(per_position) == small["accepted"] and per_position[0] >= per_position[1] and per_position[2] == 0
    assert 0 < grew("specrouter:spec_decode_num_drafts_total", level="small") <= r.usage.speculation["cycles"]
    assert grew("specrouter:spec_decode_num_forwards_total", level="small") == small["forwards"]
    assert grew("specrouter:spec_decode_chain_cycles_total", chain=f"small,{MODEL}") == r.usage.speculation["cycles"]
    assert grew("specrouter:time_to_first_token_seconds_count") == 1
    assert grew("specrouter:e2e_request_latency_seconds_count") == 1
    assert after[("specrouter:num_requests_running", ())] == 0 == after[("specrouter:num_requests_waiting", ())]
    for name in ("specrouter:inter_token_latency_seconds_count", "specrouter:batch_size_count"):
        assert (name, ()) in after


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    return body["error"]


@pytest.mark.parametrize("body,param,code", [
    ({"model": MODEL}, "prompt", "missing"),
    ({"model": MODEL, "prompt": "a", "temperature": -1}, "temperature", "greater_than_equal"),
    ({"model": MODEL, "prompt": "a", "top_p": 0}, "top_p", "greater_than"),
    ({"model": MODEL, "prompt": "a", "max_tokens": 0}, "max_tokens", "greater_than_equal"),
    ({"model": MODEL, "prompt": "a", "n": 17}, "n", "less_than_equal"),
    ({"model": MODEL, "prompt": "a", "stop": ""}, "stop", "string_too_short"),
    ({"model": MODEL, "prompt": "a", "speculation": "fast"}, "speculation", "literal_error"),
    ({"model": MODEL, "prompt": [99]}, "prompt", "invalid_token_id"),
    ({"model": MODEL, "prompt": ""}, None, "empty_prompt"),
    ({"model": MODEL, "prompt": "x" * 600}, None, "prompt_too_long"),
    ({"model": MODEL, "prompt": "a", "speculation": {"chain": ["small"]}}, None, "invalid_parameter"),
    ({"model": MODEL, "prompt": "a", "speculation": {"chain": ["/etc/passwd", MODEL]}}, "speculation.chain",
     "invalid_chain"),
    ({"model": MODEL, "prompt": "a", "speculation": {"chain": ["small", MODEL], "draft_lengths": [1, 2]}}, None,
     "invalid_parameter"),
])
def test_invalid_completion_requests_get_400_with_an_openai_error_body(server, body, param, code):
    err = error_of(httpx.post(server[0] + "/v1/completions", json=body), 400)
    assert (err["type"], err["param"], err["code"]) == ("invalid_request_error", param, code)


def test_malformed_bodies_unknown_models_and_paths(server):
    url = server[0]
    err = error_of(httpx.post(url + "/v1/chat/completions", content=b"{nope",
                              headers={"content-type": "application/json"}), 400)
    assert err["code"] == "json_invalid"
    err = error_of(httpx.post(url + "/v1/chat/completions", json={"model": MODEL, "messages": []}), 400)
    assert err["param"] == "messages"
    err = error_of(httpx.post(url + "/v1/chat/completions",
                              json={"model": MODEL, "messages": [{"role": "robot", "content": "x"}]}), 400)
    assert err["param"] == "messages" and "messages.0.role" in err["message"]
    err = error_of(httpx.post(url + "/v1/completions", json={"model": "gpt-4", "prompt": "a"}), 404)
    assert (err["param"], err["code"]) == ("model", "model_not_found")
    error_of(httpx.get(url + "/v1/nothing"), 404)
    error_of(httpx.get(url + "/v1/completions"), 405)


def test_the_openai_client_raises_its_typed_errors(client):
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model=MODEL, prompt="a", temperature=5)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="gpt-4", messages=CHAT)


def test_no_sequence_is_left_behind(server):
    _, service, models = server
    assert wait_until(lambda: service.live_sequences == 0) and leaked_kv(models) == 0


def test_a_vanishing_temperature_is_greedy(client):
    r = client.completions.create(model=MODEL, prompt="tiny", max_tokens=20, temperature=1e-300)
    assert r.choices[0].text == reference_text("tiny", 20)


def test_served_model_names_are_the_targets_and_responses_report_the_first():
    service, _ = build_service()
    with running_server(service, served_model_name=["gpt-x", "alias"]) as (url, _):
        assert [m["id"] for m in httpx.get(url + "/v1/models").json()["data"]] == ["gpt-x", "alias"]
        r = httpx.post(url + "/v1/completions", json={"model": "alias", "prompt": "abc", "max_tokens": 4,
                                                      "temperature": 0}).json()
        assert r["model"] == "gpt-x" and r["choices"][0]["text"] == reference_text("abc", 4)
        err = error_of(httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "a"}), 404)
        assert err["message"] == f"the model `{MODEL}` does not exist: this server serves `gpt-x`, `alias`"


def test_speculation_counters_move_while_a_request_runs():
    """Live metrics (openai-complete): the draft counters grow cycle by cycle, not when a
    request ends; here read while a long stream is still running."""
    service, _ = build_service(sleep=True)
    with running_server(service) as (url, _):
        body = {"model": MODEL, "prompt": "abc", "max_tokens": 400, "temperature": 0, "stream": True,
                "speculation": {"chain": ["small", MODEL], "draft_lengths": [3]}}
        key = ("specrouter:spec_decode_num_draft_tokens_total", (("level", "small"),))
        seen = []
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
            for i, line in enumerate(r.iter_lines()):
                if i in (10, 40):  # two reads mid-stream
                    samples = metric_samples(url)
                    seen.append(samples.get(key, 0))
                    assert samples.get(("specrouter:request_success_total", (("finished_reason", "length"),)), 0) == 0
        assert 0 < seen[0] < seen[1]


def test_metrics_count_the_routers_choices_per_routed_cycle(server, client, engine):
    """Every cycle of an `auto` request but its first (the target feeds the prompt alone: no
    choice) is one choice of the router, deliberated or reused (router/pacing.py); a fixed
    chain's cycles choose nothing. The counts are the router's own."""
    url, pacing = server[0], engine[0].router.pacing
    before = metric_samples(url)
    routed = client.completions.create(model=MODEL, prompt="route these letters", max_tokens=40, temperature=0,
                                       extra_body={"speculation": "auto"})
    client.completions.create(model=MODEL, prompt="fixed", max_tokens=20, temperature=0,
                              extra_body={"speculation": {"chain": ["small", MODEL], "draft_lengths": [2]}})
    after = metric_samples(url)

    def grew(decision):
        key = ("specrouter:router_choices_total", (("decision", decision),))
        return after.get(key, 0) - before.get(key, 0)

    assert routed.choices[0].text == reference_text("route these letters", 40)
    assert grew("deliberated") + grew("reused") == routed.usage.speculation["cycles"] - 1 > 1
    assert grew("deliberated") >= 1  # a request's first choice deliberates
    for decision in ("deliberated", "reused"):
        assert after[("specrouter:router_choices_total", (("decision", decision),))] == getattr(pacing, decision)
    assert after[("specrouter:router_choice_seconds", ())] == pacing.deliberation > 0
    assert after[("specrouter:router_cycle_seconds", ())] == pacing.cycle > 0


def test_a_chats_next_turn_takes_the_conversation_from_the_prefix_cache_and_says_so():
    """usage.prompt_tokens_details.cached_tokens (OpenAI's field) counts the prompt positions
    the target took from the finished turn: all of turn 1 but its last token. The text is the
    target's; /metrics counts the lookups and hits in tokens; the kept turn holds the only
    cells left, one sequence per model."""
    built, models = build_engine(prefix_cache=2)
    with running_server(built.service) as (url, _), \
            openai.OpenAI(api_key="unused", base_url=url + "/v1", max_retries=0) as client:
        first = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=20, temperature=0)
        turn = [*CHAT, {"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "more"}]
        second = client.chat.completions.create(model=MODEL, messages=turn, max_tokens=20, temperature=0)
        assert second.choices[0].message.content == reference_text(messages=turn, max_tokens=20)
        assert first.usage.prompt_tokens_details.cached_tokens == 0
        assert second.usage.prompt_tokens_details.cached_tokens == first.usage.prompt_tokens + 20 - 1
        samples = metric_samples(url)
        assert samples[("specrouter:prefix_cache_hits_total", ())] == first.usage.prompt_tokens + 19
        assert samples[("specrouter:prefix_cache_queries_total", ())] == (first.usage.prompt_tokens
                                                                          + second.usage.prompt_tokens)
        assert wait_until(lambda: built.service.live_sequences == 0)
        assert models[2].live_sequences == 1 and leaked_kv(models) <= len(models)  # the kept turn only


def test_the_prefix_cache_serves_only_requests_with_the_same_key_and_cache_salt():
    """A prompt sent again takes all of it but its last token from the cache, unless an
    earlier request with another API key or another cache_salt left it (vLLM's cache_salt);
    the text is the target's either way."""
    built, _ = build_engine(prefix_cache=4)
    with running_server(built.service) as (url, _):
        def send(key: str, **extra) -> tuple[int, int]:
            with openai.OpenAI(api_key=key, base_url=url + "/v1", max_retries=0) as client:
                r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=6, temperature=0,
                                                   extra_body=extra or None)
            assert r.choices[0].message.content == reference_text(messages=CHAT, max_tokens=6)
            return r.usage.prompt_tokens_details.cached_tokens, r.usage.prompt_tokens

        cached, prompt = send("key-a")
        assert cached == 0
        assert send("key-b") == (0, prompt)
        assert send("key-a", cache_salt="salt") == (0, prompt)
        assert send("key-a") == (prompt - 1, prompt)
        assert send("key-a", cache_salt="salt") == (prompt - 1, prompt)
        assert send("key-b", cache_salt="salt") == (0, prompt)


@pytest.mark.parametrize(("salt", "message"), [(5, "Input should be a valid string"),
                                               ("", "String should have at least 1 character")])
def test_a_cache_salt_that_is_not_a_nonempty_string_is_a_400_naming_the_field(salt, message):
    built, _ = build_engine(prefix_cache=1)
    with running_server(built.service) as (url, _):
        r = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "x", "cache_salt": salt})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "cache_salt" and message in error["message"]

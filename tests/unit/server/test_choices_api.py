"""n > 1 (openai-complete, item 5): several choices per request, each its own sequence of the
batch with its own random stream (choice 0: the seed's own, as the request alone), whole and
streamed, usage over all of them, the prompt prefilled once; a request that cannot be admitted
whole is not admitted."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from ..server_synth import MODEL, build_service, leaked_kv, reference_text, running_server, wait_until

CHAIN = {"chain": ["small", MODEL], "draft_lengths": [3]}
BODY = {"model": MODEL, "prompt": "abc", "max_tokens": 30, "temperature": 0.9, "seed": 42, "speculation": CHAIN}


@pytest.fixture(scope="module")
def url():
    with running_server(build_service()[0]) as (base, _):
        yield base


def test_choices_have_their_own_streams_and_choice_0_is_the_request_alone(url):
    alone = httpx.post(url + "/v1/completions", json=BODY).json()
    three = httpx.post(url + "/v1/completions", json={**BODY, "n": 3}).json()
    again = httpx.post(url + "/v1/completions", json={**BODY, "n": 3}).json()
    texts = [c["text"] for c in three["choices"]]
    assert [c["index"] for c in three["choices"]] == [0, 1, 2] and all(len(t) == 30 for t in texts)
    assert texts[0] == alone["choices"][0]["text"] and len(set(texts)) == 3
    assert [c["text"] for c in again["choices"]] == texts  # a seed fixes every choice
    usage = three["usage"]
    assert usage["prompt_tokens"] == 3 and usage["completion_tokens"] == 90 == usage["total_tokens"] - 3
    assert usage["speculation"]["cycles"] == sum(c["cycles"] for c in usage["speculation"]["chains_used"])


def test_the_prompt_is_prefilled_once_for_all_choices():
    """Choices 1.. take the prompt's KV from choice 0: a 300-token prompt costs each model about
    300 evaluated tokens whatever n is, not n x 300 (the synthetic models count what they evaluate)."""
    service, models = build_service(routed=False)
    body = {**BODY, "prompt": "abcdefghij" * 30, "max_tokens": 8}
    with running_server(service) as (base, _):
        evaluated = []
        for n in (1, 4):
            before = {m.name: m.decoded_tokens for m in models}
            r = httpx.post(base + "/v1/completions", json={**body, "n": n})
            assert r.status_code == 200 and len(r.json()["choices"]) == n
            evaluated.append({m.name: m.decoded_tokens - before[m.name] for m in models})
        assert wait_until(lambda: leaked_kv(models) == 0)
    for name in ("small", MODEL):
        one, four = evaluated[0][name], evaluated[1][name]
        assert 300 <= one and four < one + 3 * 40, (name, one, four)  # 3 more choices: 8 tokens each, drafts


def test_greedy_choices_are_all_the_target_alone(url):
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "abc"}], n=2,
                                       temperature=0, max_tokens=12)
    expected = reference_text(messages=[{"role": "user", "content": "abc"}], max_tokens=12)
    assert [c.message.content for c in r.choices] == [expected, expected]


def test_a_stream_interleaves_the_choices_by_index_with_one_usage_chunk(url):
    whole = httpx.post(url + "/v1/completions", json={**BODY, "n": 3, "logprobs": 1}).json()
    body = {**BODY, "n": 3, "logprobs": 1, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", url + "/v1/completions", json=body) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    texts, tokens, finished = ["", "", ""], [[], [], []], set()
    for chunk in chunks[:-1]:
        (choice,) = chunk["choices"]
        texts[choice["index"]] += choice["text"]
        tokens[choice["index"]] += (choice["logprobs"] or {}).get("tokens", [])
        if choice["finish_reason"]:
            finished.add(choice["index"])
    assert texts == [c["text"] for c in whole["choices"]] and finished == {0, 1, 2}
    assert tokens == [c["logprobs"]["tokens"] for c in whole["choices"]]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 90


def test_a_request_whose_choices_do_not_all_fit_is_refused_whole():
    # Models that take their simulated time: choice 0 still runs when choice 1 asks for a slot
    # (without, it could finish first and free the slot: seen once under load).
    service, models = build_service(max_batch=1, max_queue=0, sleep=True)
    with running_server(service) as (url, _):
        r = httpx.post(url + "/v1/completions", json={**BODY, "n": 3})
        assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full"
        assert wait_until(lambda: service.live_sequences == 0 and leaked_kv(models) == 0)
        assert httpx.post(url + "/v1/completions", json={**BODY, "n": 1}).status_code == 200

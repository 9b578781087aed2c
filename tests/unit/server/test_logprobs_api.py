"""logprobs over HTTP (openai-complete, item 2): chat's `logprobs`/`top_logprobs` and
completions' `logprobs`, in OpenAI's shapes, streamed and whole; under speculation every
value is the target's own (the synthetic target's row after the token's prefix, computed
here); bad values are a 400 naming the field."""

from __future__ import annotations

import json
import math

import httpx
import openai
import pytest

from specrouter.cascade.logprobs import log_distribution
from specrouter.cascade.sampling import SamplingParams
from specrouter.chat import chat_prompt_tokens

from ..server_synth import MODEL, build_service, family, running_server

MESSAGES = [{"role": "user", "content": "abcabcab"}]


@pytest.fixture(scope="module")
def server():
    service, models = build_service()
    with running_server(service) as (base, _):
        yield base, models[2]


def target_logprobs(prompt: list[int], tokens: list[int], params: SamplingParams) -> list[list[float]]:
    """Per token, the target's log-probabilities after its prefix (fresh models)."""
    target = family()[2]
    return [log_distribution(target.logits_for(prompt + tokens[:j]), params).tolist() for j in range(len(tokens))]


def letters(text: str) -> list[int]:
    """Synthetic token ids of a text (token t spells chr(97 + t))."""
    return [ord(c) - 97 for c in text]


@pytest.mark.parametrize("speculation", ["off", {"chain": ["ngram", "small", "mid", MODEL], "draft_lengths": [3, 2, 3]},
                                         "auto"])
@pytest.mark.parametrize("temperature", [0, 0.8])
def test_chat_logprobs_are_the_targets_whatever_the_chain(server, speculation, temperature):
    base, target = server
    client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24, temperature=temperature,
                                       seed=3, logprobs=True, top_logprobs=3,
                                       extra_body={"speculation": speculation})
    choice = r.choices[0]
    content = choice.logprobs.content
    assert "".join(e.token for e in content) == choice.message.content and len(content) == 24
    prompt = chat_prompt_tokens(target, MESSAGES)
    params = SamplingParams(temperature=temperature)
    expected = target_logprobs(prompt, letters(choice.message.content), params)
    for entry, logp in zip(content, expected):
        token = letters(entry.token)[0]
        assert entry.logprob == max(logp[token], -9999.0) and entry.bytes == list(entry.token.encode())
        ranked = sorted(range(len(logp)), key=lambda t: (-logp[t], t))[:3]
        assert [letters(t.token)[0] for t in entry.top_logprobs] == ranked
        assert [t.logprob for t in entry.top_logprobs] == [max(logp[t], -9999.0) for t in ranked]


def test_completion_logprobs_have_the_legacy_shape_with_the_token_among_its_alternatives(server):
    base, target = server
    body = {"model": MODEL, "prompt": "abcabc", "max_tokens": 16, "temperature": 0.9, "top_k": 3, "seed": 11,
            "logprobs": 2, "speculation": {"chain": ["small", MODEL], "draft_lengths": [4]}}
    r = httpx.post(base + "/v1/completions", json=body).json()
    choice = r["choices"][0]
    lp = choice["logprobs"]
    assert "".join(lp["tokens"]) == choice["text"] and lp["text_offset"] == list(range(16))
    expected = target_logprobs(target.tokenize("abcabc"), letters(choice["text"]), SamplingParams(0.9, top_k=3))
    for token, logprob, top, logp in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], expected):
        assert logprob == logp[letters(token)[0]] and math.isfinite(logprob)  # sampled within the top 3
        assert token in top and len(top) in (2, 3)  # two alternatives and the token itself, if not among them
        assert all(v == max(logp[letters(t)[0]], -9999.0) for t, v in top.items())


def test_a_stream_carries_each_tokens_logprob_with_its_text(server):
    base, _ = server
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 20, "temperature": 0, "logprobs": True,
            "top_logprobs": 1, "stream": True, "stop": ["ca"]}
    whole = httpx.post(base + "/v1/chat/completions", json={**body, "stream": False}).json()["choices"][0]
    with httpx.stream("POST", base + "/v1/chat/completions", json=body) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    text, entries = "", []
    for e in events:
        for c in e["choices"]:
            text += c["delta"].get("content") or ""
            entries += (c.get("logprobs") or {}).get("content") or []
            assert "".join(x["token"] for x in entries) in (text, text + "c")  # a held-back "c" may follow
    assert text == whole["message"]["content"] and entries == whole["logprobs"]["content"]
    completion = {"model": MODEL, "prompt": "abcabc", "max_tokens": 12, "temperature": 0, "logprobs": 0,
                  "stream": True}
    with httpx.stream("POST", base + "/v1/completions", json=completion) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    offsets = [o for c in chunks for ch in c["choices"] if ch["logprobs"] for o in ch["logprobs"]["text_offset"]]
    assert offsets == list(range(12))


def test_without_logprobs_there_are_none(server):
    base, _ = server
    r = httpx.post(base + "/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, "max_tokens": 4}).json()
    assert r["choices"][0]["logprobs"] is None
    r = httpx.post(base + "/v1/completions", json={"model": MODEL, "prompt": "ab", "max_tokens": 4}).json()
    assert r["choices"][0]["logprobs"] is None


@pytest.mark.parametrize(("path", "extra", "param"), [
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
    ("/v1/chat/completions", {"logprobs": "yes"}, "logprobs"),
    ("/v1/completions", {"logprobs": 21}, "logprobs"),
    ("/v1/completions", {"logprobs": True}, "logprobs"),
])
def test_bad_logprobs_are_a_400_naming_the_field(server, path, extra, param):
    base, _ = server
    body = {"model": MODEL, "max_tokens": 4, **extra}
    body.update({"messages": MESSAGES} if "chat" in path else {"prompt": "ab"})
    r = httpx.post(base + path, json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text

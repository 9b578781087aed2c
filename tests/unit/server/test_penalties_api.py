"""Penalties, min_p and logit_bias over HTTP (openai-complete, item 3): greedy output under
every speculation setting equals the penalised target alone (computed here from the
synthetic target's rows); bad values are a 400 naming the field."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from specrouter.cascade.penalties import History, penalize
from specrouter.cascade.sampling import SamplingParams

from ..server_synth import MODEL, build_service, family, running_server

PROMPT = "abcabcabd"


@pytest.fixture(scope="module")
def url():
    with running_server(build_service()[0]) as (base, _):
        yield base


def penalised_greedy(prompt: list[int], params: SamplingParams, n: int) -> str:
    target = family()[2]
    history, out = History(prompt), []
    for _ in range(n):
        prefix = prompt + out
        out.append(int(np.argmax(penalize(target.logits_for(prefix), prefix, params, history))))
    return target.detokenize(out)


@pytest.mark.parametrize("speculation", ["off", "auto", {"chain": ["ngram", "small", MODEL], "draft_lengths": [3, 3]}])
def test_greedy_penalised_output_is_the_penalised_targets(url, speculation):
    target = family()[2]
    fields = {"frequency_penalty": 1.1, "presence_penalty": 0.5, "repetition_penalty": 1.4,
              "logit_bias": {"0": 1.5, "3": -100}}
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 30, "temperature": 0, "speculation": speculation}
    r = httpx.post(url + "/v1/completions", json={**body, **fields})
    assert r.status_code == 200, r.text
    text = r.json()["choices"][0]["text"]
    params = SamplingParams(frequency_penalty=1.1, presence_penalty=0.5, repetition_penalty=1.4,
                            logit_bias=((0, 1.5), (3, -100.0)))
    assert text == penalised_greedy(target.tokenize(PROMPT), params, 30)
    assert "d" not in text  # token 3 is banned
    plain = httpx.post(url + "/v1/completions", json=body).json()["choices"][0]["text"]
    assert plain != text


def test_sampled_min_p_never_emits_a_token_below_its_threshold(url):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 40, "temperature": 1.0, "min_p": 0.3, "seed": 4,
            "logprobs": 1, "speculation": {"chain": ["small", MODEL], "draft_lengths": [4]}}
    r = httpx.post(url + "/v1/completions", json=body).json()["choices"][0]
    lp = r["logprobs"]
    assert len(r["text"]) == 40 and len(lp["token_logprobs"]) == 40
    for logprob, top in zip(lp["token_logprobs"], lp["top_logprobs"]):
        assert logprob >= max(top.values()) + np.log(0.3) - 1e-9  # at least 0.3 x the most likely token


@pytest.mark.parametrize(("extra", "param"), [
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"repetition_penalty": 5e-324}, "repetition_penalty"),  # a logit divided by it is inf
    ({"min_p": 1.2}, "min_p"),
    ({"logit_bias": {"1": 150}}, "logit_bias"),
    ({"logit_bias": {"x": 1}}, "logit_bias"),
    ({"logit_bias": {"16": 1}}, "logit_bias"),  # outside the vocabulary of 16
])
def test_bad_values_are_a_400_naming_the_field(url, extra, param):
    for path, body in (("/v1/completions", {"prompt": PROMPT}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}]})):
        r = httpx.post(url + path, json={"model": MODEL, "max_tokens": 4, **body, **extra})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text

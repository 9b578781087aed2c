"""Bounded soak: 32 concurrent streaming clients on a loopback server, some disconnecting,
some sending bad requests, two rounds (the second's memory growth is measured).

Every request is greedy, so whatever chain runs it (routed, off, fixed), its text must be
the target's greedy text: a completed stream that lost, repeated or reordered a token
(one character each) differs from it. Afterwards no sequence may be left anywhere.
"""

import asyncio
import json
import random

import httpx

from ..server_synth import MODEL, build_service, leaked_kv, reference_text, rss_bytes, running_server, wait_until

CLIENTS, REQUESTS_EACH = 32, 2
SPECULATIONS = [None, "auto", "off", {"chain": ["small", "mid", MODEL], "draft_lengths": [2, 2]},
                {"chain": ["ngram", MODEL]}]


#: Bad requests mixed in (raw bodies): each must get its 4xx and harm no other request.
BAD = [
    ("/v1/completions", b'{"model": "target", "prompt": "ab", "max_tokens": 3', 400),  # not JSON
    ("/v1/completions", b'{"model": "target", "prompt": "a\\ud800", "max_tokens": 3}', 400),  # lone surrogate
    ("/v1/completions", b'{"model": "other", "prompt": "ab"}', 404),
    ("/v1/chat/completions", b'{"model": "target", "messages": [], "max_tokens": 3}', 400),
    ("/v1/completions", b'{"model": "target", "prompt": "ab", "temperature": -1}', 400),
    ("/v1/completions", b'{"model": "target", "prompt": [1, 99999], "max_tokens": 3}', 400),  # id outside the vocabulary
    ("/v1/completions", b'{"model": "target", "prompt": "' + b"a" * 600 + b'"}', 400),  # longer than the context
]


def plan(rng: random.Random) -> list[dict]:
    """One client's requests: body, endpoint, expected text, and after how many chunks it
    hangs up; and a bad request or none."""
    out = []
    if rng.random() < 0.5:
        out.append({"bad": rng.choice(BAD)})
    for _ in range(REQUESTS_EACH):
        text = "".join(rng.choice("abcdefghijklmnop") for _ in range(rng.randint(2, 12)))
        max_tokens = rng.randint(8, 40)
        body = {"model": MODEL, "max_tokens": max_tokens, "temperature": 0, "stream": True}
        if (spec := rng.choice(SPECULATIONS)) is not None:
            body["speculation"] = spec
        if rng.random() < 0.5:
            messages = [{"role": "user", "content": text}]
            body["messages"] = messages
            item = {"path": "/v1/chat/completions", "expected": reference_text(messages=messages, max_tokens=max_tokens)}
        else:
            body["prompt"] = text
            item = {"path": "/v1/completions", "expected": reference_text(text, max_tokens)}
        item["body"] = body
        item["hang_up_after"] = rng.randint(1, 4) if rng.random() < 0.3 else None
        out.append(item)
    return out


async def run_client(http: httpx.AsyncClient, requests: list[dict], outcomes: list, refusals: list) -> None:
    for req in requests:
        if "bad" in req:
            path, body, status = req["bad"]
            r = await http.post(path, content=body, headers={"content-type": "application/json"})
            refusals.append((r.status_code, status, r.json()["error"]["type"]))
            continue
        texts, finishes, done = [], [], False
        async with http.stream("POST", req["path"], json=req["body"]) as r:
            assert r.status_code == 200, await r.aread()
            async for line in r.aiter_lines():
                if not line:
                    continue
                data = line.removeprefix("data: ")
                if data == "[DONE]":
                    done = True
                    continue
                assert not done, "data after [DONE]"
                choice = json.loads(data)["choices"][0]
                texts.append(choice["text"] if "text" in choice else choice["delta"].get("content") or "")
                finishes.append(choice["finish_reason"])
                if req["hang_up_after"] is not None and len(texts) >= req["hang_up_after"]:
                    break  # leaving the block closes the connection mid-stream
        outcomes.append((req, "".join(texts), finishes, done))


def test_soak_32_streaming_clients_with_random_disconnects():
    rng = random.Random(20261130)
    plans = [plan(rng) for _ in range(CLIENTS)]
    service, models = build_service(sleep=True, max_batch=8, max_queue=64)
    outcomes: list = []
    refusals: list = []

    async def main(url):
        limits = httpx.Limits(max_connections=CLIENTS + 4)
        async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:
            await asyncio.wait_for(asyncio.gather(*(run_client(http, p, outcomes, refusals) for p in plans)),
                                   timeout=180)

    with running_server(service) as (url, _):
        asyncio.run(main(url))  # a first round: what a server allocates once (caches, pools) is allocated
        assert wait_until(lambda: service.live_sequences == 0 and leaked_kv(models) == 0)
        settled = rss_bytes()
        first = len(outcomes)
        asyncio.run(main(url))
        assert wait_until(lambda: service.live_sequences == 0 and leaked_kv(models) == 0)
        grown = rss_bytes() - settled
        metrics = httpx.get(url + "/metrics").text

    assert grown < 20 * 2**20, grown / 2**20  # memory flat: a second round keeps nothing of its requests
    assert [s for s, expected, _ in refusals if s != expected] == [] and len(refusals) >= 20
    assert all(kind == "invalid_request_error" for s, _, kind in refusals if s == 400)
    outcomes = outcomes[first:]
    total = CLIENTS * REQUESTS_EACH
    assert len(outcomes) == total
    completed = [(req, text, finishes) for req, text, finishes, done in outcomes if done]
    for req, text, finishes in completed:
        assert text == req["expected"], req
        assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    hung_up = sum(1 for req, *_ in outcomes if req["hang_up_after"] is not None)
    assert len(completed) >= total - hung_up and hung_up > 0
    # Server side: every request either finished or was cancelled, and nothing is running.
    success = service.metrics.success.labels("length")._value.get()
    cancelled = service.metrics.failure.labels("cancelled")._value.get()
    assert success + cancelled == 2 * total and success >= len(completed) and cancelled >= 1
    assert "specrouter:num_requests_running 0.0" in metrics and "specrouter:num_requests_waiting 0.0" in metrics

"""The hostile list's items under concurrency (turn 2): a soak of concurrent clients with
deliberate disconnects and bad requests mixed in, and, in --exact mode, greedy outputs of
prompts sent concurrently against their solo outputs."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field

import httpx
import numpy as np

from benchmarks.hostile_client import ANSWER_SECONDS, DROPS, Client, ItemResult, StreamResult, Tally, read_sse, rss_mib
from benchmarks.hostile_servers import Running

TARGET, SMALL = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"
#: RSS the server may gain over the soak's second round (a leak per request would show there).
RSS_GROWTH_MIB = 32
PROMPTS = ["Write a Python function that reverses a string.", "What is 17 times 23?",
           "Name three sorting algorithms.", "def fibonacci(n):", "Explain recursion in one sentence.",
           "Write a SQL query that counts the rows of a table named users."]
SPECULATIONS = [None, "auto", "off", {"chain": [SMALL, TARGET], "draft_lengths": [2]}]


@dataclass(frozen=True)
class SoakRequest:
    """One request of a soak client: raw body (bad) or JSON body (good), what answer it expects."""

    what: str
    path: str
    body: dict | bytes
    expect: tuple[int, ...]
    stream: bool = False
    hang_up_after: int | None = None
    key: bool = True  # sends the server's API key


def bad_requests(keyed: bool) -> list[SoakRequest]:
    """Bad requests mixed into the soak, each with its 4xx."""
    c, chat = "/v1/completions", "/v1/chat/completions"
    out = [
        SoakRequest("not JSON", c, b'{"model": "qwen2.5-coder-1.5b", "prompt": "ab"', (400,)),
        SoakRequest("lone surrogate", c, b'{"model": "qwen2.5-coder-1.5b", "prompt": "a\\ud800"}', (400,)),
        SoakRequest("another model", c, {"model": "gpt-4", "prompt": "ab"}, (404,)),
        SoakRequest("no messages", chat, {"model": TARGET, "messages": []}, (400,)),
        SoakRequest("temperature -1", c, {"model": TARGET, "prompt": "ab", "temperature": -1}, (400,)),
        SoakRequest("token id outside the vocabulary", c, {"model": TARGET, "prompt": [1, 10**9]}, (400,)),
        SoakRequest("max_tokens 10^12", c, {"model": TARGET, "prompt": "ab", "max_tokens": 10**12}, (400,)),
        SoakRequest("speculation fast", c, {"model": TARGET, "prompt": "ab", "speculation": "fast"}, (400,)),
        SoakRequest("n 17", c, {"model": TARGET, "prompt": "ab", "n": 17}, (400,)),
    ]
    if keyed:
        out.append(SoakRequest("no key", c, {"model": TARGET, "prompt": "ab"}, (401,), key=False))
    return out


def plan(rng: random.Random, clients: int, each: int, keyed: bool) -> list[list[SoakRequest]]:
    """Per client, `each` requests: about a third bad, the rest greedy or seeded answers of
    2-4 tokens, three in four streamed, a third of the streams left after their first event."""
    bad = bad_requests(keyed)
    out = []
    for _ in range(clients):
        mine = []
        for _ in range(each):
            if rng.random() < 0.35:
                mine.append(rng.choice(bad))
                continue
            chat = rng.random() < 0.5
            body: dict = {"model": TARGET, "max_tokens": rng.randint(2, 4)}
            body.update({"messages": [{"role": "user", "content": rng.choice(PROMPTS)}]} if chat
                        else {"prompt": rng.choice(PROMPTS)})
            body.update({"temperature": 0} if rng.random() < 0.5 else {"temperature": 0.8, "seed": rng.randint(0, 99)})
            if (spec := rng.choice(SPECULATIONS)) is not None:
                body["speculation"] = spec
            stream = rng.random() < 0.75
            hang_up = 1 if stream and rng.random() < 0.33 else None
            body["stream"] = stream
            mine.append(SoakRequest("stream" if stream else "plain", "/v1/chat/completions" if chat
                                    else "/v1/completions", body, (200,), stream, hang_up))
        out.append(mine)
    return out


@dataclass
class SoakRecord:
    """What a soak's requests got: their counts, the streams read, and per answered request
    its seconds from sending to its end."""

    tally: Tally
    streams: list[StreamResult] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    #: (seconds, what was asked) of the answered requests, for the slowest ones' report.
    asked: list[tuple[float, str]] = field(default_factory=list)

    def answered(self, req: SoakRequest, seconds: float) -> None:
        self.seconds.append(seconds)
        body = req.body if isinstance(req.body, dict) else {}
        asked = {k: body[k] for k in ("speculation", "max_tokens", "temperature", "stream") if k in body}
        self.asked.append((seconds, f"{req.path} {json.dumps(asked)}"))


async def _one(http: httpx.AsyncClient, key: str | None, req: SoakRequest, record: SoakRecord) -> None:
    headers = {"authorization": f"Bearer {key}"} if key and req.key else {}
    content = req.body if isinstance(req.body, bytes) else json.dumps(req.body).encode()
    headers["content-type"] = "application/json"
    tally, sent = record.tally, time.monotonic()
    try:
        async with http.stream("POST", req.path, content=content, headers=headers) as response:
            ok = tally.status(req.what, response.status_code, req.expect)
            if not (req.stream and ok and response.status_code == 200):
                await response.aread()
                record.answered(req, time.monotonic() - sent)
                return
            result = StreamResult(response.status_code)
            lines = [line async for line in _lines(response, req.hang_up_after)]
            read_sse(lines, result, req.hang_up_after)
    except httpx.TimeoutException:
        tally.hang(f"{req.what} {content[:160].decode(errors='replace')} (sent {time.monotonic() - sent:.0f} s "
                   "before)")
        return
    except DROPS as exc:
        tally.drop(req.what, exc)
        return
    record.answered(req, time.monotonic() - sent)
    record.streams.append(result)
    if not result.hung_up and not result.done:
        tally.dropped += 1
        tally.unexpected.append(f"{req.what}: the stream ended without [DONE]")
    if result.error is not None:
        tally.unexpected.append(f"{req.what}: an error event {result.error.get('code')}")


async def _lines(response: httpx.Response, hang_up_after: int | None):
    """The stream's lines; after `hang_up_after` data events, no more (the caller leaves)."""
    events = 0
    async for line in response.aiter_lines():
        yield line
        if line.startswith("data: ") and line != "data: [DONE]":
            events += 1
            if hang_up_after is not None and events >= hang_up_after:
                return


async def _round(url: str, key: str | None, plans: list[list[SoakRequest]], record: SoakRecord,
                 timeout: float) -> None:
    async def client(requests):
        async with httpx.AsyncClient(base_url=url, timeout=timeout) as http:
            for req in requests:
                await _one(http, key, req, record)

    await asyncio.gather(*(client(p) for p in plans))


def soak(run: Running, clients: int = 24, each: int = 8, timeout: float = ANSWER_SECONDS) -> ItemResult:
    """Two rounds of `clients` concurrent clients, `each` / 2 requests each per round; RSS
    after a warm-up and after each round; a greedy answer before and after, the same.
    `timeout`: the seconds a client waits for the next byte before it counts a hang."""
    result = ItemResult("turn 2: soak", run.label, f"{clients} concurrent clients, {clients * each} requests "
                        "(about a third bad, a quarter of the streams left after their first event): no 5xx, no "
                        "hang, no drop, every stream read to its end has [DONE] and a finish_reason, RSS grows at "
                        f"most {RSS_GROWTH_MIB} MiB over the second round, a greedy answer is the same before and "
                        "after")
    plans = plan(random.Random(52), clients, each, run.key is not None)
    client = Client(run.url, run.key)
    probe = {"model": TARGET, "prompt": "def is_prime(n):", "max_tokens": 12, "temperature": 0, "speculation": "off"}
    warm = {"model": TARGET, "prompt": "def is_prime(n):", "max_tokens": 4, "speculation": {"chain": [SMALL, TARGET]}}
    client.send(result.tally, "warm-up (both models)", "POST", "/v1/completions", {200}, json=warm)
    before = client.send(result.tally, "greedy before", "POST", "/v1/completions", {200},
                         json={**probe, "cache_salt": "before"})
    rss = [rss_mib(run.pid)]
    record = SoakRecord(result.tally)
    half = each // 2
    for part in (slice(0, half), slice(half, each)):
        asyncio.run(_round(run.url, run.key, [p[part] for p in plans], record, timeout))
        rss.append(rss_mib(run.pid))
    streams = record.streams
    after = client.send(result.tally, "greedy after", "POST", "/v1/completions", {200},
                        json={**probe, "cache_salt": "after"})
    client.close()
    finished = [s for s in streams if not s.hung_up]
    unfinished = [s for s in finished if not _finish_reason(s)]
    texts = [r.json()["choices"][0]["text"] if r is not None and r.status_code == 200 else None
             for r in (before, after)]
    result.figures.update({"rss_mib": [round(x) for x in rss], "streams_read_to_the_end": len(finished),
                           "answer_seconds": {"median": round(float(np.median(record.seconds)), 1),
                                              "max": round(max(record.seconds), 1)} if record.seconds else None,
                           "slowest": [f"{t:.1f} s: {a}" for t, a in sorted(record.asked, reverse=True)[:5]],
                           "streams_left": len(streams) - len(finished), "greedy": texts})
    result.check(f"{len(finished)} streams read to the end: each has a finish_reason", not unfinished)
    result.check(f"RSS {rss[1]:.0f} -> {rss[2]:.0f} MiB over the second round (at most +{RSS_GROWTH_MIB})",
                 rss[2] - rss[1] <= RSS_GROWTH_MIB)
    result.check("the greedy answer before and after is the same", texts[0] is not None and texts[0] == texts[1])
    return result


def _finish_reason(stream: StreamResult) -> bool:
    return any(c.get("finish_reason") for e in stream.events for c in e.get("choices", []))


def exact_under_concurrency(run: Running, max_tokens: int = 10) -> ItemResult:
    """In --exact mode: each prompt's greedy output alone, then all sent at once: the same.
    The concurrent ones carry another cache salt: they are prefilled again, side by side."""
    result = ItemResult("turn 2: exactness under concurrency", run.label, f"greedy outputs ({max_tokens} tokens) "
                        f"of {len(PROMPTS)} prompts sent concurrently equal their solo outputs")
    client = Client(run.url, run.key)

    def body(prompt: str, salt: str) -> dict:
        return {"model": TARGET, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                "temperature": 0, "cache_salt": salt}

    def text(r: httpx.Response | None) -> str | None:
        return r.json()["choices"][0]["message"]["content"] if r is not None and r.status_code == 200 else None

    solo = [text(client.send(result.tally, "solo", "POST", "/v1/chat/completions", {200}, json=body(p, "solo")))
            for p in PROMPTS]

    async def together():
        async with httpx.AsyncClient(base_url=run.url, timeout=ANSWER_SECONDS, headers=Client.auth(run.key)) as http:
            return await asyncio.gather(*(http.post("/v1/chat/completions", json=body(p, "together"))
                                          for p in PROMPTS), return_exceptions=True)

    concurrent = []
    for r in asyncio.run(together()):
        if isinstance(r, httpx.TimeoutException):
            result.tally.hang("concurrent")
            concurrent.append(None)
        elif isinstance(r, BaseException):
            result.tally.drop("concurrent", r)
            concurrent.append(None)
        else:
            result.tally.status("concurrent", r.status_code, {200})
            concurrent.append(text(r))
    client.close()
    same = sum(a is not None and a == b for a, b in zip(solo, concurrent))
    result.figures.update({"solo": solo, "concurrent": concurrent})
    result.check(f"{same} of {len(PROMPTS)} concurrent outputs equal their solo ones", same == len(PROMPTS))
    return result

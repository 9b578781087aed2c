"""The seed contract (issue server-hardening-2, item 3): a request with `seed` gets the same
output each time it is sent to the same server, whatever the server served in between. It
prefills afresh (never from the prefix cache) and, under `auto`, is routed from the router's
state as it was when the server started (router/frozen.py): no estimates, memory or clocks
that other requests move."""

import httpx
import numpy as np

from specrouter.drafters.memory import SuffixMemory
from specrouter.router.estimates.costs import OnlineCosts
from specrouter.router.frozen import FrozenRoutes

from ..server_synth import MODEL, build_engine, running_server

PROMPT = "abcabcabdabcabcabd" * 3


def _seeded(http: httpx.Client, seed: int, speculation: str = "auto", max_tokens: int = 24) -> dict:
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT, "max_tokens": max_tokens, "seed": seed,
                                           "temperature": 1.0, "logprobs": 1, "speculation": speculation})
    assert r.status_code == 200, r.text
    return r.json()


def _what_repeats(body: dict) -> tuple:
    choice, spec = body["choices"][0], body["usage"]["speculation"]
    return (choice["text"], tuple(choice["logprobs"]["token_logprobs"]),
            tuple((tuple(c["chain"]), tuple(c["draft_lengths"]), c["cycles"]) for c in spec["chains_used"]))


def _move_the_routers_state(http: httpx.Client, engine) -> None:
    """What other traffic does to a live router, and more: unseeded requests (estimates,
    memory, prefix cache, timings), and every acceptance estimate pushed to an extreme."""
    for i in range(3):
        r = http.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT + "ab" * i, "max_tokens": 16,
                                               "temperature": 1.0})
        assert r.status_code == 200
    acceptance = engine.router.acceptance
    for mode in ("sampled", "greedy"):
        for proposer in engine.router.names:
            for verifier in engine.router.names:
                if proposer != verifier:
                    acceptance.set_global(proposer, verifier, 0.99, count=1e4, mode=mode)


def test_a_seeded_request_repeats_whatever_the_server_served_in_between():
    engine, _ = build_engine(prefix_cache=4, memory=SuffixMemory(10_000))
    with running_server(engine.service) as (url, _), httpx.Client(base_url=url, timeout=60) as http:
        for speculation in ("auto", "off"):
            first = _seeded(http, 1234, speculation)
            _move_the_routers_state(http, engine)
            again = [_seeded(http, 1234, speculation) for _ in range(3)]
            assert {_what_repeats(b) for b in again} == {_what_repeats(first)}, speculation
            other = _seeded(http, 1235, speculation)
            assert other["choices"][0]["text"] != first["choices"][0]["text"]  # the seed does choose the stream
            for body in (first, *again):  # never resumed from a kept cache
                assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_an_unseeded_request_does_resume_from_the_prefix_cache():
    engine, _ = build_engine(prefix_cache=4)
    with running_server(engine.service) as (url, _), httpx.Client(base_url=url, timeout=60) as http:
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "speculation": "off"}
        http.post("/v1/completions", json=body)
        again = http.post("/v1/completions", json=body).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_frozen_sessions_price_with_fixed_costs_and_share_nothing_with_the_live_router():
    engine, _ = build_engine(memory=SuffixMemory(10_000))
    router = engine.router
    frozen = FrozenRoutes(router)
    session = frozen.session()
    assert session.memory is None and session.batch_size == 1
    session.batch_size = 8  # as the scheduler sets it
    assert session.batch_size == 1
    before = session.costs.seconds(MODEL, 4)
    session.costs.observe(MODEL, 4, 100.0)
    session.costs.observe_rows("sampled", 4, 1.0)
    assert session.costs.seconds(MODEL, 4) == before and isinstance(router.costs, OnlineCosts)
    session.acceptance.set_global("small", MODEL, 0.5, count=1e4, mode="sampled")
    assert router.acceptance.global_ != session.acceptance.global_
    assert frozen.session().acceptance.global_ == frozen.acceptance.global_  # the next session starts afresh
    assert np.isinf(session.budget.left(1.0))

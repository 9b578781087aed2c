"""A server over synthetic models on a loopback port, for the server tests.

Synthetic tokenizers map one character to one token (and token t to the letter chr(97 + t)),
so a streamed text shows every token in order: lost, repeated or swapped tokens change it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import uvicorn

from specrouter.drafters import MODEL_FREE
from specrouter.drafters.memory import SuffixMemory
from specrouter.backends.synthetic import SyntheticBackend
from specrouter.cascade.chain import Chain
from specrouter.cascade.sampling import SamplingParams
from specrouter.chat import chat_prompt_tokens
from specrouter.engine import generate
from specrouter.engine.batch import BatchScheduler, Speculation
from specrouter.engine.planning import pool_planner
from specrouter.engine.prefill import PREFILL_SHARE
from specrouter.engine.prefix_cache import PrefixCache
from specrouter.errors import UnknownModelError
from specrouter.server.app import create_app
from specrouter.server.config import ServeConfig
from specrouter.server.drain import DrainingServer
from specrouter.server.run import Engine, uvicorn_config
from specrouter.server.service import Service

from .router_synth import linear, make_router

MODEL = "target"
MODELS = ["small", "mid", MODEL]
LEVELS = [*MODEL_FREE, *MODELS]
N_CTX = 512


def family(sleep: bool = False, n_ctx: int = N_CTX) -> list[SyntheticBackend]:
    """small, mid, target (cheapest first), with GPU-like simulated costs (a target forward
    about 5 ms) that the router plans with; sleep=True also spends them in wall time."""
    kw = dict(vocab=16, n_ctx=n_ctx, sleep=sleep)
    return [SyntheticBackend("small", model_seed=3, noise=1.0, params_b=0.1, latency=linear(0.0003, 0.00005), **kw),
            SyntheticBackend("mid", model_seed=2, noise=0.5, params_b=1.0, latency=linear(0.0012, 0.0002), **kw),
            SyntheticBackend(MODEL, params_b=7.0, latency=linear(0.005, 0.0004), **kw)]


class SynthPool:
    """What pool_planner needs of a Pool: chains of these models by name."""

    def __init__(self, models: list[SyntheticBackend]) -> None:
        self.by_name = {m.name: m for m in models}

    def chain(self, names, draft_lengths=None) -> Chain:
        for n in names:
            if n not in MODEL_FREE and n not in self.by_name:
                raise UnknownModelError(f"unknown model {n!r}")
        levels = [MODEL_FREE[n]() if n in MODEL_FREE else self.by_name[n] for n in names]
        return Chain(levels, list(draft_lengths) if draft_lengths is not None else [4] * (len(levels) - 1))


def _service(models: list[SyntheticBackend], router, max_batch: int, max_queue: int,
             request_timeout: float | None, prefill_share: float | None, prefix_cache: int = 0) -> Service:
    plan = pool_planner(SynthPool(models), MODEL, router, Speculation())
    return Service(BatchScheduler(plan, max_batch, prefill_share=prefill_share, prefix_cache=PrefixCache(prefix_cache)),
                   models[2], LEVELS, max_queue, request_timeout)


def build_engine(sleep: bool = False, max_batch: int = 4, max_queue: int = 16,
                 request_timeout: float | None = None, memory: SuffixMemory | None = None, n_ctx: int = N_CTX,
                 prefill_share: float | None = PREFILL_SHARE,
                 prefix_cache: int = 0) -> tuple[Engine, list[SyntheticBackend]]:
    """The synthetic family as `specrouter serve` builds a pool (server/run.Engine): the
    service, the router `auto` uses (with a memory, over the suffix lookup reading it; else the
    n-gram) and the target; prefix_cache: finished requests kept (0: none, so every request
    leaves no KV behind)."""
    models = family(sleep, n_ctx)
    small, mid, target = models
    lookup = "ngram" if memory is None else "suffix"
    router = make_router(target, [small, mid], lookup=lookup, memory=memory)
    service = _service(models, router, max_batch, max_queue, request_timeout, prefill_share, prefix_cache)
    return Engine(service, router, target), models


def build_service(sleep: bool = False, max_batch: int = 4, max_queue: int = 16,
                  request_timeout: float | None = None, routed: bool = True,
                  memory: SuffixMemory | None = None, n_ctx: int = N_CTX,
                  prefill_share: float | None = PREFILL_SHARE) -> tuple[Service, list[SyntheticBackend]]:
    """With a memory, `auto` routes the suffix lookup reading it (else the n-gram); routed=False:
    no router (a request's `auto` runs the target alone)."""
    if routed:
        engine, models = build_engine(sleep, max_batch, max_queue, request_timeout, memory, n_ctx, prefill_share)
        return engine.service, models
    models = family(sleep, n_ctx)
    return _service(models, None, max_batch, max_queue, request_timeout, prefill_share), models


@dataclass
class SynthBuild:
    """A fleet's EngineBuild (specrouter/fleet/replica.py) over the synthetic family: every
    replica builds its own models (sleep=True: their simulated costs in wall time)."""

    config: ServeConfig = field(default_factory=lambda: ServeConfig(models=MODELS))
    sleep: bool = False
    max_queue: int = 16

    @contextmanager
    def engine(self) -> Iterator[Engine]:
        engine, _ = build_engine(self.sleep, max_batch=self.config.max_batch, max_queue=self.max_queue)
        yield engine

    def vocabulary(self) -> SyntheticBackend:
        return family()[2]


def reference_text(prompt: str | None = None, max_tokens: int = 16, messages: list | None = None) -> str:
    """The target's greedy text alone, on fresh models: what every lossless chain must produce."""
    target = family()[2]
    tokens = chat_prompt_tokens(target, messages) if messages is not None else target.tokenize(prompt)
    return generate(Chain([target], []), tokens, SamplingParams(), max_tokens).text


def leaked_kv(models: list[SyntheticBackend]) -> int:
    """Sequences still holding KV cells in any model (private state: the strongest leak check)."""
    return sum(len(m._kv) for m in models)


@contextmanager
def running_server(service: Service, graceful: float = 5.0, drain: float = 5.0,
                   **config) -> Iterator[tuple[str, uvicorn.Server]]:
    """Start the server as `specrouter serve` runs it (DrainingServer: `drain` seconds for
    requests in flight on shutdown, then `graceful` for the last responses) on 127.0.0.1 (a
    free port) in a thread; yields (base url, server)."""
    serve_config = ServeConfig(**{"models": MODELS, **config})
    app = create_app(service, serve_config)
    server = DrainingServer(uvicorn_config(app, serve_config, host="127.0.0.1", port=0, log_level="warning",
                                           timeout_graceful_shutdown=graceful), service, drain)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        assert not thread.is_alive(), "the server did not stop"


def rss_bytes() -> int:
    """This process's resident memory (server and client run in it), from /proc."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def wait_until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True

"""`specrouter serve`: load the pool, build the router and the scheduler, run uvicorn."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import click
import uvicorn

from specrouter.backends.base import Backend
from specrouter.engine.batch import BatchScheduler
from specrouter.engine.planning import pool_planner
from specrouter.engine.prefix_cache import PrefixCache
from specrouter.pool import Pool
from specrouter.router import Router, auto_router
from specrouter.server.config import ServeConfig
from specrouter.server.connections import ConnectionLimits
from specrouter.server.service import Service


@dataclass
class Engine:
    """One server's engine: the service (scheduler and worker, not started), the router that
    `auto` uses (what it learned is saved or shared), and the served target."""

    service: Service
    router: Router
    target: Backend

    def __post_init__(self) -> None:
        self.service.metrics.watch_choices(self.router.pacing)  # its /metrics shows how the router chose
        self.service.metrics.watch_prefix_cache(self.service.scheduler.prefix_cache.stats)
        if self.router.memory is not None:
            self.service.metrics.watch_memory(self.router.memory)


@contextmanager
def build_engine(config: ServeConfig) -> Iterator[Engine]:
    """The pool, its router and the scheduler as `config` says; the models close on exit."""
    # One KV slot per model for every sequence that can run at once, and every one the prefix cache keeps.
    kept = config.kept_sequences
    pool = Pool(cache_dir=config.cache_dir, n_ctx=config.n_ctx, n_threads=config.threads,
                n_seq_max=config.max_batch + kept, device=config.device, torch_runtime=config.torch_runtime,
                exact=config.exact, gpu_layers=config.offload)
    try:
        router = auto_router(pool, config.served, config.models, profile_file=config.profile, lookup=config.lookup,
                             memory=config.suffix_memory(), config=config.router_settings())
        if router.message:
            click.echo(f"note: {router.message}", err=True)
        default = config.default_speculation()
        if default.mode == "chain":  # a default chain that does not load fails now, not per request
            pool.chain(list(default.chain), list(default.draft_lengths) or None)
        plan = pool_planner(pool, config.served, router, default)
        scheduler = BatchScheduler(plan, config.max_batch, stall_seconds=config.stall_seconds or None,
                                   prefill_share=config.prefill_share or None, prefix_cache=PrefixCache(kept))
        target = pool.model(config.served)
        yield Engine(Service(scheduler, target, config.levels, config.max_queue, config.request_timeout or None),
                     router, target)
    finally:
        pool.close()


def uvicorn_config(app, config: ServeConfig, **options) -> uvicorn.Config:
    """uvicorn's configuration of a server: its address, and what a connection may hold
    (server/connections.py); `options`: more of uvicorn.Config's (tests set the port)."""
    limits = ConnectionLimits(config.header_timeout, config.body_timeout, config.keep_alive_timeout,
                              config.max_connections)
    return uvicorn.Config(app, **{"host": config.host, "port": config.port, "http": limits.protocol(),
                                  "timeout_keep_alive": limits.keep_alive_seconds, **options})


def serve(config: ServeConfig) -> None:
    from specrouter.server.app import create_app
    from specrouter.server.drain import FLUSH_SECONDS, DrainingServer

    with build_engine(config) as engine:
        service = engine.service
        try:
            app = create_app(service, config)
            DrainingServer(uvicorn_config(app, config, timeout_graceful_shutdown=FLUSH_SECONDS), service,
                           config.shutdown_timeout).run()
        finally:
            service.stop()  # a forced exit skips the app's shutdown: the worker must end before the models close
        engine.router.save_estimates()  # what this run learned about acceptance informs the next one

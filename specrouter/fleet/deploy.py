"""`specrouter serve --ray`: the server as a Ray Serve application.

Shape: one ingress deployment runs the single-process server's HTTP app (server/app.py,
unchanged: routes, streaming, errors, API key, limits) over a RemoteService; N EngineReplica
replicas each own a pool, a router and a BatchScheduler with its worker thread, exactly as
`specrouter serve` does. A request is checked and tokenized in the ingress, then runs on one
replica as one stream (all its choices), routed by AffinityRouter. An actor, the fleet
(FleetKnowledge), pools what the replicas learn: each pushes a Report every
sync_seconds and a starting replica seeds its router from the pooled estimates. The
driver seeds the fleet from its saved estimates and, on exit, merges what the replicas
learned into that file, as the single-process server does.

Faults: a replica that dies mid-request ends its requests with ReplicaLostError (remote.py);
Ray Serve restarts it (its health check also fails when its scheduler's worker died); a
replica whose node lacks a model file fails to start with an error naming the node and file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import threading
from collections.abc import AsyncIterator

import click
import ray
from ray import serve
from ray._common.constants import HEAD_NODE_RESOURCE_NAME
from ray.serve.config import AutoscalingConfig, RequestRouterConfig
from ray.serve.handle import DeploymentHandle

from specrouter.cascade.grammar import prepare as grammar_vocabulary
from specrouter.engine.batch import SeqRequest
from specrouter.errors import SpecRouterError
from specrouter.fleet.affinity import AffinityRouter
from specrouter.fleet.knowledge import FleetKnowledge, Report
from specrouter.fleet.metrics import fleet_exposition
from specrouter.fleet.remote import Admitted, ChoiceItem, RemoteService
from specrouter.fleet.replica import EngineBuild, PoolBuild
from specrouter.router.estimates.acceptance import AcceptanceEstimator
from specrouter.router.estimates.learned import save_estimates
from specrouter.router.estimates.profile_cache import default_profile_dir, install_profiles, profile_files
from specrouter.router.estimates.profiler import cpu_model
from specrouter.router.estimates.store import RouterStore
from specrouter.server.app import create_app
from specrouter.server.config import ServeConfig
from specrouter.server.run import Engine
from specrouter.server.service import interleave


log = logging.getLogger(__name__)

APP_NAME = "specrouter"
#: Reports a replica may miss before the fleet stops counting it as live.
STALE_REPORTS = 3
#: Seconds a drain may take beyond its grace period (ending the requests left, Ray's round trips).
DRAIN_MARGIN = 30.0
#: Ray's and Ray Serve's settings for a fleet, read from the environment of each of its
#: processes (serve_env: the job's runtime environment carries them to the controller, the
#: proxy and the replicas; a variable the user set wins). On a machine whose cores also run
#: the engines, every millisecond Serve spends is taken from a forward:
#: - its throughput mode: calls between deployments over gRPC, the replica's code on its own
#:   event loop instead of a separate thread (one thread hop less per streamed chunk);
#: - without its direct ingress (which that mode turns on): the ingress would then listen on
#:   ports of its own instead of the one endpoint the proxy serves on --host/--port;
#: - the controller's loop every 0.5 s instead of 0.1 s and metrics exported every second
#:   instead of every 0.1 s: what an idle fleet costs in CPU (a replica restart or a scaling
#:   decision waits up to 0.4 s longer);
#: - worker processes at nice 0 (Ray starts them at 15 by default, below its own daemons):
#:   the engine replicas run the model, and at nice 15 every process of the machine at nice
#:   0 (Ray's daemons, an HTTP client, anything else) preempts their llama.cpp threads, which
#:   wait on each other at every operation (Ray's job manager sets the same for its
#:   supervisor; the job's runtime environment carries it to every worker it starts).
#: Measured in docs/journal.md.
SERVE_ENV = {"RAY_worker_niceness": "0", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_ENABLE_DIRECT_INGRESS": "0",
             "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5", "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "1000"}


def serve_env() -> dict[str, str]:
    """SERVE_ENV, with the values the user's environment sets instead."""
    return {name: os.environ.get(name, value) for name, value in SERVE_ENV.items()}


class ReplicaStartError(SpecRouterError):
    """A replica could not build its engine (a model file missing on its node, ...)."""


#: What pins an actor to the head node (Ray's own resource there; Ray Train pins its state
#: actor the same way). The ingress and the fleet live where `serve --ray` runs: a worker
#: node that goes away takes only engine replicas with it (the endpoint and what the fleet
#: learned stay), as tests/unit/fleet/test_fleet_nodes.py checks.
ON_HEAD = {HEAD_NODE_RESOURCE_NAME: 0.001}

FleetActor = ray.remote(num_cpus=0, resources=ON_HEAD)(FleetKnowledge)


class EngineReplica:
    """One replica: an engine as `specrouter serve` builds it, serving request streams."""

    async def __init__(self, build: EngineBuild, fleet: ray.actor.ActorHandle, sync_seconds: float) -> None:
        self.name = serve.get_replica_context().replica_id.unique_id
        self._node = ray.get_runtime_context().get_node_id()
        self._stack = contextlib.ExitStack()
        self._stopped = threading.Event()
        self.engine: Engine | None = None
        profiles, cpu = default_profile_dir(), cpu_model()
        install_profiles(profiles, await fleet.profiles.remote(cpu))
        try:
            self.engine = self._stack.enter_context(build.engine())
        except SpecRouterError as exc:
            raise ReplicaStartError(f"replica {self.name} on node {ray.util.get_node_ip_address()} "
                                    f"(id {self._node}) cannot start: {exc}") from None
        await fleet.add_profiles.remote(cpu, profile_files(profiles, self.engine.router.models))
        self.engine.router.acceptance.seed(await fleet.priors.remote())
        self.engine.service.start()
        self._fleet, self._sync = fleet, sync_seconds
        self._reporter = threading.Thread(target=self._report_loop, name="specrouter-report", daemon=True)
        self._reporter.start()

    def report(self) -> Report:
        service, acceptance = self.engine.service, self.engine.router.acceptance
        return Report(self.name, self._node, acceptance.snapshot(), service.metrics.exposition(), service.alive,
                      learned=acceptance.learned(), spec=service.metrics.spec_stats)

    def _report_loop(self) -> None:
        while True:
            try:
                ray.get(self._fleet.push.remote(self.report()))
            except Exception:  # noqa: BLE001 - the fleet is unreachable for now: the next period retries
                log.warning("replica %s could not report to the fleet", self.name, exc_info=True)
            if self._stopped.wait(self._sync):
                return

    async def generate(self, request: SeqRequest, n: int = 1,
                       affinity: str | None = None) -> AsyncIterator[Admitted | ChoiceItem]:
        """Admitted once the service took the request's n choices (its admission error is
        raised instead), then each choice's deltas and result as they come. Cancelled (the
        ingress closed the stream: its client left), the choices are cancelled here."""
        del affinity  # read by AffinityRouter from the call's arguments, before the request got here
        if request.params.grammar is not None:  # built once per replica, off the scheduler's thread
            await asyncio.to_thread(grammar_vocabulary, self.engine.target)
        handles = await self.engine.service.submit(request, n)
        try:
            yield Admitted()
            async with contextlib.aclosing(interleave([h.events() for h in handles])) as items:
                async for index, item in items:  # one choice's error ends the stream: the ingress fails the others
                    yield ChoiceItem(index, item)
        finally:
            for handle in handles:
                handle.cancel()

    def check_health(self) -> None:
        """Ray Serve's periodic check: a replica whose scheduler worker died is restarted."""
        if not self.engine.service.alive:
            raise RuntimeError(f"replica {self.name}: the scheduler's worker is not running")

    def __del__(self) -> None:
        self._stopped.set()
        if self.engine is not None:
            self.engine.service.stop()  # the worker ends before the models close
        self._stack.close()


@serve.ingress()
class Ingress:
    """The HTTP app of `specrouter serve` over the engine replicas."""

    def __init__(self, build: EngineBuild, engine: DeploymentHandle, fleet: ray.actor.ActorHandle,
                 sync_seconds: float) -> None:
        self._build, self._engine, self._fleet, self._sync = build, engine, fleet, sync_seconds
        self._service: RemoteService | None = None

    async def drain(self, grace: float) -> None:
        """Graceful shutdown's first part (RemoteService.drain); drain_fleet calls it."""
        await self._service.drain(grace)

    def __serve_build_asgi_app__(self):
        engine, fleet = self._engine.options(stream=True), self._fleet

        def open_stream(request: SeqRequest, n: int, affinity: str | None):
            return engine.generate.remote(request, n, affinity=affinity)

        async def serving() -> int:
            return await fleet.serving.remote()

        async def exposition() -> bytes:
            return fleet_exposition(await fleet.live.remote())

        self._service = RemoteService(self._build.vocabulary(), self._build.config.levels, open_stream, serving,
                                      exposition, poll_seconds=self._sync)
        return create_app(self._service, self._build.config)


def replica_actor_options(config: ServeConfig) -> dict[str, float]:
    """What each engine replica reserves from Ray: its threads as CPUs, and config.replica_gpus
    GPUs when it asks for any (Ray then sets the replica's CUDA_VISIBLE_DEVICES to the GPUs it
    assigned, which the replica's torch and llama.cpp see as cuda:0 up)."""
    options: dict[str, float] = {"num_cpus": config.threads or 1}
    if config.replica_gpus > 0:
        options["num_gpus"] = config.replica_gpus
    return options


def engine_deployment(config: ServeConfig) -> serve.Deployment:
    """The engine replicas' deployment for `config`'s [ray] table (not bound yet)."""
    table = config.ray
    options = dict(ray_actor_options=replica_actor_options(config),
                   # The replica's own queue answers 429 first (Service.max_queue), so Ray never
                   # holds more than a replica admits.
                   max_ongoing_requests=config.max_batch + config.max_queue + 1,
                   request_router_config=RequestRouterConfig(request_router_class=AffinityRouter,
                                                             request_router_kwargs={"slack": table.affinity_slack}))
    if table.min_replicas is not None:
        options["autoscaling_config"] = AutoscalingConfig(min_replicas=table.min_replicas,
                                                          max_replicas=table.max_replicas,
                                                          target_ongoing_requests=table.target_ongoing_requests)
    else:
        options["num_replicas"] = table.replicas
    return serve.deployment(EngineReplica, name="EngineReplica", **options)


def fleet_application(build: EngineBuild, fleet: ray.actor.ActorHandle):
    """The Ray Serve application (bound deployments) for `build.config`'s [ray] table."""
    table = build.config.ray
    engine = engine_deployment(build.config).bind(build, fleet, table.sync_seconds)
    ingress = serve.deployment(Ingress, name="Ingress", ray_actor_options={"num_cpus": 0, "resources": ON_HEAD},
                               max_ongoing_requests=10_000)
    return ingress.bind(build, engine, fleet, table.sync_seconds)


class FleetStartError(SpecRouterError):
    """The application did not deploy; the message has each failing deployment's reason."""


def new_fleet(build: EngineBuild, store: RouterStore | None = None) -> ray.actor.ActorHandle:
    """The fleet actor, seeded from `store`'s saved estimates."""
    seed = AcceptanceEstimator()
    if store is not None:
        seed.load(store.estimates_file)
    return FleetActor.remote(seed.snapshot(), STALE_REPORTS * build.config.ray.sync_seconds)


def start_fleet(build: EngineBuild, store: RouterStore | None = None, name: str = APP_NAME,
                route_prefix: str = "/", fleet: ray.actor.ActorHandle | None = None) -> ray.actor.ActorHandle:
    """Deploy on the connected Ray cluster (serve.start already called): the fleet actor
    (`fleet`, else new_fleet(build, store)), then the application, and wait until every
    replica is up; returns the fleet. Raises FleetStartError with the replicas' own errors
    (e.g. a model file missing on a node)."""
    fleet = fleet if fleet is not None else new_fleet(build, store)
    try:
        serve.run(fleet_application(build, fleet), name=name, route_prefix=route_prefix, blocking=False)
    except RuntimeError as exc:  # Ray Serve says only which deployments failed; their status says why
        status = serve.status().applications.get(name)
        reasons = [f"{d}: {s.message}" for d, s in (status.deployments.items() if status else ()) if s.message]
        serve.delete(name)
        ray.kill(fleet)
        raise FleetStartError(f"{exc}\n" + "\n".join(reasons)) from None
    return fleet


class StartInterrupted(Exception):
    """SIGINT or SIGTERM while the application was still starting (serve_fleet)."""


def save_fleet(fleet: ray.actor.ActorHandle, store: RouterStore) -> None:
    """What the fleet's replicas learned, merged into `store`'s file as one process's save
    merges (router/estimates/learned.py: pooled with what is on disk now, under its lock; a file with
    no readable table is replaced by the pooled priors). The next run, fleet or not, starts
    from it."""
    learned, priors = ray.get([fleet.learned.remote(), fleet.priors.remote()])
    save_estimates(store.estimates_file, learned, priors)


def drain_fleet(grace: float, name: str = APP_NAME) -> None:
    """The application's graceful shutdown, as `specrouter serve`'s (server/drain.py): new
    requests get 503 with Retry-After, those in flight may finish for `grace` seconds, each
    one left then ends with a clean error. Returns once all were told; then the application
    can be deleted with nothing in flight."""
    serve.get_deployment_handle("Ingress", name).drain.remote(grace).result(timeout_s=grace + DRAIN_MARGIN)


def check_local_gpus(config: ServeConfig, available: float) -> None:
    """Raise FleetStartError when a local Ray instance with `available` GPUs cannot place
    the replicas that must run (replicas, or min_replicas when autoscaling) with
    config.replica_gpus each: Ray would leave those replicas pending, and the start would
    wait for them forever. Replicas under one GPU each share a GPU as long as their
    fractions fit in it."""
    gpus, table = config.replica_gpus, config.ray
    if gpus == 0:
        return
    needed = table.min_replicas if table.min_replicas is not None else table.replicas
    fit = math.floor(available) * math.floor(1 / gpus) if gpus < 1 else math.floor(available / gpus)
    if needed > fit:
        raise FleetStartError(f"{needed} replicas of {gpus:g} GPU each need more GPUs than this machine's Ray "
                              f"instance has (GPUs: {available:g}, room for {fit} replicas): Ray would leave the "
                              f"others pending; ask for fewer replicas or set [ray] gpus_per_replica")


def serve_fleet(config: ServeConfig) -> None:
    """Run until SIGINT or SIGTERM: connect to (or start) Ray, deploy; on the signal drain
    (drain_fleet: config.shutdown_timeout), save what the fleet learned, take it down.
    A local Ray instance gets at least the CPUs the replicas ask for (threads x replicas:
    more than the machine has oversubscribes its cores, as the user asked, instead of
    leaving replicas unscheduled forever); its GPUs are those Ray detects on the machine, and
    replicas that cannot be placed on them are an error (check_local_gpus), not a start that
    waits forever. Without --ray-address the instance is always a new
    one (Ray's "local"): a bare ray.init() would join whatever cluster was last started on
    this machine. Serve runs with SERVE_ENV (a cluster whose Serve is already running keeps
    its own settings)."""
    local = {}
    if config.ray.address is None:
        table = config.ray
        local["num_cpus"] = max(os.cpu_count() or 1, (config.threads or 1) * (table.max_replicas or table.replicas))
    ray.init(address=config.ray.address or "local", include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": serve_env()}, **local)
    stop, starting = threading.Event(), [True]

    def on_signal(*_) -> None:
        # While replicas start (a model's first profile takes a minute or more), the signal
        # ends the wait for them; some may already serve, so the shutdown below runs anyway.
        stop.set()
        if starting[0]:
            starting[0] = False
            raise StartInterrupted

    for sig in (signal.SIGINT, signal.SIGTERM):  # before deploying: Ray's own handler would kill the process
        signal.signal(sig, on_signal)
    fleet, store = None, RouterStore(default_profile_dir())
    try:
        if config.ray.address is None:
            check_local_gpus(config, ray.cluster_resources().get("GPU", 0))
        try:
            serve.start(http_options={"host": config.host, "port": config.port})
            fleet = new_fleet(PoolBuild(config), store)
            start_fleet(PoolBuild(config), fleet=fleet)
            starting[0] = False
            click.echo(f"serving on http://{config.host}:{config.port} through Ray Serve "
                       f"({config.ray.replicas if config.ray.min_replicas is None else 'autoscaled'} replicas)",
                       err=True)
            stop.wait()
        except StartInterrupted:
            click.echo("stopped while the replicas were starting", err=True)
        if fleet is not None:
            try:
                drain_fleet(config.shutdown_timeout)
            except Exception:  # noqa: BLE001 - what was learned is saved and the application deleted all the same
                log.warning("the drain did not complete", exc_info=True)
            save_fleet(fleet, store)
            serve.delete(APP_NAME)
        if config.ray.address is None:
            serve.shutdown()
    finally:
        ray.shutdown()

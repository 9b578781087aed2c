"""The router: before every cycle, the chain of models (cheapest first, target last) and draft
lengths with the least expected time per committed token. It never touches tokens, only
numbers; any chain it chooses keeps the output exact.

config.py    RouterConfig: every tuning constant (docs/router.md: what each does, and why)
estimates/   what it knows: costs (profiled, corrected online), acceptance, answer lengths,
             and what of it outlives the process
learn.py     what a cycle teaches the estimates
policy/      decide(inputs, session_state, config) -> Decision: candidates, draft lengths,
             caution, hysteresis, probes, pacing (no I/O, no clock)
session.py   Router: the ChainRouter of one request (engine/request.py)
frozen.py    FrozenRoutes: sessions for seeded requests, from a router's state at one moment
build.py     which models may draft for a target
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from specrouter.drafters import DEFAULT_LOOKUP
from specrouter.drafters.memory import SuffixMemory
from specrouter.errors import InvalidParameterError
from specrouter.router.build import build_router
from specrouter.router.config import DEFAULT_CONFIG, RouterConfig
from specrouter.router.estimates.acceptance import AcceptanceEstimator
from specrouter.router.estimates.costs import CostProfile, OnlineCosts
from specrouter.router.estimates.profile_cache import default_profile_dir, load_or_profile, read_profile
from specrouter.router.estimates.profiler import profile_model
from specrouter.router.estimates.store import RouterStore
from specrouter.router.policy.predictor import ChainSpec, Prediction, predict
from specrouter.router.policy.record import DecisionRecord
from specrouter.router.policy.state import Decision
from specrouter.router.session import Router


__all__ = ["DEFAULT_CONFIG", "AcceptanceEstimator", "ChainSpec", "CostProfile", "Decision", "DecisionRecord",
           "OnlineCosts", "Prediction", "Router", "RouterConfig", "auto_router", "build_router", "load_or_profile",
           "predict", "profile_model", "read_profile"]


def auto_router(pool, target: str | None, candidates: Sequence[str], profile_dir: Path | None = None,
                progress: bool = True, profile_file: Path | None = None, lookup: str = DEFAULT_LOOKUP,
                memory: SuffixMemory | None = None, config: RouterConfig = DEFAULT_CONFIG) -> Router:
    """The router `--chain auto` uses: `target` (default: the last, i.e. largest, of the
    candidates) and every candidate that shares its tokenizer, plus the model-free level
    `lookup` (a name in specrouter.drafters.MODEL_FREE), reading and feeding `memory` (the
    process's cross-request suffix memory; None: none).
    Costs come from `profile_file` for the models it names (a saved or GPU profile), else
    from the cached profile (measured now where missing or stale); acceptance estimates
    from earlier runs are loaded (and saved back by Router.save_estimates). `config`: the
    tuning of the router and of everything it builds (its estimates, costs and profiling)."""
    given = read_profile(profile_file) if profile_file is not None else None  # a bad file fails before any work
    if target is None:
        if not candidates:
            raise InvalidParameterError("--chain auto needs a pulled pool model: run `specrouter pull`, or give --target")
        target = candidates[-1]
    model = pool.model(target)
    others = [pool.model(n) for n in candidates if n != target]
    directory = Path(profile_dir) if profile_dir is not None else default_profile_dir()
    acceptance = AcceptanceEstimator(config=config)
    store = RouterStore(directory)
    acceptance.load(store.estimates_file)
    router = build_router(model, others, acceptance=acceptance, costs=lambda models: OnlineCosts(
        load_or_profile(models, directory, progress=progress, given=given, config=config), config=config),
        lookup=lookup, memory=memory, config=config)
    store.profiled = [m for m in router.models if given is None or m.name not in given.tables]
    router.store = store
    return router

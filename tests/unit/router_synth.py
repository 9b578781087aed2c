"""Synthetic models with simulated costs for the router tests (no wall time anywhere)."""

from __future__ import annotations

import numpy as np

from specrouter.backends.synthetic import SyntheticBackend
from specrouter.cascade.chain import Chain, CycleRunner
from specrouter.engine import generate
from specrouter.metrics import SpecStats
from specrouter.router import AcceptanceEstimator, CostProfile, OnlineCosts, Router, profile_model
from specrouter.router.config import DEFAULT_CONFIG

DRAFT_GRID = DEFAULT_CONFIG.draft_grid

PROMPT = [1, 2, 3, 4, 5]


def linear(fixed: float, per_token: float):
    """Latency of a forward over n tokens: a fixed part plus a part per token (GPU-like)."""
    return lambda n: fixed + per_token * n


def family(vocab: int = 16):
    """A target and two drafts: the mid one accepts more, the small one is cheaper."""
    target = SyntheticBackend("target", vocab=vocab, latency=linear(0.050, 0.004), params_b=7.0)
    mid = SyntheticBackend("mid", vocab=vocab, model_seed=2, noise=0.5, latency=linear(0.012, 0.002), params_b=1.0)
    small = SyntheticBackend("small", vocab=vocab, model_seed=3, noise=1.0, latency=linear(0.003, 0.0005), params_b=0.1)
    return target, mid, small


def simulated_clock(models):
    return lambda: sum(m.simulated_seconds for m in models)


def profiled(models) -> CostProfile:
    """profile_model on each synthetic model, timed with its own simulated clock."""
    return CostProfile({m.name: profile_model(m, clock=lambda m=m: m.simulated_seconds) for m in models})


def make_router(target, drafts, **kw) -> Router:
    return Router(target, drafts, OnlineCosts(profiled([*drafts, target])), AcceptanceEstimator(), **kw)


def seconds_per_token(chain_or_router, models, params, max_tokens, seed=0, prompt=PROMPT):
    """Simulated seconds per committed token (from the backends' simulated_seconds) and the result."""
    clock = simulated_clock(models)
    before = clock()
    result = generate(chain_or_router, prompt, params, max_tokens, rng=np.random.default_rng(seed), clock=clock)
    return (clock() - before) / len(result.token_ids), result


def rows_cost_simulated_time(monkeypatch, model, seconds_per_row):
    """Every logits row the cascade warps charges `model`'s simulated clock (Python work)."""
    original = CycleRunner._dists

    def dists(self, rows):
        model.simulated_seconds += seconds_per_row * len(rows)
        return original(self, rows)

    monkeypatch.setattr(CycleRunner, "_dists", dists)


def static_chains(by_name: dict, names_list, grid=DRAFT_GRID):
    """Every chain of the given name tuples with every draft-length combination from grid."""
    import itertools

    for names in names_list:
        depth = len(names) - 1
        for ks in itertools.product(grid, repeat=depth):
            yield Chain([by_name[n] for n in names], list(ks))


class ScriptedRouter:
    """Switches chains every cycle by a rule of the history (the last committed token and
    the position): a stress test of exactness, which must hold for any adapted choice."""

    decisions: list = []
    deliberated = True
    prefill = False

    def __init__(self, target, chains):
        self.target, self.chains = target, chains
        self.models = list({id(m): m for c in chains for m in c.models}.values())
        self.calls = 0

    @property
    def lookup_stats(self):
        return SpecStats()

    def start(self, params, prompt_tokens, max_tokens):
        self.calls = 0

    def choose(self, position, room, cached, context, forced=()):
        self.calls += 1
        return self.chains[(self.calls + position + context[-1]) % len(self.chains)]

    def on_forward(self, level, n_tokens, seconds, shared=False, batch=1):
        pass

    def on_rows(self, level, rows, seconds):
        pass

    def on_verify(self, proposer, verifier, proposals, q, p, n_accepted, requested, match_class=None):
        pass

    def on_choice(self, seconds):
        pass

    def end_cycle(self, new_tokens, seconds):
        pass

    def finish(self):
        pass

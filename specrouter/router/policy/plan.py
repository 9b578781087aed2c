"""A plan: what the router's choice is computed from, frozen at a re-plan, and the draft-length
search over it.

The router re-plans only when its inputs moved by more than a tolerance (planner.py says
when); between re-plans every prediction is made from the same PlanInputs, so predictions are
memoised per plan (`Plan.predict`) and a cycle that asks again what another asked costs a
dictionary look-up.

Draft lengths (`Plan.best_lengths`): for a chain of depth d, each of its d non-target levels
takes a length from the grid. Chains with at most max_exhaustive length combinations search
them all; deeper ones by coordinate descent from the middle of the grid. After a small move of
the inputs the optimum moves little: `start` searches the grid neighbours of the last optimum
instead. Near the end of a request the room (tokens still allowed) cuts the grid: the target
never takes more than room - 1 proposals.

Acceptance tables (`Rates`): the estimate itself; optimistic (for probes: the estimate plus an
exploration bonus, or a stale pair's global rate); cautious and bold (the estimate caution_z
standard errors below and above: the guard to enter a chain and the one to leave it). Per pair
(proposer key, verifier): the model-free level's key is its match class (`level_key`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from specrouter.router.config import DEFAULT_CONFIG, RouterConfig
from specrouter.router.policy.predictor import ChainSpec, Prediction, predict

#: Per pair (proposer key, verifier).
Pair = tuple[str, str]


class Rates(Enum):
    """Which acceptance table a prediction uses."""

    ESTIMATE = "rates"
    OPTIMISTIC = "optimistic"  # probes
    CAUTIOUS = "cautious"  # the guard to enter a chain
    BOLD = "bold"  # the guard to leave it


def match_key(lookup: str, cls: str | int) -> str:
    """The estimator's name of the model-free level `lookup` when its match is of class `cls`
    (LookupDrafter.match_class: its acceptance is kept per class, a longer match predicts better)."""
    return f"{lookup}#{cls}"


def level_key(name: str, cls: str | None, lookup: str | None) -> str:
    """The estimator's name of a chain level in a cycle: the model-free level `lookup` goes
    by its match class `cls` (when the cycle's lookup found a match), any other by its name."""
    return cls if name == lookup and cls is not None else name


@dataclass
class PlanInputs:
    """Everything a prediction depends on, as measured before a cycle."""

    rates: dict[Pair, float]
    optimistic: dict[Pair, float]
    cautious: dict[Pair, float]
    bold: dict[Pair, float]
    stale: set[Pair]  # pairs left after a bad stretch, worth probing at their global rate
    fills: dict[Pair, float]  # share of the asked proposals a proposer gave (a lookup finds fewer)
    costs: dict[str, float]  # the cost model's snapshot (OnlineCosts.snapshot)
    refits: int  # tables the cost model replaced so far (OnlineCosts.refits)
    row: float  # seconds of Python work per logits row
    room: int  # tokens the request may still emit, capped at the longest draft + 1
    batch: int  # sequences advancing together

    def acceptance(self, kind: Rates) -> dict[Pair, float]:
        return getattr(self, kind.value)

    def moving_tables(self) -> list[dict[Pair, float]]:
        """The per-pair tables whose moves trigger a re-plan."""
        return [self.rates, self.cautious, self.bold, self.fills]

    @staticmethod
    def tolerances(config: RouterConfig) -> list[float]:
        """The tolerance of each of moving_tables(), in order."""
        return [config.rate_tolerance] * 3 + [config.fill_tolerance]

    def take_class(self, cls: str, new: PlanInputs) -> None:
        """Take up `new`'s values of the pairs whose proposer is `cls` (one match class of the lookup)."""
        for mine, theirs in zip(self.moving_tables(), new.moving_tables()):
            mine.update((pair, v) for pair, v in theirs.items() if pair[0] == cls)
        self.optimistic.update((pair, v) for pair, v in new.optimistic.items() if pair[0] == cls)
        self.stale.difference_update({pair for pair in self.stale if pair[0] == cls})
        self.stale.update(pair for pair in new.stale if pair[0] == cls)


@dataclass
class Scored:
    spec: ChainSpec
    prediction: Prediction
    catch_up: float = 0.0  # seconds the chain's models need to catch up before it runs
    score: float = 0.0  # seconds per token, catch-up amortised
    cautious: float | None = None  # the score at the cautious acceptance (None: not computed)
    sure: bool = True  # beats the target alone even at the cautious acceptance
    holds: bool = False  # the current chain, still beating the target alone at the bold acceptance

    def as_dict(self) -> dict:
        return {"chain": list(self.spec.names), "draft_lengths": list(self.spec.draft_lengths),
                "predicted_ms_per_token": round(self.prediction.seconds_per_token * 1e3, 3),
                "tokens_per_cycle": round(self.prediction.tokens_per_cycle, 3),
                "catch_up_ms": round(self.catch_up * 1e3, 3),
                "score_ms_per_token": round(self.score * 1e3, 3),
                **({} if self.cautious is None else {"cautious_ms_per_token": round(self.cautious * 1e3, 3),
                                                     "pays_for_sure": self.sure})}

    @property
    def catch_up_per_token(self) -> float:
        return self.score - self.prediction.seconds_per_token


@dataclass
class Plan:
    """The inputs of one re-plan and what was predicted from them."""

    inputs: PlanInputs
    #: Seconds of one forward of (model, n tokens), priced for the batch (cached per plan).
    cost: Callable[[str, float], float]
    grid: tuple[int, ...]
    #: The room when it cuts the grid (the request's last tokens), else None.
    window: int | None
    #: This re-plan searches every chain's lengths afresh (not around the last optimum).
    full: bool
    #: Match classes whose lookup chains keep their lengths and are only predicted again.
    rescore: set[str]
    #: The model-free level (None: the router runs none).
    lookup: str | None = None
    #: Its draft lengths when it drafts at the bottom of a chain (empty: the grid's).
    lookup_grid: tuple[int, ...] = ()
    config: RouterConfig = DEFAULT_CONFIG
    memo: dict = field(default_factory=dict)  # the predictor's, per (table, class)
    predictions: dict = field(default_factory=dict)  # per (table, class, spec, room)

    def predict(self, spec: ChainSpec, kind: Rates = Rates.ESTIMATE, room: int | None = None,
                cls: str | None = None) -> Prediction:
        """The prediction at these inputs (memoised), with the lookup's estimates of class `cls`."""
        done = self.predictions.get((kind, cls, spec, room))
        if done is None:
            rates, fills = self.inputs.acceptance(kind), self.inputs.fills
            lookup = self.lookup
            done = self.predictions[(kind, cls, spec, room)] = predict(
                spec, self.cost, lambda j, i: rates[(level_key(j, cls, lookup), i)],
                lambda j, i: fills[(level_key(j, cls, lookup), i)], room, self.memo.setdefault((kind, cls), {}),
                self.inputs.row * self.inputs.batch, frozenset({lookup} if lookup else ()))
        return done

    def forget_class(self, cls: str, new: PlanInputs) -> None:
        """One match class's estimates moved: take them up and drop what was predicted
        from the old ones (its chains are planned again when a cycle needs them)."""
        self.inputs.take_class(cls, new)
        for kind in Rates:
            self.memo.pop((kind, cls), None)
        self.predictions = {k: v for k, v in self.predictions.items() if k[1] != cls}
        self.rescore.discard(cls)

    def best_lengths(self, names: tuple[str, ...], kind: Rates, start: tuple[int, ...] | None = None,
                     cls: str | None = None) -> Scored:
        """The chain's draft lengths with the least predicted seconds per token: a full search,
        or from `start` (the last optimum) a local one where the chain drafts at more than one
        level. One draft level is always searched whole: its seconds per token are not convex
        in k (a forward's cost jumps where the backend's kernels change with its size), so a
        local search can stall at a bump short of a far better length."""
        room = self.window
        depth = len(names) - 1
        if depth == 0:
            spec = ChainSpec(names)
            return Scored(spec, self.predict(spec, kind, room, cls))
        grids = self.grids(names)
        if room is not None:  # the target never takes more than room - 1 proposals
            grids = [tuple(k for k in grid if k < max(room, 2)) or (1,) for grid in grids]
        if start is not None and depth > 1:  # near the end the room cuts the grid: start from the longest left
            start = tuple(max((g for g in grid if g <= k), default=grid[0]) for k, grid in zip(start, grids))
            return self._local_search(names, kind, grids, start, cls)
        if math.prod(len(grid) for grid in grids) <= self.config.max_exhaustive:
            options = [ChainSpec(names, ks) for ks in itertools.product(*grids)]
            best = min(options, key=lambda s: self.predict(s, kind, room, cls).seconds_per_token)
            return Scored(best, self.predict(best, kind, room, cls))
        ks = [grid[len(grid) // 2] for grid in grids]  # coordinate descent from the middle of the grids
        best_val = self.predict(ChainSpec(names, tuple(ks)), kind, room, cls).seconds_per_token
        for _ in range(4):
            improved = False
            for level in range(depth):
                for k in grids[level]:
                    trial = ks.copy()
                    trial[level] = k
                    val = self.predict(ChainSpec(names, tuple(trial)), kind, room, cls).seconds_per_token
                    if val < best_val - 1e-12:
                        ks, best_val, improved = trial, val, True
            if not improved:
                break
        spec = ChainSpec(names, tuple(ks))
        return Scored(spec, self.predict(spec, kind, room, cls))

    def grids(self, names: tuple[str, ...]) -> list[tuple[int, ...]]:
        """The draft lengths searched per non-target level: the model-free level at the
        bottom has its own (longer: a copied stretch is one block), every other the grid."""
        return [self.lookup_grid if i == 0 and names[0] == self.lookup and self.lookup_grid else self.grid
                for i in range(len(names) - 1)]

    def _local_search(self, names: tuple[str, ...], kind: Rates, grids: Sequence[Sequence[int]],
                      start: tuple[int, ...], cls: str | None) -> Scored:
        """Grid neighbours (one step down or up per level) of the last best lengths until none
        improves."""
        room = self.window

        def value(ks):
            return self.predict(ChainSpec(names, ks), kind, room, cls).seconds_per_token

        ks, best = tuple(start), value(tuple(start))
        improved = True
        while improved:
            improved = False
            for level in range(len(ks)):
                grid = grids[level]
                i = grid.index(ks[level])
                for j in (i - 1, i + 1):
                    if 0 <= j < len(grid):
                        trial = ks[:level] + (grid[j],) + ks[level + 1 :]
                        v = value(trial)
                        if v < best - 1e-12:
                            ks, best, improved = trial, v, True
                            break
        spec = ChainSpec(names, ks)
        return Scored(spec, self.predict(spec, kind, room, cls))


class LengthHints:
    """The last best draft lengths found per (chain, acceptance table, match class), shared by a
    router's sessions: a request's first plan of a chain searches around what earlier requests
    found (a local search, a tenth of a full one) instead of the whole grid; the planner's
    periodic full search still guards against a local optimum."""

    def __init__(self) -> None:
        self._lengths: dict[tuple[tuple[str, ...], Rates, str | None], tuple[int, ...]] = {}

    def get(self, names: tuple[str, ...], kind: Rates, cls: str | None) -> tuple[int, ...] | None:
        return self._lengths.get((names, kind, cls))

    def copy(self) -> LengthHints:
        twin = LengthHints()
        twin._lengths = dict(self._lengths)
        return twin

    def record(self, plans: dict[tuple[str, ...], Scored], kind: Rates, cls: str | None) -> None:
        for names, scored in plans.items():
            self._lengths[(names, kind, cls)] = scored.spec.draft_lengths

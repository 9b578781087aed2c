"""The planner of a router session: the candidate chains' best draft lengths, re-planned only
when the inputs moved enough to matter.

Candidates: the target alone, and every subset of the draft models (in size order), each with
or without the model-free level at the bottom. Inputs (PlanInputs): the acceptance tables of
every pair, the cost model's snapshot, the Python cost per row, the room and the batch size.

Cheap per cycle: draft lengths are searched again only when an input moved enough, counted in
tolerances (an acceptance by rate_tolerance, a proposer's fill by fill_tolerance, a cost
relative to the target's by cost_tolerance, a lookup's cost, the overhead per forward and the
cost per row by their own seconds): a move of one tolerance re-plans at most every plan_every
cycles, one of big_move tolerances at once. A re-plan searches a chain of several draft
levels locally around the last optimum, fully every full_search_every re-plans (a chain of one
draft level is searched whole every time: Plan.best_lengths). A chain this request has not
planned yet starts from the lengths the router's other sessions found last (plan.LengthHints),
so a new request's first plans are local searches too; a full search only where no session
planned the chain yet. The model-free level's acceptance is kept per match class: its chains
are planned per class, lazily (when a cycle with that class first needs them after a
re-plan), and a move of one class's estimates re-plans that class only (every shadow score
moves a class's per-request estimate).

Exploration inputs: a pair is optimistic at its estimate + explore_bonus / sqrt(count + 1)
(at most optimistic_cap), or at its global rate when it was left after a bad stretch
(AcceptanceEstimator.stale_low); a chain gets an optimistic plan while one of its pairs has
fewer than `confident` observations or is stale. Caution: the cautious and bold tables are
caution_z standard errors below and above the estimate (the guards enter and leave chains on
them).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Mapping, Sequence

from specrouter.router.config import DEFAULT_CONFIG, RouterConfig
from specrouter.router.estimates.acceptance import AcceptanceEstimator
from specrouter.router.estimates.costs import OnlineCosts
from specrouter.router.policy.plan import LengthHints, Pair, Plan, PlanInputs, Rates, Scored, level_key


Plans = dict[tuple[str, ...], Scored]


class Planner:
    """Best and optimistic plans per candidate chain for one request."""

    def __init__(self, acceptance: AcceptanceEstimator, costs: OnlineCosts, target: str, grid: Sequence[int],
                 drafts: Sequence[str], lookup: str | None = None, match_keys: Sequence[str] = (),
                 lookup_grid: Sequence[int] = (), hints: LengthHints | None = None,
                 config: RouterConfig = DEFAULT_CONFIG) -> None:
        """lookup: the model-free level (None: none), whose estimates go by match_keys and
        whose draft lengths are searched over lookup_grid (empty: the grid); hints: the last
        lengths of the router's sessions (shared; default this planner's own)."""
        self.acceptance, self.costs, self.target, self.grid = acceptance, costs, target, tuple(grid)
        self.config = config
        self.hints = hints or LengthHints()
        self.lookup_grid = tuple(lookup_grid)
        #: The longest draft any level may be asked for.
        self.longest = max(self.grid + self.lookup_grid)
        self.lookup = lookup
        self.ngram_keys = list(match_keys) if lookup else []
        self.chains: list[tuple[str, ...]] = []
        for size in range(len(drafts) + 1):
            for subset in itertools.combinations(drafts, size):
                self.chains.append((*subset, target))
                if lookup:
                    self.chains.append((lookup, *subset, target))
        self.models = [*drafts, target]
        self.replans = 0
        self.plan: Plan | None = None
        self.start()

    def start(self) -> None:
        """A new request: its first plan is a full search."""
        self._inputs: PlanInputs | None = None
        self._planned_at = -self.config.plan_every
        self._class_planned_at: dict[str, int] = {}  # cycle of each match class's own re-plan
        # Plans of the chains without the model-free level, and per match class of those with it.
        self._best: Plans = {}
        self._optimistic: Plans = {}
        self._by_class: dict[str, tuple[Plans, Plans]] = {}
        self._previous_by_class: dict[str, tuple[Plans, Plans]] = {}

    def exclude(self, name: str) -> None:
        """Plan without this model from now on."""
        self.chains = [c for c in self.chains if name not in c]
        self.models = [m for m in self.models if m != name]
        self._inputs, self._best, self._optimistic, self._by_class = None, {}, {}, {}

    def estimate_names(self) -> list[str]:
        return [*self.ngram_keys, *self.models]

    def rate(self, proposer: str, verifier: str) -> float:
        return self.acceptance.rate(proposer, verifier, self.estimate_names())

    def pairs_to_probe(self, names: Sequence[str], cls: str | None) -> list[Pair]:
        """The chain's adjacent pairs that only running it can teach: all but the lookup's
        under the target, which the shadow lookup scores in every cycle with a match (against
        the target's rows, or its output when it runs alone), whatever chain runs."""
        return [(level_key(j, cls, self.lookup), i) for j, i in zip(names, names[1:])
                if not (j == self.lookup and i == self.target)]

    def probe_teaches(self, names: Sequence[str], cls: str | None) -> bool:
        """Whether a probe of the chain teaches what the shadow would not soon: a pair that only
        running it observes (pairs_to_probe), or the lookup's under the target while that pair
        is barely observed (fewer than `confident` scores): the shadow scores one position per
        cycle, a probe's block as many as it reaches."""
        if self.pairs_to_probe(names, cls):
            return True
        return (cls is not None and self.lookup in names
                and self.acceptance.count(cls, self.target) < self.config.confident)

    def plans(self, cls: str | None) -> tuple[Plans, Plans]:
        """The best and the optimistic plans of this cycle: with a match of class `cls`, the
        lookup chains too (without one they are their families' other members)."""
        if cls is None:
            return self._best, self._optimistic
        by_class = self._by_class.get(cls)
        if by_class is None:  # one class per cycle, so at most one more search per cycle
            chains = [c for c in self.chains if self.lookup in c]
            by_class = self._by_class[cls] = self._plans(chains, cls, self._previous_by_class.get(cls, ({}, {})),
                                                         rescore=cls in self.plan.rescore)
        return {**self._best, **by_class[0]}, {**self._optimistic, **by_class[1]}

    # Re-planning -----------------------------------------------------------------------------
    def refresh(self, room: int, batch: int, row_kind: str, cycle: int, now: bool = False,
                cls: str | None = None) -> None:
        """Before a cycle whose lookup found a match of class `cls` (None: none): re-plan if the
        inputs moved enough (`now`: whatever they did, after a probe, whose observations are
        what the next choice needs). Only the pairs this cycle can use are measured to see
        whether they moved: the models' and its class's (a class's plans serve only the cycles
        of that class, so another class's move is taken up when a cycle of it comes); a re-plan
        measures them all."""
        partial = not now and self._inputs is not None  # else a re-plan comes whatever moved
        inputs = self._measure(room, batch, row_kind, (() if cls is None else (cls,)) if partial else None)
        base, classes = self._move(self._inputs, inputs)
        if not now and not self._due(base, cycle - self._planned_at):
            for moved, move in classes.items():
                since = cycle - self._class_planned_at.get(moved, self._planned_at)
                if move >= 1 and since >= self.config.plan_every:
                    self._replan_class(moved, inputs, cycle)
            return
        if partial:
            inputs = self._measure(room, batch, row_kind)
        self._planned_at = cycle
        self._class_planned_at = {}
        self._inputs = inputs
        self.replans += 1
        full = self.replans % self.config.full_search_every == 0  # the first plan starts from the hints
        # The lookup chains keep their draft lengths, re-scored when a cycle of their class
        # needs them; their lengths are searched again when their own estimates move
        # (_replan_class), at the periodic full search and when the problem changed (room,
        # batch).
        rescore = set() if full or math.isinf(base) else set(self.ngram_keys)
        cost = functools.lru_cache(maxsize=None)(functools.partial(self._batch_cost, batch=batch))
        self.plan = Plan(inputs, cost, self.grid, inputs.room if inputs.room <= self.longest else None, full, rescore,
                         self.lookup, self.lookup_grid, self.config)
        self._previous_by_class = {**self._previous_by_class, **self._by_class}
        self._by_class = {}
        self._best, self._optimistic = self._plans([c for c in self.chains if self.lookup not in c], None,
                                                   (self._best, self._optimistic))

    def window(self, room: int) -> int:
        """The room as a plan sees it: a plan drafts only the grids' lengths shorter than the
        room (Plan.best_lengths), so every room between two such lengths plans alike; this
        is the least of them (the longest length left + 1; the room itself from 2 down, where
        no draft is left). A plan's room moves only where it cuts another length off the
        grid: once per grid length near a request's end, not once per token."""
        if room <= 2:
            return room
        return max(k for k in (*self.grid, *self.lookup_grid) if k < room) + 1

    def _measure(self, room: int, batch: int, row_kind: str, classes: Sequence[str] | None = None) -> PlanInputs:
        """The inputs of a plan, of the pairs of the models and of the lookup's match `classes`
        (None: every class)."""
        # Chains run in size order, so a proposer is always smaller than its verifier.
        keys = self.ngram_keys if classes is None else classes
        pairs = [*itertools.combinations(self.models, 2), *((k, m) for k in keys for m in self.models)]
        acc, c = self.acceptance, self.config
        table = acc.table(pairs, self.estimate_names(), c.caution_z)
        rates = table.rate
        optimistic, stale = {}, set()
        for j, i in pairs:
            bonus = rates[(j, i)] + c.explore_bonus / math.sqrt(table.count[(j, i)] + 1)
            low = acc.stale_low(j, i)
            if low is not None:
                stale.add((j, i))
            optimistic[(j, i)] = min(c.optimistic_cap, max(bonus, low or 0.0))
        return PlanInputs(rates, optimistic, table.cautious, table.bold, stale, {(j, i): acc.fill(j, i) for j, i in pairs},
                          self.costs.snapshot(), self.costs.refits, self.costs.row_seconds(row_kind), self.window(room),
                          batch)

    def _move(self, old: PlanInputs | None, new: PlanInputs) -> tuple[float, dict[str, float]]:
        """How far the inputs moved since they were planned with, in tolerances (>= 1: enough
        to matter; timings jitter every cycle): for the chains without the model-free level, and
        per match class for the lookup's own pairs (which move only that class's plans).
        Infinite when the problem itself changed."""
        # A table replaced (OnlineCosts._refit) prices everything anew: its level and shapes
        # start over, so the snapshot alone may not show it. A cost key that came is a size
        # timed for the first time, whose correction was 1 until then.
        c = self.config
        if old is None or old.batch != new.batch or old.refits != new.refits:
            return math.inf, {}
        if old.room != new.room:  # the room cut another length off the grid (window): at once
            return c.big_move, {}
        # Model costs count relative to the target's: a level that moves for all (the machine's
        # speed, which jitters from forward to forward) changes no choice. Shapes (model@n) are
        # relative already: they are compared as they are.
        t = self.target

        def relative(costs: Mapping[str, float], key: str) -> float:
            value = costs.get(key, 1.0)
            return value / costs.get(t, 1.0) if key in self.models else value

        base = [abs(relative(new.costs, k) - relative(old.costs, k))
                / (c.cost_tolerance * max(abs(relative(old.costs, k)), 1e-9))
                for k in new.costs if k not in ("overhead", self.lookup, t)]
        if self.lookup in old.costs:  # a lookup's level jitters widely, harmlessly: its seconds count
            seconds = self.costs.profile.lookup_seconds[self.lookup]
            base.append(abs(new.costs[self.lookup] - old.costs[self.lookup]) * seconds / c.lookup_cost_tolerance)
        base.append(abs(new.costs["overhead"] - old.costs["overhead"]) / c.overhead_tolerance)
        base.append(abs(new.row - old.row) / c.row_tolerance)
        classes: dict[str, float] = {}

        def note(pair: Pair, move: float) -> None:
            if pair[0] in self.ngram_keys:
                classes[pair[0]] = max(classes.get(pair[0], 0.0), move)
            else:
                base.append(move)

        for old_table, new_table, tolerance in zip(old.moving_tables(), new.moving_tables(), PlanInputs.tolerances(c)):
            for pair, value in new_table.items():  # the pairs measured (refresh)
                note(pair, abs(value - old_table[pair]) / tolerance)
        for pair in {pair for pair in old.stale if pair in new.rates} ^ new.stale:
            note(pair, c.big_move)  # a pair became worth probing, or stopped being
        return max(base), classes

    def _due(self, move: float, cycles_since: int) -> bool:
        """A small move (one tolerance) re-plans once plan_every cycles have passed since the
        last plan (the per-request estimates and the cost averages cross one tolerance most
        cycles); a big_move at once."""
        c = self.config
        return move >= c.big_move or (move >= 1 and cycles_since >= c.plan_every)

    def _replan_class(self, cls: str, inputs: PlanInputs, cycle: int) -> None:
        """Take up the new estimates of one match class of the lookup (the plan's inputs are
        those the next moves are measured from: one update serves both); its chains are planned
        again when a cycle needs them."""
        self.plan.forget_class(cls, inputs)
        if cls in self._by_class:
            self._previous_by_class[cls] = self._by_class.pop(cls)
        self._class_planned_at[cls] = cycle

    def _plans(self, chains: list[tuple[str, ...]], cls: str | None, previous: tuple[Plans, Plans],
               rescore: bool = False) -> tuple[Plans, Plans]:
        """Best draft lengths per chain, and optimistic ones for chains with a barely observed
        pair; with `rescore`, the previous lengths predicted again where there are some."""
        p = self.plan

        def plan(names, kind, plans):
            if p.full:
                return p.best_lengths(names, kind, None, cls)
            if names in plans:
                spec = plans[names].spec
                if rescore:
                    return Scored(spec, p.predict(spec, kind, p.window, cls))
                return p.best_lengths(names, kind, spec.draft_lengths, cls)
            return p.best_lengths(names, kind, self.hints.get(names, kind, cls), cls)

        best = {names: plan(names, Rates.ESTIMATE, previous[0]) for names in chains}
        optimistic = {}
        for names in chains:
            pairs = self.pairs_to_probe(names, cls)
            if any(self.acceptance.count(j, i) < self.config.confident or (j, i) in p.inputs.stale for j, i in pairs):
                optimistic[names] = plan(names, Rates.OPTIMISTIC, previous[1])
        self.hints.record(best, Rates.ESTIMATE, cls)
        self.hints.record(optimistic, Rates.OPTIMISTIC, cls)
        return best, optimistic

    def score(self, s: Scored, position: int, horizon: int, cached: Mapping[str, int], batch: int) -> Scored:
        """The plan `s` with its catch-up (the seconds its models need to feed what they missed
        since they last ran: `cached` committed tokens each model holds, `position` the
        context's length; the whole batch waits for it) amortised over the `horizon` tokens
        expected to come (lengths.py)."""
        catch_up = 0.0
        for name in s.spec.names[:-1]:  # the target is always caught up (it runs every cycle)
            extra = position - cached.get(name, 0) - 1  # the predictor already counts 1-2 tokens
            if name != self.lookup and extra > 0:
                catch_up += self.costs.seconds(name, 1 + extra) - self.costs.seconds(name, 1)
        catch_up *= batch
        return Scored(s.spec, s.prediction, catch_up, s.prediction.seconds_per_token + catch_up / max(1, horizon))

    def _batch_cost(self, name: str, n: float, batch: int) -> float:
        """What one forward of this sequence's n tokens costs the batch it runs in. The
        target runs for every sequence every cycle: one call over the batch, priced as if
        all fed n tokens. Any other model may run for this sequence alone, and the whole
        batch waits for that call (the scheduler serves one model after another), so its
        time counts once per waiting sequence: speculation must pay for everyone's time."""
        if name == self.target:
            return self.costs.seconds(name, n, batch)
        return batch * self.costs.seconds(name, n)

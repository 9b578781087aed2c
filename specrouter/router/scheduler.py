"""The router: before every cycle, the chain and draft lengths with the least expected
time per committed token, from the profiled costs and the acceptance estimates.

Candidates: the target alone, and every subset of the draft models (in size order),
each with or without the n-gram level at the bottom; per chain, draft lengths from a
bounded grid (exhaustive up to MAX_EXHAUSTIVE combinations, coordinate descent beyond).

Cheap per cycle: draft lengths are searched again only when an input moved enough
(an acceptance by > RATE_TOLERANCE, a cost by > COST_TOLERANCE; for such small moves at
most every PLAN_EVERY cycles, for BIG_MOVE tolerances at once), and then locally
around the last optimum (a full search every FULL_SEARCH_EVERY re-plans). Every cycle
adds each chain's one-time catch-up cost (a model that sat out must first feed what it
missed, lazily) amortised over the tokens still to come, and compares. Hysteresis: the
chain changes only when the new best is more than HYSTERESIS better than the current
one, so it does not flap.

Free observations: every model in a cycle computes its distribution at the cycle's
context, so every pair of models in the chain is scored there, adjacent or not; the
n-gram lookup (microseconds) runs in the shadow every cycle and is scored against the
rows the models compute anyway, or against the target's output when it runs alone.

The n-gram level is routed per cycle on what its lookup found: its acceptance is kept
per length of the suffix match (1..max_ngram, `ngram_key`), and the lookup is done
before the choice, so a cycle whose match is long (often right) drafts with it and one
whose match is a single token (right about a quarter of the time on code) does not.
Chains that differ only by the n-gram level form one family: moving inside a family
costs nothing (the n-gram has no cache), so hysteresis applies between families only.

Caution: a chain other than the target alone is moved to only if it beats the target
alone with every acceptance CAUTION_Z standard errors below its estimate (the
estimator's cautious rate: a request's own estimate remembers ~19 positions, and a pair
seen a few times is barely known); it is kept until it loses to the target alone even
with every acceptance CAUTION_Z standard errors above its estimate (the bold rate).
Picking the argmin of noisy estimates favours the chains whose estimates are
high by chance, and on a CPU where verifying k tokens costs nearly k forwards, a gain of
a few percent at best, that bias alone made auto slower than the target alone.

Exploration: a chain whose pairs are barely observed is probed for one cycle when its
optimistic prediction (acceptance + EXPLORE_BONUS / sqrt(count + 1)) would beat the
current best; so is a chain left after a bad stretch of this request, optimistically at
the global estimate (AcceptanceEstimator.stale_low: the stretch may have passed, and its
own estimate only drifts back as it goes stale, which with an fp32 target at 0.7 s a
token took ~100 tokens while the chain would have run 1.7x faster), and a chain that
beats the choice on its estimate but not for sure (its probes are the own data that
make it sure, or show it is not). After a probe the next choice is re-planned at once.
Probes run only while their measured extra time stays within EXPLORE_FRACTION of
generation time (elapsed plus expected remaining). The cap is what keeps `auto` within
a few percent of the best static choice when nothing pays; the optimism is what lets it
find a draft that does pay, and a chain that cannot win even optimistically is never
probed (on a CPU where drafting loses, nothing is). A probe's cost is counted, not
guessed: its cycle's time minus what the chosen chain would have spent on the same
tokens (nothing when the probe did better).

Draft stop: a model drafting for the target alone ends its draft where its own confidence
says that going on no longer pays (draft_stop.py: the chance that the block is still
accepted, calibrated per confidence bin, against the profiled cost of drafting and
verifying more), up to the grid's longest length. The chain is still chosen and scored
at its planned length: the rule weighs every fixed continuation from where it stands
(a rollout of the fixed lengths), so it does at least about as well as the planned one.
A probe drafts its planned length: it is there to measure the pair.

Any chain choice made before a cycle keeps the output exact
(each cycle emits tokens distributed as the target's, whatever chain produced them).
"""
from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from specrouter.backends.base import Backend
from specrouter.backends.ngram import NGRAM_NAME, NgramDrafter
from specrouter.cascade.chain import Chain, Level
from specrouter.cascade.sampling import SamplingParams
from specrouter.errors import InvalidParameterError
from specrouter.router.acceptance import AcceptanceEstimator, pair_score
from specrouter.router.draft_stop import ConfidenceStop
from specrouter.router.plan import Plan, PlanInputs, Rates, Scored, level_key
from specrouter.router.predictor import ChainSpec
from specrouter.router.profiler import OnlineCosts, row_kind

HYSTERESIS = 0.05
EXPLORE_FRACTION = 0.03  # leaves room for auto >= 0.97x of the best static choice
EXPLORE_BONUS = 0.5
#: A chain is moved to only if it beats the target alone with each acceptance this many standard
#: errors below its estimate (Router._check_sure): about 1 in 6 chances that it is lower.
CAUTION_Z = 1.0
CONFIDENT = 48  # positions after which a pair is no longer probed
#: Draft lengths searched per level: every length to 8, then coarser. Long drafts pay when
#: verifying n tokens costs about as much as one (an fp32 target on a CPU: flat from 3 to
#: 16 tokens; any GPU); on llama.cpp q4 targets the search never goes past a few. The
#: longest is also the cap of a draft that stops on its confidence (draft_stop).
DRAFT_GRID = (*range(1, 9), 10, 12, 16, 24)
FULL_SEARCH_EVERY = 16  # re-plans between full searches of the draft-length grid (local search otherwise)
COST_TOLERANCE = 0.05  # relative cost move that triggers a re-plan
PLAN_EVERY, BIG_MOVE = 4, 2.0  # small moves re-plan at most every 4 cycles; 2 tolerances at once
HORIZON = 256  # tokens over which a catch-up cost is amortised at most
MAX_DECISIONS = 200  # per request: the first decision, every switch and probe, up to this many


def ngram_key(size: int) -> str:
    """The estimator's name for the n-gram level when its suffix match has this length."""
    return f"{NGRAM_NAME}#{size}"


def _family(names: Sequence[str]) -> tuple[str, ...]:
    """A chain without its n-gram level: chains of one family switch freely between cycles."""
    return tuple(n for n in names if n != NGRAM_NAME)


@dataclass
class Decision:
    cycle: int
    position: int
    chosen: ChainSpec
    reason: str  # "start", "switch", "probe", "keep"
    candidates: list[Scored]
    inputs: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"cycle": self.cycle, "position": self.position, "chosen": str(self.chosen),
                "reason": self.reason, "candidates": [c.as_dict() for c in self.candidates],
                "inputs": self.inputs}


class Router:
    """Chooses a Chain before each cycle and learns from the cycle's observations."""

    def __init__(
        self,
        target: Backend,
        drafts: Sequence[Backend],
        costs: OnlineCosts,
        acceptance: AcceptanceEstimator | None = None,
        use_ngram: bool = True,
        draft_grid: Sequence[int] = DRAFT_GRID,
        hysteresis: float = HYSTERESIS,
        explore_fraction: float = EXPLORE_FRACTION,
        message: str | None = None,
        confidence_stop: bool = True,
        *,
        shared_stop: ConfidenceStop | None = None,
    ) -> None:
        """use_ngram: route the n-gram level too; confidence_stop: a model drafting for the
        target may end its draft on its confidence; shared_stop: that rule's calibration is
        shared with this stop's (a session: see session())."""
        self.target = target
        self.drafts = sorted(drafts, key=lambda m: m.params_b)
        self.models: list[Backend] = [*self.drafts, target]
        self.ngram = NgramDrafter() if use_ngram else None  # keeps no state: its evidence travels with its draft
        self.costs = costs
        self.acceptance = acceptance or AcceptanceEstimator()
        self.grid = tuple(draft_grid)
        self.hysteresis, self.explore_fraction = hysteresis, explore_fraction
        self.message = message  # why the candidate set is what it is (e.g. no shared tokenizer)
        self.estimates_file: Path | None = None
        #: A model drafting for the target alone ends its draft when its confidence says going on
        #: no longer pays (draft_stop), at most max(grid) tokens on.
        self.draft_stop = (shared_stop.session() if shared_stop else ConfidenceStop()) if confidence_stop else None
        self._levels: dict[str, Level] = {m.name: m for m in self.models}
        if self.ngram:
            self._levels[NGRAM_NAME] = self.ngram
        self.chains = self._enumerate()
        self.names = [NGRAM_NAME] * bool(self.ngram) + [m.name for m in self.models]
        self._ngram_keys = [ngram_key(n) for n in range(1, self.ngram.max_ngram + 1)] if self.ngram else []
        self._chain_objs: dict[ChainSpec, Chain] = {}
        # Plans: chains without the n-gram level, and per match class those with it (lazily).
        self._best: dict[tuple[str, ...], Scored] = {}
        self._optimistic: dict[tuple[str, ...], Scored] = {}
        self._by_class: dict[str, tuple[dict, dict]] = {}
        self._previous_by_class: dict[str, tuple[dict, dict]] = {}
        self._plan_inputs: PlanInputs | None = None
        self._plan: Plan | None = None
        self.replans = 0
        self.elapsed = self.probe_spent = 0.0  # seconds of cycles (global), of which probes' extra
        self.decisions: list[Decision] = []
        self.current: ChainSpec | None = None
        self._overhead = 0.0
        #: Sequences that advance together (set by the batch scheduler before choose): every
        #: forward then carries this many sequences' tokens, so it is costed at batch x n tokens.
        self.batch_size = 1
        self.start(SamplingParams())

    def session(self) -> Router:
        """A router for one request of many running at once, built afresh, never copied: its
        own per-request state (plan, decisions, current chain, probe budget, per-request
        acceptance, chain objects carrying its own draft stop), and the objects every request
        shares: the models, the cost model, the global acceptance estimates (a view) and the
        draft stop's calibration."""
        return Router(self.target, self.drafts, self.costs, self.acceptance.view(), self.ngram is not None,
                      self.grid, self.hysteresis, self.explore_fraction, self.message,
                      self.draft_stop is not None, shared_stop=self.draft_stop)

    # Candidates ------------------------------------------------------------------------
    def _enumerate(self) -> list[tuple[str, ...]]:
        out = []
        names = [m.name for m in self.drafts]
        for size in range(len(names) + 1):
            for subset in itertools.combinations(names, size):
                out.append((*subset, self.target.name))
                if self.ngram:
                    out.append((NGRAM_NAME, *subset, self.target.name))
        return out

    def exclude(self, name: str) -> None:
        """Route without this model from now on (it failed for this request)."""
        if name == self.target.name:
            raise InvalidParameterError("the target cannot be excluded from routing")
        self.chains = [c for c in self.chains if name not in c]
        self.names = [n for n in self.names if n != name]
        self._plan_inputs, self._best, self._optimistic, self._by_class = None, {}, {}, {}
        if self.current is not None and name in self.current.names:
            self.current = None

    def chain_for(self, spec: ChainSpec) -> Chain:
        """The chain object that runs a spec: a draft that stops on its confidence runs with the
        grid's longest length as its cap (draft_stop)."""
        chain = self._chain_objs.get(spec)
        if chain is None:
            lengths = [max(self.grid)] if self._stops(spec.names) else list(spec.draft_lengths)
            chain = self._chain_objs[spec] = Chain([self._levels[n] for n in spec.names], lengths)
        return chain

    # Request lifecycle ----------------------------------------------------------------
    def start(self, params: SamplingParams, prompt_tokens: int = 0, max_tokens: int = 0) -> None:
        self.acceptance.start_request(params.greedy)
        self._row_kind = row_kind(params)
        self.current = None
        self._plan_inputs = None
        self._cycle = 0
        self._planned_at = -PLAN_EVERY
        self._class_planned_at: dict[str, int] = {}  # cycle of each match class's own re-plan
        self._probe: tuple[ChainSpec, float] | None = None
        self.decisions = []  # per request
        self._best, self._optimistic = {}, {}  # a request's first plan is a full search
        self._by_class, self._previous_by_class = {}, {}
        self._reset_cycle()

    def _reset_cycle(self) -> None:
        self._first_row: dict[str, object] = {}
        self._ngram_x: list[int] | None = None  # the n-gram's proposal at the cycle's context
        self._ngram_key: str | None = None  # and its match class (None: it found nothing)
        self._ngram_scored: set[str] = set()  # verifiers it was scored against this cycle
        self._fwd_seconds = 0.0
        self._fwd_count = 0
        self._rows_seconds = 0.0

    def finish(self) -> None:
        """End of a request (nothing to release: estimates stay for the next one)."""

    def save_estimates(self) -> None:
        """Persist the global acceptance estimates (if a file was set): the next run starts informed."""
        if self.estimates_file is not None:
            self.acceptance.save(self.estimates_file)

    # Decision ---------------------------------------------------------------------------
    def _estimate_names(self) -> list[str]:
        return [*self._ngram_keys, *(n for n in self.names if n != NGRAM_NAME)]

    def _rate(self, j: str, i: str) -> float:
        return self.acceptance.rate(j, i, self._estimate_names())

    def _inputs(self, room: int) -> PlanInputs:
        # Chains run in size order, so a proposer is always smaller than its verifier.
        models = [n for n in self.names if n != NGRAM_NAME]
        pairs = [*itertools.combinations(models, 2), *((k, m) for k in self._ngram_keys for m in models)]
        names = self._estimate_names()
        rates = {(j, i): self.acceptance.rate(j, i, names) for j, i in pairs}
        cautious = {(j, i): self.acceptance.cautious(j, i, names, CAUTION_Z) for j, i in pairs}
        bold = {(j, i): self.acceptance.bold(j, i, names, CAUTION_Z) for j, i in pairs}
        optimistic, stale = {}, set()
        for j, i in pairs:
            bonus = rates[(j, i)] + EXPLORE_BONUS / math.sqrt(self.acceptance.count(j, i) + 1)
            low = self.acceptance.stale_low(j, i)
            if low is not None:
                stale.add((j, i))
            optimistic[(j, i)] = min(0.98, max(bonus, low or 0.0))
        return PlanInputs(rates, optimistic, cautious, bold, stale, {(j, i): self.acceptance.fill(j, i) for j, i in pairs},
                          self.costs.snapshot(), self.costs.row_seconds(self._row_kind),
                          min(room, max(self.grid) + 1), self.batch_size)

    def _move(self, old: PlanInputs | None, new: PlanInputs) -> tuple[float, dict[str, float]]:
        """How far the inputs moved since they were planned with, in tolerances (>= 1: enough
        to matter; timings jitter every cycle): for the chains without the n-gram level, and
        per match class for the n-gram's own pairs (which move only that class's plans).
        Infinite when the problem itself changed."""
        if old is None or old.batch != new.batch or old.costs.keys() != new.costs.keys():
            return math.inf, {}
        if old.room != new.room:  # the last tokens of a request: every cycle, at once
            return BIG_MOVE, {}
        # Model costs count relative to the target's: a level that moves for all (the machine's
        # speed, which jitters by several % from forward to forward) changes no choice, while
        # it re-planned every few cycles. Shapes (model@n) are relative already.
        t = self.target.name
        base = [abs(new.costs[k] / new.costs.get(t, 1.0) - v / old.costs.get(t, 1.0))
                / (COST_TOLERANCE * max(abs(v / old.costs.get(t, 1.0)), 1e-9))
                for k, v in old.costs.items() if k not in ("overhead", NGRAM_NAME, t)]
        if NGRAM_NAME in old.costs:  # a lookup of ~20 us: its level jitters by tens of %, harmlessly
            base.append(abs(new.costs[NGRAM_NAME] - old.costs[NGRAM_NAME]) * self.costs.profile.ngram_seconds / 2e-4)
        base.append(abs(new.costs["overhead"] - old.costs["overhead"]) / 5e-4)
        base.append(abs(new.row - old.row) / 2e-4)
        classes: dict[str, float] = {}

        def note(pair: tuple[str, str], move: float) -> None:
            if pair[0] in self._ngram_keys:
                classes[pair[0]] = max(classes.get(pair[0], 0.0), move)
            else:
                base.append(move)

        for (old_table, tolerance), (new_table, _) in zip(old.tolerance_tables(), new.tolerance_tables()):
            for pair, value in old_table.items():
                note(pair, abs(new_table[pair] - value) / tolerance)
        for pair in old.stale ^ new.stale:
            note(pair, BIG_MOVE)  # a pair became worth probing, or stopped being
        return max(base), classes

    def _due(self, move: float, planned_at: int) -> bool:
        # A small move waits until PLAN_EVERY cycles have passed since the last plan: the
        # per-request estimates and the cost EMAs cross one tolerance most cycles, and a plan
        # costs ~2 ms of Python, ~2.5% of a CPU token. A large move re-plans at once.
        return move >= BIG_MOVE or (move >= 1 and self._cycle - planned_at >= PLAN_EVERY)

    def _refresh(self, room: int) -> None:
        inputs = self._inputs(room)
        base, classes = self._move(self._plan_inputs, inputs)
        # After a probe its observations are what the next choice needs: re-plan at once.
        if self._probe is None and not self._due(base, self._planned_at):
            # The n-gram's estimates: only their class re-plans, and at most every PLAN_EVERY
            # cycles however far they moved (every shadow score moves a class's per-request
            # estimate by ~0.1, and a plan of its chains was most of the router's time).
            for cls, move in classes.items():
                if move >= 1 and self._cycle - self._class_planned_at.get(cls, self._planned_at) >= PLAN_EVERY:
                    self._replan_class(cls, inputs)
            return
        self._planned_at = self._cycle
        self._class_planned_at = {}
        self._plan_inputs = inputs
        self.replans += 1
        r = room if room <= max(self.grid) else None
        full = self.replans % FULL_SEARCH_EVERY == 1
        # The n-gram chains keep their draft lengths, re-scored when a cycle of their class
        # needs them; their lengths are searched again when their own estimates move
        # (_replan_class), at the periodic full search and when the problem changed (room,
        # batch). A search per class after every plan was most of the router's time.
        rescore = set() if full or math.isinf(base) else set(self._ngram_keys)
        self._plan = Plan(inputs, functools.lru_cache(maxsize=None)(self._batch_cost), self.grid, r, full, rescore)
        self._previous_by_class = {**self._previous_by_class, **self._by_class}
        self._by_class = {}
        self._best, self._optimistic = self._plans([c for c in self.chains if NGRAM_NAME not in c], None,
                                                   (self._best, self._optimistic))

    def _replan_class(self, cls: str, inputs: PlanInputs) -> None:
        """Take up the new estimates of one match class of the n-gram (the plan's inputs are
        those the next moves are measured from: one update serves both); its chains are planned
        again when a cycle needs them."""
        self._plan.forget_class(cls, inputs)
        if cls in self._by_class:
            self._previous_by_class[cls] = self._by_class.pop(cls)
        self._class_planned_at[cls] = self._cycle

    def _plans(self, chains: list[tuple[str, ...]], cls: str | None, previous: tuple[dict, dict],
               rescore: bool = False) -> tuple[dict, dict]:
        """Best draft lengths per chain, and optimistic ones for chains with a barely observed
        pair; with `rescore`, the previous lengths predicted again where there are some."""
        p = self._plan

        def plan(names, kind, plans):
            if names in plans and not p.full:
                spec = plans[names].spec
                if rescore:
                    return Scored(spec, p.predict(spec, kind, p.window, cls))
                return p.best_lengths(names, kind, spec.draft_lengths, cls)
            return p.best_lengths(names, kind, None, cls)

        best = {names: plan(names, Rates.ESTIMATE, previous[0]) for names in chains}
        optimistic = {}
        for names in chains:
            pairs = self._pairs_to_probe(names, cls)
            if any(self.acceptance.count(j, i) < CONFIDENT or (j, i) in p.inputs.stale for j, i in pairs):
                optimistic[names] = plan(names, Rates.OPTIMISTIC, previous[1])
        return best, optimistic

    def _pairs_to_probe(self, names: Sequence[str], cls: str | None) -> list[tuple[str, str]]:
        """The chain's adjacent pairs that only running it can teach: all but the n-gram's
        under the target, which the shadow lookup scores in every cycle with a match (against
        the target's rows, or its output when it runs alone), whatever chain runs."""
        return [(level_key(j, cls), i) for j, i in zip(names, names[1:])
                if not (j == NGRAM_NAME and i == self.target.name)]

    def _class_plans(self, cls: str) -> tuple[dict, dict]:
        """The n-gram chains' plans for a match class: made when a cycle first needs them after
        a re-plan (one class per cycle, so at most one more search per cycle)."""
        plans = self._by_class.get(cls)
        if plans is None:
            chains = [c for c in self.chains if NGRAM_NAME in c]
            plans = self._by_class[cls] = self._plans(chains, cls, self._previous_by_class.get(cls, ({}, {})),
                                                      rescore=cls in self._plan.rescore)
        return plans

    def _batch_cost(self, name: str, n: float) -> float:
        """What one forward of this sequence's n tokens costs the batch it runs in. The
        target runs for every sequence every cycle: one call over the batch, priced as if
        all fed n tokens. Any other model may run for this sequence alone, and the whole
        batch waits for that call (the scheduler serves one model after another), so its
        time counts once per waiting sequence: speculation must pay for everyone's time."""
        if name == self.target.name:
            return self.costs.seconds(name, n, self.batch_size)
        return self.batch_size * self.costs.seconds(name, n)

    def _catch_up(self, spec: ChainSpec, position: int, cached: Mapping[str, int]) -> float:
        total = 0.0
        for name in spec.names[:-1]:  # the target is always caught up (it runs every cycle)
            if name == NGRAM_NAME:
                continue
            extra = position - cached.get(name, 0) - 1  # the predictor already counts 1-2 tokens
            if extra > 0:
                total += self.costs.seconds(name, 1 + extra) - self.costs.seconds(name, 1)
        return total

    def _score(self, s: Scored, position: int, room: int, cached: Mapping[str, int]) -> Scored:
        catch_up = self._catch_up(s.spec, position, cached) * self.batch_size  # the batch waits for it
        horizon = max(1, min(room, HORIZON))
        return Scored(s.spec, s.prediction, catch_up, s.prediction.seconds_per_token + catch_up / horizon)

    def choose(self, position: int, room: int, cached: Mapping[str, int] | None = None,
               context: Sequence[int] | None = None) -> Chain:
        """The chain for the next cycle; `cached`: committed tokens each model's cache holds.

        `context` is used for one thing: the n-gram lookup, which costs microseconds, is
        done at every cycle in the shadow and scored against the rows the models compute
        anyway, so the n-gram level is always observed (it wins on repetitive text)."""
        cached = cached or {}
        self._reset_cycle()
        if self.ngram is not None and context is not None:
            x, size = self.ngram.lookup(context, max(self.grid))
            if x:
                self._ngram_x, self._ngram_key = x, ngram_key(size)
        self._cycle += 1
        self._refresh(room)
        best_plans, optimistic = self._best, self._optimistic
        if self._ngram_key is not None:  # without a match the n-gram chains are their families' others
            by_class = self._class_plans(self._ngram_key)
            best_plans, optimistic = {**best_plans, **by_class[0]}, {**optimistic, **by_class[1]}
        ranked = sorted((self._score(s, position, room, cached) for s in best_plans.values()), key=lambda s: s.score)
        alone = next(s for s in ranked if len(s.spec.names) == 1)
        for s in ranked:
            self._check_sure(s, alone, room)
        best = next(s for s in ranked if s.sure)
        reason = "start"
        chosen = best
        current = self._current_family(ranked, alone, position, room, cached)
        if current is not None:
            # The target alone replaces a chain that holds only once the chain loses for sure:
            # the standard errors between the cautious and the bold rate are the hysteresis there.
            leave = best.spec != current.spec and best.score < (1 - self.hysteresis) * current.score
            if leave and not (current.holds and len(best.spec.names) == 1):
                reason = "switch"
            else:
                chosen, reason = current, "keep"
        elif self.current is not None:
            reason = "switch"
        # No probe while the target catches up (the first cycle prefills the prompt): that
        # time is everyone's, and a probe's cost is measured as its cycle's excess.
        target_ready = cached.get(self.target.name, 0) >= position - 1
        probe = None
        if target_ready:
            # Candidates: chains with a barely observed or stale pair, scored optimistically, and
            # chains that only the cautious guard kept out (their own data is what makes them sure).
            candidates = [self._score(opt, position, room, cached) for opt in optimistic.values()]
            candidates += [s for s in ranked if not s.sure and self._pairs_to_probe(s.spec.names, self._ngram_key)]
            probe = self._pick_probe(chosen, candidates, room)
        if probe is not None:
            self._probe = (probe.spec, chosen.prediction.seconds_per_token)
            self._record(probe.spec, "probe", position, ranked, probe)
            return self._armed(probe, position, cached, stopping=False)
        self._probe = None
        if reason != "keep" or not self.decisions:
            self._record(chosen.spec, reason, position, ranked)
        self.current = chosen.spec
        return self._armed(chosen, position, cached)

    def _stops(self, names: Sequence[str]) -> bool:
        """Whether the chain's draft ends on its confidence: a model drafting for the target."""
        return self.draft_stop is not None and len(names) == 2 and names[0] != NGRAM_NAME

    def _armed(self, scored: Scored, position: int, cached: Mapping[str, int], stopping: bool = True) -> Chain:
        """The chain object of a choice, its draft stop set up for this cycle (draft_stop); a
        probe (not `stopping`) drafts its planned length: it measures the pair."""
        chain = self.chain_for(scored.spec)
        if self._stops(scored.spec.names):
            draft, target = scored.spec.names
            cost, row = self._plan.cost, self._plan.inputs.row * self.batch_size
            # A target that feeds what it missed first (the prompt, in a request's first cycle)
            # verifies the draft in the same forward: a longer draft then costs it little more.
            behind = max(0, position - cached.get(target, 0) - 1)
            cap = chain.draft_lengths[0] if stopping else scored.spec.draft_lengths[0]
            self.draft_stop.configure((self.acceptance.mode, draft, target), self._rate(draft, target), cap,
                                      scored.prediction.seconds_per_token, cost(draft, 1) + row,
                                      lambda n: cost(target, behind + n) + n * row, stopping)
            chain.draft_stop = self.draft_stop
        return chain

    def _check_sure(self, s: Scored, alone: Scored, room: int) -> Scored:
        """Sets whether a chain beats the target alone even at the cautious acceptance (CAUTION_Z
        standard errors below the estimate, AcceptanceEstimator.cautious). The argmin over
        estimates is biased toward the chains whose estimates are high by chance (the winner's
        curse), and on a CPU where speculation wins by a few percent at best that bias alone
        made auto lose to the target alone; the draft lengths are still those of the estimate."""
        if len(s.spec.names) > 1:
            r = room if room <= max(self.grid) else None
            s.cautious = self._plan.predict(s.spec, Rates.CAUTIOUS, r, self._ngram_key).seconds_per_token + s.catch_up_per_token
            s.sure = s.cautious < alone.score
        return s

    def _current_family(self, ranked: list[Scored], alone: Scored, position: int, room: int,
                        cached: Mapping[str, int]) -> Scored | None:
        """What keeping the current chain means this cycle: the chain itself at its draft
        lengths (lengths too change only past the hysteresis) while its estimate still beats
        the target alone, or the other member of its family (with or without the n-gram
        level, at planned lengths; for sure, as any chain the router moves to) when that is
        better or the current one cannot run (an n-gram chain in a cycle without a match).
        Caution to enter, boldness to leave: the chain is kept while it beats the target alone
        at the bold acceptance (CAUTION_Z standard errors above the estimate), and then
        against the target alone without the flat hysteresis; the standard errors between
        the two rates are the hysteresis at the target alone's border. Left at its estimate
        (as before), one unlucky pair of short blocks under an fp32 target, whose blocks
        keep 8 tokens, sent a chain that ran 1.7x faster out, and with it the only data that
        could bring it back."""
        if self.current is None:
            return None
        family = _family(self.current.names)
        options = [s for s in ranked if s.sure and _family(s.spec.names) == family and s.spec.names != self.current.names]
        if NGRAM_NAME not in self.current.names or self._ngram_key is not None:
            r = room if room <= max(self.grid) else None
            prediction = self._plan.predict(self.current, room=r, cls=self._ngram_key)
            kept = self._check_sure(self._score(Scored(self.current, prediction), position, room, cached), alone, room)
            if len(self.current.names) > 1:
                bold = self._plan.predict(self.current, Rates.BOLD, r, self._ngram_key).seconds_per_token
                kept.holds = bold + kept.catch_up_per_token < alone.score
            if len(self.current.names) == 1 or kept.holds:
                options.append(kept)
        return min(options, key=lambda s: s.score) if options else None

    def _pick_probe(self, chosen: Scored, candidates: list[Scored], room: int) -> Scored | None:
        """The most promising candidate (scored optimistically, or at its estimate when only the
        cautious guard kept it out) that beats the choice by the hysteresis and whose expected
        extra time fits what is left of the probes' budget."""
        best_rate = chosen.prediction.seconds_per_token
        # Remaining time counted over at most HORIZON tokens: a request may end (EOS) long before max_tokens.
        budget = self.explore_fraction * (self.elapsed + min(room, HORIZON) * best_rate) - self.probe_spent
        options = []
        r = room if room <= max(self.grid) else None
        for scored in candidates:
            if scored.spec.names == chosen.spec.names or scored.score >= (1 - self.hysteresis) * chosen.score:
                continue  # even optimism does not beat the current choice: nothing to learn
            # At its planned lengths, or where those cost more than the budget left, at the
            # shortest (a 16-token block verified by an fp32 target on a CPU costs more than
            # 3% of a first request; one token tells less, but it tells).
            for spec in (scored.spec, ChainSpec(scored.spec.names, (1,) * len(scored.spec.draft_lengths))):
                real = self._plan.predict(spec, room=r, cls=self._ngram_key)
                extra = max(0.0, real.cycle_seconds - real.tokens_per_cycle * best_rate) + scored.catch_up
                if extra <= budget:
                    probe = scored if spec == scored.spec else Scored(spec, real, scored.catch_up, scored.score)
                    options.append((scored.score, extra, probe))
                    break
        return min(options, key=lambda o: o[:2])[2] if options else None

    def _record(self, spec: ChainSpec, reason: str, position: int, ranked: list[Scored], probe: Scored | None = None) -> None:
        if len(self.decisions) >= MAX_DECISIONS:
            return
        shown = ranked[:8] + ([probe] if probe is not None else [])
        names = sorted({n for s in shown for n in s.spec.names}, key=self.names.index)
        keys = [level_key(n, self._ngram_key) for n in names]
        pairs = {f"{j}->{i}": {"rate": round(self._rate(j, i), 3), "count": round(self.acceptance.count(j, i), 1)}
                 for j, i in itertools.combinations(keys, 2)}
        costs = {n: {str(k): round(self.costs.seconds(n, k) * 1e3, 3) for k in (1, 2, 4, 8)} for n in names if n != NGRAM_NAME}
        inputs = {"acceptance": pairs, "cost_ms": costs, "mode": self.acceptance.mode,
                  "ngram_match": self._ngram_key,
                  "overhead_ms_per_forward": round(self.costs.overhead_per_forward * 1e3, 3),
                  "row_ms": round(self.costs.row_seconds(self._row_kind) * 1e3, 4),
                  "probe_budget_used_ms": round(self.probe_spent * 1e3, 3)}
        self.decisions.append(Decision(self._cycle, position, spec, reason, shown, inputs))

    # Observations (CycleRunner's observer protocol) ---------------------------------------
    def on_forward(self, level: str, n_tokens: int, seconds: float, shared: bool = False, batch: int = 1) -> None:
        if not shared:  # a batched call teaches the shared costs once, not once per sequence
            self.costs.observe(level, n_tokens, seconds, batch)
        if level != NGRAM_NAME:
            self._fwd_seconds += seconds
            self._fwd_count += 1

    def on_rows(self, level: str, rows: int, seconds: float) -> None:
        self.costs.observe_rows(self._row_kind, rows, seconds)
        self._rows_seconds += seconds

    def on_verify(self, proposer: str, verifier: str, proposals, q, p, n_accepted: int, requested: int,
                  match: int = 0) -> None:
        key = proposer
        if proposer == NGRAM_NAME:
            # Filed under the match class of the lookup that drafted this block (every block a
            # middle level asks of it has its own). A block it found nothing for ends like a
            # rejection: the cycle's class pays (its fill).
            key = ngram_key(match) if match else self._ngram_key
        if key is not None:
            self.acceptance.observe(key, verifier, proposals, q, p, requested, n_accepted)
        # Row 0 of each level's first call in a cycle is its distribution at the cycle's
        # context: the same context for all levels, so non-adjacent pairs are observed for free.
        if proposer != NGRAM_NAME and proposer not in self._first_row and q:
            self._first_row[proposer] = q[0]
        if proposer == NGRAM_NAME:
            self._ngram_scored.add(verifier)
        if verifier not in self._first_row and p:
            self._first_row[verifier] = p[0]
            if self._ngram_x is not None and proposer != NGRAM_NAME:
                self._shadow_ngram(verifier, proposals, p)

    def _shadow_ngram(self, verifier: str, proposals, p) -> None:
        """Score the n-gram's proposal against the verifier's rows while their contexts agree
        (row i follows the actual proposals[:i], valid for the n-gram while those equal its own)."""
        greedy = self.acceptance.mode == "greedy"
        x = self._ngram_x
        scores = []
        for i in range(min(len(x), len(p))):
            scores.append(pair_score(x[i], None, p[i], greedy))
            if i >= len(proposals) or proposals[i] != x[i]:
                break
        self.acceptance.observe_scores(self._ngram_key, verifier, scores or [0.0])
        self._ngram_scored.add(verifier)

    def _shadow_ngram_on_output(self, new_tokens: Sequence[int]) -> None:
        """Target alone (no rows reported): the emitted tokens are draws from (greedy: the
        argmax of) the target's p, so [emitted == n-gram's] has expectation p(x): an
        unbiased, if noisier, acceptance score; scored while the contexts agree."""
        x = self._ngram_x
        scores = []
        for i in range(min(len(x), len(new_tokens))):
            scores.append(1.0 if x[i] == new_tokens[i] else 0.0)
            if not scores[-1]:
                break
        self.acceptance.observe_scores(self._ngram_key, self.target.name, scores or [0.0])

    def end_cycle(self, new_tokens: Sequence[int], seconds: float) -> None:
        """After a cycle: what the target emitted and how long the cycle took."""
        committed = len(new_tokens)
        self.acceptance.advance(committed)
        if self._ngram_x is not None and self.target.name not in self._ngram_scored:
            self._shadow_ngram_on_output(new_tokens)
        self.elapsed += seconds
        if self._probe is not None:
            spec, best_rate = self._probe
            # A probe that did better than the choice refunds nothing: counted net, the gains of
            # probing the one good chain paid for probing every other (seen with an fp32 target).
            self.probe_spent += max(0.0, seconds - committed * best_rate) * self.batch_size
        if self._fwd_count and self.batch_size == 1:  # in a batch, a cycle also waits for other sequences' calls
            overhead = max(0.0, (seconds - self._fwd_seconds - self._rows_seconds) / self._fwd_count)
            self._overhead += 0.2 * (overhead - self._overhead)
            self.costs.set_overhead(self._overhead)
        self._shadow_pairs()

    def _shadow_pairs(self) -> None:
        greedy = self.acceptance.mode == "greedy"
        spec = self._probe[0] if self._probe else self.current
        if spec is None:
            return
        names = spec.names
        adjacent = set(zip(names, names[1:]))
        for j, i in itertools.combinations(names, 2):
            if (j, i) in adjacent or j not in self._first_row or i not in self._first_row:
                continue  # (the n-gram is scored in on_verify)
            row = self._first_row[j]
            score = pair_score(row, None, self._first_row[i], True) if greedy else pair_score(0, row, self._first_row[i], False)
            self.acceptance.observe_scores(j, i, [score])


def sharing_drafts(target: Backend, models: Sequence[Backend]) -> tuple[list[Backend], list[str]]:
    """The models smaller than the target that share its tokenizer, and why others were left out."""
    from specrouter.errors import TokenizerMismatchError
    from specrouter.vocab import check_shared_tokenizer

    drafts, skipped = [], []
    for model in models:
        if model is target or model.name == target.name:
            continue
        if model.params_b >= target.params_b:
            skipped.append(f"{model.name} (not smaller than the target)")
            continue
        try:
            check_shared_tokenizer([model, target])
        except TokenizerMismatchError:
            skipped.append(f"{model.name} (another tokenizer)")
            continue
        drafts.append(model)
    return drafts, skipped


def build_router(target: Backend, models: Sequence[Backend],
                 costs: OnlineCosts | Callable[[list[Backend]], OnlineCosts],
                 acceptance: AcceptanceEstimator | None = None, **kw) -> Router:
    """A Router over the target, the given models that can draft for it, and the n-gram level.
    `costs` may be a function of the models kept (so only those get profiled).
    With no model sharing the target's tokenizer it says so: only the target alone and
    the n-gram level (model-free, it shares any tokenizer) remain."""
    drafts, skipped = sharing_drafts(target, models)
    if not isinstance(costs, OnlineCosts):
        costs = costs([*drafts, target])
    message = None
    if not drafts:
        message = (f"no draft model shares the tokenizer of {target.name}"
                   + (f" (left out: {', '.join(skipped)})" if skipped else "")
                   + f": falling back to {target.name} alone (and the n-gram drafter where it pays)")
    elif skipped:
        message = f"left out of routing: {', '.join(skipped)}"
    return Router(target, drafts, costs, acceptance, message=message, **kw)

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

Exploration: a chain whose pairs are barely observed is probed for one cycle when its
optimistic prediction (acceptance + EXPLORE_BONUS / sqrt(count + 1)) would beat the
current best; so is a chain left after a bad stretch of this request, optimistically at
the global estimate (AcceptanceEstimator.stale_low: the stretch may have passed, and its
own estimate only drifts back as it goes stale, which with an fp32 target at 0.7 s a
token took ~100 tokens while the chain would have run 1.7x faster). After a probe the
next choice is re-planned at once. Probes run only while the measured extra time of all
of them stays within EXPLORE_FRACTION of generation time (elapsed plus expected
remaining). The cap is what
keeps `auto` within a few percent of the best static choice when nothing pays; the
optimism is what lets it find a draft that does pay, and a chain that cannot win even
optimistically is never probed (on a CPU where drafting loses, nothing is). A probe's
cost is counted, not guessed: its cycle's time minus what the best chain would have
spent on the same tokens. Any chain choice made before a cycle keeps the output exact
(each cycle emits tokens distributed as the target's, whatever chain produced them).
"""
from __future__ import annotations

import copy
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
from specrouter.router.predictor import ChainSpec, Prediction, predict
from specrouter.router.profiler import OnlineCosts

HYSTERESIS = 0.05
EXPLORE_FRACTION = 0.03  # leaves room for auto >= 0.97x of the best static choice
EXPLORE_BONUS = 0.5
CONFIDENT = 48  # positions after which a pair is no longer probed
#: Draft lengths searched per level: every length to 8, then coarser. Long drafts pay when
#: verifying n tokens costs about as much as one (an fp32 target on a CPU: flat from 3 to
#: 16 tokens; any GPU); on llama.cpp q4 targets the search never goes past a few.
DRAFT_GRID = (*range(1, 9), 10, 12, 16)
RATE_TOLERANCE = 0.04  # acceptance move that triggers a re-plan
FULL_SEARCH_EVERY = 16  # re-plans between full searches of the draft-length grid (local search otherwise)
COST_TOLERANCE = 0.05  # relative cost move that triggers a re-plan
PLAN_EVERY, BIG_MOVE = 4, 2.0  # small moves re-plan at most every 4 cycles; 2 tolerances at once
HORIZON = 256  # tokens over which a catch-up cost is amortised at most
MAX_EXHAUSTIVE = 100  # 2-level chains: the whole grid; deeper ones by coordinate descent (a full plan costs ~15 ms, not ~90)
MAX_DECISIONS = 200  # per request: the first decision, every switch and probe, up to this many


def ngram_key(size: int) -> str:
    """The estimator's name for the n-gram level when its suffix match has this length."""
    return f"{NGRAM_NAME}#{size}"


class _MatchTrackingNgram(NgramDrafter):
    """The router's n-gram level: remembers the match length of its last proposal, so that
    every block it drafts in a cycle (a middle level may ask it several times) is scored
    under its own match class."""

    last_size = 0

    def propose(self, context: Sequence[int], n: int) -> list[int]:
        tokens, self.last_size = self.lookup(context, n)
        return tokens


def _family(names: Sequence[str]) -> tuple[str, ...]:
    """A chain without its n-gram level: chains of one family switch freely between cycles."""
    return tuple(n for n in names if n != NGRAM_NAME)


@dataclass
class Scored:
    spec: ChainSpec
    prediction: Prediction
    catch_up: float = 0.0  # seconds the chain's models need to catch up before it runs
    score: float = 0.0  # seconds per token, catch-up amortised

    def as_dict(self) -> dict:
        return {"chain": list(self.spec.names), "draft_lengths": list(self.spec.draft_lengths),
                "predicted_ms_per_token": round(self.prediction.seconds_per_token * 1e3, 3),
                "tokens_per_cycle": round(self.prediction.tokens_per_cycle, 3),
                "catch_up_ms": round(self.catch_up * 1e3, 3),
                "score_ms_per_token": round(self.score * 1e3, 3)}


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
    ) -> None:
        self.target = target
        self.drafts = sorted(drafts, key=lambda m: m.params_b)
        self.models: list[Backend] = [*self.drafts, target]
        self.ngram = _MatchTrackingNgram() if use_ngram else None
        self.costs = costs
        self.acceptance = acceptance or AcceptanceEstimator()
        self.grid = tuple(draft_grid)
        self.hysteresis, self.explore_fraction = hysteresis, explore_fraction
        self.message = message  # why the candidate set is what it is (e.g. no shared tokenizer)
        self.estimates_file: Path | None = None
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
        self._plan_inputs = None
        self._plan: dict = {}
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
        """A router for one request of many running at once: its own per-request state
        (decisions, plan, per-request acceptance), sharing the global estimates and costs."""
        twin = copy.copy(self)
        twin.acceptance = self.acceptance.view()
        twin.decisions = []
        twin.start(SamplingParams())
        return twin

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
        chain = self._chain_objs.get(spec)
        if chain is None:
            chain = self._chain_objs[spec] = Chain([self._levels[n] for n in spec.names], list(spec.draft_lengths))
        return chain

    # Request lifecycle ----------------------------------------------------------------
    def start(self, params: SamplingParams, prompt_tokens: int = 0, max_tokens: int = 0) -> None:
        self.acceptance.start_request(params.greedy)
        self.current = None
        self._plan_inputs = None
        self._cycle = 0
        self._planned_at = -PLAN_EVERY
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

    def _key(self, name: str, cls: str | None) -> str:
        """The estimator's name of a chain level in this cycle (the n-gram: its match class)."""
        return cls if name == NGRAM_NAME and cls is not None else name

    def _predict(self, spec: ChainSpec, optimistic: bool = False, room: int | None = None,
                 cls: str | None = None) -> Prediction:
        """Prediction from the inputs frozen at the last re-plan (memoised across calls), with
        the n-gram level's estimates of match class `cls`."""
        plan = self._plan
        rates = plan["optimistic" if optimistic else "rates"]
        memo = plan["memo"].setdefault((optimistic, cls), {})
        key = self._key
        return predict(spec, plan["cost"], lambda j, i: rates[(key(j, cls), i)],
                       lambda j, i: plan["fills"][(key(j, cls), i)], room, memo)

    def _best_lengths(self, names: tuple[str, ...], optimistic: bool, room: int | None,
                      start: tuple[int, ...] | None = None, cls: str | None = None) -> Scored:
        depth = len(names) - 1
        if depth == 0:
            spec = ChainSpec(names)
            return Scored(spec, self._predict(spec, optimistic, room, cls))
        grid = self.grid
        if room is not None:  # the target never takes more than room - 1 proposals
            grid = tuple(k for k in grid if k < max(room, 2)) or (1,)
        if start is not None and all(k in grid for k in start):
            return self._local_search(names, optimistic, room, grid, start, cls)
        if len(grid) ** depth <= MAX_EXHAUSTIVE:
            options = [ChainSpec(names, ks) for ks in itertools.product(grid, repeat=depth)]
            best = min(options, key=lambda s: self._predict(s, optimistic, room, cls).seconds_per_token)
            return Scored(best, self._predict(best, optimistic, room, cls))
        ks = [grid[len(grid) // 2]] * depth  # coordinate descent from the middle of the grid
        best_val = self._predict(ChainSpec(names, tuple(ks)), optimistic, room, cls).seconds_per_token
        for _ in range(4):
            improved = False
            for level in range(depth):
                for k in grid:
                    trial = ks.copy()
                    trial[level] = k
                    val = self._predict(ChainSpec(names, tuple(trial)), optimistic, room, cls).seconds_per_token
                    if val < best_val - 1e-12:
                        ks, best_val, improved = trial, val, True
            if not improved:
                break
        spec = ChainSpec(names, tuple(ks))
        return Scored(spec, self._predict(spec, optimistic, room, cls))

    def _local_search(self, names, optimistic, room, grid, start, cls) -> Scored:
        """Grid neighbours (one step down or up per level) of the last best lengths until none
        improves: after a small move of the inputs the optimum moves little, at a tenth of a
        full search."""
        def value(ks):
            return self._predict(ChainSpec(names, ks), optimistic, room, cls).seconds_per_token

        ks, best = tuple(start), value(tuple(start))
        improved = True
        while improved:
            improved = False
            for level in range(len(ks)):
                i = grid.index(ks[level])
                for j in (i - 1, i + 1):
                    if 0 <= j < len(grid):
                        k = grid[j]
                        trial = ks[:level] + (k,) + ks[level + 1 :]
                        v = value(trial)
                        if v < best - 1e-12:
                            ks, best, improved = trial, v, True
                            break
        spec = ChainSpec(names, ks)
        return Scored(spec, self._predict(spec, optimistic, room, cls))

    def _inputs(self, room: int) -> dict:
        # Chains run in size order, so a proposer is always smaller than its verifier.
        models = [n for n in self.names if n != NGRAM_NAME]
        pairs = [*itertools.combinations(models, 2), *((k, m) for k in self._ngram_keys for m in models)]
        rates = {(j, i): self._rate(j, i) for j, i in pairs}
        optimistic, stale = {}, set()
        for j, i in pairs:
            bonus = rates[(j, i)] + EXPLORE_BONUS / math.sqrt(self.acceptance.count(j, i) + 1)
            low = self.acceptance.stale_low(j, i)
            if low is not None:
                stale.add((j, i))
            optimistic[(j, i)] = min(0.98, max(bonus, low or 0.0))
        return {"rates": rates, "optimistic": optimistic, "stale": stale,
                "fills": {(j, i): self.acceptance.fill(j, i) for j, i in pairs},
                "costs": self.costs.snapshot(), "room": min(room, max(self.grid) + 1), "batch": self.batch_size}

    def _move(self, old: dict | None, new: dict) -> float:
        """How far the inputs moved since the last plan, in tolerances (>= 1: enough to
        matter; timings jitter every cycle). Infinite when the problem itself changed."""
        if old is None or old["room"] != new["room"] or old["batch"] != new["batch"] \
                or old["costs"].keys() != new["costs"].keys():
            return math.inf
        moves = [abs(new["rates"][k] - v) / RATE_TOLERANCE for k, v in old["rates"].items()]
        moves.append(BIG_MOVE * (old["stale"] != new["stale"]))  # a pair became worth probing
        moves += [abs(new["fills"][k] - v) / 0.1 for k, v in old["fills"].items()]
        moves += [abs(new["costs"][k] - v) / (COST_TOLERANCE * max(abs(v), 1e-9))
                  for k, v in old["costs"].items() if k != "overhead"]
        moves.append(abs(new["costs"]["overhead"] - old["costs"]["overhead"]) / 5e-4)
        return max(moves)

    def _refresh(self, room: int) -> None:
        inputs = self._inputs(room)
        move = self._move(self._plan_inputs, inputs)
        # A small move waits until PLAN_EVERY cycles have passed since the last plan: the
        # per-request estimates and the cost EMAs cross one tolerance most cycles, and a plan
        # costs ~2 ms of Python, ~2.5% of a CPU token. A large move re-plans at once.
        # After a probe its observations are what the next choice needs: re-plan at once.
        probed = self._probe is not None
        if not probed and (move < 1 or (move < BIG_MOVE and self._cycle - self._planned_at < PLAN_EVERY)):
            return
        self._planned_at = self._cycle
        self._plan_inputs = inputs
        self.replans += 1
        r = room if room <= max(self.grid) else None
        full = self.replans % FULL_SEARCH_EVERY == 1 or r is not None
        self._plan = {**inputs, "cost": functools.lru_cache(maxsize=None)(self._batch_cost), "memo": {},
                      "r": r, "full": full}
        self._previous_by_class = {**self._previous_by_class, **self._by_class}
        self._by_class = {}
        self._best, self._optimistic = self._plans([c for c in self.chains if NGRAM_NAME not in c], None,
                                                   (self._best, self._optimistic))

    def _plans(self, chains: list[tuple[str, ...]], cls: str | None, previous: tuple[dict, dict]) -> tuple[dict, dict]:
        """Best draft lengths per chain, and optimistic ones for chains with a barely observed pair."""
        r, full = self._plan["r"], self._plan["full"]

        def start(plans, names):
            return None if full or names not in plans else plans[names].spec.draft_lengths

        best = {names: self._best_lengths(names, False, r, start(previous[0], names), cls) for names in chains}
        optimistic = {}
        for names in chains:
            pairs = [(self._key(j, cls), i) for j, i in zip(names, names[1:])]
            if pairs and any(self.acceptance.count(j, i) < CONFIDENT or (j, i) in self._plan["stale"]
                             for j, i in pairs):
                optimistic[names] = self._best_lengths(names, True, r, start(previous[1], names), cls)
        return best, optimistic

    def _class_plans(self, cls: str) -> tuple[dict, dict]:
        """The n-gram chains' plans for a match class: made when a cycle first needs them after
        a re-plan (one class per cycle, so at most one more search per cycle)."""
        plans = self._by_class.get(cls)
        if plans is None:
            chains = [c for c in self.chains if NGRAM_NAME in c]
            plans = self._by_class[cls] = self._plans(chains, cls, self._previous_by_class.get(cls, ({}, {})))
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
        best = ranked[0]
        reason = "start"
        chosen = best
        current = self._current_family(ranked, position, room, cached)
        if current is not None:
            if best.spec != current.spec and best.score < (1 - self.hysteresis) * current.score:
                reason = "switch"
            else:
                chosen, reason = current, "keep"
        elif self.current is not None:
            reason = "switch"
        # No probe while the target catches up (the first cycle prefills the prompt): that
        # time is everyone's, and a probe's cost is measured as its cycle's excess.
        target_ready = cached.get(self.target.name, 0) >= position - 1
        probe = self._pick_probe(chosen, optimistic, position, room, cached) if target_ready else None
        if probe is not None:
            self._probe = (probe.spec, chosen.prediction.seconds_per_token)
            self._record(probe.spec, "probe", position, ranked, probe)
            return self.chain_for(probe.spec)
        self._probe = None
        if reason != "keep" or not self.decisions:
            self._record(chosen.spec, reason, position, ranked)
        self.current = chosen.spec
        return self.chain_for(chosen.spec)

    def _current_family(self, ranked: list[Scored], position: int, room: int,
                        cached: Mapping[str, int]) -> Scored | None:
        """What keeping the current chain means this cycle: the chain itself at its draft
        lengths (lengths too change only past the hysteresis), or the other member of its
        family (with or without the n-gram level, at planned lengths) when that is better
        or the current one cannot run (an n-gram chain in a cycle without a match)."""
        if self.current is None:
            return None
        family = _family(self.current.names)
        options = [s for s in ranked if _family(s.spec.names) == family and s.spec.names != self.current.names]
        if NGRAM_NAME not in self.current.names or self._ngram_key is not None:
            r = room if room <= max(self.grid) else None
            prediction = self._predict(self.current, room=r, cls=self._ngram_key)
            options.append(self._score(Scored(self.current, prediction), position, room, cached))
        return min(options, key=lambda s: s.score) if options else None

    def _pick_probe(self, chosen: Scored, optimistic: dict, position: int, room: int,
                    cached: Mapping[str, int]) -> Scored | None:
        best_rate = chosen.prediction.seconds_per_token
        # Remaining time counted over at most HORIZON tokens: a request may end (EOS) long before max_tokens.
        budget = self.explore_fraction * (self.elapsed + min(room, HORIZON) * best_rate) - self.probe_spent
        options = []
        cls = self._ngram_key
        for names, opt in optimistic.items():
            if names == chosen.spec.names:
                continue
            scored = self._score(opt, position, room, cached)
            if scored.score >= (1 - self.hysteresis) * chosen.score:
                continue  # even optimism does not beat the current choice: nothing to learn
            real = self._predict(opt.spec, room=room if room <= max(self.grid) else None, cls=cls)
            extra = max(0.0, real.cycle_seconds - real.tokens_per_cycle * best_rate) + scored.catch_up
            if extra <= budget:
                options.append((scored.score, extra, scored))
        return min(options, key=lambda o: o[:2])[2] if options else None

    def _record(self, spec: ChainSpec, reason: str, position: int, ranked: list[Scored], probe: Scored | None = None) -> None:
        if len(self.decisions) >= MAX_DECISIONS:
            return
        shown = ranked[:8] + ([probe] if probe is not None else [])
        names = sorted({n for s in shown for n in s.spec.names}, key=self.names.index)
        keys = [self._key(n, self._ngram_key) for n in names]
        pairs = {f"{j}->{i}": {"rate": round(self._rate(j, i), 3), "count": round(self.acceptance.count(j, i), 1)}
                 for j, i in itertools.combinations(keys, 2)}
        costs = {n: {str(k): round(self.costs.seconds(n, k) * 1e3, 3) for k in (1, 2, 4, 8)} for n in names if n != NGRAM_NAME}
        inputs = {"acceptance": pairs, "cost_ms": costs, "mode": self.acceptance.mode,
                  "ngram_match": self._ngram_key,
                  "overhead_ms_per_forward": round(self.costs.overhead_per_forward * 1e3, 3),
                  "probe_budget_used_ms": round(self.probe_spent * 1e3, 3)}
        self.decisions.append(Decision(self._cycle, position, spec, reason, shown, inputs))

    # Observations (CycleRunner's observer protocol) ---------------------------------------
    def on_forward(self, level: str, n_tokens: int, seconds: float, shared: bool = False, batch: int = 1) -> None:
        if not shared:  # a batched call teaches the shared costs once, not once per sequence
            self.costs.observe(level, n_tokens, seconds, batch)
        if level != NGRAM_NAME:
            self._fwd_seconds += seconds
            self._fwd_count += 1

    def on_verify(self, proposer: str, verifier: str, proposals, q, p, n_accepted: int, requested: int) -> None:
        key = proposer
        if proposer == NGRAM_NAME:
            # A block it found nothing for ends like a rejection: the cycle's class pays (its fill).
            size = self.ngram.last_size if self.ngram is not None else 0
            key = ngram_key(size) if size else self._ngram_key
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
            self.probe_spent += max(0.0, seconds - committed * best_rate) * self.batch_size
        if self._fwd_count and self.batch_size == 1:  # in a batch, a cycle also waits for other sequences' calls
            overhead = max(0.0, (seconds - self._fwd_seconds) / self._fwd_count)
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

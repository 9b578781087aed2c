"""The router: before every cycle, the chain and draft lengths with the least expected
time per committed token, from the profiled costs and the acceptance estimates.

A Router is one request's session; session() makes another on the same shared objects (the
models, the cost model, the global acceptance estimates, the draft stop's calibration). It is
made of three parts:
- the planner (planner.py; plan.py holds the typed plan and the draft-length search): the
  candidate chains and their best draft lengths, re-planned only when the inputs move;
- the learner (observe.py): what each cycle teaches the shared costs and estimates;
- the decision policy, here: every cycle adds each chain's one-time catch-up cost (a model
  that sat out must first feed what it missed, lazily) amortised over the tokens expected
  to come (lengths.py: what recent answers wrote, at most the room), and compares;
  caution, hysteresis, probes (with their lengths under uncertainty) and the draft stop below.

Hysteresis: the chain changes only when the new best is more than HYSTERESIS better than
the current one, so it does not flap.

The model-free level (the n-gram or the suffix drafter, `lookup`) is routed per cycle on
what its lookup found: its acceptance is kept per class of the suffix match's length (the
drafter's match_classes, `plan.match_key`), and the lookup is done before the choice, so a
cycle whose match is long (often right) drafts with it and one whose match is a single
token (right about a quarter of the time on code) does not. Its draft lengths are its own
(LOOKUP_GRID up to the drafter's `longest`: a copied stretch is one block). Chains that
differ only by this level form one family: moving inside a family costs nothing (a lookup
has no cache), so hysteresis applies between families only.

Caution: a chain other than the target alone is moved to only if it beats the target
alone with every acceptance planner.CAUTION_Z standard errors below its estimate (the
estimator's cautious rate: a request's own estimate remembers ~19 positions, and a pair
seen a few times is barely known), at its planned draft lengths or, where it is not sure
there, at the lengths that are best for the cautious rates (_robust); it is kept until it
loses to the target alone even with every acceptance CAUTION_Z standard errors above its
estimate (the bold rate).
Picking the argmin of noisy estimates favours the chains whose estimates are high by
chance (docs/router-design.md has the measurements behind this and the rules below).

Exploration: a chain whose pairs are barely observed is probed for one cycle when its
optimistic prediction (acceptance + EXPLORE_BONUS / sqrt(count + 1)) would beat the
current best; so is a chain left after a bad stretch of this request, optimistically at
the global estimate (AcceptanceEstimator.stale_low: the stretch may have passed, and its
own estimate only drifts back as it goes stale), and a chain that
beats the choice on its estimate but not for sure (its probes are the own data that
make it sure, or show it is not). After a probe the next choice is re-planned at once.
Probes run only while their measured extra time stays within EXPLORE_FRACTION of
generation time (elapsed plus expected remaining). The account (ProbeBudget) is the
router's, shared by its sessions: the time of every request served so far counts, so a
probe too costly for any one request (a draft that must first feed a long prompt: its
catch-up is part of the probe's cost) is taken once earlier requests have paid for it,
where a budget per request would never allow it. The cap is what keeps `auto` within
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

Pacing (pacing.py): where the choice itself costs more than FRACTION of the cycles it steers
(a GPU's, in batches), a session reuses a recent decision of the router's sessions for the
same kind of cycle instead of deliberating; on a slow CPU every choice deliberates.

Any chain choice made before a cycle keeps the output exact
(each cycle emits tokens distributed as the target's, whatever chain produced them).
"""
from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from specrouter.backends.base import Backend
from specrouter.drafters import MODEL_FREE
from specrouter.drafters.memory import MemoryScope, SuffixMemory
from specrouter.drafters.ngram import NGRAM_NAME
from specrouter.cascade.chain import Chain, Level
from specrouter.cascade.sampling import SamplingParams
from specrouter.errors import InvalidParameterError
from specrouter.router.estimates.acceptance import AcceptanceEstimator
from specrouter.router.config import DEFAULT_CONFIG, RouterConfig
from specrouter.router.draft_stop import ConfidenceStop
from specrouter.router.learn import CycleLearner
from specrouter.router.pacing import ChoicePacing, Kind, firm
from specrouter.router.plan import Decision, DecisionInputs, LengthHints, Plan, Rates, Scored, level_key, match_key
from specrouter.router.estimates.lengths import AnswerLengths
from specrouter.router.planner import Planner
from specrouter.router.estimates.store import RouterStore
from specrouter.router.predictor import ChainSpec
from specrouter.router.estimates.costs import OnlineCosts, row_kind

@dataclass
class ProbeBudget:
    """The probes' account of a router and its sessions: `elapsed`, the seconds of every
    cycle of every request (a cycle of B sequences advancing together counts B times, once
    per session, as a probe's extra does: it slows all of them); `spent`, the probes'
    measured extra time.
    Sessions running at once read it before any of their probes is counted, so the
    sequences of a batch may together overdraw it by the probes they start in one step."""

    fraction: float = DEFAULT_CONFIG.explore_fraction
    elapsed: float = 0.0
    spent: float = 0.0

    def left(self, expected: float) -> float:
        """What probes may still spend, with `expected` more seconds of generation to come."""
        return self.fraction * (self.elapsed + expected) - self.spent


def _family(names: Sequence[str], lookup: str | None) -> tuple[str, ...]:
    """A chain without its model-free level: chains of one family switch freely between cycles."""
    return tuple(n for n in names if n != lookup)


class Router:
    """Chooses a Chain before each cycle and learns from the cycle's observations."""

    def __init__(
        self,
        target: Backend,
        drafts: Sequence[Backend],
        costs: OnlineCosts,
        acceptance: AcceptanceEstimator | None = None,
        use_ngram: bool = True,
        message: str | None = None,
        confidence_stop: bool = True,
        *,
        config: RouterConfig = DEFAULT_CONFIG,
        shared_stop: ConfidenceStop | None = None,
        lookup: str = NGRAM_NAME,
        memory: SuffixMemory | None = None,
        scope: MemoryScope = MemoryScope(),
        lengths: AnswerLengths | None = None,
        budget: ProbeBudget | None = None,
        hints: LengthHints | None = None,
        pacing: ChoicePacing | None = None,
    ) -> None:
        """use_ngram: route a model-free level too, the drafter `lookup` names (MODEL_FREE);
        confidence_stop: a model drafting for the
        target may end its draft on its confidence; shared_stop: that rule's calibration is
        shared with this stop's (a session: see session()); memory: the cross-request suffix
        memory every session reads and feeds (drafters/memory.py; the lookup must be one that
        reads it), in `scope` (a session's request: its partition, or opted out); lengths: how
        long recent answers ran (shared by sessions: the horizon of one-time costs); budget:
        the probes' account (shared by sessions; default a fresh one at explore_fraction); hints:
        the draft lengths sessions found last (shared: a request's first plans start there);
        pacing: how often sessions deliberate and their recent decisions (shared; pacing.py);
        config: the tuning (its draft_grid and lookup_grid: the draft lengths searched for the
        models and for the model-free level, the latter up to its drafter's `longest`)."""
        self.config = config
        self.target = target
        self.drafts = sorted(drafts, key=lambda m: m.params_b)
        self.models: list[Backend] = [*self.drafts, target]
        if lookup not in MODEL_FREE:
            raise InvalidParameterError(f"unknown model-free drafter {lookup!r}: use one of {', '.join(MODEL_FREE)}")
        #: The session's own model-free drafter (its evidence travels with its draft).
        self.lookup_drafter = MODEL_FREE[lookup]() if use_ngram else None
        #: How long answers ran: the horizon over which a catch-up is amortised (lengths.py).
        self.lengths = lengths or AnswerLengths(config=config)
        #: The process's cross-request memory and this session's request's part of it.
        self.memory, self.scope = memory, scope
        if memory is not None and self.lookup_drafter is not None:
            self.lookup_drafter.with_memory(memory, scope)
        #: The model-free level's name (None: none is routed).
        self.lookup = self.lookup_drafter.name if self.lookup_drafter else None
        self.costs = costs
        self.acceptance = acceptance or AcceptanceEstimator(config=config)
        self.grid = tuple(config.draft_grid)
        self.lookup_grid = (tuple(k for k in config.lookup_grid if k <= self.lookup_drafter.longest)
                            if self.lookup_drafter else ())
        self.longest = max(self.grid + self.lookup_grid)
        #: The probes' account, shared by this router's sessions.
        self.budget = budget or ProbeBudget(config.explore_fraction)
        self.message = message  # why the candidate set is what it is (e.g. no shared tokenizer)
        #: Where what the router learns is kept across processes (None: nowhere).
        self.store: RouterStore | None = None
        #: A model drafting for the target alone ends its draft when its confidence says going on
        #: no longer pays (draft_stop), at most max(grid) tokens on.
        self.draft_stop = (shared_stop.session() if shared_stop else ConfidenceStop(config=config)) if confidence_stop else None
        self._levels: dict[str, Level] = {m.name: m for m in self.models}
        match_keys = []
        if self.lookup_drafter:
            self._levels[self.lookup_drafter.name] = self.lookup_drafter
            match_keys = [match_key(self.lookup_drafter.name, c) for c in self.lookup_drafter.classes]
        #: The last best draft lengths of this router's sessions (plan.LengthHints).
        self.hints = hints or LengthHints()
        #: How often this router's sessions deliberate (pacing.py), shared by them.
        self.pacing = pacing or ChoicePacing(config=config)
        #: Whether the last choice deliberated (False: it reused a recent decision).
        self.deliberated = True
        self.planner = Planner(self.acceptance, costs, target.name, self.grid, [m.name for m in self.drafts],
                               self.lookup, match_keys, self.lookup_grid, self.hints, config)
        self._chain_objs: dict[ChainSpec, Chain] = {}
        self.decisions: list[Decision] = []
        self.current: ChainSpec | None = None
        self.learner = CycleLearner(self.acceptance, costs, target.name, self.lookup, config)
        #: Sequences that advance together (set by the batch scheduler before choose): every
        #: forward then carries this many sequences' tokens, so it is costed at batch x n tokens.
        self.batch_size = 1
        self.start(SamplingParams())

    def session(self, scope: MemoryScope = MemoryScope()) -> Router:
        """A router for one request of many running at once, built afresh, never copied: its
        own per-request state (plan, decisions, current chain, per-request acceptance, chain
        objects carrying its own draft stop, its request's memory scope), and the objects
        every request shares: the models, the cost model, the global
        acceptance estimates (a view), the draft stop's calibration, the memory, the answer
        lengths, the probes' budget, the draft-length hints and the pacing."""
        return Router(self.target, self.drafts, self.costs, self.acceptance.view(), self.lookup_drafter is not None,
                      self.message, self.draft_stop is not None, config=self.config, shared_stop=self.draft_stop,
                      lookup=self.lookup or NGRAM_NAME, memory=self.memory, scope=scope, lengths=self.lengths,
                      budget=self.budget, hints=self.hints, pacing=self.pacing)

    @property
    def chains(self) -> list[tuple[str, ...]]:
        """The candidate chains (names, cheapest first)."""
        return self.planner.chains

    @property
    def names(self) -> list[str]:
        """Every level the router may run, cheapest first."""
        return [self.lookup] * bool(self.lookup) + self.planner.models

    @property
    def _plan(self) -> Plan:
        return self.planner.plan

    def exclude(self, name: str) -> None:
        """Route without this model from now on (it failed for this request)."""
        if name == self.target.name:
            raise InvalidParameterError("the target cannot be excluded from routing")
        self.planner.exclude(name)
        if self.current is not None and name in self.current.names:
            self.current = None

    def chain_for(self, spec: ChainSpec) -> Chain:
        """The chain object that runs a spec: a draft that stops on its confidence runs with the
        grid's longest length as its cap (draft_stop)."""
        chain = self._chain_objs.get(spec)
        if chain is None:
            stops = self._stops(spec.names)
            lengths = [max(self.grid)] if stops else list(spec.draft_lengths)
            chain = self._chain_objs[spec] = Chain([self._levels[n] for n in spec.names], lengths,
                                                   draft_stop=self.draft_stop if stops else None)
        return chain

    # Request lifecycle ----------------------------------------------------------------
    def start(self, params: SamplingParams, prompt_tokens: int = 0, max_tokens: int = 0) -> None:
        self.acceptance.start_request(params.greedy)
        self._row_kind = self.learner.row_kind = row_kind(params)
        self.current = None
        self.planner.start()
        self._cycle = 0
        self._probe: tuple[ChainSpec, float] | None = None
        self.decisions = []  # per request
        self._ngram_key: str | None = None  # the match class of this cycle's n-gram lookup (None: no match)
        self._output: list[int] = []  # what the request's cycles emitted (for the memory)
        #: Per match class of the lookup, the blocks it drafted in this request and the tokens
        #: accepted of them (plain counters, for reports: which source drafted, and how well).
        self.lookup_blocks: Counter[str] = Counter()
        self.lookup_accepted: Counter[str] = Counter()

    def finish(self) -> None:
        """End of a request: its output joins the cross-request memory (in its scope: nowhere
        when it opted out) and its length the answer lengths; estimates stay for the next request."""
        if self.memory is not None:
            self.memory.add(self._output, self.scope)
        self.lengths.record(len(self._output))
        self._output = []

    def save_estimates(self) -> None:
        """Persist what was learned (RouterStore.save): the next run starts informed."""
        if self.store is not None:
            self.store.save(self.acceptance, self.costs)

    # Decision ---------------------------------------------------------------------------
    def _score(self, s: Scored, position: int, room: int, cached: Mapping[str, int]) -> Scored:
        return self.planner.score(s, position, self._horizon, cached, self.batch_size)

    def choose(self, position: int, room: int, cached: Mapping[str, int] | None = None,
               context: Sequence[int] | None = None, forced: Sequence[int] = ()) -> Chain:
        """The chain for the next cycle; `cached`: committed tokens each model's cache holds.

        `context` is used for one thing: the n-gram lookup, which costs microseconds, is
        done at every cycle in the shadow and scored against the rows the models compute
        anyway, so the n-gram level is always observed (it wins on repetitive text).
        `forced`: the tokens the request's grammar forces next, which the model-free level
        proposes instead of its lookup's (their own match class)."""
        cached = cached or {}
        self._horizon = self.lengths.horizon(len(self._output), room)
        x, self._ngram_key = None, None
        if self.lookup_drafter is not None and context is not None:
            free = self.lookup_drafter
            found = free.find(context, max(self.lookup_grid), forced=forced)
            if found.tokens:
                x, self._ngram_key = found.tokens, match_key(free.name, free.match_class(found))
        self.learner.begin(x, self._ngram_key)
        self._cycle += 1
        # While the target catches up (the first cycle prefills the prompt) the session
        # deliberates and probes nothing: that time is everyone's, and a probe's cost is
        # measured as its cycle's excess. After a probe it deliberates on what it measured.
        target_ready = cached.get(self.target.name, 0) >= position - 1
        kind = Kind.of(self._row_kind, self.batch_size, self._ngram_key)
        reused = self._reusable(kind, position, room, cached) if target_ready and self._probe is None else None
        self.deliberated = reused is None
        if reused is not None:
            self.current = reused.spec
            return self._armed(reused, position, cached)
        self.planner.refresh(room, self.batch_size, self._row_kind, self._cycle, now=self._probe is not None,
                             cls=self._ngram_key)
        best_plans, optimistic = self.planner.plans(self._ngram_key)
        ranked = sorted((self._score(s, position, room, cached) for s in best_plans.values()), key=lambda s: s.score)
        alone = next(s for s in ranked if len(s.spec.names) == 1)
        ranked = sorted((self._robust(self._check_sure(s, alone, room), alone, room) for s in ranked),
                        key=lambda s: s.score)
        best = next(s for s in ranked if s.sure)
        reason = "start"
        chosen = best
        current = self._current_family(ranked, alone, position, room, cached)
        if current is not None:
            # The target alone replaces a chain that holds only once the chain loses for sure:
            # the standard errors between the cautious and the bold rate are the hysteresis there.
            leave = best.spec != current.spec and best.score < (1 - self.config.hysteresis) * current.score
            if leave and not (current.holds and len(best.spec.names) == 1):
                reason = "switch"
            else:
                chosen, reason = current, "keep"
        elif self.current is not None:
            reason = "switch"
        probe, candidates = None, []
        if target_ready:
            # Candidates: chains with a barely observed or stale pair, scored optimistically, and
            # chains that only the cautious guard kept out (their own data is what makes them sure).
            candidates = [self._score(opt, position, room, cached) for opt in optimistic.values()]
            candidates += [s for s in ranked if not s.sure and self.planner.pairs_to_probe(s.spec.names, self._ngram_key)]
            probe = self._pick_probe(chosen, candidates, room)
        if probe is not None:
            self._probe = (probe.spec, chosen.prediction.seconds_per_token)
            self._record(probe.spec, "probe", position, ranked, probe)
            return self._armed(probe, position, cached, stopping=False)
        self._probe = None
        if reason != "keep" or not self.decisions:
            self._record(chosen.spec, reason, position, ranked)
        self.current = chosen.spec
        # Optimistic candidates are rivals too: a chain worth probing soon is no firm "no".
        self.pacing.made(kind, chosen, target_ready and firm(chosen, (*ranked, *candidates), self.config.pacing_margin))
        return self._armed(chosen, position, cached)

    def _reusable(self, kind: Kind, position: int, room: int, cached: Mapping[str, int]) -> Scored | None:
        """A recent decision of this router's sessions for this kind of cycle that costs this
        session nothing a deliberation would have weighed (pacing.py); None: deliberate."""
        recent = self.pacing.recent(kind)
        if recent is None or self._plan is None or recent.spec.names not in self.chains:
            return None
        # (A chain cuts its top-level draft to the room itself: a decision made with more room
        # runs as it would have been planned for less, a little less well.)
        return recent if self._score(recent, position, room, cached).catch_up == 0 else None

    def on_choice(self, seconds: float) -> None:
        """The engine timed the last choice (the pacing's d when it deliberated)."""
        self.pacing.timed(seconds, self.deliberated)

    def _stops(self, names: Sequence[str]) -> bool:
        """Whether the chain's draft ends on its confidence: a model drafting for the target."""
        return self.draft_stop is not None and len(names) == 2 and names[0] != self.lookup

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
            self.draft_stop.configure((self.acceptance.mode, draft, target), self.planner.rate(draft, target), cap,
                                      scored.prediction.seconds_per_token, cost(draft, 1) + row,
                                      lambda n: cost(target, behind + n) + n * row, stopping)
        return chain

    def _check_sure(self, s: Scored, alone: Scored, room: int) -> Scored:
        """Sets whether a chain beats the target alone even at the cautious acceptance (CAUTION_Z
        standard errors below the estimate, AcceptanceEstimator.cautious): the argmin over
        estimates is biased toward the chains whose estimates are high by chance (the winner's
        curse). The draft lengths are still those of the estimate."""
        if len(s.spec.names) > 1:
            r = room if room <= self.longest else None
            s.cautious = self._plan.predict(s.spec, Rates.CAUTIOUS, r, self._ngram_key).seconds_per_token + s.catch_up_per_token
            s.sure = s.cautious < alone.score
        return s

    def _robust(self, s: Scored, alone: Scored, room: int) -> Scored:
        """A chain that beats the target alone on its estimate but not for sure at its lengths,
        at the lengths that are best at the cautious acceptance, where it is sure there: what
        is barely known is drafted short (a suffix class seen right 8 times of 8 is not yet
        worth a 64-token block at a 0.7 lower bound, but is worth 4 tokens), and its lengths grow
        as its estimates firm up. Scored at its estimate at those lengths."""
        if s.sure or s.score >= alone.score:
            return s
        robust = self._plan.best_lengths(s.spec.names, Rates.CAUTIOUS, None, self._ngram_key)
        cautious = robust.prediction.seconds_per_token + s.catch_up_per_token
        if robust.spec == s.spec or cautious >= alone.score:
            return s
        r = room if room <= self.longest else None
        prediction = self._plan.predict(robust.spec, room=r, cls=self._ngram_key)
        return Scored(robust.spec, prediction, s.catch_up, prediction.seconds_per_token + s.catch_up_per_token,
                      cautious, True)

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
        the two rates are the hysteresis at the target alone's border (docs/router-design.md:
        why)."""
        if self.current is None:
            return None
        family = _family(self.current.names, self.lookup)
        options = [s for s in ranked if s.sure and _family(s.spec.names, self.lookup) == family
                   and s.spec.names != self.current.names]
        if self.lookup not in self.current.names or self._ngram_key is not None:
            r = room if room <= self.longest else None
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
        # Remaining time counted over the tokens expected to come: a request may end (EOS) long before max_tokens.
        budget = self.budget.left(self._horizon * best_rate)
        options = []
        r = room if room <= self.longest else None
        for scored in candidates:
            if scored.spec.names == chosen.spec.names or scored.score >= (1 - self.config.hysteresis) * chosen.score:
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
        if len(self.decisions) >= self.config.max_decisions:
            return
        shown = ranked[:8] + ([probe] if probe is not None else [])
        names = sorted({n for s in shown for n in s.spec.names}, key=self.names.index)
        keys = [level_key(n, self._ngram_key, self.lookup) for n in names]
        pairs = {f"{j}->{i}": {"rate": round(self.planner.rate(j, i), 3), "count": round(self.acceptance.count(j, i), 1)}
                 for j, i in itertools.combinations(keys, 2)}
        costs = {n: {str(k): round(self.costs.seconds(n, k) * 1e3, 3) for k in (1, 2, 4, 8)} for n in names if n != self.lookup}
        inputs = DecisionInputs(pairs, costs, self.acceptance.mode, self._ngram_key,
                                round(self.costs.overhead_per_forward * 1e3, 3),
                                round(self.costs.row_seconds(self._row_kind) * 1e3, 4), round(self.budget.spent * 1e3, 3))
        self.decisions.append(Decision(self._cycle, position, spec, reason, shown, inputs))

    # Observations: the session's learner (observe.py) --------------------------------------
    def on_forward(self, level: str, n_tokens: int, seconds: float, shared: bool = False, batch: int = 1) -> None:
        self.learner.on_forward(level, n_tokens, seconds, shared, batch)

    def on_rows(self, level: str, rows: int, seconds: float) -> None:
        self.learner.on_rows(level, rows, seconds)

    def on_verify(self, proposer: str, verifier: str, proposals, q, p, n_accepted: int, requested: int,
                  match_class: str | None = None) -> None:
        if proposer == self.lookup and match_class is not None:
            self.lookup_blocks[match_class] += 1
            self.lookup_accepted[match_class] += n_accepted
        self.learner.on_verify(proposer, verifier, proposals, q, p, n_accepted, requested, match_class)

    def end_cycle(self, new_tokens: Sequence[int], seconds: float) -> None:
        """After a cycle: what the target emitted and how long the cycle took."""
        self.budget.elapsed += seconds  # each session of a batch adds the cycle: B times in all
        self.pacing.on_cycle(seconds)
        self._output += new_tokens
        if self._probe is not None:
            spec, best_rate = self._probe
            # A probe that did better than the choice refunds nothing: counted net, the gains of
            # probing the one good chain paid for probing every other (seen with an fp32 target).
            self.budget.spent += max(0.0, seconds - len(new_tokens) * best_rate) * self.batch_size
        self.learner.end_cycle(new_tokens, seconds, self._probe[0] if self._probe else self.current, self.batch_size)

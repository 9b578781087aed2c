"""The router's session: the ChainRouter of one request (engine/request.py's protocol).

Before every cycle it looks the context up with its model-free drafter (one find per cycle:
the result is handed to the drafter, which proposes it if the chain drafts with it), asks the
policy for the chain (policy.decide: a function of the cycle's inputs, the session's state and
the config), records the decision for --explain and sets up the draft stop. After the cycle's
forwards and verifications it feeds the learner (learn.py: the shared estimates) and the
probes' account.

A Router is one request's session; session() makes another on the same shared objects (the
models, the cost model, the global acceptance estimates, the draft stop's calibration, the
cross-request memory, the answer lengths, the probes' account, the draft-length hints and the
pacing). Any chain chosen before a cycle keeps the output exact: each cycle emits tokens
distributed as the target's, whatever chain produced them.

Draft stop (draft_stop.py): a model drafting for the target alone ends its draft where its
own confidence says that going on no longer pays, up to the grid's longest length; the chain
is still chosen and scored at its planned length. A probe drafts its planned length: it is
there to measure the pair.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from specrouter.backends.base import Backend
from specrouter.cascade.chain import Chain, Level
from specrouter.cascade.sampling import SamplingParams
from specrouter.drafters import MODEL_FREE
from specrouter.drafters.lookup import Handed
from specrouter.drafters.memory import MemoryScope, SuffixMemory
from specrouter.drafters.ngram import NGRAM_NAME
from specrouter.errors import InvalidParameterError
from specrouter.metrics import SpecStats
from specrouter.router.config import DEFAULT_CONFIG, RouterConfig
from specrouter.router.draft_stop import ConfidenceStop
from specrouter.router.estimates.acceptance import AcceptanceEstimator
from specrouter.router.estimates.costs import OnlineCosts, row_kind
from specrouter.router.estimates.lengths import AnswerLengths
from specrouter.router.estimates.store import RouterStore
from specrouter.router.learn import CycleLearner
from specrouter.router.policy.decide import decide
from specrouter.router.policy.pacing import ChoicePacing
from specrouter.router.policy.plan import LengthHints, Scored, match_key
from specrouter.router.policy.planner import Planner
from specrouter.router.policy.predictor import ChainSpec
from specrouter.router.policy.record import DecisionRecord, record
from specrouter.router.policy.state import CycleInputs, ProbeBudget, ProbeRun, Reason, SessionState


class Router:
    """Chooses a Chain before each cycle and learns from the cycle's observations."""

    def __init__(self, target: Backend, drafts: Sequence[Backend], costs: OnlineCosts,
                 acceptance: AcceptanceEstimator | None = None, use_ngram: bool = True, message: str | None = None,
                 confidence_stop: bool = True, *, config: RouterConfig = DEFAULT_CONFIG,
                 shared_stop: ConfidenceStop | None = None, lookup: str = NGRAM_NAME,
                 memory: SuffixMemory | None = None, scope: MemoryScope = MemoryScope(),
                 lengths: AnswerLengths | None = None,
                 budget: ProbeBudget | None = None, hints: LengthHints | None = None,
                 pacing: ChoicePacing | None = None) -> None:
        """use_ngram: route a model-free level too, the drafter `lookup` names (MODEL_FREE);
        confidence_stop: a model drafting for the target may end its draft on its confidence;
        shared_stop: that rule's calibration is shared with this stop's (a session); memory:
        the cross-request suffix memory every session reads and feeds (the lookup must be one
        that reads it), in `scope` (a session's request: its partition, or opted out); lengths,
        budget, hints, pacing: the answer lengths, the probes' account, the last draft lengths
        and the pacing, shared by sessions (default fresh ones); config: the tuning (its grids:
        the draft lengths searched for the models and for the model-free level, the latter up
        to its drafter's `longest`)."""
        if lookup not in MODEL_FREE:
            raise InvalidParameterError(f"unknown model-free drafter {lookup!r}: use one of {', '.join(MODEL_FREE)}")
        self.config, self.target, self.costs, self.message = config, target, costs, message
        self.drafts = sorted(drafts, key=lambda m: m.params_b)
        self.models: list[Backend] = [*self.drafts, target]
        #: The session's own model-free drafter (None: none is routed), and its name.
        self.lookup_drafter = MODEL_FREE[lookup]() if use_ngram else None
        self.lookup = self.lookup_drafter.name if self.lookup_drafter else None
        #: The process's cross-request memory and this session's request's part of it.
        self.memory, self.scope = memory, scope
        if memory is not None and self.lookup_drafter is not None:
            self.lookup_drafter.with_memory(memory, scope)
        #: How long answers ran: the horizon over which a catch-up is amortised.
        self.lengths = lengths or AnswerLengths(config=config)
        self.acceptance = acceptance or AcceptanceEstimator(config=config)
        self.grid = tuple(config.draft_grid)
        self.lookup_grid = self._lookup_grid()
        self.longest = max(self.grid + self.lookup_grid)
        #: Where what the router learns is kept across processes (None: nowhere).
        self.store: RouterStore | None = None
        self.draft_stop = ((shared_stop.session() if shared_stop else ConfidenceStop(config=config))
                           if confidence_stop else None)
        self._levels: dict[str, Level] = {m.name: m for m in self.models}
        match_keys = []
        if self.lookup_drafter:
            self._levels[self.lookup_drafter.name] = self.lookup_drafter
            match_keys = [match_key(self.lookup_drafter.name, c) for c in self.lookup_drafter.classes]
        #: The last best draft lengths of this router's sessions (plan.LengthHints).
        self.hints = hints or LengthHints()
        planner = Planner(self.acceptance, costs, target.name, self.grid, [m.name for m in self.drafts], self.lookup,
                          match_keys, self.lookup_grid, self.hints, config)
        #: The policy's memory of this request (policy/state.py).
        self.state = SessionState(planner, pacing or ChoicePacing(config=config),
                                  budget or ProbeBudget(config.explore_fraction))
        #: Whether the last choice deliberated (False: it reused a recent decision, or the
        #: target fed the prompt alone), and whether it was that prefill (decide.py).
        self.deliberated = True
        self.prefill = False
        self._chain_objs: dict[ChainSpec, Chain] = {}
        self.learner = CycleLearner(self.acceptance, costs, target.name, self.lookup, config)
        #: Sequences that advance together (set by the batch scheduler before choose): every
        #: forward then carries this many sequences' tokens, so it is costed at batch x n tokens.
        self.batch_size = 1
        self.start(SamplingParams())

    def _lookup_grid(self) -> tuple[int, ...]:
        if self.lookup_drafter is None:
            return ()
        grid = tuple(k for k in self.config.lookup_grid if k <= self.lookup_drafter.longest)
        if not grid:
            raise InvalidParameterError(f"lookup_grid has no draft length the {self.lookup} drafter drafts "
                                        f"(at most {self.lookup_drafter.longest})")
        return grid

    def session(self, scope: MemoryScope = MemoryScope()) -> Router:
        """A router for one request of many running at once, built afresh, never copied: its
        own per-request state (plan, decisions, current chain, per-request acceptance, chain
        objects carrying its own draft stop, its request's memory scope), and the objects
        every request shares (the module docstring)."""
        return Router(self.target, self.drafts, self.costs, self.acceptance.view(), self.lookup_drafter is not None,
                      self.message, self.draft_stop is not None, config=self.config, shared_stop=self.draft_stop,
                      lookup=self.lookup or NGRAM_NAME, memory=self.memory, scope=scope, lengths=self.lengths,
                      budget=self.budget, hints=self.hints, pacing=self.pacing)

    # What the session holds -------------------------------------------------------------
    @property
    def planner(self) -> Planner:
        return self.state.planner

    @property
    def pacing(self) -> ChoicePacing:
        """How often this router's sessions deliberate (pacing.py), shared by them."""
        return self.state.pacing

    @property
    def budget(self) -> ProbeBudget:
        """The probes' account, shared by this router's sessions."""
        return self.state.budget

    @budget.setter
    def budget(self, budget: ProbeBudget) -> None:
        self.state.budget = budget

    @property
    def current(self) -> ChainSpec | None:
        """The chain the request runs (None: none chosen yet)."""
        return self.state.current

    @current.setter
    def current(self, spec: ChainSpec | None) -> None:
        self.state.current = spec

    @property
    def _cycle(self) -> int:
        return self.state.cycle

    @property
    def _probe(self) -> ProbeRun | None:
        return self.state.probe

    @_probe.setter
    def _probe(self, probe: tuple[ChainSpec, float] | None) -> None:
        self.state.probe = None if probe is None else ProbeRun(*probe)

    @property
    def chains(self) -> list[tuple[str, ...]]:
        """The candidate chains (names, cheapest first)."""
        return self.planner.chains

    @property
    def names(self) -> list[str]:
        """Every level the router may run, cheapest first."""
        return [self.lookup] * bool(self.lookup) + self.planner.models

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
        self.state.start()
        self.decisions: list[DecisionRecord] = []  # per request
        self._match: str | None = None  # the match class of this cycle's lookup (None: no match)
        self._output: list[int] = []  # what the request's cycles emitted (for the memory)
        #: Per match class of the lookup, what it drafted in this request and how much of it
        #: was accepted (for reports: which source drafted, and how well).
        self.lookup_stats = SpecStats()

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

    # The choice -------------------------------------------------------------------------
    def choose(self, position: int, room: int, cached: Mapping[str, int] | None = None,
               context: Sequence[int] | None = None, forced: Sequence[int] = ()) -> Chain:
        """The chain for the next cycle; `cached`: committed tokens each model's cache holds.

        `context` is used for one thing: the model-free lookup, done before every cycle (it
        costs microseconds), whose match class the choice reads and whose proposal is scored
        in the shadow of the rows the models compute anyway, so the model-free level is always
        observed. `forced`: the tokens the request's grammar forces next, which the model-free
        level proposes instead of its lookup's (their own match class)."""
        cached = cached or {}
        proposal = self._look_up(context, forced)
        self.learner.begin(proposal, self._match)
        inputs = CycleInputs(position, room, cached, self.lengths.horizon(len(self._output), room), self._match,
                             self._row_kind, self.batch_size)
        decision = decide(inputs, self.state, self.config)
        self.deliberated, self.prefill = decision.deliberated, decision.reason is Reason.PREFILL
        if decision.deliberated and (decision.reason is not Reason.KEEP or not self.decisions):
            if len(self.decisions) < self.config.max_decisions:
                self.decisions.append(record(decision, self.state.cycle, position, self.planner, self.budget,
                                             self.names, self._row_kind, self._match))
        return self._armed(decision.chosen, stopping=not decision.probing)

    def _look_up(self, context: Sequence[int] | None, forced: Sequence[int]) -> list[int] | None:
        """The model-free lookup of this cycle, handed to the drafter (the cycle's first draft
        proposes it); sets its match class. Returns its tokens (None: no match)."""
        self._match = None
        free = self.lookup_drafter
        if free is None:
            return None
        if context is None:
            free.hand(None)
            return None
        longest = max(self.lookup_grid)
        found = free.find(context, longest, forced=forced)
        free.hand(Handed(found, len(context), longest))
        if not found.tokens:
            return None
        self._match = match_key(free.name, free.match_class(found))
        return found.tokens

    def on_choice(self, seconds: float) -> None:
        """The engine timed the last choice (the pacing's d when it deliberated; a prefill is
        no choice of the pacing's)."""
        if not self.prefill:
            self.pacing.timed(seconds, self.deliberated)

    def _stops(self, names: Sequence[str]) -> bool:
        """Whether the chain's draft ends on its confidence: a model drafting for the target."""
        return self.draft_stop is not None and len(names) == 2 and names[0] != self.lookup

    def _armed(self, scored: Scored, stopping: bool = True) -> Chain:
        """The chain object of a choice, its draft stop set up for this cycle (draft_stop); a
        probe (not `stopping`) drafts its planned length: it measures the pair."""
        chain = self.chain_for(scored.spec)
        if self._stops(scored.spec.names):
            draft, target = scored.spec.names
            plan = self.planner.plan
            cost, row = plan.cost, plan.inputs.row * self.batch_size
            cap = chain.draft_lengths[0] if stopping else scored.spec.draft_lengths[0]
            self.draft_stop.configure((self.acceptance.mode, draft, target), self.planner.rate(draft, target), cap,
                                      scored.prediction.seconds_per_token, cost(draft, 1) + row,
                                      lambda n: cost(target, n) + n * row, stopping)
        return chain

    # Observations: the session's learner (learn.py) ------------------------------------------
    def on_forward(self, level: str, n_tokens: int, seconds: float, shared: bool = False, batch: int = 1) -> None:
        self.learner.on_forward(level, n_tokens, seconds, shared, batch)

    def on_rows(self, level: str, rows: int, seconds: float) -> None:
        self.learner.on_rows(level, rows, seconds)

    def on_verify(self, proposer: str, verifier: str, proposals, q, p, n_accepted: int, requested: int,
                  match_class: str | None = None) -> None:
        if proposer == self.lookup and match_class is not None:
            self.lookup_stats.level(match_class).observe_draft(len(proposals), n_accepted)
        self.learner.on_verify(proposer, verifier, proposals, q, p, n_accepted, requested, match_class)

    def end_cycle(self, new_tokens: Sequence[int], seconds: float) -> None:
        """After a cycle: what the target emitted and how long the cycle took."""
        self.budget.elapsed += seconds  # each session of a batch adds the cycle: B times in all
        self.pacing.on_cycle(seconds)
        self._output += new_tokens
        probe = self.state.probe
        if probe is not None:
            # A probe that did better than the choice refunds nothing: counted net, the gains of
            # probing the one good chain would pay for probing every other.
            self.budget.spent += max(0.0, seconds - len(new_tokens) * probe.best_rate) * self.batch_size
        self.learner.end_cycle(new_tokens, seconds, probe.spec if probe else self.current, self.batch_size)

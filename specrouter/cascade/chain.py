"""One cycle of multi-level speculative decoding across a chain of models.

A chain is [level 0, ..., target]. Level 0 drafts through its Proposer (proposer.py:
a model autoregressively, or a model-free lookup). Every level above it produces tokens *distributed exactly as its own p*
by verifying blocks from the level below (speculative sampling), and passes its own
p at each position upward as the proposal distribution q of the next level. The
target verifies one block per cycle; what it emits is committed.

Why intermediate levels truncate to exactly n tokens: the level above may treat a
run of proposals as drawn from q only if whether position i exists does not depend
on how token i itself was drawn. A fixed count keeps that true, and so would any rule
decided by what was drawn before position i: stopping after EOS, after a block's
correction (scripts/mutants.py runs that one as a control: the tests pass it), or on
the draft's confidence so far (a LengthPolicy: whether it drafts token i + 1 is decided
from its confidences in tokens 1..i). Dropping a token after seeing it is what breaks
exactness (the mutant `stop-after-seeing-token`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from specrouter.backends.base import Backend
from specrouter.cascade.grammar import Constraint
from specrouter.cascade.logprobs import TokenLogprob, emitted_logprobs
from specrouter.cascade.model_drafter import ModelDrafter
from specrouter.cascade.penalties import History, penalize, penalized
from specrouter.cascade.proposer import Draft, LengthPolicy, Proposer, confidence, cut_after_eos
from specrouter.cascade.sampling import SamplingParams, sample
from specrouter.cascade.verify import residual, verify_greedy, verify_sampled
from specrouter.errors import InvalidChainError, InvalidParameterError
from specrouter.metrics import LevelStats
from specrouter.ops.rows import ops_of
from specrouter.state import SequenceState

#: A level: a model, or (level 0 only) a model-free Proposer.
Level = Backend | Proposer


class CycleObserver(Protocol):
    """What the router learns from: every forward's cost and every verification's distributions."""

    def on_forward(self, level: str, n_tokens: int, seconds: float, shared: bool = False, batch: int = 1) -> None:
        """A forward of `level` over n_tokens fed tokens (0 for an n-gram lookup) took `seconds`.
        batch: sequences in that call (n_tokens and seconds are then the whole call's);
        shared: another sequence of the same call reports it too."""

    def on_rows(self, level: str, rows: int, seconds: float) -> None:
        """The Python work on `rows` logits rows of `level` (warping, sampling, verifying) took
        `seconds`: a cost of its own, per row, beside the forward (a 150k-vocabulary row under
        sampling costs ~0.5 ms, so a verification of 16 proposals pays ~8 ms of it)."""

    def on_verify(self, proposer: str, verifier: str, proposals: list[int], q: list | None, p: list,
                  n_accepted: int, requested: int, match_class: str | None = None) -> None:
        """`verifier` checked `proposals` (of `requested`); q, p: per-position dists as the cascade
        keeps them (argmax ids under greedy, warped probabilities otherwise; q None for n-gram);
        match_class: the class of the lookup match behind a model-free draft (None for a
        model's). It is the
        evidence of this very block: a proposer keeps no state between drafting and verifying
        (in a batch other requests draft in between)."""


@dataclass
class EvalRequest:
    """What a cycle needs next: logits of `backend` after each of the last n_logits of
    `tokens` (the sequence's whole context, cache made to hold exactly it). The driver
    fills in what the forward fed and cost; for a batched call, the whole call's."""

    level: int  # index in the chain
    backend: Backend
    tokens: list[int]
    n_logits: int
    fed: int = 0
    seconds: float = 0.0
    batch: int = 1  # sequences in the call
    shared: bool = False  # another request of the same batched call reports it


def execute(calls: Sequence[tuple[SequenceState, EvalRequest]],
            clock: Callable[[], float] = time.perf_counter) -> list[np.ndarray]:
    """Serve EvalRequests of ONE backend, one per sequence, in one decode_batch call: each
    sequence's cache is first made to hold what its request needs (SequenceState.prepare),
    and is told what was fed once the call returned. Every request gets the call's fed
    tokens, seconds, batch size and whether another request shares the report. Returns the
    logits, one array per request. What the backend raises propagates (the states then
    hold what they held, less what prepare rolled back)."""
    backend = calls[0][1].backend
    items = [state.prepare(backend, r.tokens, r.n_logits) for state, r in calls]
    start = clock()
    outputs = backend.decode_batch(items)
    seconds = clock() - start
    fed = sum(len(item[1]) for item in items)
    for j, ((state, request), item) in enumerate(zip(calls, items)):
        state.fed(backend, item[1])
        request.fed, request.seconds, request.shared, request.batch = fed, seconds, j > 0, len(calls)
    return outputs


def check_chain(names: Sequence[str], draft_lengths: Sequence[int] | None = None,
                levels: Sequence[str] | None = None, target: str | None = None) -> None:
    """Raise unless `names` (cheapest first, target last) is a valid chain.

    draft_lengths: None for the default per level, else one integer >= 1 per non-target level.
    levels: the names a chain may use (None: any, resolved when loaded); target: the name
    the chain must end at (None: its last name is its target). Checked in this order: not
    empty, names known and distinct (InvalidChainError), target last, draft lengths.
    """
    names = list(names)
    if not names:
        raise InvalidParameterError("a chain needs at least one model (the target)")
    if levels is not None:
        unknown = [n for n in names if n not in levels]
        if unknown:
            raise InvalidChainError(f"chain {names} must use levels of {list(levels)}; unknown: {unknown}")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise InvalidChainError(f"chain {names} must use distinct levels; repeated: {repeated}")
    if target is not None and names[-1] != target:
        raise InvalidParameterError(f"chain {names} must end at the served model {target!r}")
    if draft_lengths is None:
        return
    lengths = list(draft_lengths)
    if len(lengths) != len(names) - 1:
        raise InvalidParameterError(f"a chain of {len(names)} models needs {len(names) - 1} draft lengths, "
                                    f"got {len(lengths)}")
    if any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in lengths):
        raise InvalidParameterError(f"draft lengths must be integers >= 1, got {lengths}")


@dataclass
class Chain:
    """Models from cheapest to target, and per non-target level its draft length:
    draft_lengths[i] tokens are proposed by level i to level i + 1 per block."""

    levels: list[Level]
    draft_lengths: list[int]
    eos_ids: frozenset[int] = field(default_factory=frozenset)
    #: Level 0, when a model, may end its drafts early by this policy (draft_lengths[0] is then a cap).
    draft_stop: LengthPolicy | None = None
    #: Level 0 as a Proposer (a model is wrapped in a ModelDrafter with draft_stop as its policy).
    proposer: Proposer = field(init=False)

    def __post_init__(self) -> None:
        check_chain([level.name for level in self.levels], self.draft_lengths)
        if not isinstance(self.levels[-1], Backend):
            raise InvalidParameterError(
                f"the last level of a chain (the target) must be a model, not {self.levels[-1].name}")
        for level in self.levels[1:]:
            if not isinstance(level, Backend):
                raise InvalidParameterError(f"{level.name} can only be the first (drafting) level of a chain")
        if not isinstance(self.levels[0], Backend | Proposer):
            raise InvalidParameterError(f"level 0 ({self.levels[0]!r}) is neither a model nor a proposer")
        level0 = self.levels[0]
        self.proposer = ModelDrafter(level0, self.draft_stop) if isinstance(level0, Backend) else level0
        if not self.eos_ids:
            self.eos_ids = self.target.eos_ids

    @property
    def target(self) -> Backend:
        return self.levels[-1]  # type: ignore[return-value]

    @property
    def names(self) -> list[str]:
        return [level.name for level in self.levels]

    @property
    def models(self) -> list[Backend]:
        return [level for level in self.levels if isinstance(level, Backend)]


class CycleRunner:
    """Runs cycles of one chain for one sequence; holds no state beyond statistics and the
    length of the current cycle's committed context (what its proposer may index)."""

    def __init__(
        self,
        chain: Chain,
        state: SequenceState,
        params: SamplingParams,
        rng: np.random.Generator,
        stats: list[LevelStats] | None = None,
        residual_fn=residual,
        observer: CycleObserver | None = None,
        clock: Callable[[], float] = time.perf_counter,
        logprobs: int | None = None,
        history: History | None = None,
        constraint: Constraint | None = None,
    ) -> None:
        """logprobs: report each emitted token's log-probability with that many alternatives
        (logprobs.py; None: report none). history: the committed text penalties read
        (penalties.py), synced to the cycle's context; needed when params penalise.
        constraint: the sequence's grammar state (grammar.py) over the output committed
        before the cycle's context ends; needed when params have a grammar."""
        if history is None and penalized(params):
            raise InvalidParameterError("penalties and biases need the sequence's History")
        if constraint is None and params.grammar is not None:
            raise InvalidParameterError("a grammar needs the sequence's Constraint")
        self.chain, self.state, self.params, self.rng = chain, state, params, rng
        self.stats = stats if stats is not None else [LevelStats(level.name) for level in chain.levels]
        self._residual = residual_fn
        # Optional: only reports, never changes what is computed (exactness does not depend on it).
        self.observer = observer
        self.clock = clock  # a simulated clock in tests; wall time otherwise
        self.committed = 0  # the current cycle's starting context (proposer.Drafting)
        self.logprobs = logprobs
        self.history = history if penalized(params) else None
        self.constraint = constraint if params.grammar is not None else None
        #: The emitted tokens' entries, one per token the cycle returned (when logprobs is set).
        self.emitted: list[TokenLogprob] = []

    def cycle(self, context: Sequence[int], max_new: int) -> list[int]:
        """New tokens the target emits after `context` (1 .. max_new of them)."""
        steps = self.steps(context, max_new)
        logits = None
        while True:
            try:
                request = steps.send(logits)
            except StopIteration as done:
                return done.value
            logits = execute([(self.state, request)], self.clock)[0]

    def steps(self, context: Sequence[int], max_new: int) -> Generator[EvalRequest, np.ndarray, list[int]]:
        """The same cycle as a generator: it yields every forward it needs and is sent the
        logits, so a batch scheduler can serve the requests of many sequences together.
        Returns (StopIteration.value) the new tokens."""
        self.committed = len(context)
        top = len(self.chain.levels) - 1
        draft = min(self.chain.draft_lengths[top - 1], max_new - 1) if top else 0
        tokens, _ = yield from self._block(top, list(context), draft)
        del self.emitted[max_new:]
        return tokens[:max_new]

    # ------------------------------------------------------------------------------
    def _processed(self, rows, tokens: list[int]):
        """Rows after the last len(rows) prefixes of `tokens` (row j after tokens[:len(tokens)
        - len(rows) + 1 + j]), transformed by the penalties (penalties.py), then restricted by
        the grammar (grammar.py); as they are without either."""
        first = len(tokens) - len(rows) + 1
        if self.history is not None or self.constraint is not None:
            rows = ops_of(rows).host(rows)  # penalties and grammars read rows on the host
        if self.history is not None:
            rows = [penalize(row, tokens[: first + j], self.params, self.history) for j, row in enumerate(rows)]
        if self.constraint is not None:
            rows = self.constraint.restrict(rows, tokens[self.committed:], first - self.committed)
        return rows

    def _dist(self, row):
        """What a level keeps per position: its argmax under greedy, else its warped p."""
        return self._dists([row])[0]

    def _dists(self, rows) -> list:
        """_dist of every row, in one pass over rows kept on a device (rows.py)."""
        ops = ops_of(rows)
        return ops.argmax(rows) if self.params.greedy else ops.warp(rows, self.params)

    def _evaluate(self, i: int, tokens: list[int], n_logits: int):
        request = EvalRequest(i, self.chain.levels[i], tokens, n_logits)
        logits = yield request
        self.stats[i].observe_forward(request.seconds)
        if self.observer is not None:
            self.observer.on_forward(request.backend.name, request.fed, request.seconds, request.shared, request.batch)
        return logits

    def _rows_done(self, i: int, rows: int, start: float) -> None:
        if self.observer is not None:
            self.observer.on_rows(self.chain.levels[i].name, rows, self.clock() - start)

    # What level 0's proposer is lent (proposer.Drafting) -----------------------------------
    @property
    def eos_ids(self) -> frozenset[int]:
        return self.chain.eos_ids

    def row(self, tokens: list[int]):
        """Level 0's next-token logits after tokens (penalised as every level's are)."""
        return self._processed((yield from self._evaluate(0, tokens, 1)), tokens)[0]

    def pick(self, row: np.ndarray, want_confidence: bool):
        start = self.clock()
        d = self._dist(row)
        token = d if self.params.greedy else sample(d, self.rng)
        conf = (confidence(row) if self.params.greedy else float(d[token])) if want_confidence else 0.0
        self._rows_done(0, 1, start)
        return token, d, conf

    def forced(self, tokens: list[int]) -> list[int]:
        return self.constraint.forced(tokens[self.committed:]) if self.constraint is not None else []

    def lookup_took(self, seconds: float) -> None:
        self.stats[0].seconds += seconds
        if self.observer is not None:
            self.observer.on_forward(self.chain.levels[0].name, 0, seconds)

    # ------------------------------------------------------------------------------
    def _propose(self, i: int, context: list[int], n: int):
        """n tokens following `context`, distributed as level i's own p, with that p per position
        (a Draft)."""
        if i == 0:
            return (yield from self.chain.proposer.draft(context, n, self))
        out: list[int] = []
        dists: list = []
        while len(out) < n:
            # Ask below for at most what is still missing; a surplus bonus token is free and dropped.
            below = min(self.chain.draft_lengths[i - 1], n - len(out))
            tokens, d = yield from self._block(i, context + out, below)
            out += tokens
            dists += d
            if any(t in self.chain.eos_ids for t in tokens):
                cut = len(cut_after_eos(out, self.chain.eos_ids))
                return Draft(out[: min(cut, n)], dists[: min(cut, n)])
        return Draft(out[:n], dists[:n])

    def _block(self, i: int, context: list[int], n_below: int):
        """Level i verifies up to n_below proposals from level i - 1 in one forward and
        returns the accepted ones plus its own next token, with its dist per token."""
        draft = (yield from self._propose(i - 1, context, n_below)) if n_below > 0 else Draft([], [])
        if self.constraint is not None:  # a model-free draft is cut where it leaves the grammar
            draft = draft.cut(self.constraint.valid_prefix(context[self.committed:], draft.tokens))
        proposals, q = draft.tokens, draft.dists
        rows = yield from self._evaluate(i, context + proposals, len(proposals) + 1)
        start = self.clock()
        rows = self._processed(rows, context + proposals)
        p = self._dists(rows)
        if self.params.greedy:
            n_acc, nxt = verify_greedy(proposals, p)
        else:
            n_acc, nxt = verify_sampled(proposals, q, p, self.rng, self._residual)
        if self.logprobs is not None and i == len(self.chain.levels) - 1:
            emitted = proposals[:n_acc] + [nxt]
            host = ops_of(rows).host
            self.emitted = emitted_logprobs(host(rows), emitted, self.params, self.logprobs,
                                            None if self.params.greedy else host(p))
        self._rows_done(i, len(rows), start)
        if i > 0:
            self.stats[i - 1].observe_draft(len(proposals), n_acc)
            if i == 1 and n_below > 0:
                self.chain.proposer.feedback(draft, n_acc)
            if draft.stopped:  # a draft its policy ended asked for no more: its end is no rejection to score
                n_below = len(proposals)
            if self.observer is not None and n_below > 0:
                self.observer.on_verify(self.chain.levels[i - 1].name, self.chain.levels[i].name,
                                        proposals, q, p, n_acc, n_below, draft.match_class)
        return proposals[:n_acc] + [nxt], p[: n_acc + 1]

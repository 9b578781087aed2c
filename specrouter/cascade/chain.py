"""One cycle of multi-level speculative decoding across a chain of models.

A chain is [level 0, ..., target]. Level 0 drafts (autoregressively, or by n-gram
lookup). Every level above it produces tokens *distributed exactly as its own p*
by verifying blocks from the level below (speculative sampling), and passes its own
p at each position upward as the proposal distribution q of the next level. The
target verifies one block per cycle; what it emits is committed.

Why intermediate levels truncate to exactly n tokens: the level above may treat a
run of proposals as drawn from q only if whether position i exists does not depend
on how token i itself was drawn. A fixed count keeps that true, and so would any rule
decided by what was drawn before position i: stopping after EOS, after a block's
correction (scripts/mutants.py runs that one as a control: the tests pass it), or on
the draft's confidence so far (DraftStop: whether it drafts token i + 1 is decided
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
from specrouter.backends.ngram import NgramDrafter
from specrouter.cascade.sampling import SamplingParams, sample, warp
from specrouter.cascade.verify import residual, verify_greedy, verify_sampled
from specrouter.errors import InvalidParameterError
from specrouter.state import SequenceState

Level = Backend | NgramDrafter


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
                  n_accepted: int, requested: int, match: int = 0) -> None:
        """`verifier` checked `proposals` (of `requested`); q, p: per-position dists as the cascade
        keeps them (argmax ids under greedy, warped probabilities otherwise; q None for n-gram);
        match: the suffix-match length behind an n-gram draft (0 for a model's). It is the
        evidence of this very block: a proposer keeps no state between drafting and verifying
        (in a batch other requests draft in between)."""


class DraftStop(Protocol):
    """Ends a model's draft before its length when going on no longer pays (the router's
    rule). It sees the draft's confidence in each token so far: under greedy the top
    probability of its distribution, under sampling the probability of the drawn token."""

    def more(self, confidences: Sequence[float]) -> bool:
        """Whether to draft one more token after these."""

    def learn(self, confidences: Sequence[float], n_accepted: int) -> None:
        """The verifier accepted the first n_accepted of the tokens with these confidences."""


def confidence(row: np.ndarray) -> float:
    """Top probability of the softmax of a logits row."""
    return float(1.0 / np.exp(row - row.max()).sum())


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


@dataclass(frozen=True)
class Draft:
    """What a level hands the level above: tokens, its distribution per token (None for a
    deterministic proposer: q = one-hot), and the n-gram's suffix-match length (0: a model)."""

    tokens: list[int]
    dists: list | None
    match: int = 0


@dataclass
class LevelStats:
    name: str
    proposed: int = 0  # tokens this level handed to the level above
    accepted: int = 0  # of those, how many the level above accepted
    forwards: int = 0  # model calls (0 for the n-gram level)
    seconds: float = 0.0  # wall time inside this level's calls

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.proposed if self.proposed else None

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "proposed": self.proposed,
            "accepted": self.accepted,
            "acceptance": self.acceptance,
            "forwards": self.forwards,
            "seconds": round(self.seconds, 6),
        }


@dataclass
class Chain:
    """Models from cheapest to target, and per non-target level its draft length:
    draft_lengths[i] tokens are proposed by level i to level i + 1 per block."""

    levels: list[Level]
    draft_lengths: list[int]
    eos_ids: frozenset[int] = field(default_factory=frozenset)
    #: Level 0, when a model, may end its drafts early by this rule (draft_lengths[0] is then a cap).
    draft_stop: DraftStop | None = None

    def __post_init__(self) -> None:
        if not self.levels:
            raise InvalidParameterError("a chain needs at least one model (the target)")
        if not isinstance(self.levels[-1], Backend):
            raise InvalidParameterError("the last level of a chain (the target) must be a model, not ngram")
        for level in self.levels[1:]:
            if isinstance(level, NgramDrafter):
                raise InvalidParameterError("ngram can only be the first (drafting) level of a chain")
        if len(self.draft_lengths) != len(self.levels) - 1:
            raise InvalidParameterError(
                f"a chain of {len(self.levels)} models needs {len(self.levels) - 1} draft lengths, "
                f"got {len(self.draft_lengths)}"
            )
        if any(not isinstance(k, int) or k < 1 for k in self.draft_lengths):
            raise InvalidParameterError(f"draft lengths must be integers >= 1, got {self.draft_lengths}")
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
    """Runs cycles of one chain for one sequence; holds no state beyond statistics."""

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
    ) -> None:
        self.chain, self.state, self.params, self.rng = chain, state, params, rng
        self.stats = stats if stats is not None else [LevelStats(level.name) for level in chain.levels]
        self._residual = residual_fn
        # Optional: only reports, never changes what is computed (exactness does not depend on it).
        self.observer = observer
        self.clock = clock  # a simulated clock in tests; wall time otherwise
        # Level 0's last draft under a DraftStop: its confidences, and whether the rule ended it.
        self._draft_end: tuple[list[float], bool] | None = None

    def cycle(self, context: Sequence[int], max_new: int) -> list[int]:
        """New tokens the target emits after `context` (1 .. max_new of them)."""
        steps = self.steps(context, max_new)
        logits = None
        while True:
            try:
                request = steps.send(logits)
            except StopIteration as done:
                return done.value
            start = self.clock()
            before = self.state.evaluated.get(request.backend.name, 0)
            logits = self.state.evaluate(request.backend, request.tokens, request.n_logits)
            request.seconds = self.clock() - start
            request.fed = self.state.evaluated[request.backend.name] - before

    def steps(self, context: Sequence[int], max_new: int) -> Generator[EvalRequest, np.ndarray, list[int]]:
        """The same cycle as a generator: it yields every forward it needs and is sent the
        logits, so a batch scheduler can serve the requests of many sequences together.
        Returns (StopIteration.value) the new tokens."""
        top = len(self.chain.levels) - 1
        if top == 0:
            return (yield from self._block(0, list(context), 0))[0]
        draft = min(self.chain.draft_lengths[top - 1], max_new - 1)
        tokens, _ = yield from self._block(top, list(context), draft)
        return tokens[:max_new]

    # ------------------------------------------------------------------------------
    def _dist(self, row: np.ndarray):
        """What a level keeps per position: its argmax under greedy, else its warped p."""
        return int(np.argmax(row)) if self.params.greedy else warp(row, self.params)

    def _evaluate(self, i: int, tokens: list[int], n_logits: int):
        request = EvalRequest(i, self.chain.levels[i], tokens, n_logits)
        logits = yield request
        self.stats[i].seconds += request.seconds
        self.stats[i].forwards += 1
        if self.observer is not None:
            self.observer.on_forward(request.backend.name, request.fed, request.seconds, request.shared, request.batch)
        return logits

    def _rows_done(self, i: int, rows: int, start: float) -> None:
        if self.observer is not None:
            self.observer.on_rows(self.chain.levels[i].name, rows, self.clock() - start)

    def _draft(self, context: list[int], n: int):
        """Level 0 proposes n tokens (fewer after EOS or when the n-gram finds nothing): a Draft."""
        level = self.chain.levels[0]
        if isinstance(level, NgramDrafter):
            start = self.clock()
            tokens, match = level.lookup(context, n)
            seconds = self.clock() - start
            self.stats[0].seconds += seconds
            if self.observer is not None:
                self.observer.on_forward(level.name, 0, seconds)
            return Draft(_cut_after_eos(tokens, self.chain.eos_ids), None, match)
        stop = self.chain.draft_stop
        tokens, dists, confidences, cut = [], [], [], False
        for _ in range(n):
            row = (yield from self._evaluate(0, context + tokens, 1))[0]
            start = self.clock()
            d = self._dist(row)
            token = d if self.params.greedy else sample(d, self.rng)
            if stop is not None:
                confidences.append(confidence(row) if self.params.greedy else float(d[token]))
            self._rows_done(0, 1, start)
            tokens.append(token)
            dists.append(d)
            if token in self.chain.eos_ids:
                break
            if stop is not None and len(tokens) < n and not stop.more(confidences):
                cut = True
                break
        if stop is not None:
            self._draft_end = (confidences, cut)
        return Draft(tokens, dists)

    def _propose(self, i: int, context: list[int], n: int):
        """n tokens following `context`, distributed as level i's own p, with that p per position
        (a Draft)."""
        if i == 0:
            return (yield from self._draft(context, n))
        out: list[int] = []
        dists: list = []
        while len(out) < n:
            # Ask below for at most what is still missing; a surplus bonus token is free and dropped.
            below = min(self.chain.draft_lengths[i - 1], n - len(out))
            tokens, d = yield from self._block(i, context + out, below)
            out += tokens
            dists += d
            if any(t in self.chain.eos_ids for t in tokens):
                cut = len(_cut_after_eos(out, self.chain.eos_ids))
                return Draft(out[: min(cut, n)], dists[: min(cut, n)])
        return Draft(out[:n], dists[:n])

    def _block(self, i: int, context: list[int], n_below: int):
        """Level i verifies up to n_below proposals from level i - 1 in one forward and
        returns the accepted ones plus its own next token, with its dist per token."""
        self._draft_end = None
        draft = (yield from self._propose(i - 1, context, n_below)) if n_below > 0 else Draft([], [])
        proposals, q = draft.tokens, draft.dists
        draft_end = self._draft_end if i == 1 else None
        rows = yield from self._evaluate(i, context + proposals, len(proposals) + 1)
        start = self.clock()
        p = [self._dist(row) for row in rows]
        if self.params.greedy:
            n_acc, nxt = verify_greedy(proposals, p)
        else:
            n_acc, nxt = verify_sampled(proposals, q, p, self.rng, self._residual)
        self._rows_done(i, len(rows), start)
        if i > 0:
            self.stats[i - 1].proposed += len(proposals)
            self.stats[i - 1].accepted += n_acc
            if draft_end is not None:
                confidences, cut = draft_end
                self.chain.draft_stop.learn(confidences, n_acc)
                if cut:  # a draft the rule ended asked for no more: its end is no rejection to score
                    n_below = len(proposals)
            if self.observer is not None and n_below > 0:
                self.observer.on_verify(self.chain.levels[i - 1].name, self.chain.levels[i].name,
                                        proposals, q, p, n_acc, n_below, draft.match)
        return proposals[:n_acc] + [nxt], p[: n_acc + 1]


def _cut_after_eos(tokens: list[int], eos_ids: frozenset[int]) -> list[int]:
    for j, t in enumerate(tokens):
        if t in eos_ids:
            return tokens[: j + 1]
    return tokens

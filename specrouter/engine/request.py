"""One request's generation between cycles: its state machine (committed tokens, stop rules,
statistics, the chain of every cycle) and its result.

Whoever drives a request runs each cycle, alone (generate.py: CycleRunner.cycle) or batched
with other sequences (batch.py: CycleRunner.steps). The chain of every cycle comes from a
router (chain_router.py: a fixed chain is the router that always returns it). The request's
input is checked once, when it is made (checks.py).

Stop rules: EOS ends generation and is not emitted; so does a grammar whose sentence is
complete and allows no more text (the token that completed it is emitted); a stop string
cuts the text before it and token_ids keep only the tokens that make up the kept text (a
token that straddles the cut stays; text.py); max_tokens caps the emitted tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from specrouter.backends.base import Backend
from specrouter.cascade.chain import Chain, CycleRunner
from specrouter.cascade.grammar import Constraint
from specrouter.cascade.logprobs import TokenLogprob
from specrouter.cascade.penalties import History, penalized
from specrouter.cascade.sampling import SamplingParams
from specrouter.cascade.verify import residual
from specrouter.engine.chain_router import ChainRouter, as_router
from specrouter.engine.checks import check_logit_bias, check_logprobs, check_max_tokens, check_prompt, check_stop
from specrouter.engine.text import TextTracker
from specrouter.metrics import LevelStats, SpecStats
from specrouter.state import SequenceState


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" (EOS or stop string) or "length" (max_tokens or context full)
    chain: list[str]
    draft_lengths: list[int]
    #: The counts of every level that ran (each once, over every chain it ran in), cheapest
    #: first, target last (metrics.py): what the CLI's JSON and the server's usage show.
    levels: list[LevelStats]
    cycles: int
    prompt_tokens: int
    wall_seconds: float
    evaluated_tokens: dict[str, int] = field(default_factory=dict)
    #: Prompt positions the target took from a finished request's cache (prefix_cache.py).
    cached_tokens: int = 0
    #: Distinct (chain names, draft lengths) used, and per cycle the index of the one it ran.
    chains_used: list[tuple[list[str], list[int]]] = field(default_factory=list)
    chains_per_cycle: list[int] = field(default_factory=list)
    #: The router's recorded decisions (empty for a fixed chain), for --explain.
    decisions: list[dict] = field(default_factory=list)
    #: Per token of token_ids, its log-probability (cascade/logprobs.py); None: not asked for.
    logprobs: list[TokenLogprob] | None = None
    #: What the router's model-free lookup drafted, per match class (`<lookup>#<class>`,
    #: drafters/lookup.py match_source: the request's own text, the memory, a grammar): blocks,
    #: tokens, tokens accepted. Empty for a fixed chain (its lookup is not told apart).
    lookup: SpecStats = field(default_factory=SpecStats)

    @property
    def tokens_per_second(self) -> float:
        return len(self.token_ids) / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def as_dict(self) -> dict:
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "chain": self.chain,
            "draft_lengths": self.draft_lengths,
            "levels": [s.as_dict() for s in self.levels],
            "cycles": self.cycles,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": len(self.token_ids),
            "mean_tokens_per_cycle": len(self.token_ids) / self.cycles if self.cycles else 0.0,
            "wall_seconds": round(self.wall_seconds, 4),
            "tokens_per_second": round(self.tokens_per_second, 3),
            "evaluated_tokens": self.evaluated_tokens,
            "cached_tokens": self.cached_tokens,
            "chains_used": [{"chain": c, "draft_lengths": k} for c, k in self.chains_used],
            "chains_per_cycle": self.chains_per_cycle,
            **({"router_decisions": self.decisions} if self.decisions else {}),
            **({"logprobs": [e.as_dict() for e in self.logprobs]} if self.logprobs is not None else {}),
            **({"lookup": [s.as_dict() for s in self.lookup.values()]} if self.lookup else {}),
        }


class SequenceRun:
    """One request's generation between cycles: committed tokens, text and stop rules,
    statistics, and the router's choice per cycle. Whoever drives it runs each cycle,
    alone (CycleRunner.cycle) or batched with other sequences (CycleRunner.steps)."""

    def __init__(self, chain: Chain | ChainRouter, prompt_tokens: Sequence[int], params: SamplingParams,
                 max_tokens: int, stop: Sequence[str] = (), rng: np.random.Generator | None = None,
                 detokenize: Callable[[int], bytes] | None = None, residual_fn=residual,
                 clock: Callable[[], float] = time.perf_counter, logprobs: int | None = None) -> None:
        """`chain`: a fixed Chain, or a router asked for the chain before every cycle.
        `logprobs`: report every emitted token's log-probability with that many alternatives
        (None: none)."""
        self.router = as_router(chain)
        check_max_tokens(max_tokens)
        check_logprobs(logprobs)
        check_stop(stop)
        check_prompt(self.router, prompt_tokens)
        check_logit_bias(self.router, params)
        self.params, self.max_tokens, self.clock = params, max_tokens, clock
        self.rng = rng if rng is not None else np.random.default_rng(params.seed)
        self._residual = residual_fn
        self.n_ctx = min(m.n_ctx for m in self.router.models)
        self.eos_ids = self.router.target.eos_ids
        self.state = SequenceState()
        # Counts per level name, shared by every chain that level runs in.
        self.stats = SpecStats()
        self._used: dict[tuple[tuple[str, ...], tuple[int, ...]], int] = {}
        self._per_cycle: list[int] = []
        self.router.start(params, len(prompt_tokens), max_tokens)
        self.prompt_tokens = len(prompt_tokens)
        self.context = list(prompt_tokens)
        self.generated: list[int] = []
        self.logprobs = logprobs
        self._logprobs: list[TokenLogprob] = []  # per token of generated, when logprobs is set
        self._logprobs_taken = 0  # entries handed out by take_logprobs
        self._runner: CycleRunner | None = None  # the cycle in progress
        #: What penalties read of the committed text (None: the params have none).
        self.history = History(prompt_tokens) if penalized(params) else None
        #: The grammar's state over the committed output (None: no grammar).
        self.constraint = Constraint(params.grammar, self.router.target) if params.grammar is not None else None
        self._text = TextTracker(detokenize or self.router.target.token_bytes, stop)
        self.finish_reason = "length"
        self.finished = False
        self.cycles = 0
        self._started = time.perf_counter()
        self._wall = 0.0
        self._cycle_start = 0.0
        self._released = False

    @property
    def room(self) -> int:
        """The most tokens the next cycle may emit."""
        return min(self.max_tokens - len(self.generated), self.n_ctx - len(self.context))

    def start_cycle(self, batch_size: int = 1) -> CycleRunner | None:
        """The runner of the next cycle (its chain chosen now), or None when generation is over.
        batch_size: sequences that will advance together with this one (for the router)."""
        if not self.finished and self.constraint is not None and self.constraint.stopped:
            self.finish_reason, self.finished = "stop", True  # the empty output is the grammar's whole sentence
        if self.finished or self.room <= 0:
            self.finished = True
            return None
        self.router.batch_size = batch_size
        forced = self.constraint.forced([]) if self.constraint is not None else ()
        start = self.clock()
        current = self.router.choose(len(self.context), self.room, self.state.committed_lengths(self.context),
                                     self.context, forced)
        self.router.on_choice(self.clock() - start)
        levels = [self.stats.level(lv.name) for lv in current.levels]
        if self.history is not None:
            self.history.sync(self.context)
        runner = CycleRunner(current, self.state, self.params, self.rng, stats=levels,
                             residual_fn=self._residual, observer=self.router, clock=self.clock,
                             logprobs=self.logprobs, history=self.history, constraint=self.constraint)
        self._runner = runner
        key = (tuple(runner.chain.names), tuple(runner.chain.draft_lengths))
        self._per_cycle.append(self._used.setdefault(key, len(self._used)))
        self._cycle_start = self.clock()
        return runner

    def end_cycle(self, new: Sequence[int]) -> str:
        """Commit what the target emitted; returns the text that may be shown now."""
        self.router.end_cycle(new, self.clock() - self._cycle_start)
        self.cycles += 1
        entries = self._runner.emitted if self._runner is not None and self.logprobs is not None else []
        for j, token in enumerate(new):
            if token in self.eos_ids:
                self.finish_reason, self.finished = "stop", True
                return ""
            self.generated.append(token)
            if entries:
                self._logprobs.append(entries[j])
            if self._text.add(token):
                self.finish_reason, self.finished = "stop", True
                return ""
            if self.constraint is not None:
                self.constraint.commit(token)
                if self.constraint.stopped:
                    self.finish_reason, self.finished = "stop", True
                    return ""
        self.context += new
        self.state.rollback_to(self.context)
        return self._text.flush(final=False)

    @property
    def target(self) -> Backend:
        return self.router.target

    def take_logprobs(self, final: bool = False) -> list[TokenLogprob]:
        """The entries of the tokens whose text has been shown (flushed) since the last call:
        what a stream sends with the text it sends (a token held back, for a stop string or
        an unfinished UTF-8 character, comes with the text that shows it). final (after
        result()): every kept token's, also one that straddles a stop string's cut."""
        shown = self._text.n_tokens if final else self._text.shown_tokens()
        shown = min(shown, len(self._logprobs))
        out = self._logprobs[self._logprobs_taken : shown]
        self._logprobs_taken = max(self._logprobs_taken, shown)
        return out

    def abandon_cycle(self) -> None:
        """The cycle in progress was dropped (a model failed): nothing of it is committed."""
        self._per_cycle.pop()
        self.state.rollback_to(self.context)

    def drop_model(self, name: str) -> None:
        """Generate without this (non-target) model from the next cycle on."""
        self.router.exclude(name)

    def release(self, keep: Callable[[SequenceState], None] | None = None) -> None:
        """Free every KV slot of this sequence, or hand its state to `keep` (a prefix cache;
        finished requests only), after which nothing computes with it (idempotent: finished,
        failed or cancelled)."""
        if self._released:
            return
        self._released = True
        self._wall = time.perf_counter() - self._started
        self.evaluated = dict(self.state.evaluated)
        if keep is None:
            self.state.release()
        else:
            keep(self.state)
        self.router.finish()

    def result(self) -> tuple[str, GenerationResult]:
        """After release(): the last text delta and the result."""
        generated = self.generated[: self._text.n_tokens]
        delta = self._text.flush(final=True)
        chains_used = [(list(n), list(k)) for n, k in self._used]
        # The chain run most often stands for the request; levels list every model that ran.
        top = max(range(len(self._used)), key=self._per_cycle.count) if self._used else None
        names, lengths = chains_used[top] if top is not None else ([self.target.name], [])
        levels = sorted(self.stats.values(), key=lambda s: _level_order(self.router, s.name))
        return delta, GenerationResult(
            text=self._text.text,
            token_ids=generated,
            finish_reason=self.finish_reason,
            chain=names,
            draft_lengths=lengths,
            levels=levels,
            cycles=self.cycles,
            prompt_tokens=self.prompt_tokens,
            wall_seconds=self._wall,
            evaluated_tokens=self.evaluated,
            cached_tokens=self.state.resumed.get(self.target.name, 0),
            chains_used=chains_used,
            chains_per_cycle=self._per_cycle,
            decisions=[d.as_dict() for d in self.router.decisions],
            logprobs=self._logprobs[: len(generated)] if self.logprobs is not None else None,
            lookup=self.router.lookup_stats.copy(),
        )


def _level_order(router: ChainRouter, name: str) -> tuple:
    """Cheapest first, target last, as in a chain: n-gram, then models by size."""
    if name == router.target.name:
        return (2, 0.0)
    model = next((m for m in router.models if m.name == name), None)
    return (1, model.params_b) if model is not None else (0, 0.0)

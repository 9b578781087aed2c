"""Chunked prefill: which forwards of a batch step run whole, which feed only a chunk of
their head, and how large a chunk is.

A forward's head is what it feeds without logits: a new prompt, or a draft model's
catch-up of the text it missed. While some sequence decodes (its forward's head fits a
chunk), a forward with a longer head is fed one chunk per step and runs whole once what
is left fits; with nobody decoding everything runs whole (a lone request is not slowed).
Rows that want logits are never split: a 64-token copy is verified in one call.

Chunks protect the majority: when more of a step's forwards have long heads than fit a
chunk (W > D, counted over all models: a burst of prompts beside a few streams), every
forward runs whole, as if nobody decoded; the D streams stall for the W prefills, as they
would have had they arrived together. Protecting them would cost the W prompts far more: a
chunk that keeps a stream's call within 1 + share of its own is a few tokens, which a
forward's fixed cost makes about twice as dear per token on a CPU as a whole prompt, so a
burst entered the batch one prompt at a time while the few streams gained little from
batching (figures: docs/fleet.md). A batch thus takes the same course whether its prompts
arrive within one step or a few apart. One prompt beside one or more streams is chunked.

Where a chunk runs: in the same call as the step's decoding forwards of its model (one
forward: its fixed cost, most of a token's on a CPU, is paid once). A model that no
decoding sequence used for STARVE_STEPS steps (a prompt's draft model while every other
request runs the target alone) takes its chunk in a call of its own, so nothing waits
forever.

How large, per model (a controller on measured time, no cost model): a chunk riding with
decoding forwards is scaled after each full chunk so that the call takes about
1 + share times that model's decoding calls without chunks (an EMA; a call that feeds a
prompt whole is not one); one in a call of its own so that the call takes about `share`
of a step (an EMA of steps without chunks). Each step takes half the correction (in log
terms: a call's time jitters, and full corrections overshot to 3x), rounded away from the
current size, by at most 2 either way, from FIRST_CHUNK tokens (small is safe). A
decoding stream's cycle then takes about 1 + share times as long while a prompt arrives,
instead of stalling for the whole prefill (seconds to minutes on a CPU), and the prompt
is fed with the rest of the machine's time. A chunk changes how a cache is filled, never
what it holds.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from specrouter.errors import InvalidParameterError
from specrouter.smoothing import ema

#: Share of a decoding step's time a step may add by feeding chunks. A forward's cost climbs
#: in steps on a CPU (llama.cpp's GEMM takes rows in groups of 4: 1 token 101 ms, +1 chunk
#: token 149, +4 199, +8 319 on the Xeon at 1,000 tokens of context), so the controller
#: hovers around its goal by a step: 0.5 keeps a stream's gaps under 3x (measured:
#: benchmarks/results/prefill-stall-*.md).
PREFILL_SHARE = 0.5
FIRST_CHUNK = 4  # tokens per step at first, per model
STARVE_STEPS = 8  # steps without a decoding forward on a model before its chunks run alone
ALPHA = 0.3
WAIT = -1  # a forward that neither runs nor feeds a chunk this step


@dataclass
class _Model:
    size: int = FIRST_CHUNK
    plain: float | None = None  # EMA: seconds of this model's calls without chunks
    last_whole: int = 0  # the last step with a decoding forward on it (or when it was first seen)


class ChunkedPrefill:
    """The policy of one scheduler (one thread)."""

    def __init__(self, share: float = PREFILL_SHARE) -> None:
        if not share > 0:
            raise InvalidParameterError(f"prefill_share must be > 0 (or None: no chunks), got {share}")
        self.share = share
        self._models: dict[Hashable, _Model] = {}
        self._step = 0
        self._step_seconds: float | None = None  # EMA: seconds of steps without chunks
        self._chunked_step = False
        self._long_whole: set[Hashable] = set()
        #: Calls that fed chunks so far, and the tokens of those chunks (plain counters).
        self.calls = self.tokens = 0

    def size(self, model: Hashable) -> int:
        """Tokens one step feeds in chunks to this model."""
        return self._model(model).size

    def plan(self, heads: Sequence[tuple[Hashable, int]]) -> list[int]:
        """Per forward of the step, (its model, its head): 0 to run it whole, n > 0 to feed
        n tokens of its head as a chunk, WAIT to leave it for a later step. Chunks are
        handed out in the given order (admission) until the model's size is spent."""
        self._step += 1
        self._chunked_step = False
        long = [head > self.size(m) for m, head in heads]  # a long head: more than a chunk to feed
        #: Models running a long head whole this step: their call says nothing of a decoding step.
        self._long_whole = {m for (m, _), is_long in zip(heads, long) if is_long}
        decoding = {m for (m, _), is_long in zip(heads, long) if not is_long}
        n_long = sum(long)
        if n_long > len(heads) - n_long:
            return [0] * len(heads)  # nobody decodes, or more prompts than streams: all whole
        self._long_whole = set()
        for m in decoding:
            self._model(m).last_whole = self._step
        left = {m: self.size(m) for m, _ in heads}
        out = []
        for (m, head), is_long in zip(heads, long):
            if not is_long:
                out.append(0)
            elif left[m] > 0 and (m in decoding or self._step - self._model(m).last_whole > STARVE_STEPS):
                take = min(left[m], head)
                left[m] -= take
                out.append(take)
                self._chunked_step = True
            else:
                out.append(WAIT)
        return out

    def timed(self, model: Hashable, seconds: float, whole: int, chunk_tokens: int) -> None:
        """One call of the step: `whole` forwards run whole, `chunk_tokens` fed in chunks."""
        state = self._model(model)
        if chunk_tokens:
            self.calls, self.tokens = self.calls + 1, self.tokens + chunk_tokens
        else:
            if model not in self._long_whole:  # a prompt fed whole is no decoding step
                state.plain = ema(state.plain, seconds, ALPHA)
            return
        if chunk_tokens < state.size or seconds <= 0:
            return  # a last remainder says nothing about the size
        goal = (1 + self.share) * state.plain if whole and state.plain else \
            self.share * self._step_seconds if not whole and self._step_seconds else None
        if goal is not None:  # damped (half the correction in log terms): a call's time jitters
            scaled = state.size * min(2.0, max(0.5, (goal / seconds) ** 0.5))
            # Rounded away from the current size: a small chunk still moves by the one token it needs.
            state.size = max(1, math.ceil(scaled) if scaled > state.size else math.floor(scaled))

    def step_done(self, seconds: float) -> None:
        """The step's calls took `seconds` in all."""
        if not (self._chunked_step or self._long_whole):  # a decoding step, no prompt fed whole
            self._step_seconds = ema(self._step_seconds, seconds, ALPHA)

    def _model(self, model: Hashable) -> _Model:
        if model not in self._models:  # its wait for a decoding forward starts now
            self._models[model] = _Model(last_whole=self._step)
        return self._models[model]

"""Chunked prefill: which forwards of a batch step run whole, which feed only a chunk of
their prompt, and how large a chunk is.

A forward's head is what it feeds without logits. A prompt's forward (one that feeds part of
its sequence's prompt: the target's in the request's first cycle, a draft model's the first
time it drafts for the request, a cycle or more later) is chunked: while some forward
decodes, a prompt forward whose head does not fit a chunk is fed one chunk per step and runs
whole once what is left fits; with nobody decoding everything runs whole (a lone request is
not slowed). A stream's forwards (their model holds the whole prompt) always run whole, a
draft model's catch-up of the generated text it missed included: it is part of the stream's
own cycle, which its router priced, as a verification of many rows is (rows that want logits
are never split: a 64-token copy is verified in one call). Chunking it would lengthen that
very cycle by as many steps, and counting it as a prompt would make the prompt beside it
look like a burst, to be fed whole.

Chunks protect the majority: when more of a step's forwards are long prompt heads than are
not (W > D, counted over all models: a burst of prompts beside a few streams), every
forward runs whole, as if nobody decoded; the D streams stall for the W prefills, as they
would have had they arrived together. Protecting them would cost the W prompts far more: a
chunk that keeps a stream's call within 1 + share of its own is a few tokens, which a
forward's fixed cost makes about twice as dear per token on a CPU as a whole prompt, so a
burst would enter the batch one prompt at a time while the few streams gain little from
batching (docs/serving.md, "Chunked prefill"). A batch thus takes the same course whether its
prompts arrive within one step or a few apart. One prompt beside one or more streams is chunked.

Where a chunk runs: in the same call as the step's decoding forwards of its model (one
forward: its fixed cost, most of a token's on a CPU, is paid once). A model that no
decoding sequence used for STARVE_STEPS steps (a prompt's draft model while every other
request runs the target alone) takes its chunk in a call of its own, so nothing waits
forever; such a call is sized to take about `share` of a step (an EMA of steps without
chunks).

The bound is per decoding cycle, the gap a stream's client sees between two deltas. A
cycle is a run of steps: under speculation its draft forwards, its target's verification of
k + 1 rows (a model-free lookup calls no model), and the steps it waits through while
another sequence's model is called; a chunk may ride in any of those calls. So the budget
is kept per call: a call with a chunk takes about 1 + share times what the same call takes
without one. A step then takes about 1 + share times its calls without chunks, and a cycle,
a sum of steps, about 1 + share times as long while a prompt is fed, whatever its chain (the
target alone, a drafting chain, a router switching between them), instead of stalling for
the whole prefill (seconds to minutes on a CPU); the prompt is fed with the rest of the
machine's time.

"The same call" is the model and the tokens its decoding forwards feed (the call's shape: a
token of the target alone, a verification of k + 1 rows, several streams' rows together),
not the model's average call. A router's chains put calls of several shapes on one model: a
chunk sized on their average takes a cheaper shape's call to 1 + share x average / own
(after a router's switch to the target alone, the average is that of the verifications
before the prompt came: more than twice a 1-token call on a CPU). So each shape of a model
has its own chunk size and its own time without chunks (an EMA of that shape's calls; a call
that feeds a prompt whole is not one). A shape its model was never timed at runs once
without a chunk, to be timed, and starts from the size of its model's next smaller shape
(whose goal is lower: small is safe), else FIRST_CHUNK (so does every shape of a model never
timed: nothing to compare with).

How large (a controller on measured time, no cost model): after each full chunk, the size
takes half the correction towards its goal (in log terms: a call's time jitters, so a full
correction overshoots), rounded away from the current size, by at most 2x either way.
A chunk changes how a cache is filled, never what it holds.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from specrouter.errors import InvalidParameterError
from specrouter.smoothing import ema

#: Share of a decoding call's time a chunk riding in it may add (so of a step's, and of a
#: stream's cycle's). A forward's cost climbs in steps on a CPU (llama.cpp's GEMM takes rows
#: in groups of 4, and each step is a good part of a one-token forward), so the controller
#: hovers around its goal by a step: 0.5 aims a stream's largest gap at under 3x its median
#: gap (benchmarks/results/prefill-stall-*).
PREFILL_SHARE = 0.5
#: Tokens per step at first, per model: the least, since one row more can double a small call
#: on a CPU; the controller grows it at most 2x a call where the calls allow more.
FIRST_CHUNK = 1
STARVE_STEPS = 8  # steps without a decoding forward on a model before its chunks run alone
ALPHA = 0.3  # weight of a new timing in the EMAs of calls and steps without chunks
WAIT = -1  # a forward that neither runs nor feeds a chunk this step
ALONE = 0  # the shape of a call that feeds chunks only


class Forward(NamedTuple):
    """One pending forward of a step, as the policy sees it."""

    model: Hashable
    head: int  # tokens it feeds before the rows it wants logits of
    logits: int = 1  # the rows it wants logits of
    #: Its model holds its sequence's whole prompt: a stream's forward, always run whole.
    stream: bool = False

    @property
    def tokens(self) -> int:
        """What it feeds when it runs whole."""
        return self.head + self.logits


@dataclass
class _Shape:
    """A model's calls whose decoding forwards feed a given number of tokens."""

    size: int  # chunk tokens such a call feeds
    plain: float | None = None  # EMA: seconds of such calls without chunks


@dataclass
class _Model:
    shapes: dict[int, _Shape] = field(default_factory=dict)  # by their decoding tokens (ALONE: none)
    last_whole: int = 0  # the last step with a decoding forward on it (or when it was first seen)

    def timed(self, tokens: int) -> bool:
        shape = self.shapes.get(tokens)
        return shape is not None and shape.plain is not None

    def ever_timed(self) -> bool:
        return any(self.timed(n) for n in self.shapes if n != ALONE)

    def first_size(self, tokens: int) -> int:
        """A new shape's size: that of the next smaller shape timed, else FIRST_CHUNK."""
        smaller = [n for n in self.shapes if ALONE < n < tokens and self.timed(n)]
        return self.shapes[max(smaller)].size if tokens != ALONE and smaller else FIRST_CHUNK

    def shape(self, tokens: int) -> _Shape:
        if tokens not in self.shapes:
            self.shapes[tokens] = _Shape(self.first_size(tokens))
        return self.shapes[tokens]


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
        #: This step, per model: the tokens its forwards that run whole feed (its call's shape).
        self._whole: dict[Hashable, int] = {}
        #: Calls that fed chunks so far, and the tokens of those chunks (plain counters).
        self.calls = self.tokens = 0

    def size(self, model: Hashable, tokens: int | None = None) -> int:
        """Tokens a step feeds in chunks to this model, in a call whose decoding forwards feed
        `tokens` (ALONE: a call of chunks only); None: the most over the shapes it has."""
        state = self._model(model)
        if tokens is None:
            return max((s.size for s in state.shapes.values()), default=FIRST_CHUNK)
        return state.shapes[tokens].size if tokens in state.shapes else state.first_size(tokens)

    def plan(self, forwards: Sequence[Forward | tuple[Hashable, int]]) -> list[int]:
        """Per forward of the step (a Forward; a (model, head) pair is a prompt's, wanting one
        row): 0 to run it whole, n > 0 to feed n tokens of its head as a chunk, WAIT to leave
        it for a later step. Chunks are handed out in the given order (admission) until the
        model's size is spent."""
        forwards = [Forward(*f) for f in forwards]
        self._step += 1
        self._chunked_step = False
        streams: Counter[Hashable] = Counter()
        for f in forwards:
            streams[f.model] += f.tokens if f.stream else 0
        # A long head: a prompt's, that does not fit a chunk beside the streams' forwards.
        long = [not f.stream and f.head > self.size(f.model, streams[f.model]) for f in forwards]
        n_long = sum(long)
        burst = n_long > len(forwards) - n_long  # nobody decodes, or more prompts than streams: all whole
        whole: Counter[Hashable] = Counter()
        for f, is_long in zip(forwards, long):
            whole[f.model] += f.tokens if burst or not is_long else 0
        self._whole = {m: n for m, n in whole.items() if n}
        #: Models running a long head whole this step: their call says nothing of a decoding step.
        self._long_whole = {f.model for f, is_long in zip(forwards, long) if is_long} if burst else set()
        if burst:
            return [0] * len(forwards)
        for m in self._whole:
            self._model(m).last_whole = self._step
        left = {f.model: self._budget(f.model) for f, is_long in zip(forwards, long) if is_long}
        out = []
        for f, is_long in zip(forwards, long):
            if not is_long:
                out.append(0)
            elif left[f.model] > 0:
                take = min(left[f.model], f.head)
                left[f.model] -= take
                out.append(take)
                self._chunked_step = True
            else:
                out.append(WAIT)
        return out

    def _budget(self, model: Hashable) -> int:
        """Chunk tokens the model may take this step: its shape's size beside decoding
        forwards (none at a shape not timed yet, once: this step times it), its size alone
        once starved, else none."""
        state, tokens = self._model(model), self._whole.get(model, ALONE)
        if tokens == ALONE:
            return self.size(model, ALONE) if self._step - state.last_whole > STARVE_STEPS else 0
        return self.size(model, tokens) if state.timed(tokens) or not state.ever_timed() else 0

    def timed(self, model: Hashable, seconds: float, whole: int, chunk_tokens: int) -> None:
        """One call of the step planned last: `whole` forwards run whole, `chunk_tokens` fed in chunks."""
        state = self._model(model)
        if not chunk_tokens:
            if whole and model not in self._long_whole:  # a prompt fed whole is no decoding step
                shape = state.shape(self._whole.get(model, ALONE))
                shape.plain = ema(shape.plain, seconds, ALPHA)
            return
        self.calls, self.tokens = self.calls + 1, self.tokens + chunk_tokens
        shape = state.shape(self._whole.get(model, ALONE) if whole else ALONE)
        if chunk_tokens < shape.size or seconds <= 0:
            return  # a last remainder says nothing about the size
        goal = (1 + self.share) * shape.plain if whole and shape.plain else \
            self.share * self._step_seconds if not whole and self._step_seconds else None
        if goal is not None:  # damped (half the correction in log terms): a call's time jitters
            scaled = shape.size * min(2.0, max(0.5, (goal / seconds) ** 0.5))
            # Rounded away from the current size: a small chunk still moves by the one token it needs.
            shape.size = max(1, math.ceil(scaled) if scaled > shape.size else math.floor(scaled))

    def step_done(self, seconds: float) -> None:
        """The step's calls took `seconds` in all."""
        if not (self._chunked_step or self._long_whole):  # a decoding step, no prompt fed whole
            self._step_seconds = ema(self._step_seconds, seconds, ALPHA)

    def _model(self, model: Hashable) -> _Model:
        if model not in self._models:  # its wait for a decoding forward starts now
            self._models[model] = _Model(last_whole=self._step)
        return self._models[model]

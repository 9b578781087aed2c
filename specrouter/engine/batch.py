"""Many requests advancing together: the scheduler the server runs in its worker thread.

Interface (stable for the server): add() a request under an id, cancel() it, and call
step() in a loop; every step returns the events it produced (text deltas, finished
results, failures). Requests join and leave between steps (continuous batching); a
finished or cancelled request releases its KV slots at once.

Choices of one request (n > 1) share the prompt's KV: a choice after the first waits until
the first has run a cycle, then takes every model's cache of the prompt from it
(SequenceState.adopt: llama.cpp shares the cells, torch copies the tensors) instead of
prefilling it again (at the end of that cycle, before the first may finish and free them;
and on its first forward of a model the first used later, while the first is live).

Prefix cache (prefix_cache.py, when given one): a finished request's caches are kept, and a
request admitted later takes from those of its partition (SeqRequest.cache_partition) the
longest prefix of its prompt they hold (a chat's earlier turns, a shared system prompt)
before its first cycle, so the router prices its
models with what they already hold and the first forwards feed only the rest.

Chunked prefill (prefill.py): while some sequence decodes, a prompt's forward that must
first feed a long head is fed in chunks across steps, riding in its model's call with the
decoding forwards, so no prompt stalls the running streams (unless the prompts outnumber
them: then all run whole); a sequence that has committed a cycle is a stream, whose
forwards (a draft model's catch-up included) run whole.

Not thread-safe: one thread owns a scheduler and every backend it uses.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from specrouter.cascade.chain import EvalRequest, execute
from specrouter.engine.phase import InPhase, StepModels
from specrouter.engine.prefill import PREFILL_SHARE, ChunkedPrefill, Forward
from specrouter.engine.prefix_cache import PrefixCache
from specrouter.engine.requests import Delta, Event, Failed, Finished, Planner, SeqRequest
from specrouter.engine.request import SequenceRun
from specrouter.engine.speculation import Speculation
from specrouter.errors import InvalidParameterError
from specrouter.metrics import SpecStats

#: The scheduler and the types it takes and gives (requests.py); Speculation for its callers.
__all__ = ["BatchScheduler", "Delta", "Event", "Failed", "Finished", "KvUse", "Planner", "SeqRequest", "Speculation"]


@dataclass
class _Active:
    run: SequenceRun
    cache_partition: str = ""  # its request's (SeqRequest.cache_partition)
    reproducible: bool = False  # its request's (SeqRequest.reproducible)
    steps: Generator[EvalRequest, np.ndarray, list[int]] | None = None  # the cycle in progress
    pending: EvalRequest | None = None  # the forward it waits for
    reported: int = 0  # tokens counted in Deltas so far
    waited: int = 0  # steps its pending forward has waited beyond the step it was due
    counted: SpecStats = field(default_factory=SpecStats)  # its level counts as last taken

    def spec_counts(self) -> SpecStats:
        """What its level counts added since the last call."""
        added, self.counted = self.run.stats.since(self.counted), self.run.stats.copy()
        return added

    def delta(self, rid: str, text: str, final: bool = False) -> Delta:
        tokens, self.reported = len(self.run.generated) - self.reported, len(self.run.generated)
        return Delta(rid, text, tokens, self.run.take_logprobs(final))


@dataclass
class KvUse:
    """One model's KV cache: sequences holding cells in it, and the tokens they hold."""

    sequences: int = 0
    tokens: int = 0


class _Call(NamedTuple):
    """One sequence's part of a step's call: its pending forward, or a chunk of it."""

    rid: str
    active: _Active
    request: EvalRequest
    chunk: int = 0  # tokens it feeds as a chunk (0: the whole forward)


class BatchScheduler:
    """Advances every active sequence cycle by cycle; one step serves, per model it calls,
    the forwards that all sequences wait for in ONE decode_batch call. Which models a step
    calls is `phases`' choice (phase.py): by default the one most sequences wait on, so a
    batch's sequences draft together and verify together, and any model whose sequences
    have already waited a step (a sequence that drafts and one that verifies are then
    served in the same step).

    A model that raises (or answers slower than `stall_seconds`, when set) is taken out
    of the chains of the requests it served in that call, and those requests go on
    without it: their current cycle is dropped (nothing of it was committed) and rerun.
    A failing target fails only the requests it served."""

    def __init__(self, plan: Planner, max_batch: int = 8, stall_seconds: float | None = None,
                 clock: Callable[[], float] = time.perf_counter, prefill_share: float | None = PREFILL_SHARE,
                 phases: StepModels | None = None, prefix_cache: PrefixCache | None = None) -> None:
        """prefill_share: the share of a decoding step a step may add by feeding chunks of
        long prompts (prefill.py; None: every forward runs whole); phases: which models a
        step calls (phase.py; default InPhase(): the one most sequences wait on, and any
        whose sequences have waited a step); prefix_cache: where finished requests' caches
        are kept for later prompts that begin the same way (None: none; its models need
        its capacity in sequence slots beyond max_batch)."""
        if max_batch < 1:
            raise InvalidParameterError(f"max_batch must be >= 1, got {max_batch}")
        self.plan, self.max_batch, self.stall_seconds, self.clock = plan, max_batch, stall_seconds, clock
        self.phases = phases if phases is not None else InPhase()
        #: The chunked-prefill policy (None: none).
        self.prefill = ChunkedPrefill(prefill_share) if prefill_share is not None else None
        self.prefix_cache = prefix_cache if prefix_cache is not None else PrefixCache(0)
        self._waiting: deque[tuple[str, _Active]] = deque()  # not yet admitted
        self._active: dict[str, _Active] = {}
        #: Sequences that wait for another's first cycle to take its prompt's KV: id -> donor's id.
        self._after: dict[str, str] = {}
        #: Per model name, how many of its calls served B sequences: {B: calls} (bounded, for long runs).
        self.batch_sizes: dict[str, Counter[int]] = {}
        #: Per level, what the requests' counts added since take_spec_counts last ran.
        self._spec = SpecStats()

    @property
    def n_active(self) -> int:
        return len(self._active)

    @property
    def n_waiting(self) -> int:
        return len(self._waiting)

    def kv_use(self) -> dict[str, KvUse]:
        """Per model, the sequences holding KV cells in it and the tokens those hold (active
        requests and those the prefix cache keeps: a waiting one holds none)."""
        use: dict[str, KvUse] = {}
        for state in [*(a.run.state for a in self._active.values()), *self.prefix_cache.kept()]:
            for name, tokens in state.kv_tokens().items():
                u = use.setdefault(name, KvUse())
                u.sequences, u.tokens = u.sequences + 1, u.tokens + tokens
        return use

    def take_spec_counts(self) -> SpecStats:
        """Per level, what every request's counts (drafts, proposed and accepted tokens per
        position, forwards) added since the last call: live speculation metrics, cycle by cycle."""
        out, self._spec = self._spec, SpecStats()
        return out

    def _count(self, a: _Active) -> None:
        self._spec = self._spec + a.spec_counts()

    def add(self, request_id: str, request: SeqRequest) -> None:
        """Queue a request; bad input raises here (SpecRouterError), before anything runs."""
        if request_id in self._active or any(r == request_id for r, _ in self._waiting):
            raise InvalidParameterError(f"request id {request_id!r} is already in use")
        run = SequenceRun(self.plan(request), request.prompt_tokens, request.params, request.max_tokens,
                          request.stop, request.rng(), clock=self.clock,
                          logprobs=request.logprobs)
        donor = self._run_of(request.shares_prompt_with) if request.shares_prompt_with is not None else None
        if donor is not None and donor.context[: donor.prompt_tokens] == list(request.prompt_tokens):
            run.state.donor = donor.state
            self._after[request_id] = request.shares_prompt_with
        self._waiting.append((request_id, _Active(run, request.cache_partition, request.reproducible)))

    def _run_of(self, request_id: str) -> SequenceRun | None:
        if request_id in self._active:
            return self._active[request_id].run
        return next((a.run for rid, a in self._waiting if rid == request_id), None)

    def _holds(self, request_id: str) -> bool:
        """Whether a sequence still waits for its donor's first cycle (the donor is live and
        has not finished one); once not, it never waits again."""
        donor = self._after.get(request_id)
        if donor is None:
            return False
        run = self._run_of(donor)
        if run is not None and run.cycles == 0:
            return True
        del self._after[request_id]
        return False

    def cancel(self, request_id: str) -> bool:
        """Drop a request (waiting or active) and free its KV slots at once; False if unknown."""
        for item in list(self._waiting):
            if item[0] == request_id:
                self._waiting.remove(item)
                item[1].run.release()
                self._after.pop(request_id, None)
                return True
        active = self._active.pop(request_id, None)
        self._after.pop(request_id, None)
        if active is None:
            return False
        if active.steps is not None:
            active.steps.close()
        active.run.release()
        self._count(active)
        return True

    def step(self) -> list[Event]:
        """Admit waiting requests, start cycles, then serve each model's pending forwards."""
        events: list[Event] = []
        while self._waiting and len(self._active) < self.max_batch:
            rid, a = self._waiting.popleft()
            self._active[rid] = a
            try:
                if not a.reproducible:
                    self.prefix_cache.resume(a.run.state, a.run.context, a.run.target.name, a.cache_partition)
                elif len(self._active) == 1:  # a reproducible request prefills afresh, its cells where a
                    self.prefix_cache.save_shared()  # fresh server's would lie: the same numbers each time
            except Exception as exc:  # noqa: BLE001 - a model failed sharing its cells: this request fails alone
                self._fail(rid, self._active[rid], exc, events)
        for rid, a in list(self._active.items()):
            if a.steps is None and not self._holds(rid):
                self._start_cycle(rid, a, events)
        for a in self._active.values():
            if a.pending is not None:  # a choice's first forward on a model takes the prompt's KV from its donor
                a.run.state.adopt(a.pending.backend, a.pending.tokens)
        calls = self._called(self._split([(rid, a) for rid, a in self._active.items() if a.pending is not None]))
        seconds = sum(self._serve(group, events) for group in _by_backend(calls))
        if self.prefill is not None:
            self.prefill.step_done(seconds)
        return events

    def _called(self, calls: list[_Call]) -> list[_Call]:
        """The step's calls of the models it calls (self.phases); the others wait. After the
        prefill's split: a chunk rides with its model's decoding forwards, so it waits with them."""
        waits: dict[int, list[int]] = {}
        for c in calls:
            waits.setdefault(id(c.request.backend), []).append(c.active.waited)
        called = self.phases.pick(waits)
        for c in calls:
            if id(c.request.backend) not in called:
                c.active.waited += 1
        return [c for c in calls if id(c.request.backend) in called]

    def _split(self, pending: list[tuple[str, _Active]]) -> list[_Call]:
        """The step's calls: the forwards run whole, and chunks of those the prefill policy
        feeds in parts (prefill.py); a forward it leaves waiting is not called this step."""
        calls = [_Call(rid, a, a.pending) for rid, a in pending]
        if self.prefill is None:
            return calls
        heads = [a.run.state.to_feed(r.backend, r.tokens, r.n_logits) - r.n_logits for _, a, r, _ in calls]
        # A stream's forward: its model holds the whole prompt (what it feeds is generated text).
        forwards = [Forward(id(c.request.backend), h, c.request.n_logits,
                            stream=len(c.request.tokens) - h - c.request.n_logits >= c.active.run.prompt_tokens)
                    for c, h in zip(calls, heads)]
        out = []
        for call, head, take in zip(calls, heads, self.prefill.plan(forwards)):
            if take == 0:
                out.append(call)
            elif take > 0:
                r = call.request
                # The cache holds all but the last head + n_logits tokens: feed `take` more.
                end = len(r.tokens) - head - r.n_logits + take
                out.append(_Call(call.rid, call.active, EvalRequest(r.level, r.backend, r.tokens[:end], 1), take))
        return out

    def close(self) -> None:
        for rid in list(self._active):
            self.cancel(rid)
        for _, a in self._waiting:
            a.run.release()
        self._waiting.clear()
        self.prefix_cache.clear()

    # ------------------------------------------------------------------------------
    def _start_cycle(self, rid: str, a: _Active, events: list[Event]) -> None:
        try:
            runner = a.run.start_cycle(batch_size=self._decoding(a))
            if runner is None:
                self._finish(rid, a, events)
                return
            a.steps = runner.steps(a.run.context, a.run.room)
            a.pending, a.waited = next(a.steps), 0
        except StopIteration as done:  # a cycle without a forward (cannot happen: the target runs)
            self._end_cycle(rid, a, done.value, events)
        except Exception as exc:  # noqa: BLE001 - the request fails, the others go on
            self._fail(rid, a, exc, events)

    def _decoding(self, a: _Active) -> int:
        """The sequences whose cycles advance together with `a`'s (its router prices every
        forward for that many): the streams, past their first cycle, and `a` itself. A
        prompt being prefilled is not one: its chunks add at most the prefill share to a
        stream's calls (prefill.py), not a sequence's forwards."""
        return sum(1 for b in self._active.values() if b.run.cycles > 0 or b is a)

    def _serve(self, group: list[_Call], events: list[Event]) -> float:
        """One call of one backend; its seconds. A chunk's logits row is dropped (its
        request stays pending: the next steps feed the rest)."""
        backend = group[0].request.backend
        try:
            outputs = execute([(c.active.run.state, c.request) for c in group], self.clock)
        except Exception as exc:  # noqa: BLE001 - isolated to the requests of this call
            for c in group:
                self._model_failed(c.rid, c.active, backend, exc, events)
            return 0.0
        self.batch_sizes.setdefault(backend.name, Counter())[len(group)] += 1
        seconds = group[0].request.seconds
        if self.stall_seconds is not None and seconds > self.stall_seconds and backend is not group[0].active.run.target:
            for c in group:  # a cycle waiting on it again would stall again: rerun it without it
                self._drop(c.active, backend)
            return seconds
        if self.prefill is not None:
            self.prefill.timed(id(backend), seconds, sum(not c.chunk for c in group), sum(c.chunk for c in group))
        for (rid, a, request, chunk), logits in zip(group, outputs):
            a.waited = 0  # its model was called (a chunk too: a prompt fed in parts is on its way)
            if chunk:
                continue
            try:
                try:
                    a.pending = a.steps.send(logits)
                except StopIteration as done:
                    self._end_cycle(rid, a, done.value, events)
            except Exception as exc:  # noqa: BLE001 - its own failure (a cycle's or a commit's) fails it alone
                self._fail(rid, a, exc, events)
        return seconds

    def _end_cycle(self, rid: str, a: _Active, new: list[int], events: list[Event]) -> None:
        a.steps = a.pending = None
        delta = a.run.end_cycle(new)
        if a.run.cycles == 1:  # the sequences waiting for its prompt's KV take it now
            for waiting in (self._run_of(w) for w, donor in self._after.items() if donor == rid):
                if waiting is not None:
                    waiting.state.adopt_all(waiting.context)
        self._count(a)
        if delta:
            events.append(a.delta(rid, delta))
        if a.run.finished or a.run.room <= 0:
            self._finish(rid, a, events)

    def _finish(self, rid: str, a: _Active, events: list[Event]) -> None:
        del self._active[rid]
        a.run.release(lambda state: self.prefix_cache.keep(state, a.cache_partition))
        delta, result = a.run.result()
        last = a.delta(rid, delta, final=True)
        if last.text or last.logprobs:
            events.append(last)
        events.append(Finished(rid, result))

    def _fail(self, rid: str, a: _Active, exc: Exception, events: list[Event]) -> None:
        self._active.pop(rid, None)
        if a.steps is not None:
            a.steps.close()
        a.run.release()
        self._count(a)
        events.append(Failed(rid, exc))

    def _model_failed(self, rid: str, a: _Active, backend, exc: Exception, events: list[Event]) -> None:
        """Its cache for this model is unknown now: the target fails the request, a draft is dropped."""
        if backend is a.run.target:
            a.run.state.forget(backend)  # before release(), which would ask the broken model to free it
            self._fail(rid, a, exc, events)
            return
        self._drop(a, backend)

    @staticmethod
    def _drop(a: _Active, backend) -> None:
        """Free this model's slot, abandon the cycle in progress (nothing of it is committed:
        the other models roll back) and go on without the model."""
        a.run.state.forget(backend)
        a.steps.close()
        a.steps = a.pending = None
        a.run.abandon_cycle()
        a.run.drop_model(backend.name)


def _by_backend(calls: list[_Call]) -> list[list[_Call]]:
    """The calls grouped per backend (one decode_batch call each), in first-seen order;
    in a group the whole forwards come first (the first request reports the call's cost)."""
    groups: dict[int, list[_Call]] = {}
    for call in sorted(calls, key=lambda c: c.chunk > 0):
        groups.setdefault(id(call.request.backend), []).append(call)
    return list(groups.values())

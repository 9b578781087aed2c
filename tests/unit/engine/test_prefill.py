"""The chunked-prefill policy (engine/prefill.py) on its own: which forwards run whole, which
feed a chunk, and how the chunk size follows the measured times; and in a batch scheduler:
the time chunks add to a decoding stream's cycles, whatever its chain."""

import numpy as np
import pytest

from specrouter.backends.synthetic import SyntheticBackend
from specrouter.cascade.chain import Chain
from specrouter.cascade.sampling import SamplingParams
from specrouter.engine import generate
from specrouter.engine.batch import BatchScheduler, Delta, Finished, SeqRequest
from specrouter.engine.prefill import FIRST_CHUNK, STARVE_STEPS, WAIT, ChunkedPrefill, Forward
from specrouter.errors import InvalidParameterError

from ..router_synth import ScriptedRouter, linear, simulated_clock

T, D = "target", "draft"


def test_with_nobody_decoding_everything_runs_whole():
    policy = ChunkedPrefill()
    assert policy.plan([(T, 4000), (T, 300)]) == [0, 0]


def test_long_heads_share_their_models_chunk_in_admission_order_while_another_decodes():
    policy = ChunkedPrefill()
    # Two decode (head 0); two prompts: the first takes the whole chunk, the second waits.
    assert policy.plan([(T, 0), (T, 500), (T, 0), (T, 700)]) == [0, FIRST_CHUNK, 0, WAIT]
    # A head that fits a chunk runs whole (it is decoding, or nearly done).
    assert policy.plan([(T, 0), (T, FIRST_CHUNK)]) == [0, 0]


def test_more_long_heads_than_decoders_run_whole_and_say_nothing_of_a_decoding_step():
    """A burst of prompts beside fewer streams is prefilled whole (the streams stall for it),
    and that call's time does not enter the decoding calls' average the chunks are sized on."""
    policy = ChunkedPrefill(share=1.0)
    policy.plan([(T, 0)])
    policy.timed(T, 0.010, whole=1, chunk_tokens=0)
    policy.step_done(0.010)
    assert policy.plan([(T, 0), (T, 500), (D, 700)]) == [0, 0, 0]  # counted over all models
    policy.timed(T, 5.0, whole=2, chunk_tokens=0)
    policy.timed(D, 1.0, whole=1, chunk_tokens=0)
    policy.step_done(6.0)
    # As many prompts as streams: chunked again, sized on the 10 ms calls (goal 20 ms: a 1-token
    # chunk taking 11 ms grows to ceil(1 x sqrt(20 / 11)) = 2, a 2-token one taking 12 ms to
    # ceil(2 x sqrt(20 / 12)) = 3; on a 5 s average each would double).
    assert FIRST_CHUNK == 1
    assert policy.plan([(T, 0), (T, 500)]) == [0, 1] and policy.calls == 0
    policy.timed(T, 0.011, whole=1, chunk_tokens=1)
    assert policy.plan([(T, 0), (T, 500)]) == [0, 2]
    policy.timed(T, 0.012, whole=1, chunk_tokens=2)
    assert policy.size(T) == 3


def test_a_model_no_decoder_uses_gets_chunks_only_after_starve_steps():
    """The draft's catch-up of a prompt while every other request runs the target alone: it
    waits for a decoding forward on its model to ride with, and after STARVE_STEPS steps
    without one it is fed in calls of its own (nothing waits forever)."""
    policy = ChunkedPrefill()
    plans = [policy.plan([(T, 0), (D, 900)])[1] for _ in range(STARVE_STEPS + 2)]
    assert plans[:STARVE_STEPS] == [WAIT] * STARVE_STEPS and plans[-1] == FIRST_CHUNK


def test_the_chunk_grows_until_a_step_with_it_takes_about_one_plus_share_steps_without():
    """A model whose call costs 10 ms + 1 ms per chunk token: at share 1 the call with a chunk
    should take 20 ms, so the chunk settles at 10 tokens (damped steps, at most 2x each)."""
    policy = ChunkedPrefill(share=1.0)
    for _ in range(3):
        policy.plan([(T, 0)])
        policy.timed(T, 0.010, whole=1, chunk_tokens=0)
        policy.step_done(0.010)
    sizes = []
    for _ in range(30):
        take = policy.plan([(T, 0), (T, 10_000)])[1]
        policy.timed(T, 0.010 + 0.001 * take, whole=1, chunk_tokens=take)
        policy.step_done(0.010 + 0.001 * take)
        sizes.append(take)
    assert sizes[0] == FIRST_CHUNK and all(b <= 2 * a for a, b in zip(sizes, sizes[1:]))
    assert sizes[-5:] == [10] * 5 and policy.calls == 30 and policy.tokens == sum(sizes)


def test_the_share_must_be_positive():
    with pytest.raises(InvalidParameterError, match="prefill_share must be > 0"):
        ChunkedPrefill(share=0)


def test_a_streams_forwards_run_whole_and_a_prompt_beside_them_is_chunked():
    """A stream's draft model catching up on 8 tokens it missed (more than a chunk) is the
    stream's own cycle: it runs whole, counts as decoding (so the prompt beside it is no
    burst) and carries the prompt's chunk in its call."""
    policy = ChunkedPrefill()
    assert policy.plan([Forward(D, 8, 1, stream=True), Forward(D, 900), Forward(T, 0, 1, stream=True)]) == \
        [0, FIRST_CHUNK, 0]
    # Without a stream beside it, the same head is a prompt's: nobody decodes, all run whole.
    assert policy.plan([Forward(D, 8), Forward(D, 900)]) == [0, 0]


def _timed_at(policy: ChunkedPrefill, rows: int, seconds: float) -> None:
    policy.plan([Forward(T, 0, rows, stream=True)])
    policy.timed(T, seconds, whole=1, chunk_tokens=0)
    policy.step_done(seconds)


def test_a_call_shape_never_timed_runs_once_without_a_chunk_then_starts_from_the_next_smaller():
    """A verification of 4 rows after only 1-token calls were timed: its first call carries no
    chunk (it is timed), the next one the 1-token calls' size (a smaller shape's, a lower goal)."""
    policy = ChunkedPrefill(share=1.0)
    _timed_at(policy, 1, 0.012)
    prompt = Forward(T, 10_000)
    policy.plan([Forward(T, 0, 1, stream=True), prompt])
    policy.timed(T, 0.020, whole=1, chunk_tokens=FIRST_CHUNK)  # goal 24 ms: grows to ceil(1 x sqrt(24 / 20)) = 2
    assert policy.plan([Forward(T, 0, 4, stream=True), prompt]) == [0, WAIT]
    policy.timed(T, 0.018, whole=1, chunk_tokens=0)
    assert policy.plan([Forward(T, 0, 4, stream=True), prompt]) == [0, 2]
    assert policy.size(T, 1) == policy.size(T, 4) == policy.size(T) == 2


def test_each_call_shape_takes_a_chunk_sized_on_its_own_time_without_one():
    """A stream whose cycles alternate between a 1-token call of the target alone (12 ms: 10 ms
    + 2 ms a token) and a verification of 4 rows (18 ms), as a router's chains do: at share 1
    each call with its chunk settles at twice its own time, give or take a token (a size moves
    by one at least), so the 1-token calls take 6 chunk tokens and the verifications 9. One
    size sized on the two shapes' average (15 ms) would give the 1-token calls 2.5x their time."""
    policy = ChunkedPrefill(share=1.0)
    _timed_at(policy, 1, 0.012)
    _timed_at(policy, 4, 0.018)
    ratios = {1: [], 4: []}
    for step in range(60):
        rows = 1 if step % 2 else 4
        take = policy.plan([Forward(T, 0, rows, stream=True), Forward(T, 10_000)])[1]
        seconds = 0.010 + 0.002 * (rows + take)
        policy.timed(T, seconds, whole=1, chunk_tokens=take)
        policy.step_done(seconds)
        ratios[rows].append(seconds / (0.010 + 0.002 * rows))
    assert policy.size(T, 1) in (5, 6, 7) and policy.size(T, 4) in (8, 9, 10)
    assert max(ratios[1][-20:]) <= 2 + 0.002 / 0.012 + 1e-9 and max(ratios[4][-20:]) <= 2 + 0.002 / 0.018 + 1e-9


# --- In a scheduler: the time chunks add to a stream's cycles ------------------------------------------------
SHARE = 1.0
PROMPT = [int(t) for t in np.random.default_rng(5).integers(0, 15, 400)]


def _target_alone(target, mid):
    return Chain([target], [])


def _drafting(target, mid):
    return Chain([mid, target], [3])


def _switching(target, mid):
    """A chain per cycle by a rule of the history, as a router switches: the target alone or
    the mid model drafting 3 tokens (whose calls on the target are 1 token or 4 rows)."""
    return ScriptedRouter(target, [Chain([target], []), Chain([mid, target], [3])])


def _mostly_alone(target, mid):
    """As _switching, drafting one cycle in six: the mid model catches up on the tokens it missed."""
    return ScriptedRouter(target, [Chain([target], [])] * 5 + [Chain([mid, target], [3])])


def _cycles(stream_plan, prompt_plan, prompt_at: int | None) -> tuple[list[float], list[bool]]:
    """Request A streams 500 tokens (greedy) under stream_plan; at step `prompt_at` (None:
    never) request B arrives with PROMPT under prompt_plan and asks for 8 tokens (checked
    against the target alone's). Returns A's cycles in simulated seconds, in order, and per
    cycle whether it ended while B's prompt was fed: after B arrived, before the step of B's
    first token (which runs B's last remainder and its first verification whole)."""
    target = SyntheticBackend("target", vocab=16, n_ctx=1024, latency=linear(0.010, 0.002), params_b=7.0)
    mid = SyntheticBackend("mid", vocab=16, n_ctx=1024, model_seed=2, noise=0.5, latency=linear(0.002, 0.0005),
                           params_b=1.0)
    clock = simulated_clock([target, mid])
    plans = {"a": stream_plan(target, mid), "b": prompt_plan(target, mid)}
    scheduler = BatchScheduler(lambda r: plans["b" if r.prompt_tokens is PROMPT else "a"], max_batch=2,
                               clock=clock, prefill_share=SHARE)
    scheduler.add("a", SeqRequest([1, 2, 3], SamplingParams(), 500))
    ends, feeding, b_events, step, b_started = [], [], [], 0, False
    while scheduler.n_active or scheduler.n_waiting:
        if step == prompt_at:
            scheduler.add("b", SeqRequest(PROMPT, SamplingParams(), 8))
        events = scheduler.step()
        b_events += [e for e in events if e.request_id == "b"]
        b_delta = any(e.request_id == "b" and isinstance(e, Delta) for e in events)
        for e in events:
            if e.request_id == "a" and isinstance(e, Delta) and e.tokens:
                ends.append(clock())
                feeding.append(prompt_at is not None and step >= prompt_at and not (b_started or b_delta))
        b_started = b_started or b_delta
        step += 1
    if prompt_at is not None:
        b = next(e.result for e in b_events if isinstance(e, Finished))
        assert b.token_ids == generate(Chain([SyntheticBackend("target", vocab=16, n_ctx=1024)], []), PROMPT,
                                       SamplingParams(), 8).token_ids
    return list(np.diff([0.0, *ends])), feeding


@pytest.mark.parametrize("stream_plan, prompt_plan", [
    (_target_alone, _target_alone), (_target_alone, _drafting), (_drafting, _drafting), (_switching, _target_alone),
    (_mostly_alone, _drafting)],
    ids=["target alone", "target alone, prompt drafting", "drafting", "switching", "switching, catching up"])
def test_a_prompt_adds_at_most_the_share_to_each_cycle_of_a_stream_whatever_its_chain(stream_plan, prompt_plan):
    """Head-of-line blocking under speculation: while a 400-token prompt is fed in chunks, each
    of a stream's cycles (the gap its client sees) takes at most 1 + share times the same cycle
    without the prompt (the stream's chain depends on its history only: the runs with and
    without it take the same cycles), give or take a token of the target (2 ms over its 12 ms
    1-token call: the controller hovers around its goal by one token). So for a stream that
    drafts, verifies k + 1 rows or runs the target alone from cycle to cycle as for the target
    alone, and whether the prompt's chain drafts or not. (Sized on the target's average call,
    the switching stream's 1-token cycles took 2.33x; a draft model's catch-up counted as a
    prompt's made the prompt a burst, fed whole: 8x.)"""
    alone, _ = _cycles(stream_plan, prompt_plan, None)
    cycles, feeding = _cycles(stream_plan, prompt_plan, 20)
    ratios = [with_prompt / without for with_prompt, without, fed in zip(cycles, alone, feeding) if fed]
    assert len(ratios) > 40
    assert max(ratios) <= 1 + SHARE + 0.002 / 0.012 + 1e-9, max(ratios)


class _PromptAloneThenDrafting(ScriptedRouter):
    """As the router runs a request: the target feeds the prompt alone, then the mid model
    drafts (and must first feed the prompt itself)."""

    def choose(self, position, room, cached, context, forced=()):
        self.calls += 1
        return self.chains[min(self.calls, len(self.chains)) - 1]


def test_a_draft_models_first_forward_feeds_the_prompt_in_chunks_beside_a_stream(monkeypatch):
    """The draft model of a request whose prompt the target fed alone first runs a cycle
    later, over the whole prompt: that forward is a prompt's (chunked beside a stream), not a
    stream's (run whole: it would stall the stream for the whole prompt); the draft's later
    forwards, over generated text only, are a stream's."""
    target = SyntheticBackend("target", vocab=16, n_ctx=1024, latency=linear(0.010, 0.002), params_b=7.0)
    mid = SyntheticBackend("mid", vocab=16, n_ctx=1024, model_seed=2, noise=0.5, latency=linear(0.002, 0.0005),
                           params_b=1.0)
    plans = {"a": Chain([target], []),
             "b": _PromptAloneThenDrafting(target, [Chain([target], []), Chain([mid, target], [3])])}
    planned = []
    plan = ChunkedPrefill.plan

    def spy(self, forwards):
        takes = plan(self, forwards)
        planned.extend((f, take) for f, take in zip(forwards, takes) if f.model == id(mid))
        return takes

    monkeypatch.setattr(ChunkedPrefill, "plan", spy)
    scheduler = BatchScheduler(lambda r: plans["b" if r.prompt_tokens is PROMPT else "a"], max_batch=2,
                               clock=simulated_clock([target, mid]), prefill_share=SHARE)
    scheduler.add("a", SeqRequest([1, 2, 3], SamplingParams(), 200))
    for _ in range(5):
        scheduler.step()
    scheduler.add("b", SeqRequest(PROMPT, SamplingParams(), 8))
    b = None
    while b is None:
        b = next((e.result for e in scheduler.step() if e.request_id == "b" and isinstance(e, Finished)), None)
    assert b.token_ids == generate(Chain([SyntheticBackend("target", vocab=16, n_ctx=1024)], []), PROMPT,
                                   SamplingParams(), 8).token_ids
    first, take = planned[0]
    assert not first.stream and first.tokens == len(PROMPT) + 1  # the prompt and the target's first token
    assert take != 0  # not run whole: it waits for its turn (no decoder uses the mid model), then is chunked
    prompt = [(f, t) for f, t in planned if not f.stream]
    assert sum(1 for f, t in prompt if 0 < t < f.head) >= 2
    # Once the prompt is in, the mid model's forwards feed generated text only: a stream's.
    streams = [i for i, (f, _) in enumerate(planned) if f.stream]
    assert streams and streams == list(range(streams[0], len(planned)))
    assert all(planned[i][0].tokens <= 8 for i in streams)

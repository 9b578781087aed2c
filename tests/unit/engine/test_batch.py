"""The batch scheduler: many sequences advance together with exactly the output each
would have alone, one backend call per model per step, per-sequence rollback, slots
freed at once, and a failing model taken out of the requests it served."""

from __future__ import annotations

import numpy as np
import pytest

from specrouter.drafters.ngram import NgramDrafter
from specrouter.backends.synthetic import SyntheticBackend
from specrouter.cascade.chain import Chain
from specrouter.cascade.sampling import SamplingParams
from specrouter.engine import generate
from specrouter.engine.batch import BatchScheduler, Delta, Failed, Finished, SeqRequest
from specrouter.errors import BackendError, InvalidParameterError

from ..router_synth import family, make_router

VOCAB = 16
EOS = 15


def models():
    target = SyntheticBackend("target", vocab=VOCAB, eos_id=EOS, params_b=1.5)
    mid = SyntheticBackend("mid", vocab=VOCAB, model_seed=2, noise=0.6, eos_id=EOS, params_b=0.5)
    small = SyntheticBackend("small", vocab=VOCAB, model_seed=3, noise=1.2, eos_id=EOS, params_b=0.1)
    return target, mid, small


def chains(target, mid, small):
    return {
        "target": Chain([target], []),
        "2-level": Chain([small, target], [3]),
        "3-level": Chain([small, mid, target], [2, 3]),
        "ngram-3-level": Chain([NgramDrafter(max_ngram=2), mid, target], [3, 2]),
    }


PROMPTS = [[1, 2, 3, 1, 2], [4, 5], [6, 7, 8, 9, 6, 7], [2, 2, 2], [9, 3], [5, 1, 5, 1, 5]]
LENGTHS = [24, 7, 40, 16, 1, 31]


def drain(scheduler: BatchScheduler, joins: dict[int, list] | None = None, check=None, watch=None) -> dict:
    """Step until idle; joins: step number -> requests added then; check() and watch(events
    so far) run after each step. Returns id -> events."""
    events: dict[str, list] = {}
    step = 0
    while scheduler.n_active or scheduler.n_waiting or (joins and any(s >= step for s in joins)):
        for rid, request in (joins or {}).get(step, []):
            scheduler.add(rid, request)
        for e in scheduler.step():
            events.setdefault(e.request_id, []).append(e)
        if check is not None:
            check()
        if watch is not None:
            watch(events)
        step += 1
    return events


def finished(events: list):
    assert isinstance(events[-1], Finished), events[-1]
    assert sum(isinstance(e, Finished) for e in events) == 1
    return events[-1].result


@pytest.mark.parametrize("name", ["target", "2-level", "3-level", "ngram-3-level"])
@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.8, seed=7)], ids=["greedy", "sampled"])
def test_batched_tokens_equal_tokens_alone(name, params):
    """A batching test, not an exactness one (the cascade is compared with itself): greedy and
    seeded sampling give the same tokens batched as generating each request alone, with
    requests joining mid-run, leaving at different lengths and waiting for a free slot."""
    alone_chain = chains(*models())[name]
    alone = [generate(alone_chain, p, params, n, rng=np.random.default_rng(params.seed)).token_ids
             for p, n in zip(PROMPTS, LENGTHS)]
    target, mid, small = models()
    chain = chains(target, mid, small)[name]
    scheduler = BatchScheduler(lambda r: chain, max_batch=4)

    def kv_promise():
        """Per-sequence rollback: every cache holds exactly what the books say, and between
        cycles (right after its end_cycle) only a prefix of that sequence's committed tokens."""
        for a in scheduler._active.values():
            for model in chain.models:
                slot = a.run.state.slot(model)
                if slot is None:
                    continue
                cached = model.kv_tokens(slot)
                assert cached == a.run.state.cached_tokens(model)
                if a.steps is None:
                    assert cached == a.run.context[: len(cached)], f"{model.name} holds uncommitted tokens"

    joins = {0: [], 3: [], 9: []}
    for i, (p, n) in enumerate(zip(PROMPTS, LENGTHS)):
        joins[[0, 3, 9][i % 3]].append((str(i), SeqRequest(p, params, n)))
    events = drain(scheduler, joins, kv_promise)
    for i in range(len(PROMPTS)):
        result = finished(events[str(i)])
        assert result.token_ids == alone[i], f"request {i}"
        streamed = "".join(e.text for e in events[str(i)] if isinstance(e, Delta))
        assert streamed == result.text
    assert all(m.live_sequences == 0 for m in chain.models)
    # Really batched: some calls served several sequences at once.
    assert max(max(sizes) for sizes in scheduler.batch_sizes.values()) > 1
    assert max(s for sizes in scheduler.batch_sizes.values() for s in sizes) <= 4


def test_one_call_per_model_per_step():
    target, mid, small = models()
    chain = Chain([small, target], [2])
    scheduler = BatchScheduler(lambda r: chain, max_batch=8)
    for i in range(6):
        scheduler.add(str(i), SeqRequest([1, 2, i], SamplingParams(), 12))
    steps = 0
    while scheduler.n_active or scheduler.n_waiting:
        before = (small.decode_calls, target.decode_calls)
        scheduler.step()
        steps += 1
        assert small.decode_calls - before[0] <= 1 and target.decode_calls - before[1] <= 1
    assert target.decode_calls < 6 * 12  # far fewer calls than tokens: sequences share them


def test_cancel_frees_slots_at_once():
    target, mid, small = models()
    chain = Chain([small, mid, target], [2, 2])
    scheduler = BatchScheduler(lambda r: chain, max_batch=2)
    for i in range(3):
        scheduler.add(str(i), SeqRequest([1, 2, 3 + i], SamplingParams(), 50))
    for _ in range(4):
        scheduler.step()
    assert scheduler.n_active == 2 and scheduler.n_waiting == 1
    assert scheduler.cancel("0") and scheduler.cancel("2")  # one active, one waiting
    assert not scheduler.cancel("0")
    assert all(m.live_sequences <= 1 for m in chain.models)
    events = drain(scheduler)
    assert set(events) == {"1"} and finished(events["1"]).token_ids
    assert all(m.live_sequences == 0 for m in chain.models)


def test_bad_requests_are_refused_before_running():
    target, mid, small = models()
    scheduler = BatchScheduler(lambda r: Chain([small, target], [2]))
    with pytest.raises(InvalidParameterError, match="max_tokens"):
        scheduler.add("a", SeqRequest([1], SamplingParams(), 0))
    scheduler.add("a", SeqRequest([1], SamplingParams(), 2))
    with pytest.raises(InvalidParameterError, match="already in use"):
        scheduler.add("a", SeqRequest([1], SamplingParams(), 2))
    with pytest.raises(InvalidParameterError, match="max_batch"):
        BatchScheduler(lambda r: None, max_batch=0)


class Failing(SyntheticBackend):
    """Raises on its fail_at-th batched call, and on every call once `broken` is set."""

    def __init__(self, *a, fail_at: int | None = None, **kw):
        super().__init__(*a, **kw)
        self.fail_at, self.calls, self.broken, self.failures = fail_at, 0, False, 0

    def decode_batch(self, items):
        self.calls += 1
        if self.broken or self.calls == self.fail_at:
            self.failures += 1
            raise BackendError(f"{self.name}: device lost")
        return super().decode_batch(items)


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.8, seed=3)], ids=["greedy", "sampled"])
def test_failing_draft_is_dropped_and_output_is_unchanged(params):
    """A draft that fails mid-generation is dropped from the requests it served, which go on
    without it. It fails on a scenario, not on a call count (which chunked prefill and each
    level's proposal lengths shift): from the step where some request has committed a cycle
    of the draft chain and goes on, every call of small raises, that request's next cycle's
    first among them."""
    target, mid, _ = models()
    small = Failing("small", vocab=VOCAB, model_seed=3, noise=1.2, eos_id=EOS, params_b=0.1)
    chain = Chain([small, mid, target], [2, 3])
    scheduler = BatchScheduler(lambda r: chain, max_batch=4)
    requests = list(zip(PROMPTS[:4], LENGTHS[:4]))
    for i, (p, n) in enumerate(requests):
        scheduler.add(str(i), SeqRequest(p, params, n))

    def break_small_mid_generation(events):
        # Each request a failing call served drops small: none calls it again (nor loops on it).
        assert small.failures <= len(requests)
        if any(any(isinstance(e, Delta) for e in es) and not isinstance(es[-1], (Finished, Failed))
               for es in events.values()):
            small.broken = True

    events = drain(scheduler, watch=break_small_mid_generation)
    assert small.broken
    switched = 0
    for i, (p, n) in enumerate(requests):
        result = finished(events[str(i)])
        if params.greedy:  # greedy: exactly the target's output, whatever chain produced it
            assert result.token_ids == generate(Chain([target], []), p, params, n).token_ids
        if len(result.chains_used) > 1:  # it was running when the model failed: the model is gone
            assert [c for c, _ in result.chains_used] == [["small", "mid", "target"], ["mid", "target"]]
            assert result.chains_per_cycle[-1] == 1
            switched += 1
    assert switched >= 1
    assert all(m.live_sequences == 0 for m in (small, mid, target))


def test_failing_target_fails_only_its_requests():
    target = Failing("target", vocab=VOCAB, eos_id=EOS, params_b=1.5, fail_at=3)
    other = SyntheticBackend("other", vocab=VOCAB, eos_id=EOS, params_b=1.5)
    scheduler = BatchScheduler(lambda r: Chain([target if r.max_tokens == 20 else other], []))
    scheduler.add("a", SeqRequest([1, 2], SamplingParams(), 20))
    scheduler.add("b", SeqRequest([1, 2], SamplingParams(), 21))
    events = drain(scheduler)
    assert isinstance(events["a"][-1], Failed) and "device lost" in str(events["a"][-1].error)
    assert finished(events["b"]).token_ids == generate(Chain([other], []), [1, 2], SamplingParams(), 21).token_ids
    assert target.live_sequences == 0 and other.live_sequences == 0


def test_router_sessions_in_a_batch_match_their_output_alone():
    """Each request routes on its own (per-request estimates, shared global ones), greedy exact."""
    target, mid, small = family()
    router = make_router(target, [mid, small])
    scheduler = BatchScheduler(lambda r: router.session(), max_batch=4)
    for i, p in enumerate(PROMPTS):
        scheduler.add(str(i), SeqRequest(p, SamplingParams(), 30))
    events = drain(scheduler)
    for i, p in enumerate(PROMPTS):
        assert finished(events[str(i)]).token_ids == generate(Chain([target], []), p, SamplingParams(), 30).token_ids


@pytest.mark.slow
@pytest.mark.parametrize("name", ["3-level", "4-level-ngram"])
def test_batched_sampling_follows_target_distribution(name):
    """The chi-square test of test_sampling_exactness.py, every generation a request of a
    batch of 16 (each request has its own seed, as a server gives it)."""
    from ..cascade.test_sampling_exactness import ALPHA, N_TOKENS, PROMPT, chains as exact_chains, exact_distribution, goodness_of_fit

    runs = 30_000
    chain = exact_chains()[name]
    params = SamplingParams(temperature=1.0, top_p=0.9)
    scheduler = BatchScheduler(lambda r: chain, max_batch=16)
    counts: dict[tuple[int, ...], int] = {}
    for start in range(0, runs, 64):
        for i in range(start, min(start + 64, runs)):
            scheduler.add(str(i), SeqRequest(PROMPT, SamplingParams(temperature=1.0, top_p=0.9, seed=10_000 + i), N_TOKENS))
        for events in drain(scheduler).values():
            out = tuple(finished(events).token_ids)
            counts[out] = counts.get(out, 0) + 1
    assert sum(counts.values()) == runs
    assert max(max(s) for s in scheduler.batch_sizes.values()) == 16
    pvalue = goodness_of_fit(exact_distribution(chain.target, params), counts, runs=runs)
    assert pvalue > ALPHA, f"{name}: batched output deviates from the target distribution (p = {pvalue:.2e})"


def test_router_speculates_less_as_the_batch_grows():
    """A CPU-like target (every verified token costs): alone, the router drafts 3 or more
    tokens a cycle; 8 sequences at once make each verification 8 times wider, and it drafts
    at most one token, or none. (Every request's first cycle feeds its prompt: the target alone.)"""
    from ..router_synth import linear, simulated_clock

    def mean_draft_and_alone_share(batch: int) -> tuple[float, float]:
        target = SyntheticBackend("target", vocab=VOCAB, latency=linear(0.020, 0.004), params_b=7.0)
        mid = SyntheticBackend("mid", vocab=VOCAB, model_seed=2, noise=0.5, latency=linear(0.002, 0.0005), params_b=1.0)
        router = make_router(target, [mid], use_ngram=False)
        router.acceptance.set_global("mid", "target", 0.8, mode="greedy")
        scheduler = BatchScheduler(lambda r: router.session(), max_batch=batch, clock=simulated_clock([target, mid]))
        for i in range(batch):
            scheduler.add(str(i), SeqRequest([1, 2, 3, i], SamplingParams(), 60))
        drafts = []
        for events in drain(scheduler).values():
            result = finished(events)
            assert result.chains_used[result.chains_per_cycle[0]] == (["target"], [])
            drafts += [sum(result.chains_used[c][1]) for c in result.chains_per_cycle[1:]]
        return float(np.mean(drafts)), drafts.count(0) / len(drafts)

    one, two, eight = (mean_draft_and_alone_share(b) for b in (1, 2, 8))
    assert one[0] >= 3.0 and one[1] == 0.0
    assert min(one[0], two[0]) > eight[0]
    assert eight[0] < 1.0 and eight[1] > 0.3  # one token or none: the target alone in many cycles


def test_deltas_count_every_committed_token_once():
    target, mid, small = models()
    chain = Chain([small, target], [3])
    scheduler = BatchScheduler(lambda r: chain, max_batch=3)
    for i, p in enumerate(PROMPTS[:3]):
        scheduler.add(str(i), SeqRequest(p, SamplingParams(), 25))
    for rid, events in drain(scheduler).items():
        result = finished(events)
        assert sum(e.tokens for e in events if isinstance(e, Delta)) == len(result.token_ids)


def test_stalling_draft_is_dropped_after_its_slow_call():
    from ..router_synth import simulated_clock

    target, mid, _ = models()
    small = SyntheticBackend("small", vocab=VOCAB, model_seed=3, noise=1.2, eos_id=EOS, latency=lambda n: 5.0)
    chain = Chain([small, mid, target], [2, 3])
    scheduler = BatchScheduler(lambda r: chain, max_batch=2, stall_seconds=1.0, clock=simulated_clock([small, mid, target]))
    for i in (0, 2):
        scheduler.add(str(i), SeqRequest(PROMPTS[i], SamplingParams(), 30))
    events = drain(scheduler)
    for i in (0, 2):
        result = finished(events[str(i)])
        assert result.token_ids == generate(Chain([target], []), PROMPTS[i], SamplingParams(), 30).token_ids
        assert [c for c, _ in result.chains_used] == [["small", "mid", "target"], ["mid", "target"]]
    assert small.decode_calls == 1 and small.live_sequences == 0  # one slow (batched) call, then never again


def _stream_gaps(prefill_share, long_prompt: int = 400, chain_of=lambda target, mid: Chain([target], [])):
    """Request A streams alone for 20 steps, then B arrives with a `long_prompt`-token prompt
    (its greedy output is checked against the target alone's). Returns A's gaps between
    Deltas (simulated seconds) before B came and while B's prompt was being fed, the time
    from B's arrival to its first token, the scheduler and the chain."""
    from ..router_synth import linear, simulated_clock

    target = SyntheticBackend("target", vocab=VOCAB, n_ctx=1024, latency=linear(0.010, 0.002), params_b=7.0)
    mid = SyntheticBackend("mid", vocab=VOCAB, n_ctx=1024, model_seed=2, noise=0.5, latency=linear(0.002, 0.0005),
                           params_b=1.0)
    clock = simulated_clock([target, mid])
    chain = chain_of(target, mid)
    scheduler = BatchScheduler(lambda r: chain, max_batch=2, clock=clock, prefill_share=prefill_share)
    scheduler.add("a", SeqRequest([1, 2, 3], SamplingParams(), 500))  # decodes until B is done
    prompt = [int(t) for t in np.random.default_rng(5).integers(0, EOS, long_prompt)]
    times, b_events, step, b_first = [], [], 0, None
    while scheduler.n_active or scheduler.n_waiting:
        if step == 20:
            scheduler.add("b", SeqRequest(prompt, SamplingParams(), 8))
            arrival = clock()
        for e in scheduler.step():
            if e.request_id == "a" and isinstance(e, Delta):
                times.append((clock(), step >= 20 and b_first is None))
            elif e.request_id == "b":
                b_events.append(e)
                if b_first is None and isinstance(e, Delta):
                    b_first = clock()
        step += 1
    gaps = [(t1 - t0, during) for (t0, _), (t1, during) in zip(times, times[1:])]
    before = [g for g, during in gaps if not during]
    during = [g for g, during in gaps if during]
    b = finished(b_events)
    assert b.token_ids == generate(Chain([SyntheticBackend("target", vocab=VOCAB, n_ctx=1024)], []), prompt,
                                   SamplingParams(), 8).token_ids
    return before, during, b_first - arrival, scheduler, chain


@pytest.mark.parametrize("chain_of", [lambda t, m: Chain([t], []), lambda t, m: Chain([m, t], [3])],
                         ids=["target", "mid->target"])
def test_a_long_prompt_is_fed_in_chunks_while_another_stream_decodes(chain_of):
    """Head-of-line blocking: a 400-token prompt arriving while a stream decodes. Whole, its
    prefill (0.81 simulated s on the target) sits in one step and the stream's gap grows ~40x;
    in chunks riding with the stream's calls, every gap of the stream stays under 3x its
    median before (about 1 + prefill_share by construction: measured 2.0x and 1.6x), and the
    long prompt's output is the target alone's."""
    before, during, blocking_first_token, scheduler, _ = _stream_gaps(None, chain_of=chain_of)
    assert max(during) > 20 * np.median(before) and scheduler.prefill is None  # the control: blocking without chunks
    before, during, first_token, scheduler, chain = _stream_gaps(1.0, chain_of=chain_of)
    # Every model of the chain was fed the prompt (less its last row) in chunks, all but a last
    # remainder each, at most twice the model's last chunk size (a size moves by 2x at most).
    sizes = [scheduler.prefill.size(id(m)) for m in chain.models]
    assert scheduler.prefill.tokens >= sum(399 - 2 * size for size in sizes) and scheduler.prefill.calls > 10
    assert max(during) < 3 * np.median(before), (max(during), np.median(before))
    # The prompt is fed with about half of the machine's time (prefill_share 1): its first token
    # comes 2-3x later than when its prefill stalled the stream (measured 2.2x and 3.0x).
    assert first_token < 4 * blocking_first_token


def test_a_lone_long_prompt_is_fed_whole():
    """Nobody decodes: nothing to protect, so no chunks (a lone request is not slowed)."""
    target = SyntheticBackend("target", vocab=VOCAB, n_ctx=1024)
    scheduler = BatchScheduler(lambda r: Chain([target], []), max_batch=2)
    scheduler.add("b", SeqRequest(list(range(1, 15)) * 20, SamplingParams(), 4))
    scheduler.add("c", SeqRequest(list(range(2, 14)) * 20, SamplingParams(), 4))
    drain(scheduler)
    assert scheduler.prefill.calls == 0


def test_prompts_outnumbering_the_streams_are_fed_whole_in_the_step_they_join():
    """Three prompts arriving while one stream decodes: all four forwards run in one call of
    the target in the next step (the stream stalls for them) and every prompt gets its first
    token there, instead of entering the batch one at a time in chunks; outputs are alone's."""
    target = SyntheticBackend("target", vocab=VOCAB, n_ctx=1024)
    chain = Chain([target], [])
    scheduler = BatchScheduler(lambda r: chain, max_batch=4)
    scheduler.add("a", SeqRequest([1, 2, 3], SamplingParams(), 12))
    scheduler.step(), scheduler.step()  # "a" decodes
    prompts = {str(i): [int(t) for t in np.random.default_rng(i).integers(0, EOS, 300)] for i in range(3)}
    for rid, prompt in prompts.items():
        scheduler.add(rid, SeqRequest(prompt, SamplingParams(), 4))
    calls = target.decode_calls
    joined = scheduler.step()
    assert target.decode_calls == calls + 1 and scheduler.prefill.calls == 0
    assert {e.request_id for e in joined if isinstance(e, Delta) and e.tokens} == {"a", *prompts}
    events = drain(scheduler)
    for rid, prompt in prompts.items():
        assert finished(events[rid]).token_ids == generate(chain, prompt, SamplingParams(), 4).token_ids


def test_prefill_share_must_be_positive():
    with pytest.raises(InvalidParameterError, match="prefill_share must be > 0"):
        BatchScheduler(lambda r: None, prefill_share=0)


@pytest.mark.parametrize("name", ["target", "3-level", "ngram-3-level"])
@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.8, seed=7)], ids=["greedy", "sampled"])
def test_choices_of_one_request_prefill_the_prompt_once(name, params):
    """n > 1: choices 1.. take every model's cache of the prompt from choice 0 (they start once
    it has run a cycle): each model evaluates len(prompt) - 1 tokens fewer per later choice
    than without sharing, and nothing else changes: each choice's tokens are what it writes
    alone with its random stream, and every cache holds what its books say."""
    prompt = [(7 * i) % (VOCAB - 1) for i in range(120)]

    def run(share: bool):
        requests = [SeqRequest(prompt, params, 20, choice=i, shares_prompt_with="c0" if i and share else None)
                    for i in range(4)]
        chain = chains(*models())[name]
        scheduler = BatchScheduler(lambda r: chain, max_batch=4, prefill_share=None)
        for i, r in enumerate(requests):
            scheduler.add(f"c{i}", r)

        def books():
            for a in scheduler._active.values():
                for model in chain.models:
                    if (slot := a.run.state.slot(model)) is not None:
                        assert model.kv_tokens(slot) == a.run.state.cached_tokens(model)

        events = drain(scheduler, check=books)
        assert all(m.live_sequences == 0 for m in chain.models)
        return [finished(events[f"c{i}"]).token_ids for i in range(4)], {m.name: m.decoded_tokens for m in chain.models}

    alone = [generate(chains(*models())[name], prompt, params, 20,
                      rng=SeqRequest(prompt, params, choice=i).rng()).token_ids for i in range(4)]
    shared, with_sharing = run(True)
    separate, without = run(False)
    assert shared == separate == alone
    assert {m: without[m] - with_sharing[m] for m in without} == {m: 3 * (len(prompt) - 1) for m in without}


def test_a_choice_whose_first_choice_is_gone_prefills_itself():
    target, mid, small = models()
    chain = Chain([small, target], [3])
    scheduler = BatchScheduler(lambda r: chain, max_batch=4, prefill_share=None)
    prompt = [1, 2, 3] * 20
    scheduler.add("c0", SeqRequest(prompt, SamplingParams(), 10))
    scheduler.add("c1", SeqRequest(prompt, SamplingParams(), 10, choice=1, shares_prompt_with="c0"))
    assert scheduler.cancel("c0")
    events = drain(scheduler)
    assert finished(events["c1"]).token_ids == generate(Chain([small, target], [3]), prompt, SamplingParams(),
                                                        10).token_ids
    assert target.decoded_tokens >= len(prompt)


def test_a_stream_is_priced_alone_while_a_prompt_beside_it_is_prefilled(monkeypatch):
    """A stream's router prices its forwards for the sequences that decode with it: a prompt
    being fed in chunks beside it is not one (its chunks add at most the prefill share to the
    stream's calls); once that request has run its first cycle it decodes too."""
    from specrouter.engine.request import SequenceRun

    seen: list[tuple[int, int, int]] = []  # (stream's cycles, the other request's cycles, batch size)
    runs: dict[str, SequenceRun] = {}
    start_cycle = SequenceRun.start_cycle

    def spy(self, batch_size=1):
        if self is runs.get("a") and "b" in runs:
            seen.append((self.cycles, runs["b"].cycles, batch_size))
        return start_cycle(self, batch_size)

    monkeypatch.setattr(SequenceRun, "start_cycle", spy)
    target = SyntheticBackend("target", vocab=VOCAB, n_ctx=1024)
    scheduler = BatchScheduler(lambda r: Chain([target], []), max_batch=2, prefill_share=0.5)
    scheduler.add("a", SeqRequest([1, 2, 3], SamplingParams(), 60))
    runs["a"] = scheduler._run_of("a")
    for _ in range(3):
        scheduler.step()
    scheduler.add("b", SeqRequest([int(t) for t in np.random.default_rng(1).integers(0, EOS, 300)],
                                  SamplingParams(), 4))
    while scheduler.n_active or scheduler.n_waiting:
        scheduler.step()
        if "b" not in runs and scheduler._run_of("b") is not None:
            runs["b"] = scheduler._run_of("b")
    while_fed = {size for _, b_cycles, size in seen if b_cycles == 0}
    after = {size for _, b_cycles, size in seen if 0 < b_cycles < 4}
    assert while_fed == {1} and after == {2}, seen


def test_choice_streams_are_independent_across_seeds():
    """Choice i of a request with seed s draws from its own stream: choice 0 from the seed's
    (what the request alone draws), the others from streams no other (seed, choice) shares,
    so choice 1 of seed s is not choice 0 of seed s + 1 (as a stream seeded s + i would be)."""
    draws = {(seed, i): tuple(SeqRequest([1], SamplingParams(temperature=1.0, seed=seed), choice=i).rng().random(4))
             for seed in range(6) for i in range(4)}
    assert len(set(draws.values())) == len(draws)
    assert all(draws[seed, 0] == tuple(np.random.default_rng(seed).random(4)) for seed in range(6))

    target, mid, small = models()
    chain = Chain([small, target], [3])
    scheduler = BatchScheduler(lambda r: chain, max_batch=6, prefill_share=None)
    prompt = [1, 2, 3, 1, 2]
    for seed in (7, 8):
        for i in range(3):
            scheduler.add(f"s{seed}c{i}", SeqRequest(prompt, SamplingParams(temperature=1.2, seed=seed), 30, choice=i,
                                                     shares_prompt_with=f"s{seed}c0" if i else None))
    events = drain(scheduler)
    tokens = {rid: finished(e).token_ids for rid, e in events.items()}
    assert len(tokens) == 6 and len({tuple(t) for t in tokens.values()}) == 6
    for seed in (7, 8):  # choice 0 is the request alone
        alone = generate(Chain([small, target], [3]), prompt, SamplingParams(temperature=1.2, seed=seed), 30)
        assert tokens[f"s{seed}c0"] == alone.token_ids

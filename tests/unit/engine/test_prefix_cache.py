"""The prefix cache: a finished request's caches serve later prompts that begin the same way
(engine/prefix_cache.py), with the output unchanged, only the rest of the prompt computed,
the books equal to the caches, and the slots bounded and freed."""

from __future__ import annotations

import numpy as np
import pytest

from specrouter.backends.synthetic import SyntheticBackend
from specrouter.cascade.chain import Chain
from specrouter.cascade.sampling import SamplingParams
from specrouter.engine import generate
from specrouter.engine.batch import BatchScheduler, SeqRequest
from specrouter.engine.prefix_cache import PrefixCache
from specrouter.errors import InvalidParameterError

from ..router_synth import family, make_router
from .test_batch import VOCAB, chains, drain, finished, models

FIRST = [(5 * i + 1) % (VOCAB - 1) for i in range(60)]


def books(scheduler: BatchScheduler, chain: Chain):
    """A check after every step: every cache, of live and of kept sequences, holds exactly
    what its sequence's books say."""

    def check():
        states = [a.run.state for a in scheduler._active.values()] + list(scheduler.prefix_cache.kept())
        for state in states:
            for model in chain.models:
                if (slot := state.slot(model)) is not None:
                    assert model.kv_tokens(slot) == state.cached_tokens(model)

    return check


def held(turn) -> int:
    """What a finished turn's target cache holds: every committed token but the last (an EOS
    that ended it is committed, not in token_ids)."""
    return turn.prompt_tokens + len(turn.token_ids) - (turn.finish_reason == "length")


def alone(chain: Chain, prompt: list[int], params: SamplingParams, n: int) -> list[int]:
    return generate(chain, prompt, params, n, rng=np.random.default_rng(params.seed)).token_ids


@pytest.mark.parametrize("name", ["target", "2-level", "3-level", "ngram-3-level"])
@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.8, seed=7)], ids=["greedy", "sampled"])
def test_a_next_turn_takes_the_conversation_from_the_finished_turn_and_feeds_only_the_rest(name, params):
    """Turn 2's prompt is turn 1's prompt, its answer and a new message: with the cache it
    takes every position turn 1's target cache held (all of turn 1 but its last token), each
    model computes that many tokens fewer, and both turns write what they write alone."""
    first = alone(chains(*models())[name], FIRST, params, 30)
    second_prompt = FIRST + first + [3, 1, 4, 1, 5]
    second = alone(chains(*models())[name], second_prompt, params, 25)

    def run(capacity: int):
        chain = chains(*models())[name]
        scheduler = BatchScheduler(lambda r: chain, max_batch=2, prefix_cache=PrefixCache(capacity))
        check = books(scheduler, chain)
        scheduler.add("turn 1", SeqRequest(FIRST, params, 30))
        one = finished(drain(scheduler, check=check)["turn 1"])
        scheduler.add("turn 2", SeqRequest(second_prompt, params, 25))
        two = finished(drain(scheduler, check=check)["turn 2"])
        decoded = {m.name: m.decoded_tokens for m in chain.models}
        kept = len(scheduler.prefix_cache)
        scheduler.close()
        assert all(m.live_sequences == 0 for m in chain.models)
        return one, two, decoded, kept

    one, two, with_cache, kept = run(2)
    cold_one, cold_two, without, _ = run(0)
    assert one.token_ids == cold_one.token_ids == first and two.token_ids == cold_two.token_ids == second
    assert two.cached_tokens == held(one) and cold_two.cached_tokens == 0 == one.cached_tokens
    saved = {m: without[m] - with_cache[m] for m in without}
    assert saved["target"] == two.cached_tokens
    assert all(0 < s <= two.cached_tokens for s in saved.values())  # the drafts held at most what the target held
    assert kept == 1  # turn 2 replaced turn 1, which it resumed from


def test_kept_requests_are_bounded_the_least_recently_used_leaving_first():
    target, mid, small = models()
    chain = Chain([small, target], [3])
    cache = PrefixCache(2)
    scheduler = BatchScheduler(lambda r: chain, max_batch=2, prefix_cache=cache)
    prompts = {name: [first] + [(3 * i + first) % (VOCAB - 1) for i in range(40)] for name, first in
               (("a", 1), ("b", 2), ("c", 4))}
    for name in "ab":
        scheduler.add(name, SeqRequest(prompts[name], SamplingParams(), 8))
        drain(scheduler)
    assert [[s.held_prefix(prompts[x]) for x in "ab"] for s in cache.kept()] == [[41, 0], [0, 41]]
    # b's prompt again (a retry, a shared system prompt): it takes all of it but the token it
    # must feed, and its own finished state, holding the same, replaces b's.
    scheduler.add("b again", SeqRequest(prompts["b"], SamplingParams(), 8))
    assert finished(drain(scheduler)["b again"]).cached_tokens == 40
    assert [[s.held_prefix(prompts[x]) for x in "ab"] for s in cache.kept()] == [[41, 0], [0, 41]]
    # c: over the capacity, a (the least recently used) leaves.
    scheduler.add("c", SeqRequest(prompts["c"], SamplingParams(), 8))
    drain(scheduler)
    assert [[s.held_prefix(prompts[x]) for x in "abc"] for s in cache.kept()] == [[0, 41, 0], [0, 0, 41]]
    assert cache.stats.evicted == 2 and cache.stats.kept == 4
    assert target.live_sequences == small.live_sequences == 2
    scheduler.close()
    assert target.live_sequences == small.live_sequences == 0


class Unshared(SyntheticBackend):
    """A backend whose sequences share no cells (llama.cpp's exact mode: a stream each)."""

    def share_prefix(self, src: int, dst: int, n: int) -> bool:
        return False


def test_a_backend_that_cannot_share_hands_over_the_kept_slot_itself():
    """The next turn takes the finished turn's slot, cut back to the shared prefix; the kept
    state leaves the cache (its other models' slots freed), and the output is unchanged."""
    target = Unshared("target", vocab=VOCAB, eos_id=VOCAB - 1, params_b=1.5)
    small = Unshared("small", vocab=VOCAB, model_seed=3, noise=1.2, eos_id=VOCAB - 1, params_b=0.1)
    chain = Chain([small, target], [3])
    cache = PrefixCache(2)
    scheduler = BatchScheduler(lambda r: chain, max_batch=2, prefix_cache=cache)
    check = books(scheduler, chain)
    scheduler.add("turn 1", SeqRequest(FIRST, SamplingParams(), 20))
    first = finished(drain(scheduler, check=check)["turn 1"]).token_ids
    assert len(first) > 11 and len(cache) == 1 and target.live_sequences == 1
    # A prompt that departs from turn 1 inside its answer: the slot is cut back to what they share.
    second_prompt = FIRST + first[:10] + [(first[10] + 1) % (VOCAB - 1), 2, 3]
    scheduler.add("turn 2", SeqRequest(second_prompt, SamplingParams(), 20))
    second = finished(drain(scheduler, check=check)["turn 2"])
    assert second.cached_tokens == len(FIRST) + 10
    assert second.token_ids == alone(Chain([small, target], [3]), second_prompt, SamplingParams(), 20)
    assert len(cache) == 1 and cache.stats.evicted == 1  # turn 1 was taken over; turn 2 is kept
    assert target.live_sequences == small.live_sequences == 1
    scheduler.close()
    assert target.live_sequences == small.live_sequences == 0


class Placed(SyntheticBackend):
    """A cache shared by every sequence, as llama.cpp's unified one: a new sequence's cells
    lie after those the others hold, and its logits round by where they lie (a perturbation
    of one token's logit that grows with the cells before its first)."""

    shared_cache = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._offset: dict[int, int] = {}

    def new_sequence(self) -> int:
        seq = super().new_sequence()
        self._offset[seq] = sum(len(self.kv_tokens(s)) for s in self._offset)
        return seq

    def free_sequence(self, seq: int) -> None:
        super().free_sequence(seq)
        self._offset.pop(seq, None)

    def _extend(self, seq, tokens, pos, n_logits) -> np.ndarray:
        rows = super()._extend(seq, tokens, pos, n_logits)
        rows[:, 0] += 1e-3 * self._offset[seq]
        return rows


def _served(scheduler: BatchScheduler, rid: str, request: SeqRequest):
    scheduler.add(rid, request)
    return finished(drain(scheduler)[rid])


def test_a_reproducible_request_alone_computes_as_on_a_fresh_server_over_a_shared_cache():
    """The seed contract over a shared cache: kept states hold cells there, which would move
    a new sequence's cells and so its logits (Placed); a reproducible (seeded) request
    admitted with nothing else running releases them first, and writes the same tokens with
    the same logprobs each time, whatever was served before. Other requests still resume
    from kept states."""
    target = Placed("target", vocab=VOCAB, eos_id=VOCAB - 1, params_b=1.5)
    cache = PrefixCache(4)
    scheduler = BatchScheduler(lambda r: Chain([target], []), max_batch=2, prefix_cache=cache)

    def seeded(rid: str):
        result = _served(scheduler, rid, SeqRequest(FIRST, SamplingParams(temperature=1.0, seed=1234), 12,
                                                    logprobs=0, reproducible=True))
        return result.token_ids, [t.logprob for t in result.logprobs]

    first = seeded("seeded 0")
    for i in range(3):
        other = _served(scheduler, f"other {i}", SeqRequest(FIRST[:20] + [i + 1] * (10 + 20 * i), SamplingParams(), 8))
        assert other.cached_tokens == 20  # it resumed from the kept seeded state (and replaced it)
        assert seeded(f"seeded {i + 1}") == first


@pytest.mark.parametrize(("shared", "beside", "in_cells"), [(True, False, [False, False, True]),
                                                         (True, True, [False, False, True, True]),
                                                         (False, False, [True, True, True])])
def test_kept_states_leave_a_shared_cache_for_saved_copies_when_a_request_needs_them_not(shared, beside, in_cells):
    """Every kept state stays kept; over a shared cache those a newly admitted request does
    not resume from (a reproducible one resumes from none) leave their cells for saved
    copies and free their slots; in caches of their own they keep their slots (two earlier
    requests, the one beside and the seeded one each leave a state)."""
    target = (Placed if shared else SyntheticBackend)("target", vocab=VOCAB, eos_id=VOCAB - 1, params_b=1.5)
    cache = PrefixCache(4)
    scheduler = BatchScheduler(lambda r: Chain([target], []), max_batch=2, prefix_cache=cache)
    for i in range(2):
        _served(scheduler, f"other {i}", SeqRequest([i + 1] * 30, SamplingParams(), 4))
    if beside:
        scheduler.add("running", SeqRequest([9, 9, 9], SamplingParams(), 30))
        scheduler.step()
    scheduler.add("seeded", SeqRequest(FIRST, SamplingParams(temperature=1.0, seed=1), 4, reproducible=True))
    drain(scheduler)
    assert [state.slot(target) is not None for state in cache.kept()] == in_cells
    assert target.live_sequences == sum(in_cells)
    assert [state.held_tokens() for state in cache.kept()][:2] == [{"target": 33}, {"target": 32}]  # saved or not


def test_a_kept_state_saved_for_another_partitions_request_serves_its_next_turn():
    """Conversation b's request over a shared cache finds none of a's kept cells (its logits
    are those of a fresh server: Placed rounds by the cells before a sequence's), and a's
    next turn takes its whole first turn from the saved copy, writing what it writes alone."""
    def serve(scheduler, rid, prompt, partition):
        request = SeqRequest(prompt, SamplingParams(), 12, logprobs=0, cache_partition=partition)
        return _served(scheduler, rid, request)

    def fresh(prompt):
        target = Placed("target", vocab=VOCAB, eos_id=VOCAB - 1, params_b=1.5)
        return serve(BatchScheduler(lambda r: Chain([target], []), max_batch=2, prefix_cache=PrefixCache(4)),
                     "fresh", prompt, "")

    target = Placed("target", vocab=VOCAB, eos_id=VOCAB - 1, params_b=1.5)
    cache = PrefixCache(4)
    scheduler = BatchScheduler(lambda r: Chain([target], []), max_batch=2, prefix_cache=cache)
    first = serve(scheduler, "a1", FIRST, "a")
    other = serve(scheduler, "b1", [7] * 40, "b")
    alone_b = fresh([7] * 40)
    assert (other.token_ids, [t.logprob for t in other.logprobs]) == (alone_b.token_ids,
                                                                     [t.logprob for t in alone_b.logprobs])
    assert target.live_sequences == 1  # b's kept state; a's is a saved copy
    second_prompt = FIRST + first.token_ids + [3, 1, 4]
    second = serve(scheduler, "a2", second_prompt, "a")
    assert second.cached_tokens == held(first)
    assert second.token_ids == fresh(second_prompt).token_ids
    assert target.live_sequences == 1 and len(cache) == 2  # a's second turn replaced its first; b's saved


def test_router_sessions_resume_and_write_the_target_alone_greedy_output():
    """auto's sessions start from the models' kept caches (the router sees what they hold)."""
    target, mid, small = family()
    router = make_router(target, [mid, small])
    scheduler = BatchScheduler(lambda r: router.session(), max_batch=2, prefix_cache=PrefixCache(4))
    scheduler.add("1", SeqRequest(FIRST, SamplingParams(), 30))
    one = finished(drain(scheduler)["1"])
    first = one.token_ids
    prompt = FIRST + first + [2, 7]
    scheduler.add("2", SeqRequest(prompt, SamplingParams(), 30))
    second = finished(drain(scheduler)["2"])
    assert second.cached_tokens == held(one)
    assert second.token_ids == generate(Chain([target], []), prompt, SamplingParams(), 30).token_ids


def test_capacity_zero_keeps_nothing_and_unrelated_prompts_take_nothing():
    target, mid, small = models()
    chain = Chain([small, target], [3])
    scheduler = BatchScheduler(lambda r: chain, max_batch=2, prefix_cache=PrefixCache(0))
    scheduler.add("1", SeqRequest(FIRST, SamplingParams(), 10))
    drain(scheduler)
    assert target.live_sequences == small.live_sequences == 0
    cache = PrefixCache(3)
    scheduler = BatchScheduler(lambda r: chain, max_batch=2, prefix_cache=cache)
    scheduler.add("1", SeqRequest(FIRST, SamplingParams(), 10))
    drain(scheduler)
    scheduler.add("2", SeqRequest([VOCAB - 2] + FIRST, SamplingParams(), 10))
    assert finished(drain(scheduler)["2"]).cached_tokens == 0
    assert cache.stats.queries == 2 * len(FIRST) + 1 and cache.stats.hits == 0 and len(cache) == 2


@pytest.mark.parametrize("capacity", [-1, 1.5, True, "4", None])
def test_a_capacity_that_is_not_a_count_is_refused(capacity):
    with pytest.raises(InvalidParameterError, match=r"the prefix cache's capacity must be an integer >= 0 "
                                                    r"\(sequences kept\), got " + repr(capacity).replace(".", r"\.")):
        PrefixCache(capacity)


def test_of_two_sequences_holding_the_same_only_one_is_kept():
    """Two requests of one prompt run together (neither could resume from the other): the
    second to finish covers the first, which gives way."""
    target, mid, small = models()
    chain = Chain([small, target], [3])
    cache = PrefixCache(4)
    scheduler = BatchScheduler(lambda r: chain, max_batch=2, prefix_cache=cache)
    scheduler.add("1", SeqRequest(FIRST, SamplingParams(), 10))
    scheduler.add("2", SeqRequest(FIRST, SamplingParams(), 10))
    events = drain(scheduler)
    assert finished(events["1"]).token_ids == finished(events["2"]).token_ids
    assert len(cache) == 1 and cache.stats.kept == 2 and cache.stats.hits == 0
    assert target.live_sequences == small.live_sequences == 1


def test_a_request_resumes_only_from_caches_its_own_partition_left():
    """Kept states of another partition give nothing, however much they hold (timing tells a
    tenant nothing of another's prompts), and do not give way to one that covers them."""
    target, mid, small = models()
    chain = Chain([small, target], [3])
    cache = PrefixCache(4)
    scheduler = BatchScheduler(lambda r: chain, max_batch=2, prefix_cache=cache)
    check = books(scheduler, chain)

    def run(rid: str, partition: str) -> tuple[list[int], int]:
        scheduler.add(rid, SeqRequest(FIRST, SamplingParams(), 10, cache_partition=partition))
        result = finished(drain(scheduler, check=check)[rid])
        return result.token_ids, result.cached_tokens

    tokens, cached = run("a", "tenant a")
    assert cached == 0
    assert run("b", "tenant b") == (tokens, 0)  # the same prompt, another partition
    assert run("c", "") == (tokens, 0)
    assert len(cache) == 3  # each covers the others, but only within a partition does one replace another
    assert run("a again", "tenant a") == (tokens, len(FIRST) - 1)  # all but the token it must feed
    assert run("b again", "tenant b") == (tokens, len(FIRST) - 1)
    assert len(cache) == 3 and cache.stats.hits == 2 * (len(FIRST) - 1) and cache.stats.evicted == 2
    scheduler.close()
    assert target.live_sequences == small.live_sequences == 0

"""The state manager keeps every model's KV equal to what its books say, rolls back
exactly the rejected positions and catches up lazily."""

import numpy as np
import pytest

from specrouter.drafters.ngram import NgramDrafter
from specrouter.backends.synthetic import SyntheticBackend
from specrouter.cascade.chain import Chain, CycleRunner
from specrouter.cascade.sampling import SamplingParams
from specrouter.engine.request import SequenceRun
from specrouter.state import SequenceState, common_prefix


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0
    # Long contexts go by bisection over slices: the same answer as a position-by-position scan,
    # wherever the mismatch lies, for lists and tuples alike.
    rng = np.random.default_rng(0)
    for _ in range(500):
        a = rng.integers(0, 3, int(rng.integers(0, 400))).tolist()
        b = a[: int(rng.integers(0, len(a) + 1))] + rng.integers(0, 3, int(rng.integers(0, 60))).tolist()
        scan = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        assert common_prefix(a, b) == common_prefix(tuple(b), a) == scan


def test_evaluate_feeds_only_unseen_tokens_and_rolls_back_divergent_ones():
    model = SyntheticBackend("m", vocab=8)
    state = SequenceState()
    state.evaluate(model, [1, 2, 3, 4], 1)
    assert model.decoded_tokens == 4
    state.evaluate(model, [1, 2, 3, 4, 5, 6], 2)  # catch-up of 2 tokens only
    assert model.decoded_tokens == 6
    state.evaluate(model, [1, 2, 3, 4, 5, 6], 3)  # logits of 4 are not stored: 4.. is re-fed
    assert model.decoded_tokens == 9
    state.evaluate(model, [1, 2, 3, 7], 1)  # positions 3.. were rejected: only 7 is fed
    assert model.decoded_tokens == 10
    assert model.kv_tokens(0) == [1, 2, 3, 7] == state.cached_tokens(model)


def test_evaluate_re_feeds_last_token_when_cache_already_holds_everything():
    model = SyntheticBackend("m", vocab=8)
    state = SequenceState()
    state.evaluate(model, [1, 2, 3], 1)
    logits = state.evaluate(model, [1, 2, 3], 1)
    np.testing.assert_array_equal(logits[0], model.logits_for([1, 2, 3]))
    assert model.kv_tokens(0) == [1, 2, 3]


def test_rollback_to_committed_drops_every_rejected_position():
    a, b = SyntheticBackend("a", vocab=8), SyntheticBackend("b", vocab=8)
    state = SequenceState()
    state.evaluate(a, [1, 2, 3, 4, 5], 1)
    state.evaluate(b, [1, 2, 6], 1)
    state.rollback_to([1, 2, 3, 9])
    assert a.kv_tokens(0) == [1, 2, 3]
    assert b.kv_tokens(0) == [1, 2]
    assert state.committed_length(a, [1, 2, 3, 9]) == 3


def test_random_cycles_keep_every_cache_a_prefix_of_the_committed_tokens():
    """After any sequence of accept/reject cycles, each model's KV holds committed tokens only,
    and its next-token logits equal a fresh model's fed the committed tokens."""
    models = [SyntheticBackend(f"m{i}", vocab=5, model_seed=i, noise=0.5 * i) for i in range(3, 0, -1)]
    target = SyntheticBackend("t", vocab=5)
    chain = Chain([*models, target], [3, 2, 2])
    state = SequenceState()
    runner = CycleRunner(chain, state, SamplingParams(temperature=1.0), np.random.default_rng(7))
    context = [0, 1, 2]
    for _ in range(40):
        context += runner.cycle(context, 16)
        state.rollback_to(context)
        for model in chain.models:
            cached = model.kv_tokens(0)
            assert cached == context[: len(cached)]
    for model in chain.models:
        fresh = SyntheticBackend(model.name, vocab=5, model_seed=model.model_seed, noise=model.noise)
        np.testing.assert_array_equal(
            state.evaluate(model, context, 1)[0], fresh.decode(fresh.new_sequence(), context, 0, 1)[0]
        )
    total = sum(s.proposed for s in runner.stats[:-1])
    assert total > 0 and any(s.accepted < s.proposed for s in runner.stats[:-1])  # rejections did happen


def test_release_frees_every_slot():
    model = SyntheticBackend("m", vocab=8)
    state = SequenceState()
    state.evaluate(model, [1, 2], 1)
    state.release()
    assert model._kv == {}


def test_a_model_that_sat_out_catches_up_on_unseen_tokens_only():
    """Switching chains between cycles: the returning model feeds only what it missed."""
    target = SyntheticBackend("t", vocab=6)
    small = SyntheticBackend("s", vocab=6, model_seed=2, noise=0.3)
    mid = SyntheticBackend("m", vocab=6, model_seed=3, noise=0.3)
    state = SequenceState()
    params, rng = SamplingParams(), np.random.default_rng(0)
    with_small = CycleRunner(Chain([small, target], [3]), state, params, rng)
    with_mid = CycleRunner(Chain([mid, target], [3]), state, params, rng)
    context = [1, 2, 3, 4]
    for _ in range(3):
        context += with_small.cycle(context, 50)
        state.rollback_to(context)
    seen_by_small = state.committed_length(small, context)
    fed_before = small.decoded_tokens
    for _ in range(4):
        context += with_mid.cycle(context, 50)
        state.rollback_to(context)
    assert small.decoded_tokens == fed_before  # it sat out
    missed = len(context) - seen_by_small
    with_small.cycle(context, 50)
    # First draft forward = the missed tokens; then one token per further draft step (k = 3).
    assert small.decoded_tokens - fed_before == missed + 2
    assert small.kv_tokens(0)[: len(context)] == context


def test_prepare_removes_everything_from_a_mismatch_deeper_than_the_logits_window():
    """The cache diverges 6 positions before the rows asked for: every position from the first
    mismatch on is removed and re-fed (a prepare that kept the mismatching token would leave a
    wrong token inside the context, invisible to an order-2 model's logits)."""
    model = SyntheticBackend("m", vocab=8)
    state = SequenceState()
    state.evaluate(model, [1, 2, 3, 4, 5, 6, 7], 1)
    state.evaluate(model, [1, 2, 7, 7, 7, 7, 7, 7], 1)
    assert model.kv_tokens(state.slot(model)) == [1, 2, 7, 7, 7, 7, 7, 7] == state.cached_tokens(model)
    assert model.decoded_tokens == 7 + 6


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.9)], ids=["greedy", "sampled"])
def test_after_every_cycle_each_cache_is_a_prefix_of_the_committed_tokens(params):
    """The KV promise, checked against the committed tokens (not the books, which a missing
    rollback leaves stale too), after every end_cycle of a request."""
    target = SyntheticBackend("t", vocab=6, eos_id=5)
    mid = SyntheticBackend("mid", vocab=6, model_seed=2, noise=0.8, eos_id=5)
    small = SyntheticBackend("small", vocab=6, model_seed=3, noise=1.5, eos_id=5)
    chain = Chain([NgramDrafter(max_ngram=2), small, mid, target], [3, 3, 4])
    rejections = 0
    for seed in range(6):
        run = SequenceRun(chain, [1, 2, 3, 1, 2], params, 40, rng=np.random.default_rng(seed))
        while (runner := run.start_cycle()) is not None:
            run.end_cycle(runner.cycle(run.context, run.room))
            if run.finished:
                break
            for model in chain.models:
                cached = model.kv_tokens(run.state.slot(model))
                assert cached == run.context[: len(cached)], f"{model.name} holds uncommitted tokens"
        run.release()
        rejections += sum(s.proposed - s.accepted for s in run.stats.values())
    assert rejections > 0

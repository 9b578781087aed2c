"""The chunked-prefill policy on its own: which forwards run whole, which feed a chunk, and
how the chunk size follows the measured times (engine/prefill.py)."""

import pytest

from specrouter.engine.prefill import FIRST_CHUNK, STARVE_STEPS, WAIT, ChunkedPrefill
from specrouter.errors import InvalidParameterError

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
    # As many prompts as streams: chunked again, sized on the 10 ms calls (goal 20 ms: a 4-token
    # chunk taking 14 ms grows to ceil(4 x sqrt(20 / 14)) = 5; on a 5 s average it would double).
    assert policy.plan([(T, 0), (T, 500)]) == [0, FIRST_CHUNK] and policy.calls == 0
    policy.timed(T, 0.010 + 0.001 * FIRST_CHUNK, whole=1, chunk_tokens=FIRST_CHUNK)
    assert policy.size(T) == 5


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

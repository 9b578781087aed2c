"""Several sequences in one llama_decode: each gets the logits it would get alone, and the
batch scheduler gives each request the greedy output it would get alone."""

import numpy as np
import pytest

from specrouter.cascade.sampling import SamplingParams
from specrouter.engine import generate
from specrouter.engine.batch import BatchScheduler, Failed, Finished, SeqRequest
from specrouter.router import auto_router

from .conftest import REFERENCE_TOKENS, SMALL, TARGET
from .greedy_check import assert_outputs_match
from .turns import resumable, two_turns

# Different batch shapes take different kernels (see test_rollback_real): same tolerance.
MEAN_TOL, MAX_TOL = 0.15, 1.0


def close(a, b):
    assert a.shape == b.shape
    d = np.abs(a - b)
    assert d.mean() < MEAN_TOL and d.max() < MAX_TOL, (d.mean(), d.max())
    assert (a.argmax(axis=1) == b.argmax(axis=1)).all()


def test_decode_batch_matches_sequences_decoded_alone(pool):
    model = pool.level(SMALL)
    texts = ["def add(a, b):\n    return", "The capital of France is", "for i in range(10):\n   "]
    runs = [model.tokenize(t) for t in texts]
    seqs = [model.new_sequence() for _ in runs]
    try:
        # Different positions and logits counts per sequence, after a shared-prefix-free start.
        alone = []
        for seq, toks in zip(seqs, runs):
            alone.append(model.decode(seq, toks, 0, 3))
            model.remove(seq, 0)
        together = model.decode_batch([(seq, toks, 0, 3) for seq, toks in zip(seqs, runs)])
        for a, b in zip(alone, together):
            close(a, b)
        # Removing one sequence's tail leaves the others intact.
        model.remove(seqs[0], 2)
        close(model.decode(seqs[0], runs[0][2:], 2, 3), alone[0])
        extended = model.decode(seqs[1], [11], len(runs[1]), 1)
        fresh = model.new_sequence()
        seqs.append(fresh)
        close(extended, model.decode(fresh, runs[1] + [11], 0, 1))
    finally:
        for seq in seqs:
            model.free_sequence(seq)


@pytest.mark.parametrize("speculation", ["0.5b -> 1.5b", "auto"])
def test_batched_greedy_matches_each_sequence_alone(pool, references, speculation):
    """The 8 reference prompts through the batch scheduler, 4 at a time, with different
    lengths, half of them joining after others have started: every output equals the
    target alone's (near-tie rule), and every KV slot is free afterwards."""
    target = pool.level(TARGET)
    if speculation == "auto":
        router = auto_router(pool, TARGET, [SMALL, TARGET], progress=False)
        plan = lambda r: router.session()  # noqa: E731
    else:
        chain = pool.chain([SMALL, TARGET], [3])
        plan = lambda r: chain  # noqa: E731
    scheduler = BatchScheduler(plan, max_batch=4)
    ids = list(references)
    lengths = {pid: REFERENCE_TOKENS - 7 * (i % 4) for i, pid in enumerate(ids)}
    outputs, step = {}, 0
    while len(outputs) < len(ids):
        if step in (0, 6):
            for pid in ids[:4] if step == 0 else ids[4:]:
                scheduler.add(pid, SeqRequest(references[pid][0], SamplingParams(), lengths[pid]))
        for event in scheduler.step():
            assert not isinstance(event, Failed), event.error
            if isinstance(event, Finished):
                outputs[event.request_id] = event.result.token_ids
        step += 1
    assert max(max(s) for s in scheduler.batch_sizes.values()) > 1  # really batched
    assert_outputs_match(target, references, outputs, f"batched {speculation}")
    for model in (pool.level(SMALL), target):
        assert len(model._free_slots) == model.n_seq_max  # nothing leaked


def test_a_request_continuing_an_answer_resumes_from_the_prefix_cache(pool, references):
    """Turn 2 (turn 1's prompt and answer: a "continue" request) takes every position turn 1's
    caches held, in both models of the chain (llama.cpp shares the cells), two conversations
    at a time; both turns write the target alone's text cold (near-tie rule: the shared cells
    were computed by forwards of other sizes), and every slot is free once the cache is
    closed. A new instruction after a truncated answer would open 3-4-way ties at its first
    tokens (seen: four tokens within 0.15), which the near-tie rule can only count; exact
    mode (test_exact_real.py) checks a follow-up instruction bit for bit."""
    target = pool.level(TARGET)
    chain = pool.chain([SMALL, TARGET], [3])
    turns = two_turns(lambda r: chain, [(pid, ref[0]) for pid, ref in references.items()], [], REFERENCE_TOKENS)
    assert {pid: second.cached_tokens for pid, (_, _, second) in turns.items()} == \
        {pid: resumable(first, prompt) for pid, (first, prompt, _) in turns.items()}
    alone = pool.chain([TARGET])
    cold = {pid: (prompt, generate(alone, prompt, SamplingParams(), REFERENCE_TOKENS).token_ids)
            for pid, (_, prompt, _) in turns.items()}
    assert_outputs_match(target, references, {pid: t[0].token_ids for pid, t in turns.items()}, "turn 1")
    assert_outputs_match(target, cold, {pid: t[2].token_ids for pid, t in turns.items()}, "turn 2, resumed")
    for model in (pool.level(SMALL), target):
        assert len(model._free_slots) == model.n_seq_max  # the cache released what it kept

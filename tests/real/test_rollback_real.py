"""Rollback on llama.cpp is exact: after random accept/reject cycles, every model's
next-token logits equal those of a fresh instance fed the committed tokens.

The fresh instance evaluates the context in one batch while the cycled one saw it in
pieces of many sizes, and llama.cpp's batched kernels differ from its single-token
ones: measured here, the logits then differ by about 0.06 on average (0.4 at most)
over the vocabulary. One stale token left in the cache moves them by about 0.3 on
average (2.5 at most). The tolerances sit between the two, and the test shows the
stale case fails them.
"""

import llama_cpp
import numpy as np

from specrouter.backends.llamacpp import LlamaCppBackend
from specrouter.cascade.chain import CycleRunner
from specrouter.cascade.sampling import SamplingParams
from specrouter.state import SequenceState

from .conftest import SMALL, TARGET

MEAN_TOL = 0.15  # mean absolute logit difference over the vocabulary
MAX_TOL = 1.0  # largest absolute logit difference


def within_tolerance(a: np.ndarray, b: np.ndarray) -> bool:
    d = np.abs(a - b)
    return float(d.mean()) < MEAN_TOL and float(d.max()) < MAX_TOL


def test_random_cycles_then_fresh_instance_agrees(pool):
    chain = pool.chain(["ngram", SMALL, TARGET], [3, 3])
    context = chain.target.tokenize("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n")
    state = SequenceState()
    runner = CycleRunner(chain, state, SamplingParams(temperature=1.0), np.random.default_rng(3))
    try:
        for _ in range(12):
            context += runner.cycle(context, 32)
            state.rollback_to(context)
            for model in chain.models:
                cached = state.cached_tokens(model)
                assert cached == context[: len(cached)]
        rejected = sum(s.proposed - s.accepted for s in runner.stats[:-1])
        assert rejected > 0, "the run must have rolled something back"
        for model in chain.models:
            got = state.evaluate(model, context, 1)[0]
            fresh = LlamaCppBackend(model.path, n_ctx=2048, n_seq_max=1)
            try:
                seq = fresh.new_sequence()
                want = fresh.decode(seq, context, 0, 1)[0]
                fresh.remove(seq, 0)
                # Negative control: one stale token left behind must break the tolerance.
                stale = fresh.decode(seq, context[:-1] + [context[-2]] + context[-1:], 0, 1)[0]
            finally:
                fresh.close()
            assert within_tolerance(got, want), (
                f"{model.name}: logits after rollback differ from a fresh instance: "
                f"mean {np.abs(got - want).mean():.4f}, max {np.abs(got - want).max():.4f}"
            )
            assert int(np.argmax(got)) == int(np.argmax(want))
            assert not within_tolerance(stale, want), f"{model.name}: the tolerance cannot see a stale token"
    finally:
        state.release()


def test_remove_then_refeed_in_the_same_pieces_is_bit_exact(pool):
    model = pool.level(SMALL)
    tokens = model.tokenize("The quick brown fox jumps over the lazy dog.")
    seq = model.new_sequence()
    try:
        first = model.decode(seq, tokens, 0, 3)
        model.remove(seq, len(tokens) - 5)
        again = model.decode(seq, tokens[-5:], len(tokens) - 5, 3)
        model.remove(seq, 0)
        whole = model.decode(seq, tokens, 0, 3)
        np.testing.assert_array_equal(first, whole)
        # Re-fed as a 5-token piece on top of the kept prefix: same positions, other batch shape.
        assert within_tolerance(first, again)
    finally:
        model.free_sequence(seq)


def test_a_shared_prefix_outlives_its_source_bit_for_bit(pool):
    """share_prefix tags src's cells with dst (n > 1 choices share the prompt's KV): what dst
    computes on them is the same before and after src rolls back and is freed, bit for bit
    (one shared cell lost would change it), and within the tolerance of dst's own prefill."""
    model = pool.level(SMALL)
    tokens = model.tokenize("The quick brown fox jumps over the lazy dog. It was not amused.")
    src, dst, own = model.new_sequence(), model.new_sequence(), model.new_sequence()
    try:
        model.decode(src, tokens, 0, 1)
        assert model.share_prefix(src, dst, len(tokens) - 4)
        before = model.decode(dst, tokens[-4:], len(tokens) - 4, 4)
        model.remove(dst, len(tokens) - 4)
        model.remove(src, 3)
        model.free_sequence(src)
        src = None
        after = model.decode(dst, tokens[-4:], len(tokens) - 4, 4)
        np.testing.assert_array_equal(before, after)
        model.decode(own, tokens[:-4], 0, 1)
        assert within_tolerance(after, model.decode(own, tokens[-4:], len(tokens) - 4, 4))
    finally:
        for seq in (src, dst, own):
            if seq is not None:
                model.free_sequence(seq)


def test_a_saved_sequence_restores_its_cells_bit_for_bit(pool):
    """save copies a sequence's KV out of the unified cache and restore puts it back into
    another sequence: what that one computes next equals what the saved sequence computed
    before it left, bit for bit (a lost or moved cell would change it); a restore of a
    prefix holds exactly that prefix."""
    model = pool.level(SMALL)
    tokens = model.tokenize("The quick brown fox jumps over the lazy dog. It was not amused.")
    seqs = [model.new_sequence()]
    try:
        model.decode(seqs[0], tokens[:-4], 0, 1)
        before = model.decode(seqs[0], tokens[-4:], len(tokens) - 4, 4)
        model.remove(seqs[0], len(tokens) - 4)
        saved = model.save(seqs[0])
        assert saved is not None and saved.n_tokens == len(tokens) - 4
        model.free_sequence(seqs.pop())
        seqs.append(model.new_sequence())
        assert model.restore(saved, seqs[0], len(tokens) - 4)
        np.testing.assert_array_equal(model.decode(seqs[0], tokens[-4:], len(tokens) - 4, 4), before)
        seqs.append(model.new_sequence())
        assert model.restore(saved, seqs[1], 5)
        assert llama_cpp.llama_memory_seq_pos_max(model._mem, seqs[1]) == 4
    finally:
        for seq in seqs:
            model.free_sequence(seq)

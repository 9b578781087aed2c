"""Several sequences in one llama_decode: each gets the logits it would get alone."""

import numpy as np

from .conftest import SMALL

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

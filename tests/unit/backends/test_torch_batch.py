"""TorchBackend.decode_batch: one padded forward over several sequences gives each the
logits and the KV cache that decode() alone would (tiny random Qwen2 models, see
test_torch_backend.py for the tolerance)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from specrouter.drafters.ngram import NgramDrafter  # noqa: E402
from specrouter.cascade.chain import Chain  # noqa: E402
from specrouter.cascade.sampling import SamplingParams  # noqa: E402
from specrouter.engine import generate  # noqa: E402
from specrouter.engine.batch import BatchScheduler, Finished, SeqRequest  # noqa: E402
from specrouter.errors import BackendError  # noqa: E402

from ..tiny_torch import full_forward_logits, host_backend  # noqa: E402

ATOL = 1e-4

# (past, run, n_logits) per sequence: pasts of different lengths (one empty), runs of
# different lengths, a catch-up head on some (n_logits < len(run)).
CASES = [([], [1, 2, 3], 2), ([4, 5, 0, 1, 2], [3], 1), ([5, 5], [0, 1, 2, 3, 4], 5)]


@pytest.fixture(scope="module", params=["eager", "static"])
def model(request):
    return host_backend(11, runtime=request.param)


def _prefill(m, pasts):
    seqs = [m.new_sequence() for _ in pasts]
    for seq, past in zip(seqs, pasts):
        if past:
            m.decode(seq, past, 0, 1)
    return seqs


def _free(m, seqs):
    for seq in seqs:
        m.free_sequence(seq)


def test_backend_batches_natively(model):
    assert model.batches_natively


def test_decode_batch_equals_decode_per_sequence(model):
    seqs = _prefill(model, [p for p, _, _ in CASES])
    ref = _prefill(model, [p for p, _, _ in CASES][:1])  # a spare slot for the per-sequence reference
    try:
        got = model.decode_batch([(s, run, len(past), n) for s, (past, run, n) in zip(seqs, CASES)])
        assert len(got) == len(CASES)
        for s, out, (past, run, n) in zip(seqs, got, CASES):
            assert out.shape == (n, model.n_vocab) and out.dtype == np.float32
            model.remove(ref[0], 0)
            want = model.decode(ref[0], past + run, 0, n)
            np.testing.assert_allclose(out, want, atol=ATOL)
            assert model.kv_length(s) == len(past) + len(run)
            if model.runtime == "eager":  # a DynamicCache keeps no padded batch rows
                assert all(layer.keys.shape[0] == 1 for layer in model._kv._caches[s].layers)
        # Each cache is exactly decode()'s: continuing it equals a fresh sequence fed everything.
        for s, (past, run, _) in zip(seqs, CASES):
            context = past + run + [2, 4]
            cont = model.decode(s, [2, 4], len(past) + len(run), 2)
            model.remove(ref[0], 0)
            np.testing.assert_allclose(cont, model.decode(ref[0], context, 0, 2), atol=ATOL)
            np.testing.assert_allclose(cont[-1], full_forward_logits(model, context).numpy(), atol=ATOL)
    finally:
        _free(model, seqs + ref)


def test_remove_after_a_batched_call_rolls_back_exactly(model):
    seqs = _prefill(model, [[1, 2, 3], [4], []])
    try:
        model.decode_batch([(seqs[0], [4, 5, 0], 3, 3), (seqs[1], [1, 1], 1, 1), (seqs[2], [2, 3, 4, 5], 0, 2)])
        model.remove(seqs[0], 4)  # keep one of the batched tokens
        model.remove(seqs[1], 1)  # drop all of them
        model.remove(seqs[2], 0)  # drop everything
        assert [model.kv_length(s) for s in seqs] == [4, 1, 0]
        got = model.decode_batch([(seqs[0], [3], 4, 1), (seqs[1], [0, 5], 1, 2), (seqs[2], [1], 0, 1)])
        for out, context in zip(got, ([1, 2, 3, 4, 3], [4, 0, 5], [1])):
            np.testing.assert_allclose(out[-1], full_forward_logits(model, context).numpy(), atol=ATOL)
        np.testing.assert_allclose(got[1][0], full_forward_logits(model, [4, 0]).numpy(), atol=ATOL)
    finally:
        _free(model, seqs)


def test_a_failing_batch_leaves_every_cache_as_it_was(model, monkeypatch):
    seqs = _prefill(model, [[1, 2], [3]])
    try:
        def boom(*args, **kwargs):
            raise RuntimeError("simulated failure in layer 1")

        # The MLP: the static runtime calls a layer's modules, not the layer's forward.
        monkeypatch.setattr(model._model.model.layers[1].mlp, "forward", boom)
        with pytest.raises(RuntimeError, match="simulated"):  # seqs[1] has a catch-up head fed first
            model.decode_batch([(seqs[0], [4], 2, 1), (seqs[1], [5, 0, 1], 1, 1)])
        monkeypatch.undo()
        assert [model.kv_length(s) for s in seqs] == [2, 1]
        got = model.decode_batch([(seqs[0], [4], 2, 1), (seqs[1], [5, 0, 1], 1, 1)])
        np.testing.assert_allclose(got[1][0], full_forward_logits(model, [3, 5, 0, 1]).numpy(), atol=ATOL)
    finally:
        _free(model, seqs)


def test_bad_batches_are_refused(model):
    seqs = _prefill(model, [[1], []])
    try:
        with pytest.raises(ValueError, match="once"):
            model.decode_batch([(seqs[0], [1], 1, 1), (seqs[0], [2], 1, 1)])
        with pytest.raises(BackendError, match="holds 1 positions"):
            model.decode_batch([(seqs[0], [1], 0, 1), (seqs[1], [2], 0, 1)])
        assert [model.kv_length(s) for s in seqs] == [1, 0]  # nothing was fed
        assert model.decode_batch([]) == []
    finally:
        _free(model, seqs)


@pytest.mark.parametrize("dtype, tol", [("bfloat16", 0.125), ("float16", 0.02)])
def test_half_precision_batch_is_close_to_decode(dtype, tol):
    """Compared with decode() in the same dtype: other matrix shapes round differently
    (measured: bf16 0.03, fp16 0.005 at most), while bf16 itself sits up to 0.26 from
    float32 on these contexts, so float32 is not the reference here."""
    m = host_backend(5, dtype=dtype)
    seqs = _prefill(m, [p for p, _, _ in CASES])
    got = m.decode_batch([(s, run, len(past), n) for s, (past, run, n) in zip(seqs, CASES)])
    _free(m, seqs)
    ref = m.new_sequence()
    for out, (past, run, n) in zip(got, CASES):
        m.remove(ref, 0)
        np.testing.assert_allclose(out, m.decode(ref, past + run, 0, n), atol=tol)


@pytest.mark.parametrize("runtime", ["eager", "static"])
def test_batch_scheduler_with_torch_chains_equals_generate_alone(runtime):
    """Greedy: every request gets the target's own output, with real multi-sequence calls."""
    target = host_backend(31, runtime=runtime)
    prompts, lengths = [[0, 1, 2], [3, 4], [5, 0, 1, 2, 3], [2, 2]], [20, 9, 25, 14]
    alone = [generate(Chain([target], []), p, SamplingParams(), n).token_ids for p, n in zip(prompts, lengths)]
    chain = Chain([NgramDrafter(max_ngram=2), host_backend(32, runtime=runtime), host_backend(33, runtime=runtime),
                   target], [2, 3, 3])
    scheduler = BatchScheduler(lambda r: chain, max_batch=4)
    for i, (p, n) in enumerate(zip(prompts, lengths)):
        scheduler.add(str(i), SeqRequest(p, SamplingParams(), n))
    results = {}
    while scheduler.n_active or scheduler.n_waiting:
        for e in scheduler.step():
            assert not hasattr(e, "error"), e
            if isinstance(e, Finished):
                results[e.request_id] = e.result.token_ids
    assert [results[str(i)] for i in range(len(prompts))] == alone
    assert max(scheduler.batch_sizes[target.name]) > 1  # the target really served several at once


def test_a_shared_prefix_gives_the_logits_of_its_own_prefill_and_outlives_the_source(model):
    """share_prefix copies src's first n positions into an empty dst: dst then continues as if it
    had prefilled them itself, and a later remove() or free of src leaves it whole."""
    tokens = [1, 2, 3, 4, 5, 0, 1, 2]
    src, dst, own = model.new_sequence(), model.new_sequence(), model.new_sequence()
    try:
        model.decode(src, tokens, 0, 1)
        assert model.share_prefix(src, dst, 5)
        model.remove(src, 2)
        model.free_sequence(src)
        shared = model.decode(dst, tokens[5:], 5, 3)
        model.decode(own, tokens[:5], 0, 1)
        alone = model.decode(own, tokens[5:], 5, 3)
        np.testing.assert_allclose(shared, alone, atol=ATOL)
        np.testing.assert_allclose(shared[-1], full_forward_logits(model, tokens).numpy(), atol=ATOL)
    finally:
        for seq in (dst, own):
            model.free_sequence(seq)

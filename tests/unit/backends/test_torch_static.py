"""The static torch runtime (backends/torch_static.py) against the eager one, on tiny random
Qwen2 models with the same weights.

Tolerance: float32; the two runtimes compute the same forward with other kernels (their own
attention over a preallocated cache against transformers' over a grown one, padded buckets
against exact shapes): logits agree to about 1e-6 here. ATOL = 1e-4 is far below what one
stale or missing KV position does to these models (0.1 to 1: test_torch.py's controls).
On CUDA (SPECROUTER_TEST_DEVICE=cuda) the static runtime replays CUDA graphs, and the same
tests check them.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from specrouter.backends.torch import TorchBackend  # noqa: E402
from specrouter.backends.torch_static import Bucket, bucket_for  # noqa: E402
from specrouter.errors import BackendError, InvalidParameterError, ModelFileError  # noqa: E402

from ..tiny_torch import host_backend, tiny_model, tiny_tokenizer  # noqa: E402

ATOL = 1e-4
VOCAB = 6


def pair(seed: int = 21, n_seq_max: int = 4):
    """The eager and the static runtime over models of the same weights."""
    return (host_backend(seed, runtime="eager", n_seq_max=n_seq_max),
            host_backend(seed, runtime="static", n_seq_max=n_seq_max))


def test_buckets_round_each_dimension_up_and_give_up_beyond_the_largest():
    assert bucket_for(1, 1, 5, 1, 512) == Bucket(1, 1, 128, 1)
    assert bucket_for(3, 5, 129, 5, 512) == Bucket(4, 8, 256, 8)
    assert bucket_for(3, 17, 300, 1, 512) == Bucket(4, 32, 512, 1)
    assert bucket_for(2, 17, 600, 3, 1000) == Bucket(2, 32, 1000, 4)  # the context capped at n_ctx
    assert bucket_for(1, 64, 64, 64, 512) == Bucket(1, 64, 128, 64)
    assert bucket_for(1, 65, 65, 1, 512) == Bucket(1, 65, 65, 1, graphed=False)
    assert bucket_for(33, 1, 10, 1, 512) == Bucket(33, 1, 10, 1, graphed=False)


def test_random_blocks_rollbacks_and_catch_ups_give_the_eager_logits():
    eager, static = pair()
    rng = np.random.default_rng(5)
    seqs = {m: [m.new_sequence(), m.new_sequence()] for m in (eager, static)}
    held = [0, 0]
    for step in range(40):
        which = int(rng.integers(2))
        if held[which] and rng.random() < 0.3:  # roll back, to any earlier position
            cut = int(rng.integers(held[which]))
            for m in (eager, static):
                m.remove(seqs[m][which], cut)
            held[which] = cut
        size = int(rng.choice([1, 3, 7, 17, 70])) if step else 90  # 70, 90: beyond the token buckets
        tokens = [int(t) for t in rng.integers(VOCAB, size=size)]
        n_logits = int(rng.integers(1, size + 1))
        rows = [m.decode(seqs[m][which], tokens, held[which], n_logits) for m in (eager, static)]
        np.testing.assert_allclose(rows[1], rows[0], atol=ATOL)
        held[which] += size
        assert [m.kv_length(seqs[m][which]) for m in (eager, static)] == [held[which]] * 2


def test_a_batch_of_sequences_of_different_lengths_and_slots_gives_the_eager_logits():
    eager, static = pair(n_seq_max=5)
    pasts = [[], [1, 2, 3, 4, 5, 0, 1], [2] * 40, [3, 1]]
    runs = [([1, 2, 3], 2), ([4], 1), ([0, 1, 2, 3, 4, 5, 0, 1, 2], 9), ([5, 5], 1)]
    out = []
    for m in (eager, static):
        spare = m.new_sequence()  # the batch's slots are 1..4, not 0..3
        seqs = [m.new_sequence() for _ in pasts]
        for seq, past in zip(seqs, pasts):
            if past:
                m.decode(seq, past, 0, 1)
        out.append(m.decode_batch([(s, run, len(p), n) for s, p, (run, n) in zip(seqs, pasts, runs)]))
        m.free_sequence(spare)
    for got, want in zip(out[1], out[0]):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=ATOL)


def test_a_reused_slot_holds_nothing_of_its_last_sequence():
    eager, static = pair(n_seq_max=1)
    seq = static.new_sequence()
    static.decode(seq, [1, 2, 3, 4, 5] * 8, 0, 1)
    static.remove(seq, 10)  # cells 10..39 now stale: freeing must clear them too
    static.free_sequence(seq)
    kv = static._kv
    assert all(not cache[seq].any() for cache in (*kv.keys, *kv.values))
    again = static.new_sequence()
    assert again == seq and static.kv_length(again) == 0
    ref = eager.new_sequence()
    np.testing.assert_allclose(static.decode(again, [0, 2], 0, 2), eager.decode(ref, [0, 2], 0, 2), atol=ATOL)


def test_stale_cells_after_a_rollback_are_never_attended():
    eager, static = pair()
    a, b = eager.new_sequence(), static.new_sequence()
    for m, s in ((eager, a), (static, b)):
        m.decode(s, [5, 4, 3, 2, 1, 0] * 5, 0, 1)
        m.remove(s, 6)  # 24 stale cells stay in the static slot
    np.testing.assert_allclose(static.decode(b, [1], 6, 1), eager.decode(a, [1], 6, 1), atol=ATOL)


def test_a_shared_prefix_is_copied_and_outlives_its_source():
    eager, static = pair()
    rows = []
    for m in (eager, static):
        src, dst = m.new_sequence(), m.new_sequence()
        m.decode(src, [1, 2, 3, 4, 5, 0], 0, 1)
        assert m.share_prefix(src, dst, 4)
        m.free_sequence(src)
        assert m.kv_length(dst) == 4
        rows.append(m.decode(dst, [3, 3], 4, 2))
    np.testing.assert_allclose(rows[1], rows[0], atol=ATOL)


def test_a_context_beyond_the_static_cache_is_refused_before_any_forward():
    static = host_backend(21, runtime="static")
    assert static.n_ctx == 512  # the tiny model's max_position_embeddings
    seq = static.new_sequence()
    static.decode(seq, [1] * 500, 0, 1)
    with pytest.raises(BackendError, match=r"positions up to 513 exceed the context of 512"):
        static.decode(seq, [1] * 13, 500, 1)
    assert static.kv_length(seq) == 500


def test_more_sequences_than_the_largest_batch_bucket_run_unbucketed_with_one_warning(caplog):
    eager, static = pair(n_seq_max=34)
    out = []
    with caplog.at_level(logging.WARNING, logger="specrouter.backends.torch_static"):
        for m in (eager, static):
            seqs = [m.new_sequence() for _ in range(33)]
            items = [(s, [i % VOCAB, (i + 1) % VOCAB][: 1 + i % 2], 0, 1) for i, s in enumerate(seqs)]
            out.append(m.decode_batch(items))
            out.append(m.decode_batch([(s, [2], len(t), 1) for s, t, _, _ in items]))
    for got, want in zip(out[2] + out[3], out[0] + out[1]):
        np.testing.assert_allclose(got, want, atol=ATOL)
    warned = [r.getMessage() for r in caplog.records]
    assert warned == ["tiny21: 33 sequences in one forward exceed the largest batch bucket (32): such forwards "
                      "run at their own shape, without a graph"]


def test_a_model_the_static_runtime_cannot_compute_is_a_clear_error():
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1, sliding_window=None)
    model = MistralForCausalLM(config).eval()
    with pytest.raises(ModelFileError, match=r"^mistral: the static torch runtime computes llama, qwen2 models, "
                                             r"not 'mistral'; use --torch-runtime eager$"):
        TorchBackend.from_model(model, tiny_tokenizer(VOCAB), name="mistral", runtime="static")
    assert TorchBackend.from_model(model, tiny_tokenizer(VOCAB), name="mistral", runtime="eager").runtime == "eager"
    with pytest.raises(InvalidParameterError, match=r"^torch runtime 'graphs' is not one of eager, static$"):
        TorchBackend.from_model(model, tiny_tokenizer(VOCAB), runtime="graphs")


def test_the_runtime_is_part_of_the_timing_key_and_defaults_by_device():
    eager, static = pair()
    assert (eager.runtime, eager.timing_key().kernels) == ("eager", "default")
    assert (static.runtime, static.timing_key().kernels) == ("static", "static")
    from specrouter.backends.kv_runtime import default_runtime

    assert (default_runtime("cpu"), default_runtime("cuda"), default_runtime("cuda:1")) == ("eager", "static", "static")


def test_generate_serve_and_profile_take_the_runtime(tmp_path):
    """--torch-runtime reaches the pool's torch models (generate: the same greedy text with
    either runtime), the server config has the key, and a runtime that does not exist is
    refused by each command before any model loads."""
    from click.testing import CliRunner

    from specrouter.cli import main
    from specrouter.pool import Pool
    from specrouter.server.config import load_config

    folder = tmp_path / "tiny"
    tiny_model(41, vocab=8).save_pretrained(folder)
    tiny_tokenizer(VOCAB).save_pretrained(folder)
    texts = []
    for runtime in ("eager", "static"):
        run = CliRunner().invoke(main, ["generate", "--prompt", "abc", "--chain", f"ngram,{folder}",
                                        "--draft-lengths", "2", "--max-tokens", "12", "--json",
                                        "--torch-runtime", runtime])
        assert run.exit_code == 0, run.output
        texts.append(json.loads(run.stdout)["text"])
    assert texts[0] == texts[1] and texts[0]
    pool = Pool(torch_runtime="static")
    try:
        assert pool.model(str(folder)).runtime == "static"
    finally:
        pool.close()
    assert load_config(None, torch_runtime="static").torch_runtime == "static"
    assert load_config(None).torch_runtime is None
    for command in ("generate", "serve", "profile"):
        bad = CliRunner().invoke(main, [command, "--torch-runtime", "graphs"])
        assert bad.exit_code == 2 and "'graphs' is not one of 'eager', 'static'" in bad.output, bad.output

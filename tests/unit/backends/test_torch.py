"""The torch backend keeps the base.py contract exactly, on tiny random Qwen2 models.

Tolerance: float32 on the CPU. A run of k tokens on top of a cache and the same tokens
in one cache-less forward use other matrix shapes, so logits agree to about 1e-6 here,
not bit for bit; ATOL = 1e-4 sits far above that and far below what one stale or
missing KV position does to these models (differences of order 0.1 to 1, checked by
the negative controls below).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from specrouter.drafters.ngram import NgramDrafter  # noqa: E402
from specrouter.backends.synthetic import SyntheticBackend  # noqa: E402
from specrouter.backends.torch import TorchBackend, check_device, check_dtype_runs, dtype_name  # noqa: E402
from specrouter.cascade.chain import Chain, CycleRunner  # noqa: E402
from specrouter.cascade.sampling import SamplingParams  # noqa: E402
from specrouter.engine import generate  # noqa: E402
from specrouter.errors import BackendError, InvalidParameterError, ModelFileError  # noqa: E402
from specrouter.state import SequenceState  # noqa: E402

from ..tiny_torch import DEVICE, full_forward_logits, host_backend, tiny_model, tiny_tokenizer  # noqa: E402

ATOL = 1e-4
VOCAB = 6
#: A folder holding a Qwen2 config makes AutoTokenizer load a Qwen2Tokenizer, which adds
#: '<|endoftext|>' to the 6 letters: folder models get 8 logits so the 7 tokens fit.
FOLDER_VOCAB = 8


@pytest.fixture(scope="module", params=["eager", "static"])
def model(request):
    return host_backend(11, runtime=request.param)


def test_decode_returns_logits_of_the_last_n_positions(model):
    seq = model.new_sequence()
    try:
        tokens = [1, 2, 3, 4, 5, 0, 1]
        logits = model.decode(seq, tokens, 0, 3)
        assert logits.shape == (3, VOCAB) and logits.dtype == np.float32
        for i in range(3):  # row i predicts the token after tokens[-3 + i]
            want = full_forward_logits(model, tokens[: len(tokens) - 3 + i + 1]).numpy()
            np.testing.assert_allclose(logits[i], want, atol=ATOL)
        assert model.kv_length(seq) == len(tokens)
    finally:
        model.free_sequence(seq)


def test_decoding_in_pieces_equals_one_piece(model):
    tokens = [0, 1, 2, 3, 4, 5, 4, 3, 2, 1]
    a, b = model.new_sequence(), model.new_sequence()
    try:
        whole = model.decode(a, tokens, 0, 1)
        pos = 0
        for size in (3, 1, 4, 2):
            piece = model.decode(b, tokens[pos : pos + size], pos, 1)
            pos += size
        np.testing.assert_allclose(piece, whole, atol=ATOL)
    finally:
        model.free_sequence(a)
        model.free_sequence(b)


def test_remove_drops_exactly_the_positions_from_start(model):
    seq = model.new_sequence()
    try:
        model.decode(seq, [1, 2, 3, 4, 5], 0, 1)
        model.remove(seq, 3)
        assert model.kv_length(seq) == 3
        got = model.decode(seq, [0, 0], 3, 2)
        want = np.stack([full_forward_logits(model, [1, 2, 3, 0]).numpy(),
                         full_forward_logits(model, [1, 2, 3, 0, 0]).numpy()])
        np.testing.assert_allclose(got, want, atol=ATOL)
        model.remove(seq, 5)  # nothing past the end: a no-op
        assert model.kv_length(seq) == 5
        model.remove(seq, 0)
        assert model.kv_length(seq) == 0
        np.testing.assert_allclose(model.decode(seq, [2], 0, 1)[0], full_forward_logits(model, [2]).numpy(), atol=ATOL)
    finally:
        model.free_sequence(seq)


def test_a_stale_position_is_visible_at_this_tolerance(model):
    """Negative control: had remove() left one position behind, the logits would move by far more than ATOL."""
    context = [1, 2, 3, 4, 5, 0]
    stale = full_forward_logits(model, context[:-1] + [context[-2]] + context[-1:]).numpy()
    want = full_forward_logits(model, context).numpy()
    assert np.abs(stale - want).max() > 100 * ATOL


def test_sequences_are_independent(model):
    a, b = model.new_sequence(), model.new_sequence()
    try:
        model.decode(a, [1, 2, 3], 0, 1)
        model.decode(b, [5, 5, 5, 5], 0, 1)
        model.remove(b, 1)
        la = model.decode(a, [4], 3, 1)[0]
        lb = model.decode(b, [2, 3, 4], 1, 1)[0]
        np.testing.assert_allclose(la, full_forward_logits(model, [1, 2, 3, 4]).numpy(), atol=ATOL)
        np.testing.assert_allclose(lb, full_forward_logits(model, [5, 2, 3, 4]).numpy(), atol=ATOL)
    finally:
        model.free_sequence(a)
        model.free_sequence(b)


def test_bad_calls_raise_backend_errors(model):
    seq = model.new_sequence()
    try:
        model.decode(seq, [1, 2], 0, 1)
        with pytest.raises(BackendError, match="holds 2 positions"):
            model.decode(seq, [3], 5, 1)
        with pytest.raises(BackendError, match="outside"):
            model.decode(seq, [VOCAB], 2, 1)
        with pytest.raises(ValueError):
            model.decode(seq, [1], 2, 2)
        with pytest.raises(BackendError, match="context"):
            model.decode(seq, [1] * model.n_ctx, 2, 1)
    finally:
        model.free_sequence(seq)
    with pytest.raises(BackendError, match="does not exist"):
        model.decode(99, [1], 0, 1)


def test_slots_run_out_and_come_back():
    m = TorchBackend.from_model(tiny_model(1), tiny_tokenizer(VOCAB), device=DEVICE, rows_on_device=False, n_seq_max=2)
    a, b = m.new_sequence(), m.new_sequence()
    with pytest.raises(BackendError, match="slots"):
        m.new_sequence()
    m.free_sequence(a)
    c = m.new_sequence()
    assert c == a and m.kv_length(c) == 0
    m.free_sequence(b)
    m.close()
    m.close()  # idempotent


def test_tokenizer_interface(model):
    assert model.tokenize("abcf") == [0, 1, 2, 5]
    assert model.token_bytes(2) == b"c" and model.token_text(2) == b"c"
    assert model.detokenize([0, 1, 2]) == "abc"
    assert model.n_tokens == VOCAB == model.n_vocab
    assert model.eos_ids == frozenset()
    assert model.params_b > 0


def test_byte_level_token_bytes_and_texts():
    """Byte-level BPE (Qwen, GPT-2): the stored text is the printable stand-in ('Ġa'),
    token_bytes the real bytes (b' a'); special tokens render as nothing."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import AddedToken, PreTrainedTokenizerFast

    vocab = {"a": 0, "b": 1, "Ġ": 2, "Ġa": 3, "Ã": 4, "©": 5}
    tok = Tokenizer(models.BPE(vocab, [("Ġ", "a")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok)
    hf.add_tokens([AddedToken("<|end|>", special=True)], special_tokens=True)
    m = TorchBackend.from_model(tiny_model(2, vocab=8), hf, device=DEVICE, rows_on_device=False)
    assert m.token_text(3) == "Ġa".encode() and m.token_bytes(3) == b" a"
    assert m.token_bytes(4) + m.token_bytes(5) == "é".encode()
    assert m.token_bytes(6) == b"" and m.token_text(6) == b"<|end|>"
    assert 6 in m.eos_ids
    assert m.tokenize("a a") == [0, 3]
    assert m.n_tokens == 7 and m.n_vocab == 8


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_every_dtype_decodes_close_to_float32(dtype):
    m32 = host_backend(5)
    m = host_backend(5, dtype=dtype)
    seq, ref = m.new_sequence(), m32.new_sequence()
    got = m.decode(seq, [1, 2, 3, 4], 0, 2)
    want = m32.decode(ref, [1, 2, 3, 4], 0, 2)
    tol = {"float32": ATOL, "bfloat16": 0.25, "float16": 0.05}[dtype]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=tol)
    m.remove(seq, 2)
    np.testing.assert_allclose(m.decode(seq, [3, 4], 2, 2), got, atol=tol)


def test_rollback_after_random_cycles_equals_a_fresh_instance():
    """After random accept/reject cycles across a mixed chain, each torch model's logits
    for the committed tokens equal a fresh instance's fed the committed tokens in one run."""
    draft, mid, target = host_backend(21), host_backend(22), host_backend(23)
    chain = Chain([NgramDrafter(max_ngram=2), draft, mid, target], [3, 2, 3])
    state = SequenceState()
    runner = CycleRunner(chain, state, SamplingParams(temperature=1.0), np.random.default_rng(5))
    context = [0, 1, 2, 3]
    try:
        for _ in range(30):
            context += runner.cycle(context, 16)
            state.rollback_to(context)
            for m in chain.models:
                cached = state.cached_tokens(m)
                assert cached == context[: len(cached)]
                assert m.kv_length(state._slots[id(m)]) == len(cached)  # the cache holds what the books say
        assert any(s.accepted < s.proposed for s in runner.stats[:-1]), "the run must have rolled something back"
        for seed, m in zip((21, 22, 23), chain.models):
            got = state.evaluate(m, context, 1)[0]
            fresh = host_backend(seed)
            want = fresh.decode(fresh.new_sequence(), context, 0, 1)[0]
            np.testing.assert_allclose(got, want, atol=ATOL, err_msg=f"{m.name} after rollback")
    finally:
        state.release()


def test_greedy_chains_of_torch_and_mixed_backends_equal_the_target_alone():
    target = host_backend(31)
    alone = generate(Chain([target], []), [0, 1, 2], SamplingParams(), 40).token_ids
    for levels, lengths in (
        ([host_backend(32), target], [4]),
        ([NgramDrafter(), host_backend(32), host_backend(33), target], [2, 3, 4]),
        ([SyntheticBackend("syn", vocab=VOCAB, noise=1.0), host_backend(32), target], [3, 3]),
    ):
        got = generate(Chain(levels, lengths), [0, 1, 2], SamplingParams(), 40).token_ids
        assert got == alone, [lv.name for lv in levels]


def test_mixed_pool_chain_with_torch_folder(tmp_path):
    """Pool.level accepts a torch model folder as a chain level, next to other backends."""
    from specrouter.pool import Pool

    folder = tmp_path / "tiny"
    tiny_model(41, vocab=FOLDER_VOCAB).save_pretrained(folder)
    tiny_tokenizer(VOCAB).save_pretrained(folder)
    pool = Pool(device=DEVICE)
    try:
        a = pool.level(str(folder))
        assert isinstance(a, TorchBackend) and a.name == "tiny"
        assert pool.level(str(folder)) is a  # loaded once
        chain = pool.chain(["ngram", str(folder)], [2])
        assert generate(chain, [0, 1, 2], SamplingParams(), 5).token_ids
    finally:
        pool.close()


# Bad input -----------------------------------------------------------------------------

def test_folder_without_a_tokenizer_is_refused(tmp_path):
    tiny_model(1).save_pretrained(tmp_path)
    with pytest.raises(ModelFileError, match="no tokenizer"):
        TorchBackend(tmp_path, device=DEVICE)


def test_folder_without_a_model_is_refused(tmp_path):
    with pytest.raises(ModelFileError, match="no config.json"):
        TorchBackend(tmp_path, device=DEVICE)
    with pytest.raises(ModelFileError, match="not found"):
        TorchBackend(tmp_path / "missing", device=DEVICE)


def test_model_folder_loads_and_matches_the_model_in_memory(tmp_path):
    tiny_model(3, vocab=FOLDER_VOCAB).save_pretrained(tmp_path)
    tiny_tokenizer(VOCAB).save_pretrained(tmp_path)
    loaded = TorchBackend(tmp_path, device=DEVICE, rows_on_device=False)
    mem = host_backend(3, vocab=FOLDER_VOCAB)
    np.testing.assert_allclose(loaded.decode(loaded.new_sequence(), [1, 2, 3], 0, 3),
                               mem.decode(mem.new_sequence(), [1, 2, 3], 0, 3), atol=ATOL)
    assert loaded.name == tmp_path.name and loaded.n_vocab == FOLDER_VOCAB
    assert loaded.tokenize("abc") == [0, 1, 2]


def test_a_folder_loaded_without_weights_tokenizes_as_the_model_does_and_runs_no_forward(tmp_path):
    """The vocabulary only (what a fleet's ingress loads, Pool.vocabulary): every parameter on
    the meta device (no weight read), the same tokens, texts, end tokens (the folder's
    generation config's too), context and logits width as the model loaded whole; a forward
    is a clear error."""
    from specrouter.pool import Pool

    model = tiny_model(5, vocab=FOLDER_VOCAB)
    model.generation_config.eos_token_id = 3
    model.save_pretrained(tmp_path)
    tiny_tokenizer(VOCAB).save_pretrained(tmp_path)
    pool = Pool(device=DEVICE)
    try:
        whole, vocab = pool.model(str(tmp_path)), pool.vocabulary(str(tmp_path))
        assert isinstance(vocab, TorchBackend) and whole.weights and not vocab.weights
        assert pool.vocabulary(str(tmp_path)) is vocab and pool.model(str(tmp_path)) is whole  # each loaded once
        assert {p.device.type for p in vocab._model.parameters()} == {"meta"}
        assert 3 in whole.eos_ids and vocab.eos_ids == whole.eos_ids
        assert (vocab.name, vocab.n_vocab, vocab.n_ctx, vocab.params_b, vocab.chat_template) == \
            (whole.name, whole.n_vocab, whole.n_ctx, whole.params_b, whole.chat_template)
        assert vocab.tokenize("abcfab") == whole.tokenize("abcfab") == [0, 1, 2, 5, 0, 1]
        assert vocab.vocab_texts() == whole.vocab_texts()
        assert [vocab.token_bytes(t) for t in range(FOLDER_VOCAB)] == [whole.token_bytes(t) for t in range(FOLDER_VOCAB)]
        seq = vocab.new_sequence()
        with pytest.raises(BackendError, match="loaded without its weights"):
            vocab.decode(seq, [1, 2], 0, 1)
    finally:
        pool.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_on_a_machine_without_one_is_a_clear_error():
    with pytest.raises(BackendError, match="cuda.*(no CUDA|CUDA support)"):
        host_backend(1, device="cuda")


def test_a_cuda_device_that_does_not_exist_is_a_clear_error():
    with pytest.raises(BackendError, match="cuda:99"):
        check_device("cuda:99")


def test_unknown_devices_and_dtypes_are_refused():
    with pytest.raises(InvalidParameterError, match="device"):
        check_device("tpu")
    with pytest.raises(InvalidParameterError, match="float64"):
        host_backend(1, dtype="float64")
    assert dtype_name("bf16") == "bfloat16" and dtype_name(torch.float16) == "float16"


def test_a_dtype_the_device_cannot_run_is_a_clear_error():
    """The probe runs attention, matmul and softmax in the dtype. torch 2.13 on this CPU runs
    float32, bfloat16 and float16 alike (measured), so the failure is shown with integers,
    which no matmul kernel takes."""
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        check_dtype_runs(torch.device(DEVICE), dtype)
    with pytest.raises(BackendError, match="cannot run dtype"):
        check_dtype_runs(torch.device(DEVICE), torch.int32)


def test_a_gguf_whose_architecture_transformers_cannot_convert_is_refused(tmp_path):
    gguf = pytest.importorskip("gguf")
    from specrouter.convert import convert_gguf

    path = tmp_path / "odd.gguf"
    writer = gguf.GGUFWriter(str(path), "rwkv7")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelFileError, match="cannot convert GGUF architecture 'rwkv7'"):
        convert_gguf(path, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"NOPE" + bytes(60))
    with pytest.raises(ModelFileError, match="not a readable GGUF"):
        convert_gguf(not_gguf, tmp_path / "out", progress=False)


def test_torch_pool_names_need_a_conversion_first(tmp_path):
    from specrouter.errors import UnknownModelError
    from specrouter.pool import Pool

    pool = Pool(cache_dir=tmp_path)
    with pytest.raises(ModelFileError, match="specrouter convert qwen2.5-coder-0.5b"):
        pool.level("qwen2.5-coder-0.5b:torch-fp32")
    with pytest.raises(UnknownModelError, match="torch-fp64"):
        pool.level("qwen2.5-coder-0.5b:torch-fp64")
    with pytest.raises(UnknownModelError, match="nosuch"):
        pool.level("nosuch:torch-fp32")


def test_convert_command_reports_clear_errors(tmp_path):
    import subprocess
    import sys

    def run(*args):
        return subprocess.run([sys.executable, "-m", "specrouter.cli_torch", "convert", *args,
                               "--cache-dir", str(tmp_path)], capture_output=True, text=True)

    bad = run("nosuch")
    assert bad.returncode == 2 and "error: unknown model 'nosuch'" in bad.stderr
    unpulled = run("qwen2.5-coder-0.5b:torch-bf16")
    assert unpulled.returncode == 2 and "specrouter pull qwen2.5-coder-0.5b" in unpulled.stderr
    assert "Traceback" not in bad.stderr + unpulled.stderr


def test_a_forward_that_fails_halfway_leaves_the_cache_as_it_was(monkeypatch):
    m = host_backend(12)
    seq = m.new_sequence()
    m.decode(seq, [1, 2, 3], 0, 1)
    layer = m._model.model.layers[1]

    def boom(*args, **kwargs):
        raise RuntimeError("simulated failure in layer 1")

    monkeypatch.setattr(layer, "forward", boom)
    with pytest.raises(RuntimeError, match="simulated"):
        m.decode(seq, [4, 5], 3, 1)  # layer 0 has already appended its KV for 4, 5
    monkeypatch.undo()
    assert all(lay.get_seq_length() == 3 for lay in m._kv._caches[seq].layers)
    np.testing.assert_allclose(m.decode(seq, [4, 5], 3, 1)[0], full_forward_logits(m, [1, 2, 3, 4, 5]).numpy(), atol=ATOL)


def run_script(name: str, argv: list[str]):
    """Load scripts/<name>.py (which imports its neighbours) and run its main(argv); the module."""
    import importlib.util
    import sys
    from pathlib import Path

    scripts = Path(__file__).resolve().parents[3] / "scripts"
    sys.path.insert(0, str(scripts))
    try:
        spec = importlib.util.spec_from_file_location(name, scripts / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.main(argv)
    finally:
        sys.path.remove(str(scripts))
    return module


def test_the_gpu_check_engine_script_runs_every_chain_and_splits_host_from_model_time(tmp_path):
    """scripts/gpu_engine.py as the GPU check runs it, cut down to tiny models on the CPU:
    every chain, greedy and sampled, with the rows on the host and on the device; greedy
    output equal to the target alone's (fp32 on a CPU has no near-ties to split); the
    target alone makes one forward per token."""
    out = tmp_path / "engine.json"
    gpu_engine = run_script("gpu_engine", ["--device", "cpu", "--dtype", "float32", "--tiny", "--tokens", "12",
                                           "--rounds", "1", "--out", str(out)])
    result = json.loads(out.read_text())
    labels = [label for label, *_ in gpu_engine.METHODS]
    modes = [f"{m}, rows on {where}" for where in ("host", "device") for m in ("greedy", "sampled T = 1")]
    assert list(result["summary"]) == modes
    assert all(list(by) == labels for by in result["summary"].values())
    for mode in (modes[0], modes[2]):
        greedy = result["summary"][mode]
        assert all(all(row["equals_alone"]) for row in greedy.values()), mode
        assert greedy["target alone"]["runs"] == 2 and greedy["target alone"]["median_tokens_per_cycle"] == 1.0
        for run in result["runs"][mode]["target alone"]:
            assert run["tokens"] == run["cycles"] == 12 and run["forwards"] == {gpu_engine.TARGET: 12}
            assert 0 < run["model_seconds"] < run["wall_seconds"] and run["host_seconds_per_cycle"] > 0


def test_the_static_cache_diagnostic_times_every_size_and_writes_a_cost_profile(tmp_path):
    """scripts/gpu_graphs.py on the CPU: the eager static-cache forward at every size, and a
    file the router reads (no CUDA graphs without a GPU: its tables are empty, no errors)."""
    out = tmp_path / "graphs.json"
    gpu_graphs = run_script("gpu_graphs", ["--device", "cpu", "--tiny", "--repeats", "1", "--batches", "2",
                                           "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["errors"] == {} and result["models"] == {} and result["batched"] == {}
    for table in result["eager_static"].values():
        assert [int(n) for n in table] == list(gpu_graphs.SIZES) and all(s > 0 for s in table.values())

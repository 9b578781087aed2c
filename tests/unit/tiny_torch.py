"""Tiny randomly initialised Qwen2-architecture models for fast torch-backend tests.

A model with a 6-token vocabulary and 16-dimensional hidden states computes in well
under a millisecond, so a chain of them can be run tens of thousands of times and its
output distribution enumerated exactly from the target. Weights are drawn with a fixed
seed and a large initializer range (0.5, not 0.02) so that next-token distributions are
peaked and differ between seeds the way real drafts and targets do: with the default
range every distribution would be nearly uniform and acceptance nearly 1, and a
broken residual would go unseen.

Tests run on the CPU; SPECROUTER_TEST_DEVICE=cuda runs them on a GPU (scripts/gpu_check.sh).
"""

from __future__ import annotations

import os

import torch
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from specrouter.backends.torch import TorchBackend

DEVICE = os.environ.get("SPECROUTER_TEST_DEVICE", "cpu")
if DEVICE == "cpu":
    # Tiny matrices gain nothing from threads, and on a busy 2-core machine torch's thread
    # pool waits: measured 114 ms per decode with 2 threads under load, 2 ms with 1.
    torch.set_num_threads(1)
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def tiny_tokenizer(vocab: int) -> PreTrainedTokenizerFast:
    """One letter per token: 'a' -> 0, 'b' -> 1, ..."""
    tok = Tokenizer(models.WordLevel({c: i for i, c in enumerate(LETTERS[:vocab])}, unk_token="a"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def tiny_model(seed: int, vocab: int = 6, hidden: int = 16, layers: int = 2, init: float = 0.5) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
        initializer_range=init, tie_word_embeddings=False, use_sliding_window=False,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():  # biases and norms start at 0 / 1: make them seed-dependent too
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, init)
    return model.eval()


def tiny_backend(seed: int, name: str | None = None, vocab: int = 6, device: str = DEVICE,
                 dtype: str = "float32", rows_on_device: bool | None = None, runtime: str = "eager",
                 n_seq_max: int = 4, **kw) -> TorchBackend:
    """runtime: the KV runtime, "eager" or "static" (backends/kv_runtime.py)."""
    return TorchBackend.from_model(tiny_model(seed, vocab, **kw), tiny_tokenizer(vocab),
                                   name=name or f"tiny{seed}", device=device, dtype=dtype,
                                   rows_on_device=rows_on_device, runtime=runtime, n_seq_max=n_seq_max)


def host_backend(seed: int, name: str | None = None, **kw) -> TorchBackend:
    """tiny_backend handing its rows to the host as numpy on any device: the decode contract's
    tests compare them with numpy (the device path's rows are the same values:
    tests/unit/cascade/test_device_rows.py)."""
    return tiny_backend(seed, name, rows_on_device=False, **kw)


def full_forward_logits(backend: TorchBackend, context: list[int]) -> torch.Tensor:
    """Next-token logits after `context`, from one cache-less forward over all of it."""
    ids = torch.tensor([context], device=backend.device)
    with torch.inference_mode():
        return backend._model(input_ids=ids, use_cache=False).logits[0, -1].float().cpu()

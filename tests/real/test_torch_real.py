"""The converted Qwen models through torch: same tokenizer as their GGUF originals, exact
rollback, and greedy chains (torch drafts, llama.cpp q4 drafts) that equal the torch
fp32 1.5B alone token for token, with the near-tie rule of test_greedy_equality.py.

Kept short (4 prompts x 24 tokens): the fp32 1.5B costs about 430 ms per token on
these 2 cores. Needs `specrouter convert qwen2.5-coder-0.5b qwen2.5-coder-1.5b`
(`make test` runs it); without the conversions these tests skip (fail in CI).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from specrouter.cascade.chain import CycleRunner  # noqa: E402
from specrouter.cascade.sampling import SamplingParams  # noqa: E402
from specrouter.chat import chat_prompt_tokens  # noqa: E402
from specrouter.convert import converted_dir, is_converted  # noqa: E402
from specrouter.state import SequenceState  # noqa: E402
from specrouter.vocab import check_shared_tokenizer  # noqa: E402

from .conftest import SMALL, TARGET  # noqa: E402
from .greedy_check import assert_matches_references, benchmark_prompts, reference_outputs  # noqa: E402

T_SMALL, T_TARGET = f"{SMALL}:torch-fp32", f"{TARGET}:torch-fp32"
MAX_TOKENS = 24
CHAINS = {
    "torch0.5b->torch1.5b": ([T_SMALL, T_TARGET], [4]),
    "q4-0.5b->torch1.5b": ([SMALL, T_TARGET], [4]),
    "ngram->q4-0.5b->q4-1.5b->torch1.5b": (["ngram", SMALL, TARGET, T_TARGET], [2, 3, 4]),
}


@pytest.fixture(scope="module")
def tpool(pool):
    missing = [n for n in (SMALL, TARGET) if not is_converted(n)]
    if missing:
        message = f"models not converted to torch: {missing}; run `specrouter convert {' '.join(missing)}`"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return pool


def test_converted_models_share_the_tokenizer_of_their_gguf(tpool):
    llama, torch_model = tpool.level(TARGET), tpool.level(T_TARGET)
    check_shared_tokenizer([tpool.level(SMALL), torch_model, llama])  # raises on a mismatch
    assert torch_model.vocab_texts() == llama.vocab_texts()
    assert torch_model.n_vocab == llama.n_vocab and torch_model.n_tokens == llama.n_tokens
    assert [torch_model.token_bytes(t) for t in range(llama.n_tokens)] == [llama.token_bytes(t) for t in range(llama.n_tokens)]
    assert torch_model.eos_ids == llama.eos_ids
    assert (torch_model.bos_text, torch_model.eos_text, torch_model.add_bos) == (llama.bos_text, llama.eos_text, llama.add_bos)
    assert torch_model.chat_template == llama.chat_template
    for text in ("def fib(n):\n    return n", "<|im_start|>user\nhi ünïcode 日本 🚀<|im_end|>\n", "  \t\n"):
        assert torch_model.tokenize(text) == llama.tokenize(text)
    messages = [{"role": "user", "content": "Add 2 and 3."}]
    assert chat_prompt_tokens(torch_model, messages) == chat_prompt_tokens(llama, messages)


@pytest.fixture(scope="module")
def torch_references(tpool):
    return reference_outputs(tpool.chain([T_TARGET]), benchmark_prompts(tpool.level(T_TARGET), 2), MAX_TOKENS)


@pytest.mark.parametrize("name", list(CHAINS))
def test_chain_matches_torch_target_alone(tpool, torch_references, name):
    specs, lengths = CHAINS[name]
    chain = tpool.chain(specs, lengths)
    results = assert_matches_references(chain.target, torch_references, chain, name, MAX_TOKENS)
    assert all(r.levels[0].proposed > 0 for r in results)


def test_rollback_on_a_real_torch_model_equals_a_fresh_instance(tpool):
    """Random sampled cycles (rejections included) on the torch 0.5B, then its logits for
    the committed tokens against a fresh instance fed them in one run. fp32: batch-shape
    differences stay below 1e-3 here; one stale position moves the logits by far more."""
    from specrouter.backends.torch import TorchBackend

    chain = tpool.chain(["ngram", SMALL, T_SMALL], [3, 3])
    model = chain.target
    context = model.tokenize("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n")
    state = SequenceState()
    runner = CycleRunner(chain, state, SamplingParams(temperature=1.0), np.random.default_rng(3))
    try:
        for _ in range(6):
            context += runner.cycle(context, 32)
            state.rollback_to(context)
        assert sum(s.proposed - s.accepted for s in runner.stats[:-1]) > 0, "nothing was rolled back"
        got = state.evaluate(model, context, 1)[0]
    finally:
        state.release()
    fresh = TorchBackend(converted_dir(SMALL), n_seq_max=1)
    try:
        seq = fresh.new_sequence()
        want = fresh.decode(seq, context, 0, 1)[0]
        fresh.remove(seq, 0)
        stale = fresh.decode(seq, context[:-1] + [context[-2]] + context[-1:], 0, 1)[0]
    finally:
        fresh.close()
    diff = np.abs(got - want).max()
    print(f"rollback: max |logit difference| {diff:.2e}; stale: {np.abs(stale - want).max():.2f}")
    assert diff < 1e-3
    assert np.abs(stale - want).max() > 0.1

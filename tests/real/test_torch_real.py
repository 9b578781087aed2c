"""The converted Qwen 0.5B through torch: the same tokenizer as its GGUF original, exact
rollback, and greedy chains that mix torch and llama.cpp levels and equal their target
alone token for token, with the near-tie rule of test_greedy_equality.py: a llama.cpp q4
draft (and the n-gram drafter above it) under the torch fp32 0.5B, and the torch 0.5B
drafting for the q4 1.5B.

The 0.5B only: the torch backend runs any converted model through the same code, and the
1.5B's conversion (about 5 minutes and 9 GB) and its fp32 forwards would cost `make test`
about 8 minutes more on these 2 cores. Kept short (4 prompts x 24 tokens). Needs
`specrouter convert qwen2.5-coder-0.5b` (`make test` runs it); without the conversion these
tests skip (fail in CI).
"""

from __future__ import annotations

import functools
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

T_SMALL = f"{SMALL}:torch-fp32"
MAX_TOKENS = 24
CHAINS = {
    "q4-0.5b->torch0.5b": ([SMALL, T_SMALL], [4]),
    "ngram->q4-0.5b->torch0.5b": (["ngram", SMALL, T_SMALL], [2, 4]),
    "torch0.5b->q4-1.5b": ([T_SMALL, TARGET], [4]),
}


@pytest.fixture(scope="module")
def tpool(pool):
    if not is_converted(SMALL):
        message = f"{SMALL} not converted to torch; run `specrouter convert {SMALL}`"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return pool


def test_converted_model_shares_the_tokenizer_of_its_gguf(tpool):
    llama, torch_model = tpool.level(SMALL), tpool.level(T_SMALL)
    check_shared_tokenizer([torch_model, llama, tpool.level(TARGET)])  # raises on a mismatch
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
def alone(tpool):
    """The greedy outputs of a target alone on 2 HumanEval and 2 GSM8K prompts, by target name."""
    @functools.cache
    def of(name: str) -> dict:
        return reference_outputs(tpool.chain([name]), benchmark_prompts(tpool.level(name), 2), MAX_TOKENS)
    return of


@pytest.mark.parametrize("name", list(CHAINS))
def test_mixed_chain_matches_its_target_alone(tpool, alone, name):
    specs, lengths = CHAINS[name]
    chain = tpool.chain(specs, lengths)
    results = assert_matches_references(chain.target, alone(specs[-1]), chain, name, MAX_TOKENS)
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

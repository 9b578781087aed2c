"""llama-cpp-python's own speculative decoding: prompt-lookup drafts verified by its
high-level Llama.generate (llama_cpp.llama_speculative.LlamaPromptLookupDecoding).

How it works (llama-cpp-python 0.3.36, llama.py generate()): after each sampled token
the draft model proposes up to num_pred_tokens continuation tokens of an earlier
2-gram match; the next eval feeds token + drafts in one batch, a token is sampled at
every position, and the first sampled token that differs from the draft ends the run
(the cache is cut there). A draft model forces logits_all=True (a logits row per
position). Sampling each position from the target and keeping drafts only while they
equal the samples is exact for a deterministic drafter, greedy or tempered.
"""

from __future__ import annotations

import time
from pathlib import Path

from specrouter.cascade.sampling import SamplingParams


class NativeLookup:
    def __init__(self, model_path: Path, n_threads: int, n_ctx: int = 2048, num_pred_tokens: int = 10) -> None:
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self.draft = LlamaPromptLookupDecoding(num_pred_tokens=num_pred_tokens)
        self.llm = Llama(model_path=str(model_path), n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads,
                         draft_model=self.draft, verbose=False)

    def set_draft_length(self, k: int) -> None:
        self.draft.num_pred_tokens = k

    def generate(self, tokens: list[int], params: SamplingParams, max_tokens: int,
                 eos_ids: frozenset[int]) -> tuple[list[int], float]:
        """Generated ids (EOS not included, as in the engine) and wall seconds, prefill included."""
        self.llm.reset()  # no prefix reuse across prompts: the engine starts every request cold
        self.llm.set_seed(params.seed if params.seed is not None else 0)
        out: list[int] = []
        start = time.perf_counter()
        for token in self.llm.generate(tokens, repeat_penalty=1.0, **_sampler_args(params)):
            if token in eos_ids:
                break
            out.append(token)
            if len(out) >= max_tokens:
                break
        return out, time.perf_counter() - start

    def close(self) -> None:
        self.llm.close()


def _sampler_args(params: SamplingParams) -> dict:
    """temp 0 is llama.cpp's greedy sampler; otherwise every filter off (top_k 0, top_p 1,
    min_p 0, typical 1) except those the params set, so it samples the same warped
    distribution as the engine."""
    if params.greedy:
        return {"temp": 0.0}
    return {"temp": params.temperature, "top_k": params.top_k, "top_p": params.top_p,
            "min_p": 0.0, "typical_p": 1.0}

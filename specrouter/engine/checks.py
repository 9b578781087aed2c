"""Validation of a request's own input, once, before anything is computed: max_tokens,
logprobs, stop strings, the prompt (not empty, in the target's vocabulary, inside the
context) and logit_bias (in the vocabulary). The CLI calls check_max_tokens and
check_prompt_nonempty before it loads any model. A chain spec is checked by check_chain
(cascade/chain.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from specrouter.cascade.logprobs import MAX_TOP_LOGPROBS
from specrouter.cascade.sampling import SamplingParams
from specrouter.engine.chain_router import ChainRouter
from specrouter.errors import (EmptyPromptError, InvalidLogitBiasError, InvalidParameterError, InvalidTokenIdError,
                               PromptTooLongError)


def check_max_tokens(max_tokens: int) -> None:
    """The one check of max_tokens: an int >= 1 (a bool is not a count)."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise InvalidParameterError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")


def check_logprobs(logprobs: int | None) -> None:
    """None (none reported), or how many alternatives to report per token: 0..MAX_TOP_LOGPROBS."""
    if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int)
                                 or not 0 <= logprobs <= MAX_TOP_LOGPROBS):
        raise InvalidParameterError(f"logprobs must be an integer in 0..{MAX_TOP_LOGPROBS} (alternatives per token), "
                                    f"got {logprobs!r}")


def check_stop(stop: Sequence[str]) -> None:
    if any(not s for s in stop):
        raise InvalidParameterError("stop strings must be non-empty")


def check_prompt_nonempty(prompt: str | Sequence[int]) -> None:
    """The one check that a prompt (text or token ids) is not empty."""
    if not prompt:
        raise EmptyPromptError("the prompt is empty: give at least one token of text")


def check_prompt(router: ChainRouter, prompt_tokens: Sequence[int]) -> None:
    """The one check of a request's prompt tokens, in this order: not empty, every id in the
    target's vocabulary (InvalidTokenIdError), and shorter than the smallest context of the
    router's models (PromptTooLongError)."""
    check_prompt_nonempty(prompt_tokens)
    n_tokens = router.target.n_tokens
    bad = next((t for t in prompt_tokens if not 0 <= t < n_tokens), None)
    if bad is not None:
        raise InvalidTokenIdError(f"prompt token id {bad} is outside the vocabulary (0..{n_tokens - 1})")
    n_ctx = min(m.n_ctx for m in router.models)
    if len(prompt_tokens) >= n_ctx:
        raise PromptTooLongError(
            f"the prompt has {len(prompt_tokens)} tokens but the context holds {n_ctx} "
            f"(at least one position must stay free for generation); shorten the prompt or raise --n-ctx"
        )


def check_logit_bias(router: ChainRouter, params: SamplingParams) -> None:
    """Every token id of logit_bias is in the target's vocabulary (InvalidLogitBiasError)."""
    n_tokens = router.target.n_tokens
    bad = next((t for t, _ in params.logit_bias if t >= n_tokens), None)
    if bad is not None:
        raise InvalidLogitBiasError(f"logit_bias token id {bad} is outside the vocabulary (0..{n_tokens - 1})")

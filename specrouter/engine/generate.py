"""Generation of one request, alone: the library's and the CLI's driver.

It runs the request's cycles one after the other (CycleRunner.cycle), streaming text as
tokens are committed; request.py holds the request's state machine, stop rules and result,
and batch.py drives many requests together.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from specrouter.cascade.chain import Chain
from specrouter.cascade.sampling import SamplingParams
from specrouter.cascade.verify import residual
from specrouter.engine.chain_router import ChainRouter
from specrouter.engine.request import GenerationResult, SequenceRun


def generate_stream(
    chain: Chain | ChainRouter,
    prompt_tokens: Sequence[int],
    params: SamplingParams,
    max_tokens: int,
    stop: Sequence[str] = (),
    rng: np.random.Generator | None = None,
    detokenize: Callable[[int], bytes] | None = None,
    residual_fn=residual,
    clock: Callable[[], float] = time.perf_counter,
    logprobs: int | None = None,
) -> Iterator[str | GenerationResult]:
    """Yield text deltas as tokens are committed, then the GenerationResult last.

    `chain`: a fixed Chain, or a ChainRouter asked for the chain before every cycle.
    `clock`: what seconds are measured with (tests pass a simulated clock).
    `logprobs`: the result carries every token's log-probability with that many
    alternatives (cascade/logprobs.py; None: none)."""
    run = SequenceRun(chain, prompt_tokens, params, max_tokens, stop, rng, detokenize, residual_fn, clock, logprobs)
    try:
        while (runner := run.start_cycle()) is not None:
            delta = run.end_cycle(runner.cycle(run.context, run.room))
            if delta:
                yield delta
    finally:
        run.release()
    delta, result = run.result()
    if delta:
        yield delta
    yield result


def generate(chain: Chain | ChainRouter, prompt_tokens: Sequence[int], params: SamplingParams, max_tokens: int,
             **kw) -> GenerationResult:
    """Run to completion and return only the result."""
    result = None
    for item in generate_stream(chain, prompt_tokens, params, max_tokens, **kw):
        result = item
    assert isinstance(result, GenerationResult)
    return result

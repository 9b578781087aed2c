"""Running the methods over the prompts, interleaved, greedy, on one clock.

Per prompt the reference (the first method, the target alone) runs first and last and the
others in between, rotated by one place per prompt (run_order): drift of the machine over a
prompt's runs (heat, other load) hits the reference's pooled speed as it hits the methods in
between, and no method always runs next to the same neighbours. Every run is a whole request,
prompt included; every model evaluates a few tokens first (warm), so no run pays for paging
weights in. The router learns during its runs as it would serving.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

from specrouter.backends.base import Backend
from specrouter.cascade.chain import Chain
from specrouter.cascade.sampling import SamplingParams
from specrouter.compare.figures import PromptRuns, Timed
from specrouter.compare.methods import Method
from specrouter.compare.prompts import Prompt
from specrouter.engine import generate
from specrouter.engine.chain_router import ChainRouter
from specrouter.engine.checks import check_prompt
from specrouter.errors import InvalidParameterError, SpecRouterError

#: Tokens each model evaluates before the timed runs.
WARM_TOKENS = 4


def run_order(labels: Sequence[str], turn: int) -> list[str]:
    """labels[0] first and last, the others in between rotated by `turn` places."""
    others = list(labels[1:])
    shift = turn % len(others) if others else 0
    return [labels[0], *others[shift:], *others[:shift], labels[0]]


def timed(label: str, runner: Chain | ChainRouter, prompt_tokens: Sequence[int], max_tokens: int,
          clock: Callable[[], float]) -> Timed:
    """One greedy generation, timed on `clock` from the request's start to its end."""
    start = clock()
    r = generate(runner, prompt_tokens, SamplingParams(), max_tokens, clock=clock)
    seconds = clock() - start
    lengths = f" [{','.join(map(str, r.draft_lengths))}]" if r.draft_lengths else ""
    ran = " -> ".join(r.chain) + lengths + (f" (most cycles of {len(r.chains_used)} chains)"
                                            if len(r.chains_used) > 1 else "")
    return Timed(label, ran, tuple(r.token_ids), r.text, seconds)


def warm(models: Sequence[Backend], prompt_tokens: Sequence[int]) -> None:
    """Each model evaluates the prompt's first WARM_TOKENS tokens once (weights paged in)."""
    for model in models:
        seq = model.new_sequence()
        try:
            model.decode(seq, list(prompt_tokens[:WARM_TOKENS]), 0, 1)
        finally:
            model.free_sequence(seq)


def models_of(methods: Sequence[Method]) -> list[Backend]:
    """Every model the methods use, once each, in order of first use."""
    return list({id(m): m for method in methods for m in method.runner.models}.values())


def check_prompts(methods: Sequence[Method], prompts: Sequence[Prompt]) -> None:
    """Every prompt fits every method (check_prompt), before any run: an error names the prompt."""
    for prompt in prompts:
        for method in methods:
            try:
                check_prompt(method.runner, prompt.tokens)
            except SpecRouterError as exc:
                raise InvalidParameterError(f"prompt {prompt.id}: {exc}") from None


def compare(methods: Sequence[Method], prompts: Sequence[Prompt], clock: Callable[[], float] = time.perf_counter,
            on_run: Callable[[str, Timed], None] | None = None) -> Iterator[PromptRuns]:
    """Every method on every prompt in run_order (turn: the prompt's index), after warm() on
    the first prompt; one PromptRuns per prompt as it completes. methods[0] is the
    reference; labels are distinct. on_run(prompt id, run) follows every run."""
    by_label = {m.label: m for m in methods}
    if len(by_label) != len(methods):
        raise InvalidParameterError(f"the methods' labels must be distinct, got {[m.label for m in methods]}")
    labels = tuple(by_label)
    check_prompts(methods, prompts)
    if prompts:
        warm(models_of(methods), prompts[0].tokens)
    for turn, prompt in enumerate(prompts):
        runs = []
        for label in run_order(labels, turn):
            run = timed(label, by_label[label].runner, prompt.tokens, prompt.max_tokens, clock)
            runs.append(run)
            if on_run is not None:
                on_run(prompt.id, run)
        yield PromptRuns(prompt.id, len(prompt.tokens), prompt.max_tokens, labels, tuple(runs))

"""`specrouter compare`: one prompt generated greedily by the target alone and by `--chain auto`,
each run's tokens per second, auto's speed over the target alone's, and whether the two outputs
are identical.

Greedy, so "identical" is a check: the router changes how fast the target's tokens come, never
which tokens (with llama.cpp's default kernels a near-tie between two batch shapes may flip an
argmax, docs/cascade-and-exactness.md; `--exact` rules that out). Both runs are whole requests, prompt
included, timed on one clock; every model evaluates a few tokens first, so neither run pays for
paging weights in.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import click

from specrouter.cascade.chain import Chain
from specrouter.cascade.sampling import SamplingParams
from specrouter.chat import chat_prompt_tokens
from specrouter.cli_options import cache_option
from specrouter.drafters import DEFAULT_LOOKUP, MODEL_FREE
from specrouter.engine import generate
from specrouter.engine.chain_router import ChainRouter
from specrouter.engine.checks import check_max_tokens, check_prompt_nonempty
from specrouter.errors import InvalidParameterError
from specrouter.models import DEFAULT_POOL, is_pulled
from specrouter.pool import Pool
from specrouter.router import auto_router, default_profile_dir

#: Tokens each model evaluates before the timed runs.
WARM_TOKENS = 4


@dataclass(frozen=True)
class Timed:
    """One greedy generation: what it wrote, the chain it ran (auto: the one it ran most
    cycles), and its seconds on the comparison's clock."""

    label: str
    chain: str
    token_ids: tuple[int, ...]
    text: str
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return len(self.token_ids) / self.seconds if self.seconds > 0 else 0.0

    def line(self, width: int) -> str:
        return (f"{self.label:<{width}}  {len(self.token_ids):>4} tokens in {self.seconds:6.2f} s = "
                f"{self.tokens_per_second:6.1f} tokens/s   {self.chain}")


@dataclass(frozen=True)
class Comparison:
    alone: Timed
    auto: Timed

    @property
    def ratio(self) -> float:
        """auto's tokens per second over the target alone's (nan when the target alone wrote none)."""
        alone = self.alone.tokens_per_second
        return self.auto.tokens_per_second / alone if alone > 0 else float("nan")

    @property
    def first_difference(self) -> int | None:
        """The first token index where the two outputs differ (None: identical)."""
        a, b = self.alone.token_ids, self.auto.token_ids
        if a == b:
            return None
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

    def lines(self) -> list[str]:
        width = max(len(self.alone.label), len(self.auto.label))
        diff = self.first_difference
        same = "yes" if diff is None else f"no, they part at token {diff}"
        return [self.alone.line(width), self.auto.line(width),
                f"auto / target alone: {self.ratio:.2f}x the tokens per second; outputs identical: {same}"]


def timed(label: str, chain: Chain | ChainRouter, prompt_tokens: Sequence[int], max_tokens: int,
          clock: Callable[[], float]) -> Timed:
    start = clock()
    r = generate(chain, prompt_tokens, SamplingParams(), max_tokens, clock=clock)
    seconds = clock() - start
    lengths = f" [{','.join(map(str, r.draft_lengths))}]" if r.draft_lengths else ""
    ran = " -> ".join(r.chain) + lengths + (f" (most cycles of {len(r.chains_used)} chains)"
                                            if len(r.chains_used) > 1 else "")
    return Timed(label, ran, tuple(r.token_ids), r.text, seconds)


def warm(models: Sequence, prompt_tokens: Sequence[int]) -> None:
    """Each model evaluates the prompt's first WARM_TOKENS tokens once (weights paged in)."""
    for model in models:
        seq = model.new_sequence()
        try:
            model.decode(seq, list(prompt_tokens[:WARM_TOKENS]), 0, 1)
        finally:
            model.free_sequence(seq)


def compare(alone: Chain, router: ChainRouter, prompt_tokens: Sequence[int], max_tokens: int,
            clock: Callable[[], float] = time.perf_counter) -> Comparison:
    """The target alone (`alone`: a chain of the router's target only), then auto, greedy, on
    the same prompt, after warm(); the router learns during its run as it would serving."""
    warm(router.models, prompt_tokens)
    return Comparison(timed("target alone", alone, prompt_tokens, max_tokens, clock),
                      timed("auto", router, prompt_tokens, max_tokens, clock))


def _router_folder(router_dir: Path | None) -> tuple[Path | None, str]:
    """The folder auto_router reads (None: its default) and how the output names it."""
    if router_dir is None:
        return None, f"{default_profile_dir()} (the user cache, as generate and serve use; a missing profile is measured there)"
    return router_dir, f"{router_dir} (--router-dir)"


@click.command("compare")
@click.option("--prompt", help="Raw text to continue.")
@click.option("--chat", "chat", help="One user message, formatted with the target's chat template.")
@click.option("--target", "--model", "target",
              help="The target model, a pool name, a .gguf path or an ollama:/hf:/lmstudio: model "
                   "(default: the largest pulled pool model).")
@click.option("--lookup", type=click.Choice(list(MODEL_FREE)), default=DEFAULT_LOOKUP, show_default=True,
              help="The model-free drafter auto routes beside the models.")
@click.option("--max-tokens", type=int, default=256, show_default=True)
@click.option("--n-ctx", type=int, default=4096, show_default=True, help="Context window per sequence.")
@click.option("--threads", type=int, default=None, help="CPU threads per model (default: all cores).")
@click.option("--exact", is_flag=True, help="Exact kernels for llama.cpp models (docs/cascade-and-exactness.md).")
@click.option("--router-dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="The router's cost profile and acceptance estimates (default: the user cache, as generate "
                   "uses; a missing profile is measured there).")
@cache_option
def compare_cmd(prompt, chat, target, lookup, max_tokens, n_ctx, threads, exact, router_dir, cache_dir) -> None:
    """Target alone vs --chain auto on one prompt.

    Greedy: each one's tokens per second, auto's over the target alone's, and whether the two
    outputs are identical."""
    if (prompt is None) == (chat is None):
        raise InvalidParameterError("give exactly one of --prompt TEXT or --chat TEXT")
    check_max_tokens(max_tokens)
    check_prompt_nonempty(prompt if prompt is not None else chat)
    folder, where = _router_folder(router_dir)
    click.echo(f"router: profile and estimates in {where}")
    candidates = sorted((n for n in DEFAULT_POOL if is_pulled(n, cache_dir)), key=lambda n: DEFAULT_POOL[n].params_b)
    pool = Pool(cache_dir=cache_dir, n_ctx=n_ctx, n_threads=threads, n_seq_max=1, exact=exact)
    try:
        router = auto_router(pool, target, candidates, profile_dir=folder, lookup=lookup)
        if router.message:
            click.echo(f"note: {router.message}")
        alone = pool.chain([target or candidates[-1]])
        tokens = (chat_prompt_tokens(router.target, [{"role": "user", "content": chat}]) if chat is not None
                  else router.target.tokenize(prompt))
        click.echo(f"prompt: {len(tokens)} tokens; greedy, at most {max_tokens} new tokens, the target alone first")
        result = compare(alone, router, tokens, max_tokens)
        router.save_estimates()
    finally:
        pool.close()
    click.echo(f"\nauto's output:\n{result.auto.text}\n")
    for line in result.lines():
        click.echo(line)

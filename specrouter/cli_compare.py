"""`specrouter compare`: the user's own benchmark in one command. Prompts from flags or a JSON
Lines file, each generated greedily by the target alone, by `auto` and by any fixed chain
named, interleaved (specrouter/compare/runs.py); each run's tokens per second, each method's
ratio to the target alone and whether its output is identical to the target alone's, per
prompt and as medians over the prompts.

Greedy, so "identical" is a check: a chain changes how fast the target's tokens come, never
which tokens (with llama.cpp's default kernels a near-tie between two batch shapes may flip an
argmax, docs/cascade-and-exactness.md; `--exact` rules that out). Every input is checked
before any model loads.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import click
from tqdm import tqdm

from specrouter.cli_options import cache_option
from specrouter.compare.figures import PromptRuns, Timed, report_dict, summarize, summary_lines
from specrouter.compare.methods import AUTO, Method, build_methods, parse_chain_specs
from specrouter.compare.prompts import Prompt, PromptSpec, from_flags, read_file
from specrouter.compare.runs import compare, run_order
from specrouter.drafters import DEFAULT_LOOKUP, MODEL_FREE
from specrouter.engine.checks import check_max_tokens
from specrouter.errors import InvalidParameterError
from specrouter.models import DEFAULT_POOL, is_pulled
from specrouter.pool import Pool
from specrouter.router import auto_router, default_profile_dir

NO_PROMPT = "give --prompt TEXT or --chat TEXT (each repeatable), or --prompts FILE"
NO_TARGET = "--chain auto needs a pulled pool model: run `specrouter pull`, or give --target"
#: The clock every run is timed on.
CLOCK: Callable[[], float] = time.perf_counter


def _router_folder(router_dir: Path | None) -> tuple[Path | None, str]:
    """The folder auto_router reads (None: its default) and how the output names it."""
    if router_dir is None:
        return None, f"{default_profile_dir()} (the user cache, as generate and serve use; a missing profile is measured there)"
    return router_dir, f"{router_dir} (--router-dir)"


def read_prompts(texts: Sequence[str], chats: Sequence[str], prompts_file: Path | None) -> list[PromptSpec]:
    """The prompts of the flags or of the file (not both, and at least one)."""
    if prompts_file is not None and (texts or chats):
        raise InvalidParameterError("give --prompt/--chat or --prompts FILE, not both")
    if prompts_file is not None:
        return read_file(prompts_file)
    if not texts and not chats:
        raise InvalidParameterError(NO_PROMPT)
    return from_flags(texts, chats)


@click.command("compare")
@click.option("--prompt", "texts", multiple=True, help="Raw text to continue (repeatable).")
@click.option("--chat", "chats", multiple=True,
              help="One user message, formatted with the target's chat template (repeatable; after the --prompt's).")
@click.option("--prompts", "prompts_file", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help='A JSON Lines file, one prompt per line: {"prompt": text}, {"chat": text} or {"messages": [...]}, '
                   'optional "id" and "max_tokens".')
@click.option("--chain", "chains", multiple=True, metavar="LEVELS[:DRAFT_LENGTHS]",
              help="Also run this fixed chain (repeatable): levels cheapest first, the target may be left off; "
                   "draft lengths one per level below the target (default 4 each), e.g. suffix:16 or "
                   "suffix,qwen2.5-coder-0.5b:16,4.")
@click.option("--target", "--model", "target",
              help="The target model, a pool name, a .gguf path or an ollama:/hf:/lmstudio: model "
                   "(default: the largest pulled pool model).")
@click.option("--lookup", type=click.Choice(list(MODEL_FREE)), default=DEFAULT_LOOKUP, show_default=True,
              help="The model-free drafter auto routes beside the models.")
@click.option("--max-tokens", type=int, default=256, show_default=True,
              help="Tokens each run may write (a --prompts line's max_tokens overrides it).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (per prompt and summary figures).")
@click.option("--n-ctx", type=int, default=4096, show_default=True, help="Context window per sequence.")
@click.option("--threads", type=int, default=None, help="CPU threads per model (default: all cores).")
@click.option("--exact", is_flag=True, help="Exact kernels for llama.cpp models (docs/cascade-and-exactness.md).")
@click.option("--router-dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="The router's cost profile and acceptance estimates (default: the user cache, as generate "
                   "uses; a missing profile is measured there).")
@cache_option
def compare_cmd(texts, chats, prompts_file, chains, target, lookup, max_tokens, as_json, n_ctx, threads, exact,
                router_dir, cache_dir) -> None:
    """The target alone vs --chain auto (and any --chain) on your prompts.

    Greedy and interleaved: per prompt the target alone first and last (its two runs pooled),
    the others in between. Prints each run's tokens per second, each method's ratio to the
    target alone and whether its output is identical, and with several prompts the medians."""
    check_max_tokens(max_tokens)
    specs = read_prompts(texts, chats, prompts_file)
    candidates = sorted((n for n in DEFAULT_POOL if is_pulled(n, cache_dir)), key=lambda n: DEFAULT_POOL[n].params_b)
    target = target or (candidates[-1] if candidates else None)
    if target is None:
        raise InvalidParameterError(NO_TARGET)
    fixed = parse_chain_specs(chains, target)
    folder, where = _router_folder(router_dir)
    say = _echo(err=as_json)
    say(f"router: profile and estimates in {where}")
    pool = Pool(cache_dir=cache_dir, n_ctx=n_ctx, n_threads=threads, n_seq_max=1, exact=exact)
    try:
        router = auto_router(pool, target, candidates, profile_dir=folder, lookup=lookup)
        if router.message:
            say(f"note: {router.message}")
        methods = build_methods(pool, target, router, fixed)
        prompts = [Prompt(s.id, tuple(s.tokens(router.target)), s.max_tokens or max_tokens) for s in specs]
        results = _run(methods, prompts, as_json)
        router.save_estimates()
    finally:
        pool.close()
    if as_json:
        click.echo(json.dumps(report_dict(target, results), ensure_ascii=False))


def _echo(err: bool) -> Callable[[str], None]:
    return lambda line: click.echo(line, err=err)


def _run(methods: Sequence[Method], prompts: Sequence[Prompt], as_json: bool) -> list[PromptRuns]:
    """compare() under a progress bar on stderr (where it is a terminal), printing each
    prompt's lines as it completes (none under --json) and the summary at the end."""
    labels = [m.label for m in methods]
    single = len(prompts) == 1
    with tqdm(total=len(prompts) * (len(methods) + 1), desc="compare", unit="run", file=sys.stderr,
              disable=None, leave=False) as bar:
        def echo(line: str = "") -> None:  # stdout, clear of the bar (once closed, it is disabled)
            if as_json:
                pass
            elif bar.disable:
                click.echo(line)
            else:
                tqdm.write(line, file=sys.stdout)

        def on_run(prompt_id: str, run: Timed) -> None:
            bar.update(1)
            bar.set_postfix_str(f"prompt {prompt_id}: {run.label}")

        if single:
            p = prompts[0]
            echo(f"prompt: {len(p.tokens)} tokens; greedy, at most {p.max_tokens} new tokens; "
                 f"runs: {', '.join(run_order(labels, 0))}")
        else:
            echo(f"{len(prompts)} prompts; greedy; per prompt the target alone first and last (its two runs "
                 f"pooled), the others in between")
        results = []
        for result in compare(methods, prompts, CLOCK, on_run):
            results.append(result)
            _print_prompt(echo, result, single)
    if not single:
        echo()
        for line in summary_lines(summarize(results)):
            echo(line)
    return results


def _print_prompt(echo: Callable[..., None], result: PromptRuns, single: bool) -> None:
    if single:
        echo(f"\n{AUTO}'s output:\n{result.of(AUTO)[0].text}\n")
        for line in result.lines():
            echo(line)
        return
    echo(f"\nprompt {result.id}: {result.prompt_tokens} tokens, at most {result.max_tokens} new")
    for line in result.lines():
        echo(f"  {line}")


"""`specrouter` command line: generate, pull, models.

Flag and JSON field names are a stable interface (scripts rely on them): see README.
Every SpecRouterError becomes one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from specrouter.cascade.sampling import SamplingParams
from specrouter.chat import chat_prompt_tokens
from specrouter.engine import GenerationResult, generate_stream
from specrouter.errors import EmptyPromptError, InvalidParameterError, SpecRouterError
from specrouter.models import DEFAULT_POOL, check_pulled_integrity, is_pulled, model_path, pull
from specrouter.pool import Pool, parse_chain, parse_draft_lengths

DEFAULT_CHAIN = "ngram,qwen2.5-coder-0.5b,qwen2.5-coder-1.5b"


class _Group(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except SpecRouterError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)


@click.group(cls=_Group)
@click.version_option(package_name="specrouter")
def main() -> None:
    """Lossless speculative decoding over chains of models."""


_cache_option = click.option(
    "--cache-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Folder of pulled models (default: $SPECROUTER_CACHE or the user cache dir).",
)


@main.command()
@click.option("--prompt", help="Raw text to continue.")
@click.option("--chat", "chat", help="One user message, formatted with the target's chat template.")
@click.option("--chain", default=DEFAULT_CHAIN, show_default=True,
              help="Comma-separated levels, cheapest first, target last: pool names, .gguf paths or 'ngram'.")
@click.option("--draft-lengths", help="Comma-separated tokens each non-target level proposes per block (default 4 each).")
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-k", type=int, default=0, show_default=True, help="0 disables.")
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--seed", type=int, default=None, help="Fixes the sampling randomness.")
@click.option("--max-tokens", type=int, default=128, show_default=True)
@click.option("--stop", multiple=True, help="Stop string (repeatable); the text ends before it.")
@click.option("--n-ctx", type=int, default=4096, show_default=True, help="Context window per sequence.")
@click.option("--threads", type=int, default=None, help="CPU threads per model (default: all cores).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of streaming text.")
@_cache_option
def generate(prompt, chat, chain, draft_lengths, temperature, top_k, top_p, seed, max_tokens, stop,
             n_ctx, threads, as_json, cache_dir) -> None:
    """Generate text with a chain of models."""
    if (prompt is None) == (chat is None):
        raise InvalidParameterError("give exactly one of --prompt TEXT or --chat TEXT")
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    if max_tokens < 1:
        raise InvalidParameterError(f"max_tokens must be an integer >= 1, got {max_tokens}")
    if not (prompt or chat):
        raise EmptyPromptError("the prompt is empty: give at least one token of text")
    specs = parse_chain(chain)
    lengths = parse_draft_lengths(draft_lengths, len(specs))
    pool = Pool(cache_dir=cache_dir, n_ctx=n_ctx, n_threads=threads, n_seq_max=1)
    try:
        built = pool.chain(specs, lengths)
        target = built.target
        if chat is not None:
            tokens = chat_prompt_tokens(target, [{"role": "user", "content": chat}])
        else:
            tokens = target.tokenize(prompt)
        result = None
        for item in generate_stream(built, tokens, params, max_tokens, stop=stop):
            if isinstance(item, GenerationResult):
                result = item
            elif not as_json:
                click.echo(item, nl=False)
                sys.stdout.flush()
        assert result is not None
        if as_json:
            click.echo(json.dumps(result.as_dict(), ensure_ascii=False))
        else:
            click.echo()
            click.echo(_summary(result), err=True)
    finally:
        pool.close()


def _summary(r: GenerationResult) -> str:
    lines = [
        f"-- {len(r.token_ids)} tokens in {r.wall_seconds:.2f} s = {r.tokens_per_second:.2f} tok/s, "
        f"{r.cycles} cycles ({len(r.token_ids) / max(r.cycles, 1):.2f} tokens/cycle), finish: {r.finish_reason}",
        f"-- chain: {' -> '.join(r.chain)}  draft lengths: {r.draft_lengths}",
    ]
    for s in r.levels[:-1]:
        rate = f"{s.acceptance:.1%}" if s.acceptance is not None else "-"
        lines.append(f"   {s.name:<24} proposed {s.proposed:>5}  accepted {s.accepted:>5}  ({rate})  "
                     f"{s.forwards} forwards, {s.seconds:.2f} s")
    t = r.levels[-1]
    lines.append(f"   {t.name:<24} target: {t.forwards} forwards, {t.seconds:.2f} s")
    return "\n".join(lines)


@main.command("pull")
@click.argument("names", nargs=-1)
@click.option("--verify", is_flag=True, help="Re-hash pulled files and report corruption.")
@_cache_option
def pull_cmd(names, verify, cache_dir) -> None:
    """Download the default models (all of them when no NAME is given)."""
    for name in names or tuple(DEFAULT_POOL):
        path = pull(name, cache_dir)
        if verify:
            check_pulled_integrity(name, cache_dir)
        click.echo(f"{name}: {path}")


@main.command("models")
@_cache_option
def models_cmd(cache_dir) -> None:
    """List the default pool and whether each model is pulled."""
    for name, spec in DEFAULT_POOL.items():
        state = "pulled" if is_pulled(name, cache_dir) else "not pulled"
        click.echo(f"{name:<22} {spec.params_b:>6.3f}B  {state:<11} {model_path(name, cache_dir)}")
        click.echo(f"{'':<22} {spec.description}")

"""`specrouter` command line: generate, serve, pull, models, profile (and convert, simulate).

Flag and JSON field names are a stable interface (scripts rely on them): see README.
Every SpecRouterError becomes one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from specrouter.cascade.grammar import Grammar
from specrouter.cascade.sampling import SamplingParams
from specrouter.chat import chat_prompt_tokens
from specrouter.cli_compare import compare_cmd
from specrouter.cli_options import (cache_option, gpu_layers_option, profile_option, router_config_option,
                                    torch_options)
from specrouter.cli_sim import simulate
from specrouter.cli_torch import convert
from specrouter.drafters import DEFAULT_LOOKUP, MODEL_FREE
from specrouter.engine import GenerationResult, generate_stream
from specrouter.engine.checks import check_logprobs, check_max_tokens, check_prompt_nonempty
from specrouter.engine.speculation import Speculation
from specrouter.errors import InvalidParameterError, SpecRouterError
from specrouter.models import DEFAULT_POOL, check_pulled_integrity, is_pulled, model_path, pull
from specrouter.offload import GpuLayers
from specrouter.pool import Pool, parse_chain, parse_draft_lengths

#: "auto": the router picks chain and draft lengths before every cycle.
DEFAULT_CHAIN = "auto"
AUTO = "auto"


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


main.add_command(compare_cmd)
main.add_command(convert)
main.add_command(simulate)


def _grammar(json_schema, regex: str | None, grammar) -> Grammar | None:
    """The output's constraint from generate's options (at most one of them)."""
    if sum(option is not None for option in (json_schema, regex, grammar)) > 1:
        raise InvalidParameterError("give at most one of --json-schema, --regex and --grammar")
    if json_schema is not None:
        return Grammar("json_schema", json_schema.read())
    if regex is not None:
        return Grammar("regex", regex)
    if grammar is not None:
        return Grammar("gbnf", grammar.read())
    return None


@main.command()
@click.option("--prompt", help="Raw text to continue.")
@click.option("--chat", "chat", help="One user message, formatted with the target's chat template.")
@click.option("--chain", default=DEFAULT_CHAIN, show_default=True,
              help="'auto' (routed per cycle), or comma-separated levels, cheapest first, target last: "
                   "pool names, .gguf paths, ollama:/hf:/lmstudio: models (README) or 'ngram'.")
@click.option("--target", "--model", "target",
              help="With --chain auto: the target model, a pool name, a .gguf path or an ollama:/hf:/lmstudio: "
                   "model (default: the largest pulled pool model).")
@click.option("--explain", is_flag=True, help="With --chain auto: print the router's decisions to stderr.")
@click.option("--lookup", type=click.Choice(list(MODEL_FREE)), default=None,
              help="With --chain auto: the model-free drafter routed beside the models (default suffix: the "
                   "longest earlier match of the context, no length cap, long copies in one block; ngram: up to 4 tokens).")
@click.option("--draft-lengths", help="Comma-separated tokens each non-target level proposes per block (default 4 each).")
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-k", type=int, default=0, show_default=True, help="0 disables.")
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--min-p", type=float, default=0.0, show_default=True, help="0 disables.")
@click.option("--frequency-penalty", type=float, default=0.0, show_default=True)
@click.option("--presence-penalty", type=float, default=0.0, show_default=True)
@click.option("--repetition-penalty", type=float, default=1.0, show_default=True, help="1 disables.")
@click.option("--json-schema", type=click.File("r"), default=None,
              help="Hold the output to this JSON schema (a file, - for stdin; {\"type\": \"object\"}: any object).")
@click.option("--regex", default=None, help="Hold the output to this regular expression.")
@click.option("--grammar", type=click.File("r"), default=None,
              help="Hold the output to this GBNF or Lark grammar (a file).")
@click.option("--seed", type=int, default=None, help="Fixes the sampling randomness.")
@click.option("--max-tokens", type=int, default=128, show_default=True)
@click.option("--stop", multiple=True, help="Stop string (repeatable); the text ends before it.")
@click.option("--n-ctx", type=int, default=4096, show_default=True, help="Context window per sequence.")
@click.option("--threads", type=int, default=None, help="CPU threads per model (default: all cores).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of streaming text.")
@click.option("--logprobs", type=int, default=None,
              help="With --json: each token's log-probability under the target and this many alternatives.")
@click.option("--exact", is_flag=True,
              help="Exact kernels for llama.cpp models: greedy output of every chain equals the target alone's bit for bit "
                   "(a one-token forward then costs a four-token one; docs/cascade-and-exactness.md).")
@torch_options
@gpu_layers_option
@profile_option
@router_config_option
@cache_option
def generate(prompt, chat, chain, target, explain, lookup, draft_lengths, temperature, top_k, top_p, min_p,
             frequency_penalty, presence_penalty, repetition_penalty, json_schema, regex, grammar, seed, max_tokens,
             stop, n_ctx, threads, as_json, logprobs, exact, device, torch_runtime, gpu_layers, profile_file,
             router_config_file, cache_dir) -> None:
    """Generate text with a chain of models."""
    if (prompt is None) == (chat is None):
        raise InvalidParameterError("give exactly one of --prompt TEXT or --chat TEXT")
    if logprobs is not None and not as_json:
        raise InvalidParameterError("--logprobs is reported in the --json output: add --json")
    check_logprobs(logprobs)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, min_p=min_p,
                            frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
                            repetition_penalty=repetition_penalty, grammar=_grammar(json_schema, regex, grammar))
    check_max_tokens(max_tokens)  # before any model loads
    check_prompt_nonempty(prompt if prompt is not None else chat)
    specs = parse_chain(chain)
    lengths = tuple(parse_draft_lengths(draft_lengths, 0)) if draft_lengths else ()
    spec = Speculation(draft_lengths=lengths) if specs == [AUTO] else Speculation.fixed(specs, lengths)
    auto = spec.mode == "auto"
    if not auto and (target or explain or profile_file or lookup):
        raise InvalidParameterError("--target, --explain, --lookup and --profile work with --chain auto; "
                                    "an explicit chain ends at its target")
    if not auto and router_config_file:
        raise InvalidParameterError("--router-config works with --chain auto: an explicit chain is not routed")
    from specrouter.router.config import DEFAULT_CONFIG, RouterConfig

    router_config = RouterConfig.load(router_config_file) if router_config_file else DEFAULT_CONFIG  # before models load
    pool = Pool(cache_dir=cache_dir, n_ctx=n_ctx, n_threads=threads, n_seq_max=1, exact=exact,
                gpu_layers=GpuLayers.parse(gpu_layers), device=device or "cpu", torch_runtime=torch_runtime)
    router = None
    try:
        if auto:
            router = _auto_router(pool, target, cache_dir, profile_file, lookup or DEFAULT_LOOKUP, router_config)
            built, model = router, router.target
        else:
            built = pool.chain(list(spec.chain), list(spec.draft_lengths) or None)
            model = built.target
        if chat is not None:
            tokens = chat_prompt_tokens(model, [{"role": "user", "content": chat}])
        else:
            tokens = model.tokenize(prompt)
        result = None
        for item in generate_stream(built, tokens, params, max_tokens, stop=stop, logprobs=logprobs):
            if isinstance(item, GenerationResult):
                result = item
            elif not as_json:
                click.echo(item, nl=False)
                sys.stdout.flush()
        assert result is not None
        if router is not None:
            router.save_estimates()
        if not as_json:
            click.echo()  # ends the streamed text
        if explain:
            click.echo(_explain(result, router.config, router_config_file), err=True)
        if as_json:
            click.echo(json.dumps(result.as_dict(), ensure_ascii=False))
        else:
            click.echo(_summary(result), err=True)
    finally:
        pool.close()


def _pulled_pool(cache_dir) -> list[str]:
    return sorted((n for n in DEFAULT_POOL if is_pulled(n, cache_dir)), key=lambda n: DEFAULT_POOL[n].params_b)


def _auto_router(pool: Pool, target_spec: str | None, cache_dir, profile_file: Path | None, lookup: str, config):
    from specrouter.router import auto_router

    router = auto_router(pool, target_spec, _pulled_pool(cache_dir), profile_file=profile_file, lookup=lookup,
                         config=config)
    if router.message:
        click.echo(f"note: {router.message}", err=True)
    return router


def _explain(r: GenerationResult, config=None, source: Path | None = None) -> str:
    """The router's decisions as --explain prints them; with `config` (a RouterConfig, read
    from `source`), first what it changed from the defaults."""
    lines = [f"-- router: {len(r.decisions)} decisions over {r.cycles} cycles"]
    if config is not None:
        lines.append(f"   config ({source}): {config.shown()}" if config.changed() else f"   config: {config.shown()}")
    for d in r.decisions:
        lines.append(f"   cycle {d['cycle']} (position {d['position']}): {d['reason']} {d['chosen']}")
        lines.append(f"     {'candidate':<58} {'pred ms/tok':>11} {'tok/cycle':>9} {'catch-up ms':>11} {'score':>8}")
        for c in d["candidates"]:
            spec = " -> ".join(c["chain"]) + (f" [{','.join(map(str, c['draft_lengths']))}]" if c["draft_lengths"] else "")
            lines.append(f"     {spec:<58} {c['predicted_ms_per_token']:>11.2f} {c['tokens_per_cycle']:>9.2f} "
                         f"{c['catch_up_ms']:>11.1f} {c['score_ms_per_token']:>8.2f}")
        inputs = d["inputs"]
        pairs = ", ".join(f"{k} {v['rate']:.2f} (n={v['count']:.0f})" for k, v in inputs["acceptance"].items())
        lines.append(f"     acceptance ({inputs['mode']}): {pairs}")
        for name, costs in inputs["cost_ms"].items():
            lines.append(f"     cost ms {name}: " + ", ".join(f"t({n})={ms:.1f}" for n, ms in costs.items()))
        lines.append(f"     overhead {inputs['overhead_ms_per_forward']:.2f} ms/forward, "
                     f"probes so far {inputs['probe_budget_used_ms']:.0f} ms")
    counts: dict[int, int] = {}
    for i in r.chains_per_cycle:
        counts[i] = counts.get(i, 0) + 1
    for i, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        names, lengths = r.chains_used[i]
        lines.append(f"   {n:>4} cycles: {' -> '.join(names)} {lengths or ''}")
    return "\n".join(lines)


def _summary(r: GenerationResult) -> str:
    lines = [
        f"-- {len(r.token_ids)} tokens in {r.wall_seconds:.2f} s = {r.tokens_per_second:.2f} tok/s, "
        f"{r.cycles} cycles ({len(r.token_ids) / max(r.cycles, 1):.2f} tokens/cycle), finish: {r.finish_reason}",
        f"-- chain: {' -> '.join(r.chain)}  draft lengths: {r.draft_lengths}"
        + (f"  (most used of {len(r.chains_used)} chains)" if len(r.chains_used) > 1 else ""),
    ]
    for s in r.levels[:-1]:
        rate = f"{s.acceptance:.1%}" if s.acceptance is not None else "-"
        lines.append(f"   {s.name:<24} proposed {s.proposed:>5}  accepted {s.accepted:>5}  ({rate})  "
                     f"{s.forwards} forwards, {s.seconds:.2f} s")
    t = r.levels[-1]
    lines.append(f"   {t.name:<24} target: {t.forwards} forwards, {t.seconds:.2f} s")
    return "\n".join(lines)


@main.command("serve")
@click.option("--config", "config_file", type=click.Path(path_type=Path, dir_okay=False),
              help="TOML file of server settings (keys as the flags below, with underscores); flags override it.")
@click.option("--models", help="Comma-separated pool, cheapest first (default: qwen2.5-coder-0.5b,qwen2.5-coder-1.5b).")
@click.option("--target", "--model", "target",
              help="The served model (default: the last of --models; one not among them joins the pool, last).")
@click.option("--chain", help="Default speculation of a request: auto (routed, the default), off, or a,b,target.")
@click.option("--draft-lengths", help="Comma-separated draft lengths for an explicit --chain.")
@click.option("--lookup", type=click.Choice(list(MODEL_FREE)),
              help="The model-free drafter auto routes beside the models (default suffix).")
@click.option("--n-ctx", type=int, help="Context window per sequence (default 4096).")
@click.option("--threads", type=int, help="CPU threads per model (default: all cores).")
@torch_options
@click.option("--max-batch", type=int, help="Sequences generating at once (default 4).")
@click.option("--prefix-cache", type=int, help="Finished requests whose KV caches are kept for later prompts that "
                                               "begin the same way, a chat's next turn (default: --max-batch; 0: none).")
@click.option("--max-queue", type=int, help="Requests waiting for a slot before 429 (default 32).")
@click.option("--max-tokens", type=int, help="A request's max_tokens when it gives none (default 256).")
@click.option("--request-timeout", type=float, help="Seconds before a request is cancelled; 0 = never (default 600).")
@click.option("--shutdown-timeout", type=float, help="Seconds in-flight requests may finish on shutdown (default 30).")
@click.option("--stall-seconds", type=float, help="Drop a draft model from its requests when a call takes longer (default 0: never).")
@click.option("--host", help="Address to listen on (default 127.0.0.1).")
@click.option("--port", type=int, help="Port (default 8000).")
@click.option("--api-key", envvar="SPECROUTER_API_KEY", help="Require `Authorization: Bearer KEY` on /v1 (env SPECROUTER_API_KEY).")
@click.option("--memory", type=click.Choice(["per-key", "shared", "off"]),
              help="The suffix lookup's cross-request memory: requests share texts with the same API key (per-key, "
                   "the default), with all (shared), or none (off).")
@click.option("--memory-tokens", type=int, help="Tokens the cross-request memory keeps (default 2,000,000).")
@click.option("--max-body-bytes", type=int, help="Largest request body; a larger one is refused before it is read (default 4 MiB).")
@click.option("--allowed-hosts", help="Comma-separated Host names served, '*' for any (default: loopback names when "
                                      "bound to loopback, else any).")
@click.option("--header-timeout", type=float, help="Seconds a request's headers may take to arrive (default 10); "
                                                   "then 408 and the connection is closed.")
@click.option("--body-timeout", type=float, help="Seconds a request's body may take after its headers (default 30).")
@click.option("--keep-alive-timeout", type=float, help="Seconds an idle kept-alive connection stays open (default 5).")
@click.option("--max-connections", type=int, help="Connections open at once; one more gets a 503 (default 512).")
@click.option("--exact", is_flag=True, default=None,
              help="Exact kernels for llama.cpp models: greedy output of every chain equals the target alone's bit for bit "
                   "(a one-token forward then costs a four-token one; docs/cascade-and-exactness.md).")
@click.option("--prefill-share", type=float, help="While streams decode, a long prompt is fed in chunks adding about "
                                                  "this share to their steps (default 0.5; 0: fed whole).")
@click.option("--max-prompt-tokens", type=int, help="Longest prompt in tokens (default: the context less one).")
@click.option("--cors-origins", help="Comma-separated origins a browser may call the API from, '*' for any "
                                     "(default: none).")
@click.option("--served-model-name", help="Comma-separated names a request's `model` may use for the target; "
                                          "responses report the first (default: the target's name).")
@click.option("--ray", "ray_enabled", is_flag=True, default=None,
              help="Serve through Ray Serve: engine replicas behind one ingress (needs the `ray` extra).")
@click.option("--ray-address", help="With --ray: join this cluster (auto, or the head's address); default: a local "
                                    "Ray started and stopped with the server.")
@click.option("--replicas", type=int, help="With --ray: engine replicas (default 1).")
@click.option("--min-replicas", type=int, help="With --ray and --max-replicas: autoscale on ongoing requests.")
@click.option("--max-replicas", type=int, help="With --ray and --min-replicas: autoscale on ongoing requests.")
@click.option("--target-ongoing-requests", type=float, help="With autoscaling: target ongoing requests per replica "
                                                            "(default 2).")
@click.option("--ray-sync-seconds", type=float, help="With --ray: how often replicas share estimates and metrics "
                                                     "(default 1).")
@click.option("--affinity-slack", type=int, help="With --ray: ongoing requests a session's replica may carry above "
                                                 "the least loaded before its requests go elsewhere (default 2).")
@gpu_layers_option
@profile_option
@router_config_option
@cache_option
def serve_cmd(config_file, models, draft_lengths, gpu_layers, allowed_hosts, cors_origins, served_model_name,
              profile_file, router_config_file, **options) -> None:
    """Serve the OpenAI-compatible HTTP API (needs the `serve` extra; --ray also the `ray` extra)."""
    try:
        from specrouter.server.config import load_config
        from specrouter.server.run import serve
    except ImportError as exc:
        raise InvalidParameterError(f"`specrouter serve` needs the serve extra (pip install 'specrouter[serve]'): {exc}") from None
    ray = {name: options.pop(flag) for flag, name in _RAY_FLAGS.items()}
    config = load_config(
        config_file,
        models=parse_chain(models) if models else None,
        draft_lengths=parse_draft_lengths(draft_lengths, 0) if draft_lengths else None,
        gpu_layers=list(gpu_layers) or None, allowed_hosts=_names(allowed_hosts), cors_origins=_names(cors_origins),
        served_model_name=_names(served_model_name), profile=profile_file, router_config=router_config_file, ray=ray,
        **options)
    if config.ray.enabled:
        try:
            from specrouter.fleet.deploy import serve_fleet
        except ImportError as exc:
            raise InvalidParameterError(f"`specrouter serve --ray` needs the ray extra (pip install "
                                        f"'specrouter[ray]'): {exc}") from None
        serve_fleet(config)
        return
    serve(config)


#: The serve flags of the [ray] table: flag parameter -> its field there.
_RAY_FLAGS = {"ray_enabled": "enabled", "ray_address": "address", "replicas": "replicas",
              "min_replicas": "min_replicas", "max_replicas": "max_replicas",
              "target_ongoing_requests": "target_ongoing_requests", "ray_sync_seconds": "sync_seconds",
              "affinity_slack": "affinity_slack"}


def _names(flag: str | None) -> list[str] | None:
    """A comma-separated flag's names (None when the flag is not given)."""
    return [n.strip() for n in flag.split(",") if n.strip()] if flag else None


@main.command("pull")
@click.argument("names", nargs=-1)
@click.option("--verify", is_flag=True, help="Re-hash pulled files and report corruption.")
@cache_option
def pull_cmd(names, verify, cache_dir) -> None:
    """Download the default models (all of them when no NAME is given)."""
    for name in names or tuple(DEFAULT_POOL):
        path = pull(name, cache_dir)
        if verify:
            check_pulled_integrity(name, cache_dir)
        click.echo(f"{name}: {path}")


@main.command("models")
@cache_option
def models_cmd(cache_dir) -> None:
    """List the default pool and whether each model is pulled."""
    for name, spec in DEFAULT_POOL.items():
        state = "pulled" if is_pulled(name, cache_dir) else "not pulled"
        click.echo(f"{name:<22} {spec.params_b:>6.3f}B  {state:<11} {model_path(name, cache_dir)}")
        click.echo(f"{'':<22} {spec.description}")


@main.command("profile")
@click.option("--models", "model_specs", help="Comma-separated pool names, .gguf paths or ollama:/hf:/lmstudio: models "
                                                  "(default: every pulled pool model).")
@click.option("--json", "json_file", type=click.Path(path_type=Path), help="Also write the table to this JSON file.")
@click.option("--force", is_flag=True, help="Measure again even where a valid cached profile exists.")
@click.option("--repeats", type=int, default=3, show_default=True, help="Timings per size (the median is kept).")
@click.option("--threads", type=int, default=None, help="CPU threads per model (default: all cores).")
@click.option("--load", "load_file", type=click.Path(path_type=Path, dir_okay=False),
              help="Show a saved profile (--json's, or the GPU check's) instead of measuring.")
@click.option("--exact", is_flag=True, help="Profile the exact kernels (generate/serve --exact), kept apart from the default ones.")
@torch_options
@gpu_layers_option
@cache_option
def profile_cmd(model_specs, json_file, force, repeats, threads, load_file, exact, device, torch_runtime, gpu_layers,
                cache_dir) -> None:
    """Measure (or show the cached) seconds of a forward over n tokens, per model."""
    from specrouter.router.estimates.profiler import PROFILE_BATCHES, profile_lookups
    from specrouter.router.estimates.profile_cache import load_or_profile, read_profile

    if load_file is not None:
        if model_specs or force or exact or gpu_layers or device or torch_runtime:
            raise InvalidParameterError("--load shows a saved profile: it measures nothing (no --models, --force, "
                                        "--exact, --gpu-layers, --device, --torch-runtime)")
        profile = read_profile(load_file)
    else:
        if repeats < 1:
            raise InvalidParameterError(f"--repeats must be >= 1, got {repeats}")
        specs = parse_chain(model_specs) if model_specs else _pulled_pool(cache_dir)
        if not specs:
            raise InvalidParameterError("no model to profile: run `specrouter pull`, or give --models")
        pool = Pool(cache_dir=cache_dir, n_ctx=512, n_threads=threads, n_seq_max=max(PROFILE_BATCHES), exact=exact,
                    gpu_layers=GpuLayers.parse(gpu_layers), device=device or "cpu", torch_runtime=torch_runtime)
        try:
            models = [pool.model(s) for s in specs if s not in MODEL_FREE]
            profile = load_or_profile(models, repeats=repeats, force=force)
            profile.lookup_seconds = profile_lookups()
        finally:
            pool.close()
    _print_profile(profile)
    if json_file:
        Path(json_file).write_text(json.dumps(profile.as_dict(), indent=1))


def _print_profile(profile) -> None:
    from specrouter.router.estimates.costs import LONG_CONTEXT
    from specrouter.router.estimates.profiler import CONTEXT_NS, PROFILE_BATCH_NS, PROFILE_NS

    # Sizes a profile did not time (a loaded one may have others) are interpolated, as the router does.
    width = max(len(m) for m in [*profile.tables, *profile.lookup_seconds])
    click.echo(f"{'ms per forward over n tokens':<{width}}  " + " ".join(f"{n:>7}" for n in PROFILE_NS))
    for name in profile.tables:
        click.echo(f"{name:<{width}}  " + " ".join(f"{profile.seconds(name, n) * 1e3:>7.1f}" for n in PROFILE_NS))
    for name, seconds in profile.lookup_seconds.items():
        click.echo(f"{name:<{width}}  {seconds * 1e3:>7.3f} (one lookup)")
    if profile.batch_tables:
        click.echo(f"\n{'ms per batched call (B x n)':<{width + 6}}  " + " ".join(f"{f'n={n}':>7}" for n in PROFILE_BATCH_NS))
    for name, tables in profile.batch_tables.items():
        for b, table in sorted(tables.items()):
            click.echo(f"{name:<{width}} B={b:<3} " + " ".join(f"{table[n] * 1e3:>7.1f}" if n in table else f"{'':>7}"
                                                            for n in PROFILE_BATCH_NS))
    if profile.context_tables:
        click.echo(f"\n{f'ms per forward after {LONG_CONTEXT} tokens':<{width}}  "
                   + " ".join(f"{n:>7}" for n in CONTEXT_NS))
    for name in profile.context_tables:
        click.echo(f"{name:<{width}}  " + " ".join(f"{profile.seconds_after(name, n, LONG_CONTEXT) * 1e3:>7.1f}"
                                                  for n in CONTEXT_NS))

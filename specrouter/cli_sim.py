"""`specrouter simulate`: record a trace with the real models, replay it on any cost profile,
or validate the replay against this machine's real runs (specrouter.sim).

Registered on the main command group by specrouter.cli.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from specrouter.chat import chat_prompt_tokens
from specrouter.drafters import DEFAULT_LOOKUP, MODEL_FREE
from specrouter.errors import InvalidParameterError
from specrouter.pool import Pool, parse_chain

if TYPE_CHECKING:
    from specrouter.router.config import RouterConfig
    from specrouter.sim.host import HostCosts

DEFAULT_TARGET, DEFAULT_DRAFTS = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"


def read_prompts(file: Path, target) -> list[tuple[str, str, list[int]]]:
    """JSON Lines, one request per line: {"prompt": raw text} or {"messages": [chat]}, with
    an optional "id" (default: the line number) and "group" (default: "all")."""
    out = []
    try:
        lines = Path(file).read_text().splitlines()
    except OSError as exc:
        raise InvalidParameterError(f"cannot read the prompts {file}: {exc.strerror or exc}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or ("prompt" in row) == ("messages" in row):
                raise ValueError('one of "prompt" (text) or "messages" (a chat) is needed')
            tokens = (target.tokenize(row["prompt"]) if "prompt" in row
                      else chat_prompt_tokens(target, row["messages"]))
        except (ValueError, TypeError, KeyError) as exc:
            raise InvalidParameterError(f"{file}, line {number}: {exc}") from None
        if not tokens:
            raise InvalidParameterError(f"{file}, line {number}: the prompt is empty")
        out.append((str(row.get("group", "all")), str(row.get("id", number)), tokens))
    if not out:
        raise InvalidParameterError(f"{file} holds no prompt")
    return out


@click.command("simulate")
@click.argument("trace_file", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--record", "prompts_file", type=click.Path(path_type=Path, dir_okay=False),
              help="Record TRACE_FILE from these prompts (JSON Lines: {\"prompt\": text} or {\"messages\": chat}, "
                   "optional \"id\" and \"group\") with the real models, instead of replaying it.")
@click.option("--target", default=DEFAULT_TARGET, show_default=True, help="With --record: the target.")
@click.option("--drafts", default=DEFAULT_DRAFTS, show_default=True,
              help="With --record: comma-separated draft models recorded beside the target ('' for none).")
@click.option("--max-tokens", type=int, default=128, show_default=True, help="With --record: tokens per answer.")
@click.option("--branch-tokens", type=int, default=24, show_default=True,
              help="With --record: how far a draft is recorded past a wrong token (a longer draft is replayed "
                   "approximately beyond it).")
@click.option("--profile", "profile_file", type=click.Path(path_type=Path, dir_okay=False),
              help="Replay on this cost profile (`specrouter profile --json`, or the GPU check's), each table "
                   "fitted non-decreasing in n.")
@click.option("--roofline", type=click.Choice(["h100", "h200"]),
              help="Replay on a roofline profile of this device (a simulation of a machine that is not here).")
@click.option("--overhead-ms", type=float, help="With --roofline: fixed cost of one forward (default 5 ms).")
@click.option("--bytes-per-param", type=float, default=2.0, show_default=True,
              help="With --roofline: weight bytes per parameter (2: fp16/bf16).")
@click.option("--batch", "batch_sizes", default=None, metavar="B[,B...]",
              help="With --profile or --roofline: predict throughput with B sequences served at once (the batch "
                   "scheduler, the trace's requests repeated to fill it), per batch size, e.g. 1,8,32.")
@click.option("--validate", is_flag=True, help="Run the trace's requests for real here (target alone, auto, the "
              "best fixed chain) and compare with the replay on this machine's profile; exit 1 when off by more "
              "than --max-error.")
@click.option("--repeats", type=int, default=1, show_default=True,
              help="With --validate: runs of auto and the fixed chain per request.")
@click.option("--max-error", type=float, default=0.10, show_default=True,
              help="With --validate: the largest relative error of a simulated speed-up allowed.")
@click.option("--lookup", type=click.Choice(list(MODEL_FREE)), default=DEFAULT_LOOKUP, show_default=True,
              help="auto's model-free drafter (and the fixed chains').")
@click.option("--host-ms", "host_ms", default=None, metavar="CALL,ROW[,CHOICE[,REUSE]]",
              help="Price the engine's own work on the simulated clock (sim/host.py): ms per sequence in a call, "
                   "per row, per router choice that deliberates and per one that does not (docs/simulation.md "
                   "measures them); default: not priced.")
@click.option("--json", "json_file", type=click.Path(path_type=Path, dir_okay=False),
              help="Also write the result to this JSON file.")
@click.option("--router-config", "router_config_file", type=click.Path(path_type=Path, dir_okay=False),
              help="With a replay: tune auto's router with this TOML file of RouterConfig keys (docs/router.md).")
@click.option("--threads", type=int, default=None, help="CPU threads per model (default: all cores).")
@click.option("--cache-dir", type=click.Path(path_type=Path), default=None,
              help="Folder of pulled models (default: $SPECROUTER_CACHE or the user cache dir).")
def simulate(trace_file, prompts_file, target, drafts, max_tokens, branch_tokens, profile_file, roofline, overhead_ms,
             bytes_per_param, batch_sizes, validate, repeats, max_error, lookup, host_ms, json_file,
             router_config_file, threads, cache_dir) -> None:
    """Trace-driven simulation of the target alone, every fixed chain and auto.

    Record once (--record PROMPTS), then replay TRACE_FILE on a profile (--profile FILE, or
    --roofline DEVICE: labelled a simulation) to predict speed-ups, or --validate it here.
    Greedy only, one request at a time (--batch: B at a time), no prefill priced
    (docs/simulation.md).
    """
    from specrouter.router.config import DEFAULT_CONFIG, RouterConfig
    from specrouter.sim.trace import Trace

    batches, host = check_options(prompts_file, profile_file, roofline, overhead_ms, batch_sizes, validate, host_ms,
                                  max_tokens, branch_tokens, repeats, max_error, bytes_per_param)
    if router_config_file is not None and prompts_file is not None:
        raise InvalidParameterError("--router-config goes with a replay (--profile, --roofline or --validate), "
                                    "not --record")
    config = RouterConfig.load(router_config_file) if router_config_file is not None else DEFAULT_CONFIG
    if prompts_file is not None:
        record_trace(trace_file, prompts_file, target, drafts, max_tokens, branch_tokens, threads, cache_dir)
        return
    trace = Trace.load(trace_file)
    if validate:
        show_validation(trace, lookup, repeats, max_error, host, json_file, threads, cache_dir, config)
        return
    profile, label = replay_profile(trace, profile_file, roofline, overhead_ms, bytes_per_param)
    if batches is not None:
        show_batches(trace, profile, label, batches, lookup, json_file, host, config)
        return
    show_replay(trace, profile, label, lookup, json_file, host, config)


def check_options(prompts_file, profile_file, roofline, overhead_ms, batch_sizes, validate, host_ms, max_tokens,
                  branch_tokens, repeats, max_error, bytes_per_param) -> tuple[list[int] | None, HostCosts]:
    """The options checked together (one mode, options that go with it, ranges): the batch
    sizes (None: not asked for) and the engine's own work to price."""
    from specrouter.sim.host import NO_HOST, HostCosts

    modes = sum(x for x in (prompts_file is not None, profile_file is not None or roofline is not None, validate))
    if modes != 1 or (profile_file is not None and roofline is not None):
        raise InvalidParameterError("give one of --record PROMPTS, --profile FILE, --roofline DEVICE or --validate")
    if overhead_ms is not None and roofline is None:
        raise InvalidParameterError("--overhead-ms goes with --roofline")
    batches = parse_batches(batch_sizes) if batch_sizes is not None else None
    host = HostCosts.parse_ms(host_ms) if host_ms is not None else NO_HOST
    if host_ms is not None and prompts_file is not None:
        raise InvalidParameterError("--host-ms goes with a replay (--profile, --roofline or --validate), not --record")
    if batches is not None and profile_file is None and roofline is None:
        raise InvalidParameterError("--batch goes with --profile or --roofline")
    for name, value, least in (("--max-tokens", max_tokens, 1), ("--branch-tokens", branch_tokens, 1),
                               ("--repeats", repeats, 1)):
        if value < least:
            raise InvalidParameterError(f"{name} must be >= {least}, got {value}")
    for name, value in (("--max-error", max_error), ("--bytes-per-param", bytes_per_param)):
        if not value > 0:
            raise InvalidParameterError(f"{name} must be > 0, got {value}")
    return batches, host


def record_trace(trace_file: Path, prompts_file: Path, target: str, drafts: str, max_tokens: int,
                 branch_tokens: int, threads: int | None, cache_dir: Path | None) -> None:
    """--record: the trace of the prompts, recorded with the real models and saved."""
    from specrouter.sim.trace import record

    draft_names = parse_chain(drafts) if drafts.strip() else []
    if unknown := [d for d in draft_names if d in MODEL_FREE]:
        raise InvalidParameterError(f"--drafts are models; model-free drafters need no recording: {unknown}")
    pool = Pool(cache_dir=cache_dir, n_ctx=4096, n_threads=threads, n_seq_max=1)
    try:
        model = pool.model(target)
        prompts = read_prompts(prompts_file, model)
        trace = record(model, [pool.model(d) for d in draft_names], prompts, max_tokens, branch_tokens,
                       note=f"recorded by specrouter simulate --record {prompts_file}",
                       progress=lambda what: click.echo(f"recording {what}", err=True))
    finally:
        pool.close()
    trace.save(trace_file)
    click.echo(f"{trace_file}: {len(trace.requests)} requests, {sum(len(r.answer) for r in trace.requests)} "
               f"tokens, target {trace.target}, drafts {', '.join(trace.drafts) or 'none'}")


def show_validation(trace, lookup: str, repeats: int, max_error: float, host: HostCosts, json_file: Path | None,
                    threads: int | None, cache_dir: Path | None, config: RouterConfig) -> None:
    """--validate: the trace's requests run here and compared with the replay; exit 1 when
    the simulation is off by more than max_error."""
    from specrouter.sim.validate import OVERALL, validate as run_validation

    pool = Pool(cache_dir=cache_dir, n_ctx=4096, n_threads=threads, n_seq_max=1)
    try:
        result = run_validation(trace, pool, lookup, repeats, max_error,
                                progress=lambda what: click.echo(f"running {what}", err=True), host=host,
                                config=config)
    finally:
        pool.close()
    click.echo(f"engine's own work: {host.label()}")
    click.echo(f"simulated on the machine timed in {result.rounds} rounds between the real runs; "
               "'up front': on the profile timed before them")
    click.echo(f"per group the median per request; 'all' (not checked): {OVERALL}")
    click.echo(f"{'method':<6} {'group':<16} {'measured':>9} {'simulated':>9} {'error':>7} {'up front':>9} "
               f"{'error':>7}  drafting cycles  same text")
    for method, checks in (("auto", result.groups), ("fixed", result.fixed)):
        for group, g in checks.items():
            click.echo(f"{method:<6} {group:<16} {g.measured:>9.3f} {g.simulated:>9.3f} {g.error:>+7.1%} "
                       f"{g.simulated_upfront:>9.3f} {g.error_upfront:>+7.1%}  "
                       f"{g.drafted_measured:>6.1%} / {g.drafted_simulated:>6.1%}  {g.same_text}")
    click.echo("fixed: " + "; ".join(f"{group} {label}" for group, label in result.chains.items()))
    if json_file:
        Path(json_file).write_text(json.dumps({**result.as_dict(), "host": host.label()}, indent=1))
    if not result.ok:
        click.echo(f"the simulation is off by more than {max_error:.0%}", err=True)
        sys.exit(1)


def replay_profile(trace, profile_file: Path | None, roofline: str | None, overhead_ms: float | None,
                   bytes_per_param: float) -> tuple:
    """The cost profile a replay runs on, and its label."""
    if roofline is not None:
        from specrouter.sim.roofline import device, roofline_profile

        dev = device(roofline, overhead_ms)
        profile = roofline_profile(dev, trace.params_b, bytes_per_param)
        label = f"{dev.name}, {dev.overhead_ms} ms per forward, {bytes_per_param} bytes per parameter: SIMULATION"
        return profile, label
    from specrouter.router.estimates.profile_cache import read_profile

    # Fitted non-decreasing in n (CostProfile.nondecreasing): a GPU's launch-bound medians
    # jitter, and a dip below n = 1 would discount every chain.
    return read_profile(profile_file).nondecreasing(), f"profile {profile_file} (fitted non-decreasing)"


def show_replay(trace, profile, label: str, lookup: str, json_file: Path | None, host: HostCosts,
                config: RouterConfig) -> None:
    """The replay of one request at a time: per group, each method's speed-up over the target alone."""
    from specrouter.sim.simulate import predict
    from specrouter.sim.validate import OVERALL

    out = predict(trace, profile, lookup, progress=lambda what: click.echo(f"replaying {what}", err=True), host=host,
                  config=config)
    groups = [*trace.groups, "all"]
    click.echo(f"Simulated speed-up over the target alone (per group the median per request; 'all': {OVERALL}), "
               f"{label}; engine's own work: "
               f"{host.label()}")
    click.echo(f"{'method':<44} " + " ".join(f"{g:>10}" for g in groups))
    rows = {"target alone": "target alone", "auto": "auto"}
    for which, per_group in out.best.items():
        rows[which] = per_group["all"]
    for shown, method in rows.items():
        name = shown if shown == method else f"{shown}: {method}"
        click.echo(f"{name:<44} " + " ".join(f"{out.speedup[method][g]:>10.3f}" for g in groups))
    if json_file:
        Path(json_file).write_text(json.dumps({"profile": label, "host": host.label(), "speedup": out.speedup,
                                               "drafted": out.drafted, "best": out.best}, indent=1))


def parse_batches(text: str) -> list[int]:
    """Comma-separated batch sizes, each >= 1."""
    try:
        sizes = [int(x) for x in text.split(",")]
    except ValueError:
        raise InvalidParameterError(f"--batch takes comma-separated whole numbers, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise InvalidParameterError(f"--batch sizes must be >= 1, got {text!r}")
    return sizes


def show_batches(trace, profile, label: str, batches: list[int], lookup: str, json_file: Path | None,
                 host: HostCosts, config: RouterConfig) -> None:
    """The batch prediction (sim/batched.py): per batch size, throughput over the target alone's."""
    from specrouter.sim.batched import predict_batches
    from specrouter.sim.simulate import ALONE, AUTO

    out = predict_batches(trace, profile, batches, lookup,
                          progress=lambda what: click.echo(f"replaying {what}", err=True), host=host, config=config)
    click.echo(f"Simulated throughput over the target alone's, all requests served B at a time, {label}; "
               f"engine's own work: {host.label()}")
    click.echo(f"{'method':<12} " + " ".join(f"{'B=' + str(b):>10}" for b in batches) + "  (best chain per batch)")
    click.echo(f"{'tokens/s':<12} " + " ".join(f"{out.tokens_per_second[b][ALONE]:>10.1f}" for b in batches)
               + "  (the target alone)")
    for method in (ALONE, "best 2-level", "best 3-level", AUTO):
        per_batch = {b: out.best[b].get(method, method) for b in batches}
        if any(m not in out.speedup[b] for b, m in per_batch.items()):
            continue
        chains = "; ".join(per_batch[b] for b in batches) if method.startswith("best") else ""
        click.echo(f"{method:<12} " + " ".join(f"{out.speedup[b][per_batch[b]]:>10.3f}" for b in batches)
                   + (f"  ({chains})" if chains else ""))
    if json_file:
        per_batch_values = {k: {str(b): v for b, v in getattr(out, k).items()}
                            for k in ("tokens_per_second", "speedup", "drafted", "best")}
        Path(json_file).write_text(json.dumps({"profile": label, "host": host.label(), **per_batch_values}, indent=1))

"""The trace-driven simulator (specrouter.sim) on the committed prompt sets: recorded once here
with the real models, validated against real runs on this machine, then asked what a GPU
would do (roofline: a simulation, labelled so).

    python -m benchmarks simulation [--prompts first-turn|copy] [--per-dataset 5] [--max-tokens 128] [--repeats 1]
                                    [--target NAME] [--stem NAME]
    python -m benchmarks simulation --trace benchmarks/results/NAME-trace.json [--no-validate] [--batches 1,8,32]
                                    [--phases in-phase|serve-all] [--gpu-profile FILE ...] [--no-rooflines]

1. Record (skipped with --trace): HumanEval (raw completion), GSM8K and MT-Bench (first
   turn, chat), or with --prompts copy the copy workloads (benchmarks/workloads.py: code
   editing, MT-Bench second turns after the target's own greedy first answer, documents;
   --per-dataset tasks each), the default q4 llama.cpp 1.5B target (or --target) with the q4 0.5B recorded beside it
   (branches of 24 tokens: at least the router's longest model draft, 23); the trace is written beside
   the results (<stem>-trace.json).
2. Validate (specrouter.sim.validate): per request the target alone, then --repeats times
   auto and the target alone again, for real; the simulation on the same measured profile.
3. Predict: the target alone, the best two- and three-level fixed chains (chosen per dataset
   with hindsight) and auto, on this machine's profile (the validation's) and on roofline
   H100 / H200 profiles with 5 ms and 0.5 ms per forward (fp16 weights), batch 1, and on
   each --gpu-profile: a cost profile measured on a GPU by scripts/gpu_check.sh
   (gpu_cost_profile.json; its batched table prices the batches), a simulation too: the
   acceptance is the trace's, only the costs were measured there.
4. Batches (roofline and GPU profiles only; specrouter.sim.batched): the same methods with B
   sequences served at once by the batch scheduler (--batches, default 1, 8, 32), the
   trace's requests repeated to fill the batch; throughput over the target alone's. The
   scheduler calls per step the model most sequences wait on (--phases in-phase, the
   server's) or every model some sequence waits on (serve-all; engine/phase.py).
Writes <stem>.json and .md to benchmarks/results/.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.args import benchmark_parser, int_list, result_stem
from benchmarks.chains import SMALL, TARGET, load_prompts
from benchmarks.copy_drafting import build_prompts
from benchmarks.machine import machine_info
from benchmarks.output import write_result
from specrouter.engine.phase import InPhase, ServeAll, StepModels
from specrouter.pool import Pool
from specrouter.router.estimates.costs import CostProfile
from specrouter.router.estimates.profile_cache import read_profile
from specrouter.sim.batched import BATCHES, predict_batches
from specrouter.sim.host import NO_HOST, HostCosts
from specrouter.sim.roofline import device, roofline_profile
from specrouter.sim.simulate import ALONE, AUTO, predict
from specrouter.sim.trace import Trace, record
from specrouter.sim.validate import OVERALL, TIMED, validate

BRANCH_TOKENS = 24
ROOFLINES = (("h100", 5.0), ("h200", 5.0), ("h200", 0.5))
#: --prompts: what is recorded, (dataset or workload, id, prompt tokens) per request.
PROMPT_SETS: dict[str, Callable[[Any, int], list[tuple[str, str, list[int]]]]] = {
    "first-turn": load_prompts, "copy": lambda target, n: build_prompts(target, n)[0]}
#: --phases: which models a step of the batch scheduler calls.
PHASES: dict[str, StepModels] = {"in-phase": InPhase(), "serve-all": ServeAll()}
#: How a report says it (a result from before --phases was served with serve-all).
STEP_MODELS = {"in-phase": "the model most sequences wait on and any whose sequences waited a step",
               "serve-all": "every model some sequence waits on"}


def run(per_dataset: int, max_tokens: int, repeats: int, trace_file: Path | None, stem: str, out: Path,
        do_validate: bool, target_name: str = TARGET, batches: tuple[int, ...] = BATCHES,
        phases_name: str = "in-phase", host: HostCosts = NO_HOST, gpu_profiles: tuple[Path, ...] = (),
        rooflines: bool = True, prompt_set: str = "first-turn") -> dict:
    phases: dict[str, float] = {}
    started = time.perf_counter()
    pool = Pool(n_ctx=4096, n_seq_max=1)
    try:
        if trace_file is None:
            target, machine = pool.model(target_name), machine_info()
            trace = record(target, [pool.model(SMALL)], PROMPT_SETS[prompt_set](target, per_dataset), max_tokens,
                           BRANCH_TOKENS, note=f"{machine['cpu']}, {machine['date']}, prompts: {prompt_set}",
                           progress=lambda what: print(f"recording {what}", flush=True))
            trace_file = out / f"{stem}-trace.json"
            trace.save(trace_file)
            phases["record"] = time.perf_counter() - started
        else:
            trace = Trace.load(trace_file)
        checked = None
        if do_validate:
            mark = time.perf_counter()
            checked = validate(trace, pool, repeats=repeats, progress=lambda what: print(f"running {what}", flush=True),
                               host=host)
            phases["validate"] = time.perf_counter() - mark
    finally:
        pool.close()
    mark = time.perf_counter()
    profiles: dict[str, CostProfile] = {}
    if checked is not None:
        profiles["this machine (timed between the validation's real runs)"] = CostProfile.from_dict(checked.machine)
    for name, overhead in ROOFLINES if rooflines else ():
        dev = device(name, overhead)
        profiles[f"{dev.name}, {overhead} ms per forward: SIMULATION"] = roofline_profile(dev, trace.params_b)
    measured_on: dict[str, dict] = {}
    for file in gpu_profiles:
        label, profile, ran = gpu_profile(file, trace)
        profiles[label] = profile
        measured_on[label] = ran
    predictions = predict_all(trace, profiles, host)
    phases["predict"] = time.perf_counter() - mark
    mark = time.perf_counter()
    batched = {label: predict_batched(trace, profile, batches, PHASES[phases_name], host) for label, profile in profiles.items()
               if "SIMULATION" in label} if batches else {}
    phases["batches"] = time.perf_counter() - mark
    return {
        "machine": machine_info(),
        "trace": {"file": trace_file.name, "target": trace.target, "drafts": trace.drafts,
                  "requests": len(trace.requests), "tokens": sum(len(r.answer) for r in trace.requests),
                  "max_tokens": trace.max_tokens, "branch_tokens": trace.branch_tokens, "note": trace.note},
        "phase_seconds": {k: round(v, 1) for k, v in phases.items()},
        "gpu_profiles": measured_on,
        "step_models": phases_name,
        "host": host.label(),
        "overall": OVERALL,
        "validation": None if checked is None else {"repeats": repeats, "timed": TIMED, **checked.as_dict()},
        "predictions": predictions,
        "batches": batched,
    }


def gpu_profile(file: Path, trace: Trace) -> tuple[str, CostProfile, dict]:
    """A measured profile (scripts/gpu_check.sh) as the simulator prices it: its label, the
    profile fitted non-decreasing in n (CostProfile.nondecreasing: medians of 5 forwards bound
    by kernel launches jitter by tens of percent, and a dip at n = 2..6 under n = 1 would
    hand every chain a discount the device does not give), and what ran it. It must name
    every model of the trace (the GPU check's models carry the default pool's names)."""
    profile = read_profile(file).nondecreasing()
    missing = [m for m in (trace.target, *trace.drafts) if m not in profile.tables]
    if missing:
        raise SystemExit(f"{file} has no costs for {', '.join(missing)} (it has {', '.join(profile.tables)})")
    ran = json.loads(file.read_text()).get("device", {})
    what = f"{ran.get('gpu', ran.get('device', 'a device'))}, torch {ran.get('torch', '?')}, measured {ran.get('date', '?')}"
    return f"{what} ({file.name}, fitted non-decreasing): SIMULATION on measured costs", profile, {"file": file.name, **ran}


def predict_all(trace: Trace, profiles: dict[str, CostProfile], host: HostCosts = NO_HOST) -> dict[str, dict]:
    """Per profile: the target alone, auto and the best fixed chain of each depth (per
    dataset), their speed-ups; auto's share of drafting cycles; a few forward costs."""
    out = {}
    for label, profile in profiles.items():
        p = predict(trace, profile, host=host)
        rows = {ALONE: p.speedup[ALONE], AUTO: p.speedup[AUTO]}
        for which, per_group in p.best.items():
            rows[which] = {g: p.speedup[chain][g] for g, chain in per_group.items()}
        out[label] = {"speedup": rows, "best": p.best, "auto_drafted": p.drafted[AUTO],
                      "costs_ms": {m: {str(n): round(profile.seconds(m, n) * 1e3, 2) for n in (1, 4, 16)}
                                   for m in profile.tables}}
    return out


def predict_batched(trace: Trace, profile: CostProfile, batches: tuple[int, ...], phases: StepModels,
                    host: HostCosts = NO_HOST) -> dict:
    """Per batch size: the target alone's throughput, and the speed-ups of the best fixed
    chain of each depth (all requests pooled, chosen with hindsight per batch) and auto."""
    p = predict_batches(trace, profile, batches, progress=lambda what: print(f"replaying {what}", flush=True),
                        phases=phases, host=host)
    out = {}
    for b in batches:
        rows = {ALONE: {"speedup": p.speedup[b][ALONE]}}
        rows.update({which: {"speedup": p.speedup[b][chain], "chain": chain} for which, chain in p.best[b].items()})
        rows[AUTO] = {"speedup": p.speedup[b][AUTO], "drafted": p.drafted[b][AUTO]}
        out[str(b)] = {"alone_tokens_per_second": p.tokens_per_second[b][ALONE], "methods": rows}
    return out


def markdown(result: dict) -> str:
    m, t = result["machine"], result["trace"]
    lines = [f"# Trace-driven simulation ({m['date']})", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, llama-cpp-python {m['llama_cpp_python']}. Command: "
             f"`{m['command']}`. Phases (s): {result['phase_seconds']}.", "",
             f"Trace: {t['requests']} requests ({t['tokens']} tokens, at most {t['max_tokens']} each), target "
             f"{t['target']}, drafts {', '.join(t['drafts'])}, branches of {t['branch_tokens']} tokens; recorded: "
             f"{t['note']}. Greedy, batch 1, prefill not priced. The engine's own work per call (docs/simulation.md): "
             f"{result.get('host', 'not priced')}. Speed-up: median per request of the target alone's "
             "(simulated or measured decode) time over the method's"
             + (f"; 'all': {result['overall']}." if "overall" in result else "."), ""]
    for label, ran in result.get("gpu_profiles", {}).items():
        lines += [f"Measured GPU profile `{ran['file']}`: {ran.get('gpu', '?')} ({ran.get('cuda', '?')} CUDA), host "
                  f"{ran.get('host_cpu', '?')}, torch {ran.get('torch', '?')}, transformers {ran.get('transformers', '?')}, "
                  f"{ran.get('date', '?')}; randomly initialised models of the trace's shapes (costs depend on shapes, "
                  "not weights); each table fitted non-decreasing in n (isotonic) before use.", ""]
    v = result["validation"]
    if v is not None:
        lines += [f"## Validation on this machine ({v['repeats']} run(s) per request and method)", ""]
        if "timed" in v:
            lines += [f"Timed {v['timed']}.", ""]
        # Results from before the machine was timed between the runs simulated on the up-front profile only.
        upfront = "rounds" in v
        if upfront:
            lines += [f"Simulated on the machine's profile timed in {v['rounds']} rounds between the real runs (the "
                      "router starting from the up-front profile, as the real one did); 'up front': on the profile "
                      "timed before the runs.", ""]
        lines += ["| method | dataset | measured | simulated | error | "
                  + ("simulated up front | error up front | " if upfront else "")
                  + "cycles that drafted, measured / simulated | real runs with the recorded text |",
                  "|---|---|---|---|---|---|---|" + ("---|---|" if upfront else "")]
        # Results from before the fixed chain was validated hold auto's checks only.
        for method, checks in (("auto", v["groups"]), ("best fixed chain", v.get("fixed", {}))):
            lines += [f"| {method if method == 'auto' else v['chains'].get(g, method)} | {g} | {c['measured']:.3f} | "
                      f"{c['simulated']:.3f} | {c['error']:+.1%} | "
                      + (f"{c['simulated_upfront']:.3f} | {c['error_upfront']:+.1%} | " if upfront else "")
                      + (f"{c['drafted_measured']:.1%} / {c['drafted_simulated']:.1%}" if "drafted_measured" in c else "")
                      + f" | {c['same_text']} |" for g, c in checks.items()]
        lines += ["", (f"Within {v['max_error']:.0%} on every dataset, auto and its best fixed chain ('all' not "
                       f"checked): **{v['ok']}**." if "overall" in v else
                       f"Within {v['max_error']:.0%} everywhere: **{v['ok']}**."), ""]
        if v.get("requests"):  # results from before it kept the group medians only
            lines += ["Per request, measured / simulated (runs with the recorded text; for auto, its cycles that "
                      "drafted, measured / simulated):", "",
                      "| dataset | request | auto | best fixed chain |", "|---|---|---|---|"]
            per = {}
            for r in v["requests"]:
                drafted = (f"; {r['drafted_measured']:.0%} / {r['drafted_simulated']:.0%}"
                           if r["method"] == AUTO and "drafted_measured" in r else "")
                per.setdefault((r["group"], r["id"]), []).append(
                    f"{r['measured']:.3f} / {r['simulated']:.3f} ({r['same_text']}{drafted})")
            lines += [f"| {g} | {i} | " + " | ".join(cells) + " |" for (g, i), cells in per.items()]
            lines.append("")
    for label, p in result["predictions"].items():
        groups = list(p["speedup"][ALONE])
        lines += [f"## {label}", "", "| method | " + " | ".join(groups) + " |", "|---|" + "---|" * len(groups)]
        for method, per_group in p["speedup"].items():
            lines.append(f"| {method} | " + " | ".join(f"{per_group[g]:.3f}" for g in groups) + " |")
        lines += ["", "Best fixed chains (per dataset): " + "; ".join(
            f"{which}: " + ", ".join(f"{g} {c}" for g, c in per_group.items()) for which, per_group in p["best"].items()),
            f"auto drafted in {p['auto_drafted']['all']:.0%} of its cycles. Forward costs (ms, n = 1 / 4 / 16): "
            + "; ".join(f"{mm} {c['1']} / {c['4']} / {c['16']}" for mm, c in p["costs_ms"].items()), ""]
    for label, per_batch in result.get("batches", {}).items():
        batches = list(per_batch)
        methods = list(per_batch[batches[0]]["methods"])
        lines += [f"## Batches: {label}", "",
                  "Throughput over the target alone's at the same batch (all requests pooled; the trace's requests "
                  "repeated to fill the batch, served by the batch scheduler calling per step "
                  + STEP_MODELS[result.get("step_models", "serve-all")]
                  + "; the best chain chosen per batch).", "",
                  "| method | " + " | ".join(f"B = {b}" for b in batches) + " |", "|---|" + "---|" * len(batches),
                  "| target alone, tokens/s | " + " | ".join(f"{per_batch[b]['alone_tokens_per_second']:.0f}"
                                                          for b in batches) + " |"]
        for method in methods:
            cells = [per_batch[b]["methods"][method] for b in batches]
            lines.append(f"| {method} | " + " | ".join(f"{c['speedup']:.3f}" + (f" ({c['chain']})" if "chain" in c else "")
                                                       for c in cells) + " |")
        lines += ["", "auto drafted in " + ", ".join(f"{per_batch[b]['methods'][AUTO]['drafted']:.0%} at B = {b}"
                                                    for b in batches) + " of its cycles.", ""]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    ap = benchmark_parser("simulation", __doc__, per=("dataset", 5), max_tokens=128, repeats=1, trace=None,
                          render=True, repeats_help="auto runs per request in the validation")
    ap.add_argument("--prompts", choices=list(PROMPT_SETS), default="first-turn",
                    help="what is recorded: the first-turn sets or the copy workloads (ignored with --trace)")
    ap.add_argument("--target", default=TARGET, help="the target recorded (e.g. qwen2.5-coder-1.5b:torch-fp32)")
    ap.add_argument("--no-validate", action="store_true", help="predict only (no real runs)")
    ap.add_argument("--batches", type=int_list, default=list(BATCHES),
                    help="batch sizes predicted on the roofline profiles ('' for none)")
    ap.add_argument("--phases", choices=list(PHASES), default="in-phase",
                    help="which models a step of the batch scheduler calls (engine/phase.py)")
    ap.add_argument("--host-ms", type=HostCosts.parse_ms, default=NO_HOST, metavar="CALL,ROW[,CHOICE[,REUSE]]",
                    help="price the engine's own work: ms per sequence in a call, ms per row (docs/simulation.md), "
                         "ms per router choice that deliberates and per choice that reuses a recent decision "
                         "(router/pacing.py; benchmarks/router_work.py); default: not priced")
    ap.add_argument("--gpu-profile", type=Path, action="append", default=[], metavar="FILE",
                    help="also predict on this measured cost profile (scripts/gpu_check.sh's gpu_cost_profile.json)")
    ap.add_argument("--no-rooflines", action="store_true", help="skip the roofline profiles")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = result_stem(args, "simulation")
    result = (json.loads(args.render.read_text()) if args.render is not None
              else run(args.per_group, args.max_tokens, args.repeats, args.trace, stem, args.out,
                       not args.no_validate, args.target, tuple(args.batches), args.phases, args.host_ms,
                       tuple(args.gpu_profile), not args.no_rooflines, args.prompts))
    write_result(result, markdown, out=args.out, stem=stem)


if __name__ == "__main__":
    main()

"""The torch backend's static runtime against its eager one on this machine: the fp32 torch
1.5B target alone and `auto` over it, with either runtime, interleaved.

    python -m benchmarks torch-runtime [--per-set 2] [--lengths 64] [--stem NAME]

Two pools, one per runtime (backends/kv_runtime.py), each with its own auto router over the
q4 0.5B, the q4 1.5B and the target (+ the model-free level), started fresh (their profiles
measured at the start, the static target's apart: its timing key differs). Prompts: MT-Bench
first turns (`chat`) and documentation pages to summarise (`summary`), greedy. Per prompt:
the eager target alone first and last (pooled: the reference of every ratio), the static
target alone, auto over each runtime in between, in an order that rotates from prompt to
prompt. Tokens/s is the whole generation's wall time, prompt included. Also: the median
seconds of one forward of n tokens after 256 cached ones, per runtime (the profile each
router measured). The default runtime on a CPU follows this result (kv_runtime.py).
Writes <stem>.json and .md to benchmarks/results/.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

from benchmarks.args import benchmark_parser, int_list, profile_line, result_stem, router_start
from benchmarks.chains import static_runner
from benchmarks.machine import machine_info
from benchmarks.measure import run_routed
from benchmarks.output import write_result
from benchmarks.summary import BASELINE, baseline_drift, ratio_table, summarise
from benchmarks.torch_auto import MID, SMALL, TARGET, build_prompts, interleaved_runs
from specrouter.pool import Pool
from specrouter.router import auto_router

STATIC_ALONE = "target alone (static)"
AUTO_EAGER, AUTO_STATIC = "auto (eager)", "auto (static)"


def run(per_set: int, lengths: list[int]) -> dict:
    started = time.perf_counter()
    pools = {runtime: Pool(n_ctx=4096, n_seq_max=1, torch_runtime=runtime) for runtime in ("eager", "static")}
    routers, profiles = {}, {}
    for runtime, pool in pools.items():
        router_dir, _ = router_start(None)
        routers[runtime] = auto_router(pool, TARGET, [SMALL, MID, TARGET], profile_dir=router_dir, progress=False)
        profiles[runtime] = routers[runtime].costs.profile.as_dict()
    prompts = build_prompts(pools["eager"].level(TARGET), per_set)
    methods = {BASELINE: static_runner(pools["eager"], [TARGET], ()),
               STATIC_ALONE: static_runner(pools["static"], [TARGET], ()),
               AUTO_EAGER: lambda tokens, params, n: run_routed(routers["eager"], tokens, params, n),
               AUTO_STATIC: lambda tokens, params, n: run_routed(routers["static"], tokens, params, n)}
    setup = time.perf_counter() - started
    try:
        runs = interleaved_runs(prompts, lengths, methods)
    finally:
        for pool in pools.values():
            pool.close()
    summary = summarise(runs)
    return {
        "machine": machine_info(),
        "settings": {"per_set": per_set, "lengths": lengths, "target": TARGET, "pool": [SMALL, MID, TARGET],
                     "router_start": "fresh per runtime: no saved estimates, profiles measured at the start"},
        "phase_seconds": {"setup": round(setup, 1), "main": round(time.perf_counter() - started - setup, 1)},
        "runs": runs,
        "summary": summary,
        "ratios": ratio_table(summary),
        "baseline_drift": [round(d, 3) for d in baseline_drift(runs)],
        "profiles": profiles,
    }


def forward_table(profiles: dict[str, dict]) -> list[str]:
    """The target's forward seconds per size, per runtime, from the routers' profiles."""
    rows = ["| runtime | " + " | ".join(f"n={n}" for n in (1, 4, 16, 32, 64)) + " |", "|---|" + "---|" * 5]
    for runtime, profile in profiles.items():
        table = profile["models"].get(TARGET, {})
        cells = [f"{table[str(n)] * 1e3:.1f} ms" if str(n) in table else "" for n in (1, 4, 16, 32, 64)]
        rows.append(f"| {runtime} | " + " | ".join(cells) + " |")
    return rows


def markdown(result: dict) -> str:
    m, s = result["machine"], result["settings"]
    columns = [f"{d} | {n} tokens" for n in s["lengths"] for d in ("chat", "summary", "all")]
    drift = result["baseline_drift"]
    lines = [
        f"# The static torch runtime against the eager one, fp32 1.5B target ({m['date']})", "",
        f"Machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}. Command: `{m['command']}`. "
        f"Run time {sum(result['phase_seconds'].values()) / 60:.1f} min. Routers: {s['router_start']}.", "",
        f"Target {s['target']}; auto's pool {', '.join(s['pool'])} (+ the model-free level). {s['per_set']} prompts "
        "per set, greedy; per prompt the eager target alone first and last (pooled: the reference), the others "
        "between, rotating. Tokens/s: the whole generation, prompt included."
        + (f" The eager target alone's second run over its first: {min(drift):.2f}-{max(drift):.2f}." if drift else ""),
        "", "## Median ratio to the eager target alone (per prompt)", "",
        "| method | " + " | ".join(c.replace(" | ", ", ") for c in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for method, values in result["ratios"].items():
        lines.append(f"| {method} | " + " | ".join(str(values.get(c, "")) for c in columns) + " |")
    lines += ["", "## Details", "", "| method | set, length | median tok/s | greedy identical |", "|---|---|---|---|"]
    for key, v in result["summary"].items():
        method, dataset, mode = key.split(" | ")
        lines.append(f"| {method} | {dataset}, {mode} | {v['median_tokens_per_second']} | {v['identical_outputs']} |")
    lines += ["", "## The target's forward, per runtime (the routers' starting profiles)", "",
              *forward_table(result["profiles"]), ""]
    lines += [f"- {runtime}: {profile_line(profile, TARGET, 'auto')}" for runtime, profile in result["profiles"].items()]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    ap = benchmark_parser("torch-runtime", __doc__, per=("set", 2), render=True)
    ap.add_argument("--lengths", type=int_list, default=[64], help="comma-separated new-token limits")
    args = ap.parse_args(argv)
    result = (json.loads(args.render.read_text()) if args.render is not None else run(args.per_group, args.lengths))
    write_result(result, markdown, out=args.out, stem=result_stem(args, "torch-runtime", result))


if __name__ == "__main__":
    main()

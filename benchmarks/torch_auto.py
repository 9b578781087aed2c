"""auto over the fp32 torch target where a new user meets it: chat and summarisation
prompts, short answers (48 and 128 new tokens), against the target alone.

    python -m benchmarks torch-auto [--per-set 4] [--lengths 48,128] [--router-dir DIR] [--stem NAME]

The fp32 torch 1.5B is the target where model drafts pay on this CPU (a q4 0.5B draft
token costs a few % of its forward: benchmarks/torch_target.py); the copy-drafting issue
asks auto to reach 1.5x the target alone on chat and summarisation at 48 and at 128 new
tokens, where a short answer leaves little to amortise exploration and a draft model's
prefill of the prompt over.

Sets: `chat`, MT-Bench first turns (one user message); `summary`, FastChat documentation
pages of 1,000-6,000 characters to summarise in three sentences (benchmarks.workloads
summaries: a long prompt, a short answer). Greedy. Per prompt and length: the target alone
first and last (both runs pooled: the reference of every ratio), the fixed chain
q4 0.5B -> fp32 1.5B [16] and auto in between, in an order that rotates from turn to
turn; the prompts' two lengths follow one another. One auto router for the whole run (as a
server or a user's saved estimates keep it) over the q4 0.5B, the q4 1.5B and the target,
with the default model-free level, started as --router-dir says (default: fresh, the
profile measured at the start). Tokens/s is the whole generation's wall time, prompt
included: what a user waits for. The profile the router started from is recorded (`profile`
in the JSON, the target's and the draft's sizes in the report). Writes <stem>.json and .md to
benchmarks/results/.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from benchmarks.args import ROUTER_DIR, benchmark_parser, int_list, profile_line, result_stem, router_start
from benchmarks.chains import run_order, static_runner
from benchmarks.machine import machine_info
from benchmarks.measure import run_routed
from benchmarks.output import write_result
from benchmarks.prompts import load as load_prompts
from benchmarks.summary import BASELINE, baseline_drift, ratio_table, routed_chains, summarise
from benchmarks.workloads import summaries
from specrouter.cascade.sampling import SamplingParams
from specrouter.chat import chat_prompt_tokens
from specrouter.pool import Pool
from specrouter.router import auto_router

TARGET = "qwen2.5-coder-1.5b:torch-fp32"
SMALL, MID = "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"  # llama.cpp q4
CHAIN = "0.5b q4 -> 1.5b fp32 [16]"
AUTO = "auto"
BAR = 1.5
GREEDY = SamplingParams()


def build_prompts(target, per_set: int) -> list[tuple[str, str, list[int]]]:
    """(set, id, prompt tokens), the sets alternating so that a run stopped early stays balanced."""
    chat = [(p.id, [{"role": "user", "content": p.text}]) for p in load_prompts("mtbench", per_set)]
    summary = [(t.id, t.messages()) for t in summaries(per_set)]
    out = []
    for pair in zip(chat, summary):
        for name, (pid, messages) in zip(("chat", "summary"), pair):
            out.append((name, pid, chat_prompt_tokens(target, messages)))
    return out


def run(per_set: int, lengths: list[int], router_dir: Path | None) -> dict:
    started = time.perf_counter()
    router_dir, router_state = router_start(router_dir)
    pool = Pool(n_ctx=4096, n_seq_max=1)
    target = pool.level(TARGET)
    prompts = build_prompts(target, per_set)
    router = auto_router(pool, TARGET, [SMALL, MID, TARGET], profile_dir=router_dir, progress=False)
    profile = router.costs.profile.as_dict()  # as it starts: the runs refine the router's own
    methods = {BASELINE: static_runner(pool, [TARGET], ()), CHAIN: static_runner(pool, [SMALL, TARGET], (16,)),
               AUTO: lambda tokens, params, n: run_routed(router, tokens, params, n)}
    setup = time.perf_counter() - started
    try:
        runs = interleaved_runs(prompts, lengths, methods)
    finally:
        pool.close()
    summary = summarise(runs)
    return {
        "machine": machine_info(),
        "settings": {"per_set": per_set, "lengths": lengths, "target": TARGET, "pool": [SMALL, MID, TARGET],
                     "chain": CHAIN, "router_start": router_state},
        "phase_seconds": {"setup": round(setup, 1), "main": round(time.perf_counter() - started - setup, 1)},
        "runs": runs,
        "summary": summary,
        "ratios": ratio_table(summary),
        "baseline_drift": [round(d, 3) for d in baseline_drift(runs)],
        "auto_chains": auto_chains(runs),
        "profile": profile,
    }


def interleaved_runs(prompts: list[tuple[str, str, list[int]]], lengths: list[int], methods: dict) -> list[dict]:
    """Every method on every prompt and length, greedy, in run_order (the target alone first
    and last), one record per run; `same_as_target` compares with the target alone's first."""
    runs, turn = [], 0
    with tqdm(total=len(prompts) * len(lengths) * (len(methods) + 1), desc="runs", unit="run") as bar:
        for dataset, pid, tokens in prompts:
            for n in lengths:
                reference = None  # the target alone's text, which runs first
                for position, method in enumerate(run_order(list(methods), turn)):
                    bar.set_postfix_str(f"{dataset} {pid} {n} {method}")
                    record, ids = methods[method](tokens, GREEDY, n)
                    reference = ids if reference is None else reference
                    record.update(dataset=dataset, prompt=pid, mode=f"{n} tokens", method=method,
                                  position=position, prompt_tokens=len(tokens), same_as_target=ids == reference)
                    runs.append(record)
                    bar.update(1)
                turn += 1
    return runs


def auto_chains(runs: list[dict]) -> dict[str, dict[str, int]]:
    """Per 'set | length': cycles auto ran per chain, most used first."""
    return routed_chains(runs, lambda r: f"{r['dataset']} | {r['mode']}" if r["method"] == AUTO else None)


def markdown(result: dict) -> str:
    m, s = result["machine"], result["settings"]
    ratios = result["ratios"]
    columns = [f"{d} | {n} tokens" for n in s["lengths"] for d in ("chat", "summary", "all")]
    drift = result["baseline_drift"]
    lines = [
        f"# auto over the fp32 torch target, short answers ({m['date']})", "",
        f"Machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}, llama-cpp-python {m['llama_cpp_python']}. "
        f"Command: `{m['command']}`. Run time {sum(result['phase_seconds'].values()) / 60:.1f} min. "
        f"Router at the start: {s['router_start']}.", "",
        f"Target {s['target']}; auto's pool {', '.join(s['pool'])} (+ the model-free level). {s['per_set']} prompts "
        "per set (chat: MT-Bench first turns; summary: a documentation page to summarise in three sentences), "
        "greedy, per prompt and length the target alone first and last (pooled: the reference), the others between. "
        "Tokens/s: the whole generation, prompt included. The target alone's second run over its first, per prompt "
        f"and length (the noise floor): {min(drift):.2f}-{max(drift):.2f}." if drift else "", "",
        f"## Median ratio to the target alone (per prompt; the bar for auto: {BAR}x)", "",
        "| method | " + " | ".join(c.replace(" | ", ", ") for c in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for method, values in ratios.items():
        lines.append(f"| {method} | " + " | ".join(str(values.get(c, "")) for c in columns) + " |")
    lines += ["", "## Details", "", "| method | set, length | median tok/s | greedy identical |", "|---|---|---|---|"]
    for key, v in result["summary"].items():
        method, dataset, mode = key.split(" | ")
        lines.append(f"| {method} | {dataset}, {mode} | {v['median_tokens_per_second']} | {v['identical_outputs']} |")
    lines += ["", "## Chains auto ran (cycles)", ""]
    lines += [f"- {key}: " + ", ".join(f"{c} {n}" for c, n in chains.items())
              for key, chains in result["auto_chains"].items()]
    if "profile" in result:
        lines += ["", "## The router's starting profile", ""]
        lines += [f"- {profile_line(result['profile'], name, 'auto')}" for name in (TARGET, SMALL)]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    ap = benchmark_parser("torch-auto", __doc__, per=("set", 4), render=True, router_dir=ROUTER_DIR)
    ap.add_argument("--lengths", type=int_list, default=[48, 128], help="comma-separated new-token limits")
    args = ap.parse_args(argv)
    result = (json.loads(args.render.read_text()) if args.render is not None
              else run(args.per_group, args.lengths, args.router_dir))
    write_result(result, markdown, out=args.out, stem=result_stem(args, "torch-auto", result))


if __name__ == "__main__":
    main()

"""Serving throughput and latency versus concurrency: the target alone and auto routing.

    python -m benchmarks serving [--concurrency 1,2,4,8] [--requests-per-slot 2] [--max-tokens 96]
                                 [--workload first-turn|code-edit|docs] [--lookup ngram|suffix]
                                 [--router-dir DIR] [--exact] [--stem NAME]
                                 [--chain A,B --draft-lengths K [--no-auto]]

Closed loop, in process, through the same BatchScheduler the server runs: at
concurrency c, c requests are in flight at every moment (a finished one is replaced
at once from the prompt list) until c x requests-per-slot have completed. Both methods
run in one process, alternating per concurrency level, on the same prompts (first-turn:
HumanEval completions and GSM8K chats; or a workload whose answers repeat their prompt,
benchmarks/workloads.py), greedy. Auto routes the default pool and the lookup drafter
(with the suffix drafter, a cross-request memory of the default budget that every
request feeds, as a server's `shared` memory); its estimates and profile start as
--router-dir says (default: fresh), and the profile it started from is recorded
(`profile`). Reports total generated tokens/s, time to first token and inter-token
latency (median and p95; a delta of k tokens after a gap g counts as k gaps of g/k), the
batch sizes the models actually ran, and for auto the share of cycles that speculated.
--exact runs every model on the exact kernels (`serve --exact`; docs/cascade-and-exactness.md), the
target alone included. Writes JSON, a markdown table and a PNG plot to benchmarks/results/.

--chain adds a fixed chain of pool models, served twice: by a scheduler whose steps call the
model most sequences wait on (in-phase, the server's) and by one whose steps call every
model some sequence waits on (serve-all; engine/phase.py); the target alone then runs again
last at each level, and the ratios are to the mean of its two runs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tqdm import tqdm

from benchmarks.args import ROUTER_DIR, benchmark_parser, int_list, profile_line, result_stem, router_start
from benchmarks.machine import machine_info
from benchmarks.output import write_result
from benchmarks.prompts import load
from benchmarks.workloads import load as load_workload
from specrouter.cascade.sampling import SamplingParams
from specrouter.chat import chat_prompt_tokens
from specrouter.drafters import MODEL_FREE
from specrouter.drafters.memory import SuffixMemory
from specrouter.engine.batch import BatchScheduler, Delta, Failed, Finished, SeqRequest
from specrouter.engine.phase import InPhase, ServeAll
from specrouter.pool import Pool
from specrouter.router import auto_router

SMALL, TARGET = "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"


def prompts(target, n: int) -> list[list[int]]:
    out = [target.tokenize(p.text) for p in load("humaneval", n)]
    out += [chat_prompt_tokens(target, [{"role": "user", "content": p.text}]) for p in load("gsm8k", n)]
    return [out[i // 2 + (i % 2) * n] for i in range(2 * n)]  # alternate the two kinds


def closed_loop(scheduler: BatchScheduler, prompt_list: list[list[int]], concurrency: int, total: int,
                max_tokens: int) -> dict:
    """Keep `concurrency` requests in flight until `total` have finished."""
    submitted = done = 0
    sent_at, first_at, last_at, gaps, tokens = {}, {}, {}, [], 0
    speculated = cycles = 0
    start = time.perf_counter()
    while done < total:
        while submitted < total and submitted - done < concurrency:
            rid = str(submitted)
            scheduler.add(rid, SeqRequest(prompt_list[submitted % len(prompt_list)], SamplingParams(), max_tokens))
            sent_at[rid] = time.perf_counter()
            submitted += 1
        for e in scheduler.step():
            now = time.perf_counter()
            if isinstance(e, Failed):
                raise RuntimeError(f"request {e.request_id} failed: {e.error}")
            if isinstance(e, Delta) and e.tokens:
                if e.request_id not in first_at:
                    first_at[e.request_id] = now
                else:
                    gaps += [(now - last_at[e.request_id]) / e.tokens] * e.tokens
                last_at[e.request_id] = now
            if isinstance(e, Finished):
                done += 1
                tokens += len(e.result.token_ids)
                cycles += e.result.cycles
                speculated += sum(1 for c in e.result.chains_per_cycle if e.result.chains_used[c][1])
    wall = time.perf_counter() - start
    ttft = [first_at[r] - sent_at[r] for r in first_at]
    return {
        "concurrency": concurrency,
        "requests": total,
        "tokens": tokens,
        "seconds": round(wall, 3),
        "tokens_per_second": round(tokens / wall, 3),
        "ttft_median_ms": round(float(np.median(ttft)) * 1e3, 1),
        "itl_median_ms": round(float(np.median(gaps)) * 1e3, 1) if gaps else None,
        "itl_p95_ms": round(float(np.percentile(gaps, 95)) * 1e3, 1) if gaps else None,
        "speculating_cycles": round(speculated / cycles, 3) if cycles else 0.0,
        "batch_sizes": {m: round(sum(b * n for b, n in s.items()) / s.total(), 2) for m, s in scheduler.batch_sizes.items()},
    }


def repeating_prompts(target, workload: str, n: int) -> list[list[int]]:
    """Chat prompts of a one-turn workload of benchmarks/workloads.py."""
    return [chat_prompt_tokens(target, task.messages()) for task in load_workload(workload, n)]


def run(levels: list[int], per_slot: int, max_tokens: int, workload: str = "first-turn", lookup: str = "ngram",
        router_dir: Path | None = None, chain: list[str] | None = None, draft_lengths: list[int] | None = None,
        auto: bool = True, exact: bool = False) -> dict:
    router_dir, router_state = router_start(router_dir)
    pool = Pool(n_ctx=2048, n_seq_max=max(levels), exact=exact)
    target = pool.level(TARGET)
    n = max(4, max(levels) * per_slot // 2)
    prompt_list = prompts(target, n) if workload == "first-turn" else repeating_prompts(target, workload, 2 * n)
    memory = SuffixMemory() if MODEL_FREE[lookup].remembers else None
    router = auto_router(pool, TARGET, [SMALL, TARGET], profile_dir=router_dir, progress=True, lookup=lookup,
                         memory=memory) if auto else None
    profile = router.costs.profile.as_dict() if router is not None else None  # as it starts
    alone = pool.chain([TARGET])
    # (method, planner, the scheduler's step policy)
    methods = [("target alone", lambda r: alone, InPhase())]
    if auto:
        methods.append(("auto", lambda r: router.session(), InPhase()))
    if chain:
        fixed = pool.chain(chain, draft_lengths)
        label = f"{' -> '.join(chain)} {list(fixed.draft_lengths)}"
        methods += [(f"{label}, in-phase", lambda r: fixed, InPhase()), (f"{label}, serve-all", lambda r: fixed, ServeAll()),
                    ("target alone", lambda r: alone, InPhase())]
    rows = []
    with tqdm(total=len(levels) * len(methods), desc="concurrency levels") as bar:
        for c in levels:
            for method, plan, phases in methods:
                scheduler = BatchScheduler(plan, max_batch=c, phases=phases)
                rows.append({"method": method, **closed_loop(scheduler, prompt_list, c, c * per_slot, max_tokens)})
                bar.update(1)
    if router is not None:
        router.save_estimates()
    pool.close()
    return {"machine": machine_info(), "max_tokens": max_tokens, "requests_per_slot": per_slot, "rows": rows,
            "workload": workload, "lookup": lookup, "router_start": router_state, "exact": exact, "profile": profile,
            "memory": None if memory is None else {"tokens_held": len(memory), "budget": memory.budget,
                                                   "megabytes": round(memory.nbytes / 2**20, 1)}}


def markdown(result: dict, plot: str) -> str:
    m = result["machine"]
    lines = [
        f"# Serving: throughput and latency vs concurrency ({m['date']})", "",
        f"Machine: {m['cpu']}, {m['cores']} cores, llama-cpp-python {m['llama_cpp_python']}. "
        f"Command: `{m['command']}`. Default pool (target {TARGET}, draft {SMALL} and the "
        f"{result.get('lookup', 'ngram')} lookup), "
        f"{'exact' if result.get('exact') else 'default'} kernels, workload {result.get('workload', 'first-turn')}, greedy, "
        f"{result['max_tokens']} new tokens per request at most, closed loop with c requests in flight, "
        f"{result['requests_per_slot']} x c requests per level, every method in one run. "
        + (f"Router at the start: {result.get('router_start', 'the user cache')}."
           if any(r["method"] == "auto" for r in result["rows"]) else "No router (auto left out).")
        + (f" Cross-request memory at the end: {result['memory']['tokens_held']:,} tokens held, "
           f"{result['memory']['megabytes']} MB." if result.get("memory") else ""), "",
        "| concurrency | method | total tok/s | ratio to target alone | TTFT median ms | ITL median ms | ITL p95 ms "
        "| cycles speculating | mean batch per model call |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    alone: dict[int, list[float]] = {}
    for r in result["rows"]:
        if r["method"] == "target alone":
            alone.setdefault(r["concurrency"], []).append(r["tokens_per_second"])
    base = {c: float(np.mean(v)) for c, v in alone.items()}  # its run first and, with --chain, last
    for r in result["rows"]:
        lines.append(
            f"| {r['concurrency']} | {r['method']} | {r['tokens_per_second']} | "
            f"{r['tokens_per_second'] / base[r['concurrency']]:.3f} | {r['ttft_median_ms']} | {r['itl_median_ms']} | "
            f"{r['itl_p95_ms']} | {r['speculating_cycles']:.0%} | "
            + ", ".join(f"{k}: {v}" for k, v in r["batch_sizes"].items()) + " |")
    if result.get("profile"):
        lines += ["", profile_line(result["profile"], TARGET, "auto")]
    return "\n".join(lines + ["", f"![throughput and latency vs concurrency]({plot})", ""])


def plot(result: dict, file: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for method in dict.fromkeys(r["method"] for r in result["rows"]):
        rows = [r for r in result["rows"] if r["method"] == method]
        xs = [r["concurrency"] for r in rows]
        left.plot(xs, [r["tokens_per_second"] for r in rows], marker="o", label=method)
        right.plot(xs, [r["itl_median_ms"] for r in rows], marker="o", label=f"{method} median")
        right.plot(xs, [r["itl_p95_ms"] for r in rows], marker="x", linestyle="--", label=f"{method} p95")
    left.set(xlabel="concurrent requests", ylabel="total tokens/s", title="Throughput")
    right.set(xlabel="concurrent requests", ylabel="ms per token", title="Inter-token latency")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.legend()
    fig.tight_layout()
    fig.savefig(file, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    ap = benchmark_parser("serving", __doc__, concurrency="1,2,4,8", max_tokens=96, router_dir=ROUTER_DIR)
    ap.add_argument("--requests-per-slot", type=int, default=2)
    ap.add_argument("--workload", choices=["first-turn", "code-edit", "docs"], default="first-turn")
    ap.add_argument("--lookup", choices=list(MODEL_FREE), default="ngram")
    ap.add_argument("--chain", help="also a fixed chain of pool models, e.g. qwen2.5-coder-0.5b,qwen2.5-coder-1.5b, "
                                    "served in phase and serving every model each step")
    ap.add_argument("--draft-lengths", type=int_list, help="the fixed chain's draft lengths, e.g. 3")
    ap.add_argument("--no-auto", action="store_true", help="leave auto out")
    ap.add_argument("--exact", action="store_true", help="every model on the exact kernels (serve --exact)")
    args = ap.parse_args(argv)
    chain = args.chain.split(",") if args.chain else None
    result = run(args.concurrency, args.requests_per_slot, args.max_tokens, args.workload, args.lookup,
                 args.router_dir, chain, args.draft_lengths, not args.no_auto, args.exact)
    stem = result_stem(args, "serving", result)
    args.out.mkdir(parents=True, exist_ok=True)
    plot(result, args.out / f"{stem}.png")
    write_result(result, lambda r: markdown(r, f"{stem}.png"), out=args.out, stem=stem)


if __name__ == "__main__":
    main()

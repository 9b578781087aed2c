"""Fixed chains and `auto` against the target alone, side by side in one run.

    python -m benchmarks.chains [--per-dataset 10] [--max-tokens 128]

For every prompt (HumanEval as raw completion, GSM8K as chat) every method runs in
turn, so drift of the machine hits all methods alike. Reports per method the median
tokens/s, the median ratio to the target alone on the same prompt, mean accepted
length per level, and whether the greedy output equals the target's. Also measures
what one forward over k tokens costs each model (k = 1..16), the number that decides
whether verification pays. Writes JSON and a markdown table to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from benchmarks.machine import machine_info
from benchmarks.prompts import load
from specrouter.cascade.sampling import SamplingParams
from specrouter.chat import chat_prompt_tokens
from specrouter.engine import generate
from specrouter.pool import Pool
from specrouter.router import auto_router

SMALL, TARGET = "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"
METHODS = {
    "target alone": ([TARGET], []),
    "0.5b -> 1.5b": ([SMALL, TARGET], [4]),
    "ngram -> 1.5b": (["ngram", TARGET], [4]),
    "ngram -> 0.5b -> 1.5b": (["ngram", SMALL, TARGET], [3, 4]),
}
RESULTS = Path(__file__).parent / "results"


def forward_costs(pool: Pool, ks=(1, 2, 3, 4, 6, 8, 12, 16), repeats: int = 5) -> dict[str, dict[int, float]]:
    """Median ms of one decode of k tokens after a cached 64-token prefix."""
    costs = {}
    for name in (SMALL, TARGET):
        model = pool.level(name)
        seq = model.new_sequence()
        prefix = model.tokenize("def quicksort(items):\n" * 8)[:64]
        model.decode(seq, prefix, 0, 1)
        row = {}
        for k in ks:
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                model.decode(seq, prefix[:k], len(prefix), k)
                times.append(time.perf_counter() - start)
                model.remove(seq, len(prefix))
            row[k] = round(statistics.median(times) * 1000, 1)
        model.free_sequence(seq)
        costs[name] = row
    return costs


def run(per_dataset: int, max_tokens: int) -> dict:
    pool = Pool(n_ctx=4096, n_seq_max=1)
    target = pool.level(TARGET)
    prompts = []
    for p in load("humaneval", per_dataset):
        prompts.append((p.dataset, p.id, target.tokenize(p.text)))
    for p in load("gsm8k", per_dataset):
        prompts.append((p.dataset, p.id, chat_prompt_tokens(target, [{"role": "user", "content": p.text}])))
    chains = {m: pool.chain(specs, lengths) for m, (specs, lengths) in METHODS.items()}
    # One router for the whole run, as a server would keep it: its estimates carry over.
    chains["auto"] = auto_router(pool, TARGET, [SMALL, TARGET], progress=False)

    costs = forward_costs(pool)
    runs = []
    for dataset, pid, tokens in tqdm(prompts, desc="prompts"):
        reference = None
        for method, chain in chains.items():
            r = generate(chain, tokens, SamplingParams(), max_tokens)
            if reference is None:
                reference = r.token_ids
            levels = r.levels
            if method == "auto":  # per-level numbers of a routed run mix chains: report its choice
                levels = []
            runs.append({
                "dataset": dataset,
                "prompt": pid,
                "method": method,
                "tokens": len(r.token_ids),
                "seconds": r.wall_seconds,
                "tokens_per_second": r.tokens_per_second,
                "cycles": r.cycles,
                "same_as_target": r.token_ids == reference,
                # tokens accepted per verification block, for each proposing level
                "accepted_per_block": [
                    levels[i].accepted / levels[i + 1].forwards if levels[i + 1].forwards else 0.0
                    for i in range(len(levels) - 1)
                ],
                "acceptance": [s.acceptance for s in levels[:-1]],
                "chains_used": [" -> ".join(c) for c, _ in r.chains_used],
            })
    pool.close()
    return {"machine": machine_info(), "max_tokens": max_tokens, "per_dataset": per_dataset,
            "methods": {**{m: {"chain": s, "draft_lengths": k} for m, (s, k) in METHODS.items()},
                        "auto": {"chain": "auto", "draft_lengths": "chosen per cycle"}},
            "forward_ms": costs, "runs": runs, "summary": summarise(runs)}


def summarise(runs: list[dict]) -> dict:
    by = {}
    baseline = {(r["dataset"], r["prompt"]): r["tokens_per_second"] for r in runs if r["method"] == "target alone"}
    for method in dict.fromkeys(r["method"] for r in runs):
        for dataset in ("all", *dict.fromkeys(r["dataset"] for r in runs)):
            rows = [r for r in runs if r["method"] == method and dataset in ("all", r["dataset"])]
            depth = len(rows[0]["accepted_per_block"])
            by[f"{method} | {dataset}"] = {
                "median_tokens_per_second": round(statistics.median(r["tokens_per_second"] for r in rows), 2),
                "median_ratio_to_target": round(statistics.median(
                    r["tokens_per_second"] / baseline[(r["dataset"], r["prompt"])] for r in rows), 3),
                "mean_accepted_per_block": [round(float(np.mean([r["accepted_per_block"][i] for r in rows])), 2)
                                            for i in range(depth)],
                "identical_outputs": f"{sum(r['same_as_target'] for r in rows)}/{len(rows)}",
                "chains_used": sorted({c for r in rows for c in r["chains_used"]}),
            }
    return by


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [
        f"# Fixed chains vs the target alone ({m['date']})",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, llama-cpp-python {m['llama_cpp_python']}. "
        f"Command: `{m['command']}`. Greedy, {result['max_tokens']} new tokens, "
        f"{result['per_dataset']} HumanEval + {result['per_dataset']} GSM8K prompts, one run each, "
        "methods interleaved per prompt.",
        "",
        "| method | dataset | median tok/s | median ratio to target | mean accepted per block (per level) | greedy output = target | chains run |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, s in result["summary"].items():
        method, dataset = key.split(" | ")
        lines.append(f"| {method} | {dataset} | {s['median_tokens_per_second']} | {s['median_ratio_to_target']} | "
                     f"{s['mean_accepted_per_block']} | {s['identical_outputs']} | {'; '.join(s['chains_used'])} |")
    ks = list(next(iter(result["forward_ms"].values())))
    lines += ["", "Cost of one forward over k tokens (ms, median of 5, cached 64-token prefix):", "",
              "| model | " + " | ".join(f"k={k}" for k in ks) + " |", "|---|" + "---|" * len(ks)]
    for name, row in result["forward_ms"].items():
        lines.append(f"| {name} | " + " | ".join(str(row[k]) for k in ks) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-dataset", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    result = run(args.per_dataset, args.max_tokens)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"chains-{result['machine']['date'][:10]}"
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1, default=str))
    md = markdown(result)
    (args.out / f"{stem}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()

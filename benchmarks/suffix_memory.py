"""The cross-request suffix memory's size and speed (docs/drafters.md):

    python -m benchmarks suffix-memory [--budget 2000000]

Fills a memory of `budget` tokens with Zipf-distributed texts of 256 tokens over a
50,000-token vocabulary (seed 0), then times propose(64) on 199 contexts that quote a
stored text and 200 random ones. Reports bytes per token of budget, add time per token,
and the median and p95 of propose. Writes suffix-memory-<date>.json and .md to
benchmarks/results/ (or --out).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import numpy as np

from benchmarks.args import benchmark_parser, result_stem
from benchmarks.machine import machine_info
from benchmarks.output import write_result
from specrouter.drafters.memory import SuffixMemory


def run(budget: int) -> dict:
    rng = np.random.default_rng(0)
    memory = SuffixMemory(budget)
    texts = [(rng.zipf(1.3, size=256) % 50_000).tolist() for _ in range(budget // 256 * 9 // 8)]
    start = time.perf_counter()
    for text in texts:
        memory.add(text)
    add = (time.perf_counter() - start) / sum(len(t) for t in texts)
    contexts = {"contexts quoting a stored text": [texts[-i][:100] for i in range(1, 200)],
                "random contexts": [(rng.zipf(1.3, size=100) % 50_000).tolist() for _ in range(200)]}
    propose = {}
    for label, batch in contexts.items():
        times = []
        for context in batch:
            start = time.perf_counter()
            memory.propose(context, 64)
            times.append(time.perf_counter() - start)
        propose[label] = {"median_ms": statistics.median(times) * 1e3, "p95_ms": float(np.percentile(times, 95)) * 1e3}
    return {"machine": machine_info(), "budget": budget, "held": len(memory), "bytes": memory.nbytes,
            "add_us_per_token": add * 1e6, "propose_64": propose}


def markdown(result: dict) -> str:
    m, budget = result["machine"], result["budget"]
    lines = [f"# The cross-request suffix memory's size and speed ({m['date']})", "",
             f"Machine: {m['cpu']}, {m['cores']} cores. Command: `{m['command']}`.", "",
             f"{result['held']:,} of {budget:,} tokens held, {result['bytes'] / 2**20:.1f} MB "
             f"({result['bytes'] / budget:.1f} bytes per token), add {result['add_us_per_token']:.2f} us per token.", "",
             "| propose(64) on | median (ms) | p95 (ms) |", "|---|---|---|"]
    lines += [f"| {label} | {t['median_ms']:.3f} | {t['p95_ms']:.3f} |" for label, t in result["propose_64"].items()]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    ap = benchmark_parser("suffix-memory", __doc__)
    ap.add_argument("--budget", type=int, default=2_000_000, help="tokens the memory keeps (default 2,000,000)")
    args = ap.parse_args(argv)
    result = run(args.budget)
    write_result(result, markdown, out=args.out, stem=result_stem(args, "suffix-memory", result))


if __name__ == "__main__":
    main()

"""The cross-request suffix memory's size and speed (docs/drafters.md):

    python -m benchmarks.suffix_memory [--budget 2000000]

Fills a memory of `budget` tokens with Zipf-distributed texts of 256 tokens over a
50,000-token vocabulary (seed 0), then times propose(64) on 199 contexts that quote a
stored text and 200 random ones. Prints bytes per token of budget, add time per token,
and the median and p95 of propose.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from benchmarks.machine import machine_info
from specrouter.drafters.memory import SuffixMemory


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=2_000_000)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    memory = SuffixMemory(args.budget)
    texts = [(rng.zipf(1.3, size=256) % 50_000).tolist() for _ in range(args.budget // 256 * 9 // 8)]
    start = time.perf_counter()
    for text in texts:
        memory.add(text)
    add = (time.perf_counter() - start) / sum(len(t) for t in texts)
    m = machine_info()
    print(f"{m['date']}, {m['cpu']}, {m['cores']} cores: {len(memory):,} of {args.budget:,} tokens held, "
          f"{memory.nbytes / 2**20:.1f} MB ({memory.nbytes / args.budget:.1f} bytes per token), "
          f"add {add * 1e6:.2f} us per token")
    contexts = {"contexts quoting a stored text": [texts[-i][:100] for i in range(1, 200)],
                "random contexts": [(rng.zipf(1.3, size=100) % 50_000).tolist() for _ in range(200)]}
    for label, batch in contexts.items():
        times = []
        for context in batch:
            start = time.perf_counter()
            memory.propose(context, 64)
            times.append(time.perf_counter() - start)
        print(f"propose(64), {label}: median {statistics.median(times) * 1e3:.3f} ms, "
              f"p95 {np.percentile(times, 95) * 1e3:.3f} ms")


if __name__ == "__main__":
    main()

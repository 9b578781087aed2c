"""The single-process server versus `serve --ray`, over HTTP, at the same total threads.

    python -m benchmarks fleet [--concurrency 1,4,8] [--requests-per-slot 2] [--max-tokens 48]
                               [--repeats 3] [--chain off] [--stem NAME]

Three `specrouter serve` setups, one subprocess on a loopback port at a time (each `--ray`
one starts its own local Ray and stops it with the server): the single-process server with
2 threads, `--ray` with 1 replica x 2 threads, `--ray` with 2 replicas x 1 thread. A round
starts each in turn, the single-process server first and last (the drift of the machine
within a round), and runs every concurrency c on it after a warm-up request: a closed loop
keeps c streamed completions in flight until c x requests-per-slot have finished
(first-turn prompts: HumanEval and GSM8K texts, greedy). (Until 2026-12-03 the three were up
side by side: the idle Ray instances' controllers took about 20% of a core from whichever
server was measured.) Reports per method and c the median over repeats of total generated
tokens/s, time to first token and the gaps between text chunks (median, p95) and request
latency, and the median over repeats of each round's ratio to the geometric mean of that
round's first and last single-process runs. Every server starts from a fresh cache
folder per thread count (the pulled models linked, profiles measured at the first start,
no saved estimates), with --chain as given (default off: the comparison is of serving
paths; the engine's work per token is the same). Writes JSON and markdown to
benchmarks/results/.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
import numpy as np

from benchmarks.args import benchmark_parser, result_stem
from benchmarks.machine import machine_info
from benchmarks.output import write_result
from benchmarks.prompts import load
from benchmarks.servers import free_port, stop, wait_healthy
from specrouter.models import default_cache_dir

TARGET = "qwen2.5-coder-1.5b"
CLI = str(Path(sys.executable).with_name("specrouter"))
#: server name -> (extra flags, threads per model)
SERVERS = {"single 1x2": ([], 2), "ray 1x2": (["--ray", "--replicas", "1"], 2),
           "ray 2x1": (["--ray", "--replicas", "2"], 1)}
#: The order of a round: (label, server).
ROUND = [("single 1x2", "single 1x2"), ("ray 1x2", "ray 1x2"), ("ray 2x1", "ray 2x1"),
         ("single 1x2 (last)", "single 1x2")]


def start(flags: list[str], threads: int, cache: Path, chain: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "SPECROUTER_CACHE": str(cache / "models")}
    proc = subprocess.Popen([CLI, "serve", "--port", str(port), "--threads", str(threads), "--chain", chain,
                             "--max-batch", "8", *flags], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(proc, url, f"the server {flags}")
    return proc, url


async def one(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int) -> dict:
    body = {"model": TARGET, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    first, last, gaps, tokens = None, None, [], 0
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if chunk["choices"] and chunk["choices"][0]["text"]:
                now = time.perf_counter()
                if first is None:
                    first = now
                else:
                    gaps.append(now - last)
                last = now
    return {"ttft": first - sent, "e2e": time.perf_counter() - sent, "gaps": gaps, "tokens": tokens}


async def closed_loop(url: str, prompts: list[str], concurrency: int, total: int, max_tokens: int) -> dict:
    queue = list(range(total))
    results: list[dict] = []
    async with httpx.AsyncClient(timeout=600) as client:
        async def worker() -> None:
            while queue:
                i = queue.pop(0)
                results.append(await one(client, url, prompts[i % len(prompts)], max_tokens))

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    gaps = [g for r in results for g in r["gaps"]]
    ttft = [r["ttft"] for r in results]
    return {"concurrency": concurrency, "requests": total, "wall_s": wall,
            "tokens_per_s": sum(r["tokens"] for r in results) / wall,
            "ttft_median_s": statistics.median(ttft), "ttft_p95_s": float(np.percentile(ttft, 95)),
            "gap_median_s": statistics.median(gaps), "gap_p95_s": float(np.percentile(gaps, 95)),
            "e2e_median_s": statistics.median(r["e2e"] for r in results)}


def run(levels: list[int], per_slot: int, max_tokens: int, chain: str, repeats: int) -> dict:
    texts = [p.text for p in load("humaneval", 8)] + [p.text for p in load("gsm8k", 8)]
    prompts = [texts[i // 2 + (i % 2) * 8] for i in range(16)]
    rows: dict[tuple[int, int], dict[str, dict]] = {(c, r): {} for r in range(repeats) for c in levels}
    with tempfile.TemporaryDirectory(prefix="specrouter-fleet-bench-") as tmp:
        for r in range(repeats):
            for label, server in ROUND:  # one server up at a time: nothing else of ours on the cores
                flags, threads = SERVERS[server]
                cache = Path(tmp) / f"threads-{threads}"
                if not cache.exists():  # the first start of a thread count profiles; later ones read it
                    cache.mkdir()
                    (cache / "models").symlink_to(default_cache_dir(), target_is_directory=True)
                proc, url = start(flags, threads, cache, chain)
                try:
                    asyncio.run(closed_loop(url, prompts, 1, 1, 8))  # warm-up
                    for c in levels:
                        rows[c, r][label] = asyncio.run(closed_loop(url, prompts, c, c * per_slot, max_tokens))
                finally:
                    stop(proc)
                print(r, label, {c: round(rows[c, r][label]["tokens_per_s"], 2) for c in levels}, flush=True)
    rounds = [{"concurrency": c, "repeat": r, "methods": row} for (c, r), row in rows.items()]
    return {"machine": machine_info(), "chain": chain, "max_tokens": max_tokens, "requests_per_slot": per_slot,
            "repeats": repeats, "rounds": rounds, "summary": summary(rounds)}


def summary(rounds: list[dict]) -> list[dict]:
    """Per concurrency and method: medians over the repeats, and the median of each round's
    ratio of tokens/s to that round's single-process runs, first and last (their geometric
    mean: a machine that drifts within a round at a steady pace cancels out; until
    2026-12-03 the ratio was to the first run alone)."""
    out = []
    for c in sorted({r["concurrency"] for r in rounds}):
        mine = [r["methods"] for r in rounds if r["concurrency"] == c]
        for label, _ in ROUND:
            runs = [m[label] for m in mine]
            out.append({"concurrency": c, "method": label,
                        "ratio": statistics.median(m[label]["tokens_per_s"] / bracket(m) for m in mine),
                        **{k: statistics.median(run[k] for run in runs)
                           for k in ("tokens_per_s", "ttft_median_s", "ttft_p95_s", "gap_median_s", "gap_p95_s",
                                     "e2e_median_s")}})
    return out


def bracket(methods: dict) -> float:
    """The geometric mean of a round's first and last single-process tokens/s."""
    return (methods["single 1x2"]["tokens_per_s"] * methods["single 1x2 (last)"]["tokens_per_s"]) ** 0.5


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [f"# Single-process server vs Ray Serve ({m['date']})", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, llama-cpp-python {m['llama_cpp_python']}. Command: "
             f"`{m['command']}`. Target {TARGET} (q4, llama.cpp), chain `{result['chain']}`, greedy, "
             f"{result['max_tokens']} new tokens, streamed completions over HTTP on loopback; at concurrency c a "
             f"closed loop of c x {result['requests_per_slot']} requests. One server up at a time; "
             f"{result['repeats']} rounds, each starting the servers in the order shown and running every c on each. "
             "Values: medians over the rounds; ratio: the median of each round's tokens/s over the geometric mean of "
             "that round's first and last single-process runs.", "",
             "| method | c | tok/s | ratio | TTFT median / p95 (ms) | chunk gap median / p95 (ms) | "
             "request median (s) |", "|---|---|---|---|---|---|---|"]
    for r in result["summary"]:
        lines.append(f"| {r['method']} | {r['concurrency']} | {r['tokens_per_s']:.2f} | {r['ratio']:.3f} | "
                     f"{1000 * r['ttft_median_s']:.0f} / {1000 * r['ttft_p95_s']:.0f} | "
                     f"{1000 * r['gap_median_s']:.0f} / {1000 * r['gap_p95_s']:.0f} | {r['e2e_median_s']:.2f} |")
    at_one = {r["method"]: r for r in result["summary"] if r["concurrency"] == 1}
    if "single 1x2" in at_one and "ray 1x2" in at_one:
        extra = 1000 * (at_one["ray 1x2"]["e2e_median_s"] - at_one["single 1x2"]["e2e_median_s"])
        lines += ["", f"Ray's overhead at c = 1 (median request of ray 1x2 less single 1x2's): {extra:.0f} ms per "
                      f"request of {result['max_tokens']} tokens."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    ap = benchmark_parser("fleet", __doc__, concurrency="1,4,8", max_tokens=48, repeats=3)
    ap.add_argument("--requests-per-slot", type=int, default=2)
    ap.add_argument("--chain", default="off", help="the servers' default speculation (off, auto or a chain)")
    args = ap.parse_args(argv)
    result = run(args.concurrency, args.requests_per_slot, args.max_tokens, args.chain, args.repeats)
    write_result(result, markdown, out=args.out, stem=result_stem(args, "fleet", result))


if __name__ == "__main__":
    main()

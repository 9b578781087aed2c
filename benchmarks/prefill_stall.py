"""Head-of-line blocking on the real pool: a stream's gaps while a long prompt arrives.

    python -m benchmarks.prefill_stall [--prompt-tokens 2000] [--shares none,1.0,0.5] [--repeats 2]
                                       [--stem NAME]

In process, through the BatchScheduler the server runs, on the default target (the q4
1.5B, llama.cpp) alone: request A (a GSM8K chat) streams; after its 10th delta, request
B arrives with a prompt of --prompt-tokens tokens (HumanEval prompts joined) and asks for
8 tokens. Per prefill share (none: the prompt is fed whole, as before chunked prefill),
repeated and interleaved: A's median gap before B arrived, its largest and 90th-percentile
gap while B's prompt was fed (from B's arrival to B's first token), their ratios, and B's
time to first token. Writes JSON and markdown to benchmarks/results/.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from benchmarks.args import benchmark_parser, result_stem
from benchmarks.machine import machine_info
from benchmarks.output import write_result
from benchmarks.prompts import load
from specrouter.cascade.sampling import SamplingParams
from specrouter.chat import chat_prompt_tokens
from specrouter.engine.batch import BatchScheduler, Delta, SeqRequest
from specrouter.pool import Pool

TARGET = "qwen2.5-coder-1.5b"


def one_run(pool: Pool, share: float | None, stream: list[int], long: list[int]) -> dict:
    chain = pool.chain([TARGET])
    scheduler = BatchScheduler(lambda r: chain, max_batch=2, prefill_share=share)
    scheduler.add("a", SeqRequest(stream, SamplingParams(), 1200))
    times, arrival, first = [], None, None
    while scheduler.n_active or scheduler.n_waiting:
        for event in scheduler.step():
            now = time.perf_counter()
            if event.request_id == "a" and isinstance(event, Delta):
                times.append(now)
                if len(times) == 10:
                    scheduler.add("b", SeqRequest(long, SamplingParams(), 8))
                    arrival = now
            elif event.request_id == "b" and isinstance(event, Delta) and first is None:
                first = now
        if first is not None and times[-1] > first:
            scheduler.cancel("a")
            scheduler.cancel("b")
    gaps = np.diff(times)
    before = float(np.median(gaps[:9]))
    during = [g for t, g in zip(times[1:], gaps) if arrival < t <= first] or [first - arrival]
    return {"share": share, "median_gap_before_s": round(before, 4), "max_gap_during_s": round(max(during), 4),
            "p90_gap_during_s": round(float(np.percentile(during, 90)), 4),
            "max_ratio": round(max(during) / before, 2), "p90_ratio": round(float(np.percentile(during, 90)) / before, 2),
            "gaps_during": len(during), "b_time_to_first_token_s": round(first - arrival, 3),
            "chunk_calls": scheduler.prefill.calls if scheduler.prefill else 0}


def main(argv: Sequence[str] | None = None) -> None:
    parser = benchmark_parser("prefill-stall", __doc__, repeats=2)
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--shares", default="none,1.0,0.5")
    args = parser.parse_args(argv)
    shares = [None if s == "none" else float(s) for s in args.shares.split(",")]
    pool = Pool(n_ctx=args.prompt_tokens + 1600, n_seq_max=2)
    target = pool.level(TARGET)
    stream = chat_prompt_tokens(target, [{"role": "user", "content": load("gsm8k", 1)[0].text}])
    joined = target.tokenize("\n\n".join(p.text for p in load("humaneval", 40)))
    long = joined[: args.prompt_tokens]
    assert len(long) == args.prompt_tokens, "not enough prompt text"
    one_run(pool, None, stream, long[:64])  # warm-up: weights paged in
    rows = [one_run(pool, share, stream, long) for _ in range(args.repeats) for share in shares]
    pool.close()
    result = {"machine": machine_info(), "prompt_tokens": args.prompt_tokens, "rows": rows}
    write_result(result, markdown, out=args.out, stem=result_stem(args, "prefill-stall", result))


def markdown(result: dict) -> str:
    m = result["machine"]
    head = ["prefill share", "A's median gap before (ms)", "max gap during (ms)", "max / median",
            "p90 / median", "B's time to first token (s)", "calls with chunks"]
    lines = [f"# Head-of-line blocking: a stream's gaps while a {result['prompt_tokens']}-token prompt arrives "
             f"({m['date']})", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, llama-cpp-python {m['llama_cpp_python']}. Command: "
             f"`{m['command']}`. Target {TARGET} (q4, llama.cpp) alone for both requests, greedy; runs interleaved "
             "over the shares, in order. \"none\": the prompt is fed whole (no chunked prefill).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in result["rows"]:
        lines.append("| " + " | ".join(str(x) for x in (
            "none" if r["share"] is None else r["share"], round(r["median_gap_before_s"] * 1e3, 1),
            round(r["max_gap_during_s"] * 1e3, 1), r["max_ratio"], r["p90_ratio"], r["b_time_to_first_token_s"],
            r["chunk_calls"])) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

"""Head-of-line blocking on the real pool: a stream's gaps while a long prompt arrives.

    python -m benchmarks.prefill_stall [--prompt-tokens 4000] [--speculation auto,off]
                                       [--shares none,0.5] [--repeats 2] [--router-dir DIR] [--stem NAME]

In process, through the BatchScheduler the server runs (max_batch 2), on the default pool
(target: the q4 1.5B, llama.cpp): request A (a GSM8K chat) streams; after its 10th delta,
request B arrives with a prompt of --prompt-tokens tokens (HumanEval prompts joined) and
asks for 8 tokens. Both requests name the run's speculation: `off` (the target alone) or
`auto` (the server's router over the default pool's models and lookup drafter, built
afresh for each run with a suffix memory of its own, so that no run drafts from an
earlier run's text or starts from its estimates); its estimates and profile start as
--router-dir says (default: a fresh folder, the profile measured at the start; every run
starts from that one profile), and the profile is recorded (`profile`). Per speculation
and prefill share (none: the prompt is fed whole, as before chunked prefill), repeated and
interleaved: A's median gap between deltas before B arrived, its largest and
90th-percentile gap while B's prompt was fed (from B's arrival to B's first token), their
ratios, and B's time to first token. Writes JSON and markdown to benchmarks/results/.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from benchmarks.args import benchmark_parser, profile_line, result_stem, router_start
from benchmarks.machine import machine_info
from benchmarks.output import write_result
from benchmarks.prompts import load
from specrouter.cascade.sampling import SamplingParams
from specrouter.chat import chat_prompt_tokens
from specrouter.drafters import DEFAULT_LOOKUP
from specrouter.drafters.memory import SuffixMemory
from specrouter.engine.batch import BatchScheduler, Delta, SeqRequest
from specrouter.engine.planning import pool_planner
from specrouter.engine.speculation import Speculation
from specrouter.pool import Pool
from specrouter.router import auto_router

SMALL, TARGET = "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"


def one_run(pool: Pool, router_dir: Path, profile: Path | None, speculation: str, share: float | None,
            stream: list[int], long: list[int]) -> dict:
    """One run: A streams, B's prompt arrives after A's 10th delta; A's gaps and B's first token.
    Under auto, a router of its own: the starting `profile` (a JSON file), the estimates in
    router_dir, a fresh suffix memory."""
    router = auto_router(pool, TARGET, [SMALL, TARGET], profile_dir=router_dir, progress=False, profile_file=profile,
                         lookup=DEFAULT_LOOKUP, memory=SuffixMemory()) if speculation == "auto" else None
    scheduler = BatchScheduler(pool_planner(pool, TARGET, router), max_batch=2, prefill_share=share)
    spec = Speculation(speculation)
    scheduler.add("a", SeqRequest(stream, SamplingParams(), 1200, speculation=spec))
    times, tokens, arrival, first = [], [], None, None
    while scheduler.n_active or scheduler.n_waiting:
        for event in scheduler.step():
            now = time.perf_counter()
            if event.request_id == "a" and isinstance(event, Delta):
                times.append(now)
                tokens.append(event.tokens)
                if len(times) == 10:
                    scheduler.add("b", SeqRequest(long, SamplingParams(), 8, speculation=spec))
                    arrival = now
            elif event.request_id == "b" and isinstance(event, Delta) and first is None:
                first = now
        if first is not None and times[-1] > first:
            scheduler.cancel("a")
            scheduler.cancel("b")
    gaps = np.diff(times)
    before = float(np.median(gaps[:9]))
    during = [g for t, g in zip(times[1:], gaps) if arrival < t <= first] or [first - arrival]
    p90 = float(np.percentile(during, 90))
    # Per token: a drafting cycle's gap carries several tokens (B's prompt aside, a longer gap).
    per_token = [g / max(1, n) for t, g, n in zip(times[1:], gaps, tokens[1:]) if arrival < t <= first]
    per_token_before = float(np.median([g / max(1, n) for g, n in zip(gaps[:9], tokens[1:10])]))
    return {"speculation": speculation, "share": share, "median_gap_before_s": round(before, 4),
            "max_gap_during_s": round(float(max(during)), 4), "p90_gap_during_s": round(p90, 4),
            "max_ratio": round(float(max(during)) / before, 2), "p90_ratio": round(p90 / before, 2),
            "max_per_token_ratio": round(max(per_token or [first - arrival]) / per_token_before, 2),
            "gaps_during": len(during), "b_time_to_first_token_s": round(first - arrival, 3),
            "chunk_calls": scheduler.prefill.calls if scheduler.prefill else 0}


def main(argv: Sequence[str] | None = None) -> None:
    parser = benchmark_parser("prefill-stall", __doc__, repeats=2,
                              router_dir="the router's starting profile and estimates (default: fresh)")
    parser.add_argument("--prompt-tokens", type=int, default=4000)
    parser.add_argument("--speculation", default="auto,off", help="comma-separated: auto, off")
    parser.add_argument("--shares", default="none,0.5")
    args = parser.parse_args(argv)
    modes = args.speculation.split(",")
    for mode in modes:
        if mode not in ("auto", "off"):
            parser.error(f"--speculation takes auto and off, got {mode!r}")
    shares = [None if s == "none" else float(s) for s in args.shares.split(",")]
    pool = Pool(n_ctx=args.prompt_tokens + 1600, n_seq_max=2)
    target = pool.level(TARGET)
    stream = chat_prompt_tokens(target, [{"role": "user", "content": load("gsm8k", 1)[0].text}])
    joined = target.tokenize("\n\n".join(p.text for p in load("humaneval", 80)))
    long = joined[: args.prompt_tokens]
    assert len(long) == args.prompt_tokens, "not enough prompt text"
    router_dir, router_state = router_start(args.router_dir)
    profile, profile_file = None, None
    if "auto" in modes:  # measured (or read from router_dir) once: every run's router starts from it
        profile = auto_router(pool, TARGET, [SMALL, TARGET], profile_dir=router_dir, progress=True,
                              lookup=DEFAULT_LOOKUP).costs.profile.as_dict()
        profile_file = Path(tempfile.mkdtemp(prefix="specrouter-bench-profile-")) / "profile.json"
        profile_file.write_text(json.dumps(profile))
    for mode in modes:  # warm-up: weights paged in
        one_run(pool, router_dir, profile_file, mode, None, stream, long[:64])
    rows = [one_run(pool, router_dir, profile_file, mode, share, stream, long)
            for _ in range(args.repeats) for mode in modes for share in shares]
    pool.close()
    result = {"machine": machine_info(), "prompt_tokens": args.prompt_tokens, "router_start": router_state,
              "profile": profile, "rows": rows}
    write_result(result, markdown, out=args.out, stem=result_stem(args, "prefill-stall", result))


def markdown(result: dict) -> str:
    m = result["machine"]
    head = ["speculation", "prefill share", "A's median gap before (ms)", "max gap during (ms)", "max / median",
            "p90 / median", "max / median per token", "B's time to first token (s)", "calls with chunks"]
    lines = [f"# Head-of-line blocking: a stream's gaps while a {result['prompt_tokens']}-token prompt arrives "
             f"({m['date']})", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, llama-cpp-python {m['llama_cpp_python']}. Command: "
             f"`{m['command']}`. Default pool, target {TARGET} (q4, llama.cpp); both requests name the row's "
             "speculation (off: the target alone; auto: the server's router, a fresh suffix memory per run), "
             "greedy; runs interleaved over speculation and shares, in order. \"none\": the prompt is fed whole "
             "(no chunked prefill). A gap is the time between two of A's deltas (one per cycle); per token: a "
             "gap over the tokens its delta carried (a drafting cycle's carries several), against the same before "
             "B arrived.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in result["rows"]:
        lines.append("| " + " | ".join(str(x) for x in (
            r.get("speculation", "off"), "none" if r["share"] is None else r["share"],
            round(r["median_gap_before_s"] * 1e3, 1), round(r["max_gap_during_s"] * 1e3, 1), r["max_ratio"],
            r["p90_ratio"], r.get("max_per_token_ratio", ""), r["b_time_to_first_token_s"],
            r["chunk_calls"])) + " |")
    if result.get("profile"):
        lines += ["", f"Router start: {result['router_start']}. "
                  + profile_line(result["profile"], TARGET, "auto")]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

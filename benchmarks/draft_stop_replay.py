"""Replays the router's draft stop on recorded greedy text: how a q4 0.5B draft under the
fp32 torch 1.5B would do with fixed draft lengths and with the confidence rule.

    python -m benchmarks draft-stop-replay [--per-dataset 5] [--max-tokens 128]

1. Greedy text per prompt, made by the q4 0.5B -> q4 1.5B chain; the replay keeps it up to
   the first position where the fp32 target's argmax differs (the fp32 target's own text).
2. One forward each of the fp32 target and the q4 draft over prompt + text: at every
   position the draft's top probability and whether its argmax is the target's. Up to
   its first rejection a draft sees exactly this (it drafts on the accepted text).
3. Each policy walks the text block by block; a block costs k draft forwards plus the
   verification of k + 1 tokens, both from the router's cost profile of this machine,
   measured at the start (or read from --router-dir).
Writes draft-stop-replay-<date>.json and .md to benchmarks/results/ (or --out).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from benchmarks.args import ROUTER_DIR, benchmark_parser, profile_line, result_stem, router_start
from benchmarks.machine import machine_info
from benchmarks.output import write_result
from benchmarks.torch_target import MID, SMALL, TARGET, load_prompts
from specrouter.cascade.chain import Chain
from specrouter.cascade.proposer import confidence
from specrouter.cascade.sampling import SamplingParams
from specrouter.engine import generate
from specrouter.pool import Pool
from specrouter.router import load_or_profile
from specrouter.router.draft_stop import ConfidenceStop

STATIC = (8, 12, 16, 24)
CAPS = (16, 24)
WORTH = 0.17  # seconds a token: about what the q4 0.5B -> fp32 chain runs at here


def record(pool: Pool, per_dataset: int, max_tokens: int) -> list[dict]:
    target, small, mid = pool.level(TARGET), pool.level(SMALL), pool.level(MID)
    streams = []
    for _, pid, tokens in load_prompts(target, per_dataset):
        text = generate(Chain([small, mid], [3]), tokens, SamplingParams(), max_tokens).token_ids
        logits = {}
        for name, model in (("target", target), ("draft", small)):
            seq = model.new_sequence()
            try:
                logits[name] = np.asarray(model.decode(seq, tokens + text, 0, len(text) + 1))[:-1]
            finally:
                model.free_sequence(seq)
        n = min(logits["target"].shape[1], logits["draft"].shape[1])  # padded vocabularies: the shared range
        t_arg, d_arg = logits["target"][:, :n].argmax(1), logits["draft"][:, :n].argmax(1)
        off = np.flatnonzero(t_arg != np.array(text))
        on_text = int(off[0]) if off.size else len(text)
        streams.append({"id": pid, "agree": (t_arg == d_arg)[:on_text].astype(int).tolist(),
                        # what the cascade computes for the draft stop, row by row
                        "confidence": [round(confidence(row), 5) for row in logits["draft"][:on_text]]})
        print(f"{pid}: {on_text} positions, agreement {np.mean(streams[-1]['agree']):.3f}", flush=True)
    return streams


def replay(stream: dict, cap: int, draft_s: float, verify, stop: ConfidenceStop | None) -> float:
    """Seconds per committed token of one policy over one recorded text."""
    agree, conf = stream["agree"], stream["confidence"]
    seconds = tokens = pos = 0
    if stop is not None:
        stop.configure(("greedy", SMALL, TARGET), 0.9, cap, WORTH, draft_s, verify)
    while pos < len(agree):
        k, seen = 0, []
        while pos + k < len(agree) and k < cap:
            seen.append(conf[pos + k])
            k += 1
            if stop is not None and k < cap and not stop.more(seen):
                break
        accepted = next((j for j in range(k) if not agree[pos + j]), k)
        if stop is not None:
            stop.learn(seen, accepted)
        seconds += k * draft_s + verify(k + 1)
        step = min(accepted + 1, len(agree) - pos)
        tokens += step
        pos += step
    return seconds / tokens


def main(argv: Sequence[str] | None = None) -> None:
    ap = benchmark_parser("draft-stop-replay", __doc__, per=("dataset", 5), max_tokens=128, router_dir=ROUTER_DIR)
    args = ap.parse_args(argv)
    result = run(args.per_group, args.max_tokens, args.router_dir)
    write_result(result, markdown, out=args.out, stem=result_stem(args, "draft-stop-replay", result))


def run(per_dataset: int, max_tokens: int, router_dir: Path | None) -> dict:
    router_dir, router_state = router_start(router_dir)
    pool = Pool(n_ctx=4096, n_seq_max=1)
    costs = load_or_profile([pool.level(SMALL), pool.level(TARGET)], router_dir, progress=False)
    draft_s, verify = costs.seconds(SMALL, 1), lambda n: costs.seconds(TARGET, n)
    streams = record(pool, per_dataset, max_tokens)
    methods = {f"static {k}": (k, False) for k in STATIC} | {f"stop, cap {c}": (c, True) for c in CAPS}
    per_prompt = {}
    for name, (cap, stops) in methods.items():
        stop = ConfidenceStop() if stops else None  # one calibration over the whole run, as in the router
        per_prompt[name] = [replay(s, cap, draft_s, verify, stop) for s in streams]
    pool.close()
    return {"machine": machine_info(), "router_start": router_state, "profile": costs.as_dict(),
            "positions": sum(len(s["agree"]) for s in streams), "streams": streams,
            "ms_per_token": {k: [round(1e3 * x, 2) for x in v] for k, v in per_prompt.items()}}


def markdown(result: dict) -> str:
    m, per_prompt = result["machine"], result["ms_per_token"]
    base = per_prompt["static 16"]
    lines = [f"# Draft stop replayed on recorded text: {m['date']}", "",
             f"Machine: {m['cpu']}, {m['cores']} cores. Command: `{m['command']}`.", "",
             f"{len(result['streams'])} prompts, {result['positions']} positions; q4 0.5B draft, "
             f"fp32 torch 1.5B target, costs from the router's profile ({result['router_start']}). "
             + profile_line(result["profile"], TARGET, "The replay"), "",
             "| policy | mean ms/token over prompts | median speed over static 16, per prompt |", "|---|---|---|"]
    lines += [f"| {name} | {sum(v) / len(v):.1f} | {statistics.median(b / x for b, x in zip(base, v)):.3f} |"
              for name, v in per_prompt.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

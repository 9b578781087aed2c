"""Replays the router's draft stop on recorded greedy text: how a q4 0.5B draft under the
fp32 torch 1.5B would do with fixed draft lengths and with the confidence rule.

    python -m benchmarks.draft_stop_replay [--per-dataset 5] [--max-tokens 128]

1. Greedy text per prompt, made by the q4 0.5B -> q4 1.5B chain; the replay keeps it up to
   the first position where the fp32 target's argmax differs (the fp32 target's own text).
2. One forward each of the fp32 target and the q4 draft over prompt + text: at every
   position the draft's top probability and whether its argmax is the target's. Up to
   its first rejection a draft sees exactly this (it drafts on the accepted text).
3. Each policy walks the text block by block; a block costs k draft forwards plus the
   verification of k + 1 tokens, both from the router's cost profile of this machine.
Writes draft-stop-replay-<date>.json and .md to benchmarks/results/ (or --out).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np

from benchmarks.args import benchmark_parser
from benchmarks.machine import machine_info
from benchmarks.torch_target import MID, SMALL, TARGET, load_prompts
from specrouter.cascade.chain import Chain
from specrouter.cascade.proposer import confidence
from specrouter.cascade.sampling import SamplingParams
from specrouter.engine import generate
from specrouter.pool import Pool
from specrouter.router import load_or_profile
from specrouter.router.draft_stop import ConfidenceStop

RESULTS = Path(__file__).parent / "results"
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


def main() -> None:
    ap = benchmark_parser(__doc__, RESULTS)
    ap.set_defaults(per_dataset=5)
    args = ap.parse_args()
    pool = Pool(n_ctx=4096, n_seq_max=1)
    costs = load_or_profile([pool.level(SMALL), pool.level(TARGET)], progress=False)  # the router's cached profile
    draft_s, verify = costs.seconds(SMALL, 1), lambda n: costs.seconds(TARGET, n)
    streams = record(pool, args.per_dataset, args.max_tokens)
    methods = {f"static {k}": (k, False) for k in STATIC} | {f"stop, cap {c}": (c, True) for c in CAPS}
    per_prompt = {}
    for name, (cap, stops) in methods.items():
        stop = ConfidenceStop() if stops else None  # one calibration over the whole run, as in the router
        per_prompt[name] = [replay(s, cap, draft_s, verify, stop) for s in streams]
    base = per_prompt["static 16"]
    rows = [(name, 1e3 * sum(v) / len(v), statistics.median(b / x for b, x in zip(base, v)))
            for name, v in per_prompt.items()]
    info = machine_info()
    date = info["date"].split()[0]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"draft-stop-replay-{date}.json").write_text(json.dumps(
        {"machine": info, "positions": sum(len(s["agree"]) for s in streams), "streams": streams,
         "ms_per_token": {k: [round(1e3 * x, 2) for x in v] for k, v in per_prompt.items()}}, indent=1))
    lines = [f"# Draft stop replayed on recorded text: {info['date']}", "",
             f"Machine: {info['cpu']}, {info['cores']} cores. Command: `{info['command']}`.", "",
             f"{len(streams)} prompts, {sum(len(s['agree']) for s in streams)} positions; q4 0.5B draft, "
             "fp32 torch 1.5B target, costs from this machine's router profile.", "",
             "| policy | mean ms/token over prompts | median speed over static 16, per prompt |", "|---|---|---|"]
    lines += [f"| {name} | {ms:.1f} | {ratio:.3f} |" for name, ms, ratio in rows]
    (args.out / f"draft-stop-replay-{date}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

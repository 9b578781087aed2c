"""The engine end to end on one device: the target alone against fixed chains, with
randomly initialised models of the default pool's shapes (Qwen2.5-Coder 1.5B target,
0.5B draft; scripts/torch_profile.py builds them), greedy and sampled.

What it measures is the engine's own cost on that device, not a speed-up: with random
weights, acceptance says nothing of real text. Per run it records the wall time, the
cycles, each level's forwards and the seconds spent inside them (LevelStats), so that

    host seconds per cycle = (wall - seconds inside the models' calls) / cycles

is the engine's work around the forwards (drafting lookups, the cascade's numpy work on
full-vocabulary rows, bookkeeping), the figure the simulator's host costs
(specrouter/sim/host.py) stand for. Greedy runs also say whether each chain's output equals
the target alone's (random weights give near-ties, so bf16 batching noise can split them).
Each mode runs twice: with the models' logits rows copied to the host (the numpy cascade)
and left on the device (ops/rows_torch.py), the difference being what the
device-resident cascade saves per cycle.

Methods run interleaved, the target alone first and last in every round, fixed seeds.

    python scripts/gpu_engine.py --device cuda --out engine.json
    python scripts/gpu_engine.py --device cpu --dtype float32 --tiny --tokens 16 --rounds 1   # smoke test
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, installed or not
sys.path.insert(0, str(Path(__file__).resolve().parent))

TARGET, DRAFT = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"
#: (label, levels by name, draft lengths); "suffix" is the model-free drafter.
METHODS = (
    ("target alone", (TARGET,), ()),
    ("suffix -> 1.5b, k = 8", ("suffix", TARGET), (8,)),
    ("0.5b -> 1.5b, k = 4", (DRAFT, TARGET), (4,)),
    ("suffix -> 0.5b -> 1.5b, k = 8, 4", ("suffix", DRAFT, TARGET), (8, 4)),
)


def run_once(chain, prompt: list[int], params, tokens: int, seed: int) -> dict:
    import numpy as np

    from specrouter.engine import generate

    start = time.perf_counter()
    result = generate(chain, prompt, params, tokens, rng=np.random.default_rng(seed), detokenize=lambda t: b"")  # ids only
    wall = time.perf_counter() - start
    inside = sum(s.seconds for s in result.levels)
    return {"wall_seconds": wall, "tokens": len(result.token_ids), "cycles": result.cycles,
            "forwards": {s.name: s.forwards for s in result.levels},
            "model_seconds": inside, "host_seconds_per_cycle": (wall - inside) / max(result.cycles, 1),
            "accepted_per_cycle": len(result.token_ids) / max(result.cycles, 1), "token_ids": result.token_ids}


def summarise(runs: dict[str, dict[str, list[dict]]], show: bool) -> dict:
    """Per mode and method: medians over the rounds, and the speed-up over the target alone."""
    summary: dict[str, dict] = {}
    for mode, by_method in runs.items():
        alone = by_method[METHODS[0][0]]
        alone_wall = statistics.median(x["wall_seconds"] for x in alone)
        summary[mode] = {}
        for label, rs in by_method.items():
            wall = statistics.median(x["wall_seconds"] for x in rs)
            row = {"runs": len(rs), "median_wall_seconds": round(wall, 4),
                   "ms_per_token": round(1e3 * wall / statistics.median(x["tokens"] for x in rs), 3),
                   "speedup_vs_alone": round(alone_wall / wall, 3),
                   "median_host_ms_per_cycle": round(1e3 * statistics.median(x["host_seconds_per_cycle"] for x in rs), 3),
                   "median_model_ms_per_cycle": round(1e3 * statistics.median(x["model_seconds"] / max(x["cycles"], 1)
                                                                             for x in rs), 3),
                   "median_tokens_per_cycle": round(statistics.median(x["accepted_per_cycle"] for x in rs), 3)}
            if mode.startswith("greedy"):
                row["equals_alone"] = [x["token_ids"] == alone[0]["token_ids"] for x in rs]
            summary[mode][label] = row
            if show:
                print(f"{mode:14} {label:34} {row['ms_per_token']:8.2f} ms/token  x{row['speedup_vs_alone']:.2f}  "
                      f"host {row['median_host_ms_per_cycle']:.2f} ms/cycle  models {row['median_model_ms_per_cycle']:.2f} "
                      f"ms/cycle  {row['median_tokens_per_cycle']:.2f} tokens/cycle", flush=True)
    return summary


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--tiny", action="store_true", help="cut the shapes down (CPU smoke test)")
    ap.add_argument("--tokens", type=int, default=128, help="tokens generated per run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rows", default="host,device", help="where the cascade reads the rows: host, device or both")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    placements = args.rows.split(",")
    if not placements or any(p not in ("host", "device") for p in placements):
        ap.error(f"--rows takes host, device or host,device, got {args.rows!r}")

    import numpy as np
    import torch

    from specrouter.backends.torch import TorchBackend
    from specrouter.cascade.chain import Chain
    from specrouter.cascade.sampling import SamplingParams
    from specrouter.drafters import SuffixDrafter
    from torch_profile import _Tokenizer, device_info, random_model, save

    backends = {}
    for name in (TARGET, DRAFT):
        model = random_model(name, args.tiny, args.device, getattr(torch, args.dtype))
        backends[name] = TorchBackend.from_model(model, _Tokenizer(model.config.vocab_size), name=name,
                                                 device=args.device, dtype=args.dtype, n_seq_max=2)
    vocab = backends[TARGET].n_vocab
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, vocab, 48).tolist() * 4  # text that repeats, as copy workloads do
    modes = {f"{name}, rows on {where}": (params, where == "device") for where in placements
             for name, params in (("greedy", SamplingParams()), ("sampled T = 1", SamplingParams(temperature=1.0)))}
    runs: dict[str, dict[str, list[dict]]] = {mode: {label: [] for label, *_ in METHODS} for mode in modes}
    order = [*METHODS, METHODS[0]]  # the target alone first and last in every round
    result: dict = {}
    for r in range(args.rounds):
        for mode, (params, on_device) in modes.items():
            for backend in backends.values():
                backend.rows_on_device = on_device
            for label, names, lengths in order:
                levels = [SuffixDrafter() if n == "suffix" else backends[n] for n in names]
                runs[mode][label].append(run_once(Chain(levels, list(lengths)), prompt, params, args.tokens, seed=r))
        print(f"round {r + 1}/{args.rounds} done", flush=True)
        result = {"device": device_info(args.device), "settings": {
            "dtype": args.dtype, "tiny": args.tiny, "tokens": args.tokens, "rounds": r + 1,
            "prompt": "48 random token ids repeated 4 times", "weights": "random (torch.manual_seed(0))"},
            "summary": summarise(runs, show=r + 1 == args.rounds),
            "runs": {mode: {label: [{k: v for k, v in x.items() if k != "token_ids"} for x in rs] for label, rs in by.items()}
                     for mode, by in runs.items()}}
        save(result, args.out)  # after every round: a run cut short keeps what it measured
    if args.out:
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()

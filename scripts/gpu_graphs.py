"""What a launch-free runtime would cost on this GPU: the forward of the Qwen2.5-Coder 1.5B and
0.5B shapes (bf16, random weights) over a static KV cache, eager and replayed as a CUDA graph,
for n = 1..64 new tokens after 256 cached ones, and B = 8 and 32 sequences of k = 1, 4, 8, 17
tokens each in one forward (medians of 20), logits left on the device.
A diagnostic for the simulator, not a backend (the engine's torch backend keeps one dynamic
cache per sequence, rolled back by cropping): `--out` writes the graphs' table as "models"
in the router's CostProfile format, so `benchmarks/simulation.py --gpu-profile FILE` replays
a trace on what a launch-free runtime with a device-resident cascade would cost.

    python scripts/gpu_graphs.py --out graphs_profile.json
    python scripts/gpu_graphs.py --device cpu --tiny      # the eager path only (a smoke test)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SIZES = (1, 2, 4, 8, 16, 32, 64)
BATCH_KS = (1, 4, 8, 17)
PREFIX = 256


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--batches", type=lambda t: tuple(int(x) for x in t.split(",") if x), default=(8, 32),
                    help="batch sizes of the batched table ('' for none)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    import torch

    from torch_profile import device_info, random_model, save

    cuda = args.device.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    result = {"device": device_info(args.device), "settings": {
        "prefix_tokens": PREFIX, "repeats": args.repeats,
        "what": "median seconds of one forward of n tokens (of each of B sequences: 'batched') over a StaticCache, "
                "logits left on the device: eager ('eager_static'), and replayed as a CUDA graph ('models', "
                "'batched': the router's CostProfile format)"},
        "eager_static": {}, "models": {}, "batched": {}, "errors": {}}
    for name in ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"):
        model = random_model(name, args.tiny, args.device, dtype)
        eager, graph, batched = {}, {}, {}
        for batch, sizes in ((1, SIZES), *((b, BATCH_KS) for b in args.batches)):
            for n in sizes:
                try:
                    e, g = measure(model, batch, n, args.repeats, args.device, graphs=cuda)
                except Exception as exc:  # noqa: BLE001 - a diagnostic reports what failed and goes on
                    result["errors"][f"{name} B={batch} n={n}"] = f"{type(exc).__name__}: {exc}"[:500]
                    continue
                if batch == 1:
                    eager[n] = e
                    if g is not None:
                        graph[n] = g
                elif g is not None:
                    batched.setdefault(batch, {})[n] = g
        result["eager_static"][name] = {str(n): round(x, 7) for n, x in eager.items()}
        if graph:
            result["models"][name] = {str(n): round(x, 7) for n, x in graph.items()}
        if batched:
            result["batched"][name] = {str(b): {str(n): round(x, 7) for n, x in t.items()} for b, t in batched.items()}
        print(f"{name}: eager static ms " + ", ".join(f"{n}: {x * 1e3:.2f}" for n, x in eager.items()), flush=True)
        print(f"{name}: CUDA graph ms " + ", ".join(f"{n}: {x * 1e3:.2f}" for n, x in graph.items()), flush=True)
        for b, t in batched.items():
            print(f"{name}: CUDA graph, {b} sequences, ms " + ", ".join(f"{n}: {x * 1e3:.2f}" for n, x in t.items()),
                  flush=True)
        model = None  # noqa: F841 - free it before the next model is built
        if cuda:
            torch.cuda.empty_cache()
        save(result, args.out)
    for what, error in result["errors"].items():
        print(f"error: {what}: {error}", flush=True)


def measure(model, batch: int, n: int, repeats: int, device: str, graphs: bool) -> tuple[float, float | None]:
    """Median seconds of one forward of n new tokens for each of `batch` sequences after
    PREFIX cached ones, over a StaticCache: eager, and replayed as a CUDA graph (None
    without graphs)."""
    import torch
    from transformers import StaticCache

    from torch_profile import _median_time

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    vocab = model.config.vocab_size
    cache = StaticCache(config=model.config, max_cache_len=PREFIX + max(n, 1) + 8)
    ids = torch.randint(0, vocab, (batch, n), device=device)
    pos = torch.arange(PREFIX, PREFIX + n, device=device)

    def rewind() -> None:
        # A static layer writes at its own running length (a tensor, advanced in place, so a
        # graph replays that too): set it back so every call writes PREFIX.. again.
        for layer in cache.layers:
            layer.cumulative_length.fill_(PREFIX)

    def step():
        return model(input_ids=ids, position_ids=pos.unsqueeze(0).expand(batch, n), cache_position=pos,
                     past_key_values=cache, use_cache=True, logits_to_keep=n).logits

    def timed(call) -> float:  # one warm-up call; each timed to a synchronize, the rewind outside the timing
        return _median_time(lambda: (call(), sync()), lambda: (rewind(), sync()), repeats)

    with torch.inference_mode():
        prefix = torch.randint(0, vocab, (batch, PREFIX), device=device)
        model(input_ids=prefix, past_key_values=cache, use_cache=True, cache_position=torch.arange(PREFIX, device=device),
              logits_to_keep=1)
        eager = timed(step)
        if not graphs:
            return eager, None
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                step()
                rewind()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()  # the graph keeps its output buffer
        rewind()
        return eager, timed(graph.replay)

if __name__ == "__main__":
    main()

"""Two diagnostics of a GPU machine's host side, printed as tables (random data, no network):

1. launch: microseconds per launch of a tiny kernel, and one n = 1 forward of the
   Qwen2.5-Coder 1.5B and 0.5B shapes (bf16, random weights, 256 cached tokens): wall-time
   median of 40, the number of kernels it launches and the GPU's busy time in them
   (torch.profiler). Wall far above busy time means the forward is bound by the host's
   launches, not by the device.
2. copy: milliseconds to bring n rows of 151,936 bf16 logits to host float32 numpy, by
   strategy: widen on the device then copy (A, what the torch backend did until
   2026-12-04), copy then widen on the host (B, what it does now), into a reused pinned
   buffer (C) and the same plus a numpy copy out of it (D), into a reused pageable buffer
   (E); F allocates and fills a fresh host array of that size (first-touch page faults), G
   copies the bf16 rows alone.

    python scripts/gpu_diag.py launch|copy|all
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

VOCAB = 151936


def launch() -> None:
    import torch
    from transformers import DynamicCache

    from torch_profile import random_model

    x = torch.ones(16, device="cuda")
    torch.cuda.synchronize()

    def per_launch(n: int = 3000) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(n):
            x.add_(1)
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / n * 1e6

    for threads in (16, 1):
        torch.set_num_threads(threads)
        print(f"threads {threads}: us per small kernel launch", [round(per_launch(), 1) for _ in range(3)], flush=True)
    for name in ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"):
        model = random_model(name, False, "cuda", torch.bfloat16)
        cache = DynamicCache(config=model.config)
        with torch.inference_mode():
            model(input_ids=torch.zeros(1, 256, dtype=torch.long, device="cuda"), past_key_values=cache, use_cache=True,
                  logits_to_keep=1)
            ids = torch.zeros(1, 1, dtype=torch.long, device="cuda")
            pos = torch.tensor([[256]], device="cuda")
            times = []
            for _ in range(40):
                torch.cuda.synchronize()
                start = time.perf_counter()
                model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True, logits_to_keep=1)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - start)
                cache.crop(-1)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True, logits_to_keep=1)
                torch.cuda.synchronize()
            cache.crop(-1)
            kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            busy_ms = sum(e.device_time for e in kernels) / 1e3
        times.sort()
        print(f"{name}: n=1 forward ms median {statistics.median(times) * 1e3:.2f} min {times[0] * 1e3:.2f} "
              f"p90 {times[35] * 1e3:.2f}; kernels {len(kernels)}, GPU busy {busy_ms:.2f} ms", flush=True)
        del model, cache
        torch.cuda.empty_cache()


def copy() -> None:
    import numpy as np
    import torch

    def timed(fn, reps: int = 8) -> float:
        fn()
        times = []
        for _ in range(reps):
            torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3

    pinned = torch.empty(2048, VOCAB, dtype=torch.float32, pin_memory=True)
    pageable = np.empty((2048, VOCAB), np.float32)
    pageable.fill(0)
    pageable_t = torch.from_numpy(pageable)
    print("rows | A float().cpu().numpy() | B cpu().float() | C pinned reused (view) | D pinned + np copy "
          "| E pageable reused | F fresh np alloc+fill | G bf16 cpu() only", flush=True)
    for n in (1, 9, 64, 288, 512, 1024):
        x = torch.randn(n, VOCAB, device="cuda", dtype=torch.bfloat16)
        cells = [timed(lambda: x.float().cpu().numpy()), timed(lambda: x.cpu().float().numpy()),
                 timed(lambda: pinned[:n].copy_(x)), timed(lambda: np.array(pinned[:n].copy_(x).numpy())),
                 timed(lambda: pageable_t[:n].copy_(x)), timed(lambda: np.empty((n, VOCAB), np.float32).fill(1.0)),
                 timed(lambda: x.cpu())]
        print(f"{n} | " + " | ".join(f"{c:.2f}" for c in cells), flush=True)


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "all"
    if what in ("launch", "all"):
        launch()
    if what in ("copy", "all"):
        copy()

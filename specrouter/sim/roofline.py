"""Roofline cost profiles: what a forward would cost on a device that is not here.

One forward of n tokens of a model with P parameters, stored at b bytes each, on a device
of memory bandwidth W (bytes/s) and peak throughput F (FLOP/s):

    t(n) = overhead + max(P * b / W, 2 * P * n / F)

reading every weight once per forward (batch 1) and doing 2 FLOPs per weight per token,
whichever bound is slower, plus a fixed per-forward overhead (kernel launches, the host's
work per step). Left out: KV-cache reads (short contexts), attention FLOPs, and any
efficiency below peak. Labelled as simulation wherever it is used; a measured GPU profile
(scripts/gpu_check.sh) replaces it when one is committed.

Device figures are the vendors' datasheet values (dense bf16/fp16 tensor throughput, HBM
bandwidth); the overhead is a stated assumption, not a measurement: OVERHEAD_MS is the
launch overhead of an eager forward of a ~30-layer model as usually quoted, CUDA-graph
runtimes (llama.cpp, vLLM) get well under 1 ms. A transformers forward measured on an H200
behind a virtualised 16-core host took ~20 ms of launches for 2-3 ms of GPU work
(benchmarks/results/gpu-check-2026-12-04-h200.md): replay that measured profile
(`specrouter simulate --profile`) rather than the roofline for the torch backend there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from specrouter.errors import InvalidParameterError
from specrouter.router.estimates.costs import CostProfile

OVERHEAD_MS = 5.0
#: Tokens per forward the profile holds: every size a single sequence's cycle feeds (up to a
#: 64-token block and its bonus row), then a batch's (up to 64 sequences of 64), plus the
#: device's crossover from the bandwidth to the compute bound (roofline_profile).
SIZES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 17, 24, 25, 32, 33, 48, 49, 64, 65, 128, 256, 512, 1024, 2048, 4096, 8192)


@dataclass(frozen=True)
class Device:
    name: str
    bandwidth_gb_s: float  # memory bandwidth, 1e9 bytes/s
    peak_tflops: float  # dense fp16/bf16, 1e12 FLOP/s
    overhead_ms: float = OVERHEAD_MS

    def __post_init__(self) -> None:
        if not (self.bandwidth_gb_s > 0 and self.peak_tflops > 0 and self.overhead_ms >= 0):
            raise InvalidParameterError(f"device {self.name}: bandwidth and peak must be > 0, overhead >= 0")

    def crossover(self, bytes_per_param: float = 2.0) -> float:
        """Tokens per forward where the compute bound meets the bandwidth bound: b * F / (2 W),
        the same for every model size."""
        return bytes_per_param * self.peak_tflops * 1e12 / (2 * self.bandwidth_gb_s * 1e9)

    def seconds(self, params_b: float, n: float, bytes_per_param: float = 2.0) -> float:
        weights = params_b * 1e9 * bytes_per_param / (self.bandwidth_gb_s * 1e9)
        compute = 2 * params_b * 1e9 * n / (self.peak_tflops * 1e12)
        return self.overhead_ms / 1e3 + max(weights, compute)


DEVICES = {
    "h100": Device("NVIDIA H100 SXM (roofline)", bandwidth_gb_s=3350, peak_tflops=989),
    "h200": Device("NVIDIA H200 SXM (roofline)", bandwidth_gb_s=4800, peak_tflops=989),
}


def device(name: str, overhead_ms: float | None = None) -> Device:
    if name not in DEVICES:
        raise InvalidParameterError(f"unknown device {name!r}; known: {', '.join(DEVICES)}")
    d = DEVICES[name]
    return d if overhead_ms is None else Device(d.name, d.bandwidth_gb_s, d.peak_tflops, overhead_ms)


def roofline_profile(dev: Device, params_b: dict[str, float], bytes_per_param: float = 2.0,
                     sizes: tuple[int, ...] = SIZES) -> CostProfile:
    """A profile of every model in `params_b` (name -> billions of parameters) on `dev`, at
    `sizes` and at the two whole sizes around the crossover (t(n) is linear on each side of
    it, so interpolating the table gives t(n) inside its range, exactly but between those two)."""
    x = dev.crossover(bytes_per_param)
    ns = sorted({*sizes, *(k for k in (math.floor(x), math.ceil(x)) if sizes[0] <= k <= sizes[-1])})
    return CostProfile({m: {n: dev.seconds(p, n, bytes_per_param) for n in ns} for m, p in params_b.items()})

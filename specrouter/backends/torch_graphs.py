"""CUDA graphs of the static runtime's forwards, one per bucket, captured the first time the
bucket is used (torch_static.py).

A graph replays the kernels of one forward with the addresses they were captured with: its
inputs are static buffers, refilled before each replay, and its output a static buffer that
the next replay of the same graph overwrites (the runtime copies rows out). The KV caches
are the runtime's own tensors, so every graph writes and reads the same cells the eager
forward would. Warm-up and capture run with every write pointed at the scratch slot, so
capturing never touches a sequence's KV. All graphs allocate from one memory pool (they
never run at once).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from specrouter.backends.static_forward import Inputs

log = logging.getLogger(__name__)

#: Forwards run on a side stream before a capture (CUDA's lazy initialisation, cuBLAS
#: workspaces and autotuning happen outside the graph).
WARMUP = 2


@dataclass
class Captured:
    graph: Any  # torch.cuda.CUDAGraph
    inputs: Inputs  # its static input buffers
    output: torch.Tensor  # its static output (B', L', vocab)


class GraphCache:
    """Buckets' graphs of one model; `captured` and `capture_seconds` say what capturing cost."""

    def __init__(self, run: Callable[[Inputs], torch.Tensor], device: torch.device, scratch: int) -> None:
        self._run, self._device, self._scratch = run, device, scratch
        self._graphs: dict[Any, Captured] = {}
        self._pool = torch.cuda.graph_pool_handle()
        self.captured = 0
        self.capture_seconds = 0.0

    def run(self, bucket: Any, inputs: Inputs) -> torch.Tensor:
        """The bucket's forward on `inputs` (host tensors of the bucket's shape), replayed."""
        cap = self._graphs.get(bucket)
        if cap is None:
            cap = self._graphs[bucket] = self._capture(bucket)
        for static, value in ((cap.inputs.ids, inputs.ids), (cap.inputs.positions, inputs.positions),
                              (cap.inputs.write_slot, inputs.write_slot), (cap.inputs.write_pos, inputs.write_pos),
                              (cap.inputs.read_slot, inputs.read_slot), (cap.inputs.logit_cols, inputs.logit_cols)):
            static.copy_(value, non_blocking=True)
        cap.graph.replay()
        return cap.output

    def _capture(self, bucket: Any) -> Captured:
        start = time.perf_counter()
        b, n, dev = bucket.rows, bucket.tokens, self._device
        column = torch.arange(n, device=dev).repeat(b, 1)
        inputs = Inputs(
            ids=torch.zeros(b, n, dtype=torch.long, device=dev), positions=column.clone(),
            write_slot=torch.full((b, n), self._scratch, dtype=torch.long, device=dev), write_pos=column.clone(),
            read_slot=torch.full((b,), self._scratch, dtype=torch.long, device=dev),
            logit_cols=torch.zeros(b, bucket.logits, dtype=torch.long, device=dev), context=bucket.context)
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            for _ in range(WARMUP):
                self._run(inputs)
        torch.cuda.current_stream(dev).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            output = self._run(inputs)
        torch.cuda.synchronize(dev)
        seconds = time.perf_counter() - start
        self.captured += 1
        self.capture_seconds += seconds
        log.info("captured the forward of bucket %s in %.3f s", bucket, seconds)
        return Captured(graph, inputs, output)

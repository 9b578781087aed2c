"""The torch backend's static runtime (kv_runtime.py): every sequence slot's KV preallocated,
forwards padded to buckets and, on CUDA, each bucket replayed as a captured graph.

- **KV**: per layer one tensor (slots + 1, n_ctx, kv_heads, head_dim) allocated at load
  (static_forward.py's layout; the extra slot is scratch, where padding writes). A sequence
  is a slot and a length: a forward writes at absolute positions, rollback sets the length
  (no copy), sharing a prefix copies cells, and freeing zeroes the cells the sequence wrote,
  so a reused slot holds nothing of its last request.
- **Buckets**: a forward of B rows of at most N tokens, wanting at most L logit rows per
  row, after contexts of at most C cells, runs at the shape (B', N', C', L'): B' and N' the
  next of BATCH_BUCKETS and TOKEN_BUCKETS, L' the next of TOKEN_BUCKETS capped at N', C' the
  next power of two from MIN_CONTEXT, capped at n_ctx. Padding rows and tokens write only to
  the scratch slot and their rows are dropped, so a padded forward's rows are the unpadded
  one's. A forward beyond the largest buckets (a prompt chunk of more than 64 tokens, more
  than 32 sequences) runs at its own shape: eager, never captured; more than 32 sequences
  is warned of once.
- **Graphs** (CUDA): torch_graphs.GraphCache captures a bucket the first time it is used.
  Its static inputs are refilled and the graph replayed; rows are copied out of its static
  output, which the next replay overwrites. On a CPU the same forward runs eagerly.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from specrouter.backends.static_forward import Inputs, check_supported, forward, kv_shape
from specrouter.errors import BackendError

log = logging.getLogger(__name__)

TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32)
#: The smallest context bucket (a power of two); the largest is n_ctx.
MIN_CONTEXT = 128


@dataclass(frozen=True)
class Bucket:
    """A forward's padded shape; `graphed` False: a shape beyond the buckets, run as it is."""

    rows: int
    tokens: int
    context: int
    logits: int
    graphed: bool = True


def _next(value: int, sizes: Sequence[int]) -> int | None:
    return next((s for s in sizes if s >= value), None)


def bucket_for(rows: int, tokens: int, context: int, logits: int, n_ctx: int) -> Bucket:
    """The shape a forward runs at (see the module docstring)."""
    b, n = _next(rows, BATCH_BUCKETS), _next(tokens, TOKEN_BUCKETS)
    if b is None or n is None:
        return Bucket(rows, tokens, context, logits, graphed=False)
    c = MIN_CONTEXT
    while c < context:
        c *= 2
    return Bucket(b, n, min(c, n_ctx), min(_next(logits, TOKEN_BUCKETS) or n, n))


class StaticKV:
    """The static runtime (kv_runtime.KVRuntime) of one model; `graphs` replays buckets as
    CUDA graphs."""

    name = "static"

    def __init__(self, model: Any, config: Any, device: torch.device, dtype: torch.dtype, slots: int,
                 n_ctx: int, label: str, graphs: bool) -> None:
        check_supported(config, label)
        self._model, self._device, self._label, self._n_ctx = model, device, label, n_ctx
        self._slots = slots
        self._lengths: dict[int, int] = {}
        #: Per live sequence, the cells it has written (its length before any rollback): what
        #: freeing it clears.
        self._written: dict[int, int] = {}
        self._free = list(range(slots))
        self._warned = False
        shape = kv_shape(config, slots, n_ctx)
        layers = config.num_hidden_layers
        try:
            self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
            self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        except (torch.OutOfMemoryError, RuntimeError) as exc:
            gib = 2 * layers * torch.Size(shape).numel() * torch.finfo(dtype).bits / 8 / 2**30
            raise BackendError(f"{label}: the static KV cache of {slots} slots x {n_ctx} positions "
                               f"({gib:.1f} GiB) cannot be allocated on {device} ({str(exc).splitlines()[0]}); "
                               "lower the context or the slots, or use --torch-runtime eager") from None
        self.graphs = None
        if graphs:
            from specrouter.backends.torch_graphs import GraphCache

            self.graphs = GraphCache(self._run, device, scratch=slots)

    # Slots ----------------------------------------------------------------------------
    def new(self) -> int:
        if not self._free:
            raise BackendError(f"{self._label}: all {self._slots} sequence slots are in use")
        seq = self._free.pop(0)
        self._lengths[seq] = self._written[seq] = 0
        return seq

    def free(self, seq: int) -> None:
        if self._lengths.pop(seq, None) is None:
            return
        written = self._written.pop(seq)
        for cache in (*self.keys, *self.values):
            cache[seq, :written].zero_()
        self._free.append(seq)

    def length(self, seq: int) -> int:
        try:
            return self._lengths[seq]
        except KeyError:
            raise BackendError(f"{self._label}: sequence {seq} does not exist") from None

    def crop(self, seq: int, length: int) -> None:
        self._lengths[seq] = min(self.length(seq), max(int(length), 0))

    def share(self, src: int, dst: int, n: int) -> None:
        n = min(n, self.length(src))
        self.length(dst)  # BackendError for a sequence that does not exist
        for cache in (*self.keys, *self.values):
            cache[dst, :n] = cache[src, :n]
        self._lengths[dst] = n
        self._written[dst] = max(self._written[dst], n)

    def close(self) -> None:
        self.keys, self.values, self.graphs = [], [], None

    # Forwards -------------------------------------------------------------------------
    def forward(self, runs: Sequence[tuple[int, Sequence[int], int, int]]) -> list:
        lens = [len(tokens) for _, tokens, _, _ in runs]
        wanted = [n for *_, n in runs]
        bucket = bucket_for(len(runs), max(lens), max(pos + n for (_, _, pos, _), n in zip(runs, lens)),
                            max(max(wanted), 1), self._n_ctx)
        if not bucket.graphed and len(runs) > BATCH_BUCKETS[-1] and not self._warned:
            self._warned = True
            log.warning("%s: %d sequences in one forward exceed the largest batch bucket (%d): such forwards "
                        "run at their own shape, without a graph", self._label, len(runs), BATCH_BUCKETS[-1])
        inputs = self._inputs(runs, bucket)
        for (seq, _, pos, _), n in zip(runs, lens):  # before: a forward that fails may have written some
            self._written[seq] = max(self._written[seq], pos + n)
        try:
            with torch.inference_mode():
                if self.graphs is not None and bucket.graphed:
                    logits = self.graphs.run(bucket, inputs)[: len(runs)].clone()
                else:
                    logits = self._run(self._to_device(inputs))
        except torch.OutOfMemoryError:
            raise BackendError(f"{self._label}: out of GPU memory decoding {sum(lens)} tokens of {len(runs)} "
                               "sequences") from None
        for (seq, _, pos, _), n in zip(runs, lens):
            self._lengths[seq] = pos + n
        last = logits.shape[1]
        return [logits[i, last - n:] if n else None for i, n in enumerate(wanted)]

    def _run(self, inputs: Inputs) -> torch.Tensor:
        return forward(self._model, self.keys, self.values, inputs)

    def _inputs(self, runs: Sequence[tuple[int, Sequence[int], int, int]], bucket: Bucket) -> Inputs:
        """The bucket's inputs on the host (see the module docstring for the padding), built
        with whole-array operations: a batch's rows cost no Python loop of tensor operations.
        Each run starts at its sequence's length (TorchBackend._check_item checks it)."""
        b, n, k, scratch = bucket.rows, bucket.tokens, len(runs), self._slots
        lens = np.array([len(tokens) for _, tokens, _, _ in runs], dtype=np.int64)[:, None]  # (k, 1)
        pos = np.array([p for _, _, p, _ in runs], dtype=np.int64)[:, None]
        seqs = np.array([seq for seq, *_ in runs], dtype=np.int64)[:, None]
        column = np.arange(n, dtype=np.int64)
        real = column < lens  # (k, n): the rows' own tokens; the rest is padding
        ids = np.zeros((b, n), dtype=np.int64)
        ids[:k][real] = np.fromiter(itertools.chain.from_iterable(t for _, t, _, _ in runs), np.int64)
        positions = np.tile(column, (b, 1))
        positions[:k] = pos + np.minimum(column, lens - 1)  # padding repeats the row's last position
        write_slot = np.full((b, n), scratch, dtype=np.int64)
        write_slot[:k] = np.where(real, seqs, scratch)
        write_pos = np.tile(column, (b, 1))
        write_pos[:k] = np.where(real, pos + column, column)
        read_slot = np.full(b, scratch, dtype=np.int64)
        read_slot[:k] = seqs[:, 0]
        logit_cols = np.zeros((b, bucket.logits), dtype=np.int64)
        logit_cols[:k] = np.maximum(lens - bucket.logits + np.arange(bucket.logits), 0)
        return Inputs(*(torch.from_numpy(a) for a in (ids, positions, write_slot, write_pos, read_slot, logit_cols)),
                      bucket.context)

    def _to_device(self, inputs: Inputs) -> Inputs:
        dev = self._device
        return Inputs(inputs.ids.to(dev), inputs.positions.to(dev), inputs.write_slot.to(dev),
                      inputs.write_pos.to(dev), inputs.read_slot.to(dev), inputs.logit_cols.to(dev), inputs.context)


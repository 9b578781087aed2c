"""The torch backend's two runtimes, behind one interface: how a sequence's KV is held, rolled
back and fed to a forward.

- `eager` (torch_cache.DynamicKV): one transformers DynamicCache per sequence, grown by
  concatenation, cropped on rollback; a forward's shapes are the call's own.
- `static` (torch_static.StaticKV): every sequence slot's KV preallocated (slots x context),
  written at absolute positions; rollback sets a length; forwards padded to buckets and, on
  CUDA, each bucket captured once as a graph and replayed.

`default_runtime` picks `static` on CUDA and `eager` on a CPU (benchmarks/results/
torch-runtime-*: on a CPU no launch is saved and padding to buckets costs compute).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from specrouter.errors import InvalidParameterError

RUNTIMES = ("eager", "static")


def default_runtime(device: str) -> str:
    """The runtime a device gets when none is asked for."""
    return "static" if str(device).startswith("cuda") else "eager"


def check_runtime_name(name: str | None, device: str) -> str:
    """The runtime to use: `name` checked, or the device's default for None."""
    if name is None:
        return default_runtime(device)
    if name not in RUNTIMES:
        raise InvalidParameterError(f"torch runtime {name!r} is not one of {', '.join(RUNTIMES)}")
    return name


class KVRuntime(Protocol):
    """Sequences' KV and the forwards over it. A run is (sequence, tokens, first position,
    logit rows wanted: its last ones, 0 for none); positions are absolute and a sequence's KV
    covers [0, length)."""

    #: "eager" or "static" (what the profile cache keys a model's costs by).
    name: str
    #: The CUDA graphs captured so far (torch_graphs.GraphCache: `captured`, `capture_seconds`);
    #: None where forwards are not captured (the eager runtime, or a CPU).
    graphs: Any

    def new(self) -> int:
        """A free sequence slot with no KV (BackendError when all are in use)."""

    def free(self, seq: int) -> None:
        """Release the slot; what it held is gone before it is handed out again."""

    def length(self, seq: int) -> int:
        """Positions the sequence holds (BackendError for a sequence that does not exist)."""

    def crop(self, seq: int, length: int) -> None:
        """Keep positions [0, length) (nothing happens to a shorter sequence)."""

    def share(self, src: int, dst: int, n: int) -> None:
        """Make the new sequence dst hold src's first n positions."""

    def forward(self, runs: Sequence[tuple[int, Sequence[int], int, int]]) -> list:
        """Feed every run to its sequence in one forward; per run, its last n_logits rows of
        logits (a tensor on the device, the model's dtype; None for n_logits 0)."""

    def close(self) -> None:
        """Free the KV."""

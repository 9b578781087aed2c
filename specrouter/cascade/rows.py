"""Where a level's logits rows live, and the few operations the cascade applies to them.

A backend hands the cascade its rows as one array (n_logits, n_vocab): numpy on the host
(llama.cpp, the synthetic and replay backends, torch on a CPU), or a torch tensor left on
its device (a torch model on a GPU: copying 17 rows of a 152k vocabulary to the host costs
more than the forward there, benchmarks/results/gpu-check-2026-12-04-h200.md). The cascade
never asks which: it calls `ops_of(rows)`, which returns the RowOps of the rows' kind, and
every operation on rows goes through it. What crosses to the host per cycle is then only
what decides the control flow: token ids (argmax, a sample), and per proposal the two
probabilities of the acceptance test. The uniforms stay on the host's Generator, drawn in
the same order by both kinds, so a seeded run draws the same numbers whichever kind its
levels produce (the tokens can still differ where float rounding moves a sample across a
CDF boundary).

Contracts, the same for every kind (the numpy one is the reference; tests run both on the
same inputs):
- `argmax(rows)`: each row's argmax, the first index on ties.
- `warp(rows, params)`: each row's warped distribution (sampling.warp's rules: exponentials
  in float32 for float32 logits, normalised in float64), as a list of rows.
- `sample(probs, u)`: inverse-CDF sampling of one row with the uniform u in [0, 1): the
  first index whose cumulative mass exceeds u * total (the last index with mass at most).
- `at(rows, tokens)`: rows[j][tokens[j]] as floats, 0.0 past a row's end (padded vocabularies).
- `residual(p, q, token)`: norm(max(p - q, 0)), q one-hot(token) when None (verify.py).
- `overlap(ps, qs)`: per pair of rows sum(min(p, q)) over their shared range: 1 - TV(p, q),
  the acceptance rate of speculative sampling.
- `confidence(row)`: the top probability of a logits row's softmax.
- `host(rows)`: the rows on the host as numpy (a 2-D array, or a list of host rows as
  given): what penalties, grammars and logprobs read. Dtypes are kept.

A second operand of another kind (a llama.cpp draft's q under a torch target) is converted
to the first's kind. Kinds other than numpy register themselves (`register`) when their
backend's module is imported, so the cascade imports no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from specrouter.cascade.sampling import SamplingParams

#: Rows as a backend returns them (2-D) or as the cascade keeps them (a list of 1-D rows).
Rows = Any


class RowOps(Protocol):
    def argmax(self, rows: Rows) -> list[int]: ...

    def warp(self, rows: Rows, params: SamplingParams) -> list: ...

    def sample(self, probs: Any, u: float) -> int: ...

    def at(self, rows: Rows, tokens: Sequence[int]) -> list[float]: ...

    def residual(self, p: Any, q: Any | None, token: int) -> Any: ...

    def overlap(self, ps: Rows, qs: Rows) -> list[float]: ...

    def confidence(self, row: Any) -> float: ...

    def host(self, rows: Rows) -> Any: ...


class NumpyOps:
    """Rows as numpy arrays: the functions of sampling.py and verify.py."""

    def argmax(self, rows: Rows) -> list[int]:
        return [int(np.argmax(row)) for row in rows]

    def warp(self, rows: Rows, params: SamplingParams) -> list:
        from specrouter.cascade.sampling import warp

        return [warp(row, params) for row in rows]

    def sample(self, probs: np.ndarray, u: float) -> int:
        from specrouter.cascade.sampling import sample_with

        return sample_with(probs, u)

    def at(self, rows: Rows, tokens: Sequence[int]) -> list[float]:
        return [float(row[t]) if t < row.shape[0] else 0.0 for row, t in zip(rows, tokens)]

    def residual(self, p: np.ndarray, q: Any | None, token: int) -> np.ndarray:
        from specrouter.cascade.verify import residual

        return residual(p, q, token)

    def overlap(self, ps: Rows, qs: Rows) -> list[float]:
        out = []
        for p, q in zip(ps, self.host(qs)):
            n = min(p.shape[0], q.shape[0])  # padded vocabularies: compare the shared range
            out.append(float(np.minimum(p[:n], q[:n]).sum()))
        return out

    def confidence(self, row: np.ndarray) -> float:
        return float(1.0 / np.exp(row - row.max()).sum())

    def host(self, rows: Rows) -> Any:
        x = rows[0] if isinstance(rows, (list, tuple)) and rows else rows
        return rows if isinstance(x, np.ndarray) else ops_of(rows).host(rows)


NUMPY = NumpyOps()
_KINDS: list[tuple[type, RowOps]] = []


def register(kind: type, ops: RowOps) -> None:
    """Rows of type `kind` (and its subclasses) are handled by `ops` from now on."""
    if all(k is not kind for k, _ in _KINDS):
        _KINDS.append((kind, ops))


def ops_of(rows: Rows) -> RowOps:
    """The operations for `rows`: one row, a 2-D block, or a list of rows (its first decides)."""
    x = rows[0] if isinstance(rows, (list, tuple)) and rows else rows
    if isinstance(x, np.ndarray):
        return NUMPY
    for kind, ops in _KINDS:
        if isinstance(x, kind):
            return ops
    raise TypeError(f"no row operations for {type(x).__name__} (a backend's module registers its kind)")

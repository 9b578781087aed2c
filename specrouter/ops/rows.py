"""The row operations of a row's kind (contract.py): the one door the cascade goes through.

numpy rows get rows_numpy's operations; any other kind is registered by the backend whose
module produces it (`register`: the torch backend registers rows_torch's for torch.Tensor), so
nothing here imports torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specrouter.ops.contract import RowOps, Rows
from specrouter.ops.rows_numpy import NumpyOps

_KINDS: list[tuple[type, RowOps]] = []


def _first(rows: Rows) -> Any:
    return rows[0] if isinstance(rows, (list, tuple)) and rows else rows


def to_host(rows: Rows) -> Any:
    """The rows on the host as numpy: numpy rows as they are, others through their kind's `host`."""
    return rows if isinstance(_first(rows), np.ndarray) else ops_of(rows).host(rows)


NUMPY = NumpyOps(to_host)


def register(kind: type, ops: RowOps) -> None:
    """Rows of type `kind` (and its subclasses) are handled by `ops` from now on."""
    if all(k is not kind for k, _ in _KINDS):
        _KINDS.append((kind, ops))


def ops_of(rows: Rows) -> RowOps:
    """The operations for `rows`: one row, a 2-D block, or a list of rows (its first decides)."""
    x = _first(rows)
    if isinstance(x, np.ndarray):
        return NUMPY
    for kind, ops in _KINDS:
        if isinstance(x, kind):
            return ops
    raise TypeError(f"no row operations for {type(x).__name__} (a backend's module registers its kind)")

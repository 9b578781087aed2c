"""The row operations (contract.py) on numpy rows: the reference every other kind follows.

warp: temperature, then min-p, top-k and top-p, in that order (penalties and grammars have
transformed the logits before, cascade/penalties.py and grammar.py). sample: inverse-CDF with
one uniform. residual: norm(max(p - q, 0)), the distribution speculative sampling draws from
after a rejection (cascade/verify.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from specrouter.ops.contract import FLOAT32_MAX_INVERSE_TEMPERATURE, TOP_P_MARGIN, Rows, WarpParams

# Top-p on a 150k vocabulary: a full sort costs more than a draft forward. The nucleus almost
# always lies inside the top few hundred tokens, so those are sorted first, and the full sort
# runs only when they do not reach top_p.
_TOP_P_CANDIDATES = 512
#: sample_with() searches block sums first, then one block: two short cumulative sums instead
#: of one over the whole vocabulary.
_SAMPLE_BLOCK = 1024


def warp(logits: np.ndarray, params: WarpParams) -> np.ndarray:
    """The probability vector (float64) a level samples from. Greedy gives one-hot argmax.

    The exponentials are taken in the logits' own precision: float32 exp is several times
    faster than float64 on a large vocabulary, and it moves a probability by a few 1e-6
    relative at most, the order of what float32 logits (llama.cpp's and torch's) were rounded
    by already. Normalisation is in float64, so the vector sums to 1 as exactly as a float64
    warp's; float64 logits stay float64 throughout."""
    if params.greedy:
        probs = np.zeros(logits.shape[-1], dtype=np.float64)
        probs[int(np.argmax(logits))] = 1.0
        return probs
    inverse = 1.0 / params.temperature
    dtype = np.float32 if logits.dtype == np.float32 and inverse < FLOAT32_MAX_INVERSE_TEMPERATURE else np.float64
    # Shift by the max first: a tiny temperature then sends the others to -inf, never inf - inf.
    scaled = logits.astype(dtype)  # a copy: the caller's logits stay as they are
    scaled -= scaled.max()
    if inverse != 1.0:  # (x * 1.0 is x: temperature 1 skips the pass and its error-state switch)
        with np.errstate(over="ignore", invalid="ignore"):
            scaled *= inverse
    if math.isinf(inverse):  # a temperature so small its inverse overflows: 0 * inf at the maximum
        scaled[np.isnan(scaled)] = 0.0
    if params.min_p > 0:
        # p / p_max = exp(scaled) (the maximum is at 0): keep p >= min_p * p_max.
        scaled[scaled < math.log(params.min_p)] = -np.inf
    vocab = scaled.shape[-1]
    if params.top_k and params.top_k < vocab:
        # Ties at the k-th value are cut by argpartition's order; every level of a chain
        # applies the same deterministic rule, so the target distribution stays well defined.
        keep = np.argpartition(-scaled, params.top_k - 1)[: params.top_k]
        masked = np.full(vocab, -np.inf, dtype=dtype)
        masked[keep] = scaled[keep]
        scaled = masked
    np.exp(scaled, out=scaled)
    probs = scaled.astype(np.float64, copy=False)
    probs /= probs.sum()
    if params.top_p < 1.0:
        probs = _top_p_filter(probs, params.top_p)
    return probs


def _top_p_filter(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Keep the smallest set of most likely tokens whose mass reaches top_p (as HF does)."""
    n = probs.shape[0]
    if n > _TOP_P_CANDIDATES:
        cand = np.argpartition(-probs, _TOP_P_CANDIDATES - 1)[:_TOP_P_CANDIDATES]
        order = cand[np.argsort(-probs[cand], kind="stable")]
        if probs[order].sum() < top_p:
            order = np.argsort(-probs, kind="stable")
    else:
        order = (-probs).argsort(kind="stable")
    cumulative = probs[order].cumsum()
    # First index where the cumulative mass reaches top_p; keep up to and including it.
    cut = int(cumulative.searchsorted(top_p - TOP_P_MARGIN)) + 1
    kept = order[:cut]
    out = np.zeros(n, dtype=probs.dtype)
    out[kept] = probs[kept]
    out /= out.sum()
    return out


def sample_with(probs: np.ndarray, u: float) -> int:
    """The token the uniform u in [0, 1) draws from probs: the first index whose cumulative
    mass exceeds u * total."""
    n = probs.shape[0]
    if n <= 4 * _SAMPLE_BLOCK:
        cdf = probs.cumsum()
        return int(min(cdf.searchsorted(u * cdf[-1], side="right"), n - 1))
    starts = np.arange(0, n, _SAMPLE_BLOCK)
    block_cdf = np.cumsum(np.add.reduceat(probs, starts))
    x = u * block_cdf[-1]
    b = int(min(np.searchsorted(block_cdf, x, side="right"), len(starts) - 1))
    block = probs[starts[b] : starts[b] + _SAMPLE_BLOCK]
    cdf = np.cumsum(block)
    j = int(np.searchsorted(cdf, x - (block_cdf[b - 1] if b else 0.0), side="right"))
    if j >= block.shape[0]:  # rounding between the two sums: the block's last token with mass
        j = int(np.flatnonzero(block)[-1])
    return int(starts[b]) + j


def residual(p: np.ndarray, q: np.ndarray | None, proposed: int) -> np.ndarray:
    """norm(max(p - q, 0)), with q = one-hot(proposed) when q is None.

    p and q may have different lengths (padded vocabularies): the missing tail is
    probability zero.
    """
    if q is None:
        r = p.copy()
        if proposed < r.shape[0]:
            r[proposed] = 0.0
    else:
        n = max(p.shape[0], q.shape[0])
        r = _pad(p, n) - _pad(q, n)
        np.maximum(r, 0.0, out=r)
    total = r.sum()
    if total <= 0:
        # Only reachable through rounding when p == q, where rejection has probability 0.
        return p
    return r / total


def _pad(v: np.ndarray, n: int) -> np.ndarray:
    if v.shape[0] == n:
        return v.astype(np.float64, copy=True)
    out = np.zeros(n, dtype=np.float64)
    out[: v.shape[0]] = v
    return out


class NumpyOps:
    """Rows as numpy arrays. `to_host` brings rows of any kind to the host (rows.py, which
    knows every kind): what a second operand of another kind goes through."""

    def __init__(self, to_host: Callable[[Rows], Any]) -> None:
        self._to_host = to_host

    def argmax(self, rows: Rows) -> list[int]:
        return [int(np.argmax(row)) for row in rows]

    def warp(self, rows: Rows, params: WarpParams) -> list:
        return [warp(row, params) for row in rows]

    def sample(self, probs: np.ndarray, u: float) -> int:
        return sample_with(probs, u)

    def at(self, rows: Rows, tokens: Sequence[int]) -> list[float]:
        return [float(row[t]) if t < row.shape[0] else 0.0 for row, t in zip(rows, tokens)]

    def residual(self, p: np.ndarray, q: Any | None, token: int) -> np.ndarray:
        # a device-kept q under a host p (a torch draft under a llama.cpp target) comes to the host
        return residual(p, None if q is None else self._to_host(q), token)

    def overlap(self, ps: Rows, qs: Rows) -> list[float]:
        out = []
        for p, q in zip(ps, self._to_host(qs)):
            n = min(p.shape[0], q.shape[0])  # padded vocabularies: compare the shared range
            out.append(float(np.minimum(p[:n], q[:n]).sum()))
        return out

    def confidence(self, row: np.ndarray) -> float:
        return float(1.0 / np.exp(row - row.max()).sum())

    def host(self, rows: Rows) -> Any:
        return self._to_host(rows)

    def one_hot(self, rows: Rows, tokens: Sequence[int], values: Sequence[float]) -> np.ndarray:
        out = np.zeros(rows.shape, rows.dtype)
        out[np.arange(len(tokens)), list(tokens)] = values
        return out

"""Sampling parameters and logit warping (temperature, top-k, top-p).

Every level of a chain warps its own logits with the same parameters, so the
distribution the target's output must follow is the target's *warped* distribution.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from specrouter.errors import InvalidParameterError

# Top-p on a 150k vocabulary: sorting everything costs ~10 ms, more than a draft
# forward. The nucleus almost always lies inside the top few hundred tokens, so we
# sort those first and fall back to the full sort only when they do not reach top_p.
_TOP_P_CANDIDATES = 512


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy (argmax); top_k 0 and top_p 1 disable those filters."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or math.isnan(self.temperature) or self.temperature < 0:
            raise InvalidParameterError(f"temperature must be >= 0, got {self.temperature}")
        if not math.isfinite(self.temperature):
            raise InvalidParameterError(f"temperature must be finite, got {self.temperature}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidParameterError(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k}")
        if not isinstance(self.top_p, (int, float)) or math.isnan(self.top_p) or not 0 < self.top_p <= 1:
            raise InvalidParameterError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64) - np.max(logits)
    e = np.exp(z)
    return e / e.sum()


def warp(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The probability vector (float64) a level samples from. Greedy gives one-hot argmax."""
    if params.greedy:
        probs = np.zeros(logits.shape[-1], dtype=np.float64)
        probs[int(np.argmax(logits))] = 1.0
        return probs
    # Shift by the max first: a tiny temperature then sends the others to -inf, never inf - inf.
    shifted = logits.astype(np.float64)
    with np.errstate(over="ignore"):
        scaled = (shifted - shifted.max()) / params.temperature
    vocab = scaled.shape[-1]
    if params.top_k and params.top_k < vocab:
        # Ties at the k-th value are cut by argpartition's order; every level of a chain
        # applies the same deterministic rule, so the target distribution stays well defined.
        keep = np.argpartition(-scaled, params.top_k - 1)[: params.top_k]
        masked = np.full(vocab, -np.inf)
        masked[keep] = scaled[keep]
        scaled = masked
    probs = softmax(scaled)
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
        order = np.argsort(-probs, kind="stable")
    cumulative = np.cumsum(probs[order])
    # First index where the cumulative mass reaches top_p; keep up to and including it.
    cut = int(np.searchsorted(cumulative, top_p - 1e-12)) + 1
    kept = order[:cut]
    out = np.zeros_like(probs)
    out[kept] = probs[kept]
    return out / out.sum()


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Inverse-CDF sampling with one uniform from rng (tests fix rng to fix the draw)."""
    cdf = np.cumsum(probs)
    u = rng.random() * cdf[-1]
    return int(min(np.searchsorted(cdf, u, side="right"), probs.shape[0] - 1))

"""Sampling parameters and logit warping (temperature, min-p, top-k, top-p).

Every level of a chain warps its own logits with the same parameters, so the
distribution the target's output must follow is the target's *warped* distribution.
Penalties and biases transform the logits before warping (penalties.py), and then a
grammar restricts them (grammar.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from specrouter.cascade.grammar import Grammar
from specrouter.cascade.rows import ops_of
from specrouter.errors import InvalidParameterError

# Top-p on a 150k vocabulary: sorting everything costs ~10 ms, more than a draft
# forward. The nucleus almost always lies inside the top few hundred tokens, so we
# sort those first and fall back to the full sort only when they do not reach top_p.
_TOP_P_CANDIDATES = 512
#: Top-p keeps tokens until their cumulative mass reaches top_p less this (float rounding of the sum).
TOP_P_MARGIN = 1e-12


#: The range of a logit_bias value (OpenAI's).
MAX_LOGIT_BIAS = 100.0
#: The range of frequency_penalty and presence_penalty (OpenAI's).
MAX_PENALTY = 2.0
#: The range of repetition_penalty, symmetric about 1 (which disables it): a logit divided
#: by the smallest stays finite in float32 (below 3e35 in magnitude), where a smaller one
#: would make it inf and the warped row NaN.
MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY = 1e-3, 1e3


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy (argmax); top_k 0, top_p 1 and min_p 0 disable those
    filters. Penalties and biases (penalties.py): frequency_penalty and presence_penalty 0,
    repetition_penalty 1 and an empty logit_bias ((token, bias) pairs) change nothing."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    #: Structured output (grammar.py): the output stays a prefix of a sentence of this grammar.
    grammar: Grammar | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or math.isnan(self.temperature) or self.temperature < 0:
            raise InvalidParameterError(f"temperature must be >= 0, got {self.temperature}")
        if not math.isfinite(self.temperature):
            raise InvalidParameterError(f"temperature must be finite, got {self.temperature}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidParameterError(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k}")
        if not isinstance(self.top_p, (int, float)) or math.isnan(self.top_p) or not 0 < self.top_p <= 1:
            raise InvalidParameterError(f"top_p must be in (0, 1], got {self.top_p}")
        if not _real(self.min_p) or not 0 <= self.min_p <= 1:
            raise InvalidParameterError(f"min_p must be in [0, 1], got {self.min_p}")
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if not _real(value) or not -MAX_PENALTY <= value <= MAX_PENALTY:
                raise InvalidParameterError(f"{name} must be in [-{MAX_PENALTY}, {MAX_PENALTY}], got {value}")
        if not _real(self.repetition_penalty) or not (
                MIN_REPETITION_PENALTY <= self.repetition_penalty <= MAX_REPETITION_PENALTY):
            raise InvalidParameterError(f"repetition_penalty must be in [{MIN_REPETITION_PENALTY:g}, "
                                        f"{MAX_REPETITION_PENALTY:g}] (1 disables), got {self.repetition_penalty}")
        if self.grammar is not None and not isinstance(self.grammar, Grammar):
            raise InvalidParameterError(f"grammar must be a Grammar, got {type(self.grammar).__name__}")
        for token, bias in self.logit_bias:
            if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                raise InvalidParameterError(f"logit_bias keys must be token ids >= 0, got {token!r}")
            if not _real(bias) or not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
                raise InvalidParameterError(f"logit_bias values must be in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}], "
                                            f"got {bias!r} for token {token}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _real(x: object) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


#: Above this 1/temperature the scaled logits leave float32's range: float64 is used.
_FLOAT32_MAX_INVERSE_TEMPERATURE = 1e30


def warp(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The probability vector (float64) a level samples from. Greedy gives one-hot argmax.

    The exponentials are taken in the logits' own precision: float32 exp is ~6x faster than
    float64 on a 150k vocabulary (0.2 against 1.3 ms here, and a verification warps up to
    17 rows per cycle), and it moves a probability by a few 1e-6 relative at most (measured
    on 150k Qwen-sized logits at T=0.7), the order of what float32 logits (llama.cpp's and
    torch's) were rounded by already. Normalisation is in float64, so the vector sums to 1
    as exactly as before; float64 logits stay float64 throughout."""
    if params.greedy:
        probs = np.zeros(logits.shape[-1], dtype=np.float64)
        probs[int(np.argmax(logits))] = 1.0
        return probs
    inverse = 1.0 / params.temperature
    dtype = np.float32 if logits.dtype == np.float32 and inverse < _FLOAT32_MAX_INVERSE_TEMPERATURE else np.float64
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


#: sample() searches block sums first, then one block: two short cumulative sums instead
#: of one over the whole vocabulary (0.6 ms on 150k tokens here, more than the warp).
_SAMPLE_BLOCK = 1024


def sample(probs, rng: np.random.Generator) -> int:
    """Inverse-CDF sampling with one uniform from rng (tests fix rng to fix the draw), on
    the host or on the row's device (rows.py)."""
    u = rng.random()
    if isinstance(probs, np.ndarray):
        return sample_with(probs, u)
    return ops_of(probs).sample(probs, u)


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

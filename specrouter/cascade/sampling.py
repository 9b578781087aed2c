"""Warping and sampling one row, on the host or on the row's device, through the row
operations of its kind (ops/rows.py).

SamplingParams and its bounds are defined in params.py and exported here as well, beside
the functions that read them.
"""

from __future__ import annotations

import numpy as np

from specrouter.cascade.params import (MAX_LOGIT_BIAS, MAX_PENALTY, MAX_REPETITION_PENALTY, MIN_REPETITION_PENALTY,
                                       SamplingParams)
from specrouter.ops.rows import ops_of

__all__ = ["MAX_LOGIT_BIAS", "MAX_PENALTY", "MAX_REPETITION_PENALTY", "MIN_REPETITION_PENALTY", "SamplingParams",
           "sample", "warp"]


def warp(logits, params: SamplingParams):
    """The probability vector a level samples from (float64; one-hot argmax when greedy):
    ops/rows_numpy.py's rules."""
    return ops_of(logits).warp([logits], params)[0]


def sample(probs, rng: np.random.Generator) -> int:
    """Inverse-CDF sampling with one uniform from rng (tests fix rng to fix the draw)."""
    return ops_of(probs).sample(probs, rng.random())

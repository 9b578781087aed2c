"""Sampling parameters: what a request asks of every level's distribution, validated once.

Every level of a chain warps its own logits with the same parameters (ops/rows_numpy.py:
warp), so the distribution the target's output must follow is the target's *warped*
distribution. Penalties and biases transform the logits before warping (penalties.py), and
then a grammar restricts them (grammar.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from specrouter.cascade.grammar import Grammar
from specrouter.errors import InvalidParameterError

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


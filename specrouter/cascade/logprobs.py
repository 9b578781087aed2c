"""Log-probabilities of emitted tokens: what the target alone reports, whatever chain ran.

Contract. For every token the target emits, the log-probability of that token and of the
`top` most likely tokens under the distribution the target decoded it from (its logits after
penalties and biases, penalties.py, where the request has any):
- sampling: the target's warped distribution (temperature, then top-k, then top-p, exactly
  what cascade.sampling.warp samples from); a token the filters cut has probability 0, its
  log-probability -inf;
- greedy: the target's distribution at temperature 1, log_softmax(logits) (the argmax of a
  distribution that is one-hot at its argmax says nothing; OpenAI and vLLM report the model's
  own distribution when decoding at temperature 0).

Why it is the target alone's, under any chain: every emitted token is decided at the target
level from one row of the target's logits, the row after the emitted token's own prefix
(accepted drafts: the row that verified them; the correction or bonus token: the row it
was drawn from). A chain changes how many rows one forward evaluates, never which prefix a
row belongs to, so the reported values are the target alone's up to the rounding of a
batched forward (none with exact kernels). Rows of lower levels never report.

Cost: one log-sum-exp over the vocabulary per emitted token, plus an argpartition for the
top list; nothing when logprobs were not asked for (CycleRunner never calls this then).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specrouter.cascade.sampling import SamplingParams, warp

#: The most alternatives a request may ask for per token (as vLLM's default max_logprobs).
MAX_TOP_LOGPROBS = 20
#: What a log-probability of -inf (a token the sampling filters cut) is written as in JSON,
#: which has no infinity (OpenAI's and vLLM's value).
JSON_MIN_LOGPROB = -9999.0


@dataclass(frozen=True)
class TokenLogprob:
    """One emitted token's log-probability and the `top` most likely tokens with theirs
    (most likely first; ties by token id)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()

    def as_dict(self) -> dict:
        """JSON's form (ids; -inf written as JSON_MIN_LOGPROB)."""
        return {"token": self.token, "logprob": finite(self.logprob),
                "top": [[t, finite(lp)] for t, lp in self.top]}


def finite(logprob: float) -> float:
    """A log-probability as JSON can carry it."""
    return max(logprob, JSON_MIN_LOGPROB)


def log_distribution(row: np.ndarray, params: SamplingParams, probs: np.ndarray | None = None) -> np.ndarray:
    """Log-probabilities (float64) of the distribution a target row decodes from (see the
    module docstring). `probs`: the row's warped distribution when the caller has it already
    (sampling), so it is not warped twice."""
    if params.greedy:
        x = row.astype(np.float64)
        x -= x.max()
        return x - np.log(np.exp(x).sum())
    if probs is None:
        probs = warp(row, params)
    with np.errstate(divide="ignore"):
        return np.log(probs)


def token_logprob(logp: np.ndarray, token: int, top: int) -> TokenLogprob:
    """`token`'s entry from a row's log-probabilities, with its `top` alternatives."""
    alternatives: tuple[tuple[int, float], ...] = ()
    if top > 0:
        k = min(top, logp.shape[0])
        best = np.argpartition(-logp, k - 1)[:k]
        best = best[np.lexsort((best, -logp[best]))]  # most likely first, ties by id
        alternatives = tuple((int(t), float(logp[t])) for t in best)
    return TokenLogprob(int(token), float(logp[token]), alternatives)


def emitted_logprobs(rows: Sequence[np.ndarray], tokens: Sequence[int], params: SamplingParams, top: int,
                     probs: Sequence | None = None) -> list[TokenLogprob]:
    """Entries for `tokens`, token j decoded from rows[j] (probs[j]: its warped distribution,
    under sampling, when the caller has it)."""
    out = []
    for j, token in enumerate(tokens):
        p = probs[j] if probs is not None and not params.greedy else None
        out.append(token_logprob(log_distribution(rows[j], params, p), token, top))
    return out

"""Penalties and biases: a transformation of a row of logits by the text before it.

Contract. Before temperature and the filters (sampling.warp), a row of logits after a
prefix is transformed, in this order (vLLM's):
1. logit_bias: `bias[t]` is added to token t's logit (OpenAI's logit_bias; -100 bans in
   practice, +100 forces);
2. repetition_penalty r (HF's, vLLM's extension): every token that occurs in the prompt or
   the output so far has its logit divided by r when positive, multiplied by r otherwise;
3. frequency_penalty f and presence_penalty c (OpenAI's): every token that occurs c_t > 0
   times in the output so far (not the prompt) loses f * c_t + c.
min_p (keep the tokens of probability >= min_p x the top one) is a filter of warp, after
temperature, as top-k and top-p are.

Why speculation stays lossless. The transformation is a function of (row, prefix) only. The
target's output distribution is defined as its transformed, warped rows along the output;
every level of a chain applies the same transformation to its own row after the same prefix
(the committed text plus the tokens drafted before that position in the block: a draft's
own earlier tokens count, as the target's will when it verifies them), so every level is
exactly a penalised model, and speculative sampling makes the output follow the top one
(verify.py). A rejected token leaves no trace: the counts of a row are those of its own
prefix, recomputed from it, never accumulated across rows.

History keeps what the committed text contributes (the prompt's distinct tokens, the
output's counts), updated once per cycle with the newly committed tokens; a row adds the
few tokens its prefix has past the committed text.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from specrouter.cascade.sampling import SamplingParams


class History:
    """The committed text a sequence's penalties read: its prompt's distinct tokens and its
    output's token counts. `sync(context)` counts what the committed context added (it must
    extend what was synced: committed text is never rolled back)."""

    def __init__(self, prompt: Sequence[int]) -> None:
        self.prompt_length = len(prompt)
        self.prompt_tokens = np.unique(np.asarray(prompt, dtype=np.int64))
        self.committed = self.prompt_length  # context tokens counted
        self.output = Counter()

    def sync(self, context: Sequence[int]) -> None:
        if len(context) < self.committed:
            raise ValueError("a committed context never shrinks")
        self.output.update(int(t) for t in context[self.committed:])
        self.committed = len(context)

    def counts(self, prefix: Sequence[int]) -> Counter:
        """Output token counts after `prefix` (which extends the synced context)."""
        extra = prefix[self.committed:]
        if not extra:
            return self.output
        counts = self.output.copy()
        counts.update(int(t) for t in extra)
        return counts


def penalized(params: SamplingParams) -> bool:
    """Whether params transform rows at all (else rows are used as the model gave them)."""
    return bool(params.logit_bias) or params.repetition_penalty != 1.0 or bool(
        params.frequency_penalty or params.presence_penalty)


def penalize(row: np.ndarray, prefix: Sequence[int], params: SamplingParams, history: History) -> np.ndarray:
    """The transformed row after `prefix` (a copy; see the module docstring)."""
    out = np.array(row, copy=True)
    vocab = out.shape[-1]
    if params.logit_bias:
        ids = np.fromiter((t for t, _ in params.logit_bias if t < vocab), dtype=np.int64)
        bias = np.fromiter((b for t, b in params.logit_bias if t < vocab), dtype=np.float64)
        out[ids] += bias.astype(out.dtype)
    counts = history.counts(prefix)
    if params.repetition_penalty != 1.0:
        seen = np.union1d(history.prompt_tokens, np.fromiter(counts, dtype=np.int64, count=len(counts)))
        seen = seen[seen < vocab]
        values = out[seen]
        r = params.repetition_penalty
        out[seen] = np.where(values > 0, values / r, values * r)
    if (params.frequency_penalty or params.presence_penalty) and counts:
        ids = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
        n = np.fromiter(counts.values(), dtype=np.float64, count=len(counts))
        keep = ids < vocab
        out[ids[keep]] -= (params.frequency_penalty * n[keep] + params.presence_penalty).astype(out.dtype)
    return out

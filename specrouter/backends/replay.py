"""Recorded greedy answers replayed as a model: the target of a trace-driven simulation.

Greedy verification commits only the verifier's argmax at positions whose context is the
committed text itself (the accepted prefix of a block, then the verifier's own token);
every other row of a block is discarded. So a model whose argmax after prompt + answer[:i]
is answer[i] (and EOS after the whole answer, where it ended at EOS) makes every chain over
it, routed or fixed, commit exactly the recorded answer, whatever its drafts propose, and the
simulated clock (SyntheticBackend's `simulated_seconds`, `latency(n)` per forward of n
tokens) says what the run would have cost on the machine the latency describes.

- Rows off the recorded path (after a rejected proposal, or any other context) are one
  fixed token's (OFF); no greedy chain commits them. Only greedy runs are replayed.
- Ids are remapped to a compact vocabulary (the distinct ids of every script, then EOS and
  OFF): a model-free drafter compares ids only, so its proposals, and every decision made
  from them, are those of the real run. A model draft would need its own recorded rows: not
  modelled here.
- The prompt is not priced: a forward's cost counts only the tokens it feeds at positions
  from the prompt's last token on (the prefill is the same for every method compared, and
  the copy ceiling's replay leaves it out too). While no script is current (a profiler's
  probes), every token counts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from specrouter.backends.synthetic import SyntheticBackend

#: The logit of a row's one token (every other is 0): argmax only matters under greedy.
PEAK = 10.0


@dataclass(frozen=True)
class Script:
    """One recorded request: its prompt and greedy answer (original ids), and whether the
    answer ended at EOS (else at max_tokens)."""

    prompt: list[int]
    answer: list[int]
    eos: bool


class ReplayBackend(SyntheticBackend):
    """Replays `scripts`, one at a time: `play(i)` makes script i current and returns its
    prompt and answer in this model's ids."""

    def __init__(self, name: str, scripts: Sequence[Script], latency: Callable[[int], float],
                 params_b: float = 1.0) -> None:
        ids = sorted({t for s in scripts for t in (*s.prompt, *s.answer)})
        self._compact = {t: i for i, t in enumerate(ids)}
        eos, self.off = len(ids), len(ids) + 1
        super().__init__(name, vocab=len(ids) + 2, eos_id=eos, latency=latency, params_b=params_b, order=0)
        self.scripts = list(scripts)
        self._path: list[int] = []
        self._prompt = 0

    def compact(self, tokens: Sequence[int]) -> list[int]:
        return [self._compact[t] for t in tokens]

    def play(self, index: int | None) -> tuple[list[int], list[int]]:
        """Make script `index` current (None: none) and return its (prompt, answer), compact."""
        if index is None:
            self._path, self._prompt = [], 0
            return [], []
        s = self.scripts[index]
        prompt, answer = self.compact(s.prompt), self.compact(s.answer)
        self._path = prompt + answer + ([min(self.eos_ids)] if s.eos else [])
        self._prompt = len(prompt)
        return prompt, answer

    def logits_for(self, context: Sequence[int]) -> np.ndarray:
        n = len(context)
        on_path = self._prompt <= n < len(self._path) and list(context) == self._path[:n]
        row = np.zeros(self.n_vocab)
        row[self._path[n] if on_path else self.off] = PEAK
        return row

    def decode(self, seq: int, tokens: Sequence[int], pos: int, n_logits: int) -> np.ndarray:
        logits = self._extend(seq, tokens, pos, n_logits)
        unpriced = max(0, min(len(tokens), self._prompt - 1 - pos))  # prompt tokens before its last
        self._charge(len(tokens) - unpriced)
        return logits

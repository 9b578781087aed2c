"""Level 0 of a chain: a proposer, behind two methods (draft, then feedback).

A proposer drafts the block the level above verifies. It returns a `Draft`: the
tokens, the distribution each was drawn from (None for a deterministic proposer: the
verifier then treats q as one-hot, verify.py), and the evidence the router learns
from (a lookup's suffix-match length; a model's confidences). Once the block is
verified it gets `feedback(draft, n_accepted)`, which is where its draft-length
policy learns; it keeps nothing between the two calls (in a batch other requests
draft in between), so everything feedback needs travels in the Draft.

A model drafter's proposals must keep the cascade exact (chain.py's docstring): its
draft-length policy may end a draft only on what was drawn *before* the next token
(`LengthPolicy.more` sees the confidences so far), never drop a token after seeing it.

A model at level 0 drafts through model_drafter.py's `ModelDrafter` (autoregressively, its
length decided by a LengthPolicy, none by default); the model-free lookup drafters, whose
draft yields no forward, live in specrouter.drafters.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

import numpy as np

from specrouter.ops.rows import ops_of


@dataclass(frozen=True)
class Draft:
    """What a level hands the level above."""

    tokens: list[int]
    #: Per token, the distribution it was drawn from as the cascade keeps it (argmax id under
    #: greedy, warped probabilities otherwise); None for a deterministic proposer (q one-hot).
    dists: list | None
    #: A lookup draft's match class (LookupDrafter.match_class; None: a model's draft, or no match).
    match_class: str | None = None
    #: A model draft's confidence per token, when its length policy asked for them.
    confidences: tuple[float, ...] = ()
    #: Its length policy ended it before the length it was asked for (its end is then no
    #: rejection to score: the block asked for no more).
    stopped: bool = False

    def cut(self, n: int) -> Draft:
        """Its first n tokens (itself when it has no more): what a grammar lets through
        (grammar.py). Not `stopped`: the tokens cut were drafted and are scored as rejected."""
        if n >= len(self.tokens):
            return self
        return replace(self, tokens=self.tokens[:n], dists=None if self.dists is None else self.dists[:n],
                       confidences=self.confidences[:n], stopped=False)


class Drafting(Protocol):
    """What the cascade lends a proposer for one draft."""

    eos_ids: frozenset[int]
    #: How many leading tokens of any context of this cycle are committed (the cycle's
    #: starting context): what follows them may still be rolled back.
    committed: int

    def row(self, tokens: list[int]) -> Generator[object, np.ndarray, np.ndarray]:
        """Level 0's next-token logits after `tokens` (yields the cascade's EvalRequest)."""

    def pick(self, row: np.ndarray, want_confidence: bool) -> tuple[int, object, float]:
        """A token from the row as the cascade samples (argmax under greedy), its kept
        distribution, and its confidence (0.0 unless asked: it costs a softmax)."""

    def lookup_took(self, seconds: float) -> None:
        """A model-free proposer reports the time its lookup took."""

    def forced(self, tokens: list[int]) -> list[int]:
        """The tokens the request's grammar forces after `tokens` (empty: none, or no grammar)."""

    def clock(self) -> float: ...


@runtime_checkable
class Proposer(Protocol):
    name: str

    def draft(self, context: list[int], n: int, drafting: Drafting) -> Generator[object, np.ndarray, Draft]:
        """Up to n tokens following `context` (fewer after EOS, on the length policy's
        word, or when a lookup finds nothing)."""

    def feedback(self, draft: Draft, n_accepted: int) -> None:
        """The level above accepted the first n_accepted of draft's tokens."""


class LengthPolicy(Protocol):
    """Ends a model's draft before its length when going on no longer pays (the router's
    ConfidenceStop). It sees the draft's confidence in each token so far: under greedy the
    top probability of its distribution, under sampling the probability of the drawn token."""

    def more(self, confidences: Sequence[float]) -> bool:
        """Whether to draft one more token after these."""

    def learn(self, confidences: Sequence[float], n_accepted: int) -> None:
        """The verifier accepted the first n_accepted of the tokens with these confidences."""


def confidence(row) -> float:
    """Top probability of the softmax of a logits row (on the row's device, rows.py)."""
    return ops_of(row).confidence(row)


def cut_after_eos(tokens: list[int], eos_ids: frozenset[int]) -> list[int]:
    """tokens up to and including the first end-of-generation token."""
    for j, t in enumerate(tokens):
        if t in eos_ids:
            return tokens[: j + 1]
    return tokens

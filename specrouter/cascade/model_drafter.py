"""A model as level 0: drafts autoregressively, one forward per token (a Proposer).

The chain wraps a model it is given at level 0 in one (chain.py: Chain, with the chain's
draft_stop as the LengthPolicy). It is part of the cascade, not of the drafters: whether a
draft may end early is the cascade's exactness law (chain.py's docstring), and this is where
that law meets a model: the policy is asked before the next token is drawn, never after.
"""

from __future__ import annotations

from collections.abc import Generator

import numpy as np

from specrouter.backends.base import Backend
from specrouter.cascade.proposer import Draft, Drafting, LengthPolicy


class ModelDrafter:
    """A Backend drafting autoregressively, one forward per token. With no length policy
    it drafts the length it is asked for (no confidences computed)."""

    def __init__(self, backend: Backend, policy: LengthPolicy | None = None) -> None:
        self.backend, self.policy = backend, policy
        self.name = backend.name

    def draft(self, context: list[int], n: int, drafting: Drafting) -> Generator[object, np.ndarray, Draft]:
        policy = self.policy
        tokens: list[int] = []
        dists: list = []
        confidences: list[float] = []
        for _ in range(n):
            row = yield from drafting.row(context + tokens)
            token, dist, conf = drafting.pick(row, policy is not None)
            tokens.append(token)
            dists.append(dist)
            if policy is not None:
                confidences.append(conf)
            if token in drafting.eos_ids:
                break
            if policy is not None and len(tokens) < n and not policy.more(confidences):
                return Draft(tokens, dists, confidences=tuple(confidences), stopped=True)
        return Draft(tokens, dists, confidences=tuple(confidences))

    def feedback(self, draft: Draft, n_accepted: int) -> None:
        if self.policy is not None and draft.confidences:
            self.policy.learn(draft.confidences, n_accepted)

"""What every model-free drafter shares: the Proposer methods around a lookup."""

from __future__ import annotations

from collections.abc import Generator, Sequence

import numpy as np

from specrouter.cascade.proposer import Draft, Drafting, cut_after_eos


class LookupDrafter:
    """A deterministic Proposer (q one-hot) that drafts by looking tokens up, no forward.
    A subclass names itself (`name`), states the seconds of one lookup before any is timed
    (`LOOKUP_SECONDS`), the match classes its acceptance is learned per (`match_classes`)
    and the longest draft worth asking of it (`longest`), and implements `lookup`; its
    evidence is the match length."""

    name: str
    params_b = 0.0
    LOOKUP_SECONDS: float
    #: Match lengths that open a class: a match of length m belongs to the largest one <= m
    #: (a longer match predicts its continuation better; classes keep the estimates apart).
    match_classes: tuple[int, ...] = (1,)
    #: The longest draft the router may ask of it.
    longest: int = 24

    def match_class(self, match: int) -> int:
        """The class of a match of this length (>= 1)."""
        return max(c for c in self.match_classes if c <= max(match, self.match_classes[0]))

    def lookup(self, context: Sequence[int], n: int, committed: int | None = None) -> tuple[list[int], int]:
        """Up to n tokens following the context and the length of the match behind them
        (0: none); the first `committed` tokens (default: all) are never rolled back."""
        raise NotImplementedError

    def draft(self, context: list[int], n: int, drafting: Drafting) -> Generator[object, np.ndarray, Draft]:
        """The Proposer method: lookup's tokens (cut after EOS) with its match length."""
        start = drafting.clock()
        tokens, match = self.lookup(context, n, drafting.committed)
        drafting.lookup_took(drafting.clock() - start)
        return Draft(cut_after_eos(tokens, drafting.eos_ids), None, match)
        yield  # a generator (the Proposer protocol) that yields no forward

    def feedback(self, draft: Draft, n_accepted: int) -> None:
        """Nothing to learn here: the router learns acceptance per match length (on_verify)."""

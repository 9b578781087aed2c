"""Prompt-lookup (n-gram) drafter: proposes the continuation of the latest earlier
occurrence of the context's suffix. Model-free and deterministic, so the cascade
treats its proposals as one-hot q (exact verification above it); a Proposer
(cascade/proposer.py) whose evidence is the suffix-match length."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specrouter.drafters.lookup import Found, LookupDrafter

NGRAM_NAME = "ngram"


class NgramDrafter(LookupDrafter):
    name = NGRAM_NAME
    #: Seconds of one lookup before any is timed: the order of one numpy pass over a context
    #: of a few thousand tokens.
    LOOKUP_SECONDS = 2e-5

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.match_classes = tuple(range(1, max_ngram + 1))

    def propose(self, context: Sequence[int], n: int) -> list[int]:
        """Up to n tokens; empty when no suffix of the context occurred before.

        Longer n-grams first: a longer matching suffix predicts its continuation better.
        """
        return self.lookup(context, n).tokens

    def lookup(self, context: Sequence[int], n: int, committed: int | None = None) -> Found:
        """propose()'s tokens and the length of the suffix match behind them; the
        whole context is searched each time (nothing is indexed: `committed` is unused). The
        router estimates acceptance per match length (a longer match predicts its continuation
        better: docs/drafters.md, "Match classes")."""
        if n <= 0 or len(context) < 2:
            return Found([])
        arr = np.asarray(context, dtype=np.int64)
        last = len(arr) - 1
        # Earlier occurrences of the last token (each has a token after it), then how far
        # back each agrees with the suffix: one pass over the context, not one per size.
        ends = np.flatnonzero(arr[:-1] == arr[-1])
        if not ends.size:
            return Found([])
        longest = min(self.max_ngram, last)
        agree = np.ones(ends.size, dtype=bool)
        length = np.ones(ends.size, dtype=np.int64)
        for back in range(1, longest):
            ok = ends >= back
            agree &= ok
            agree[ok] &= arr[ends[ok] - back] == arr[last - back]
            length += agree
        size = int(length.max())
        if size < self.min_ngram:
            return Found([])
        start = int(ends[length >= size][-1]) + 1
        return Found(arr[start : start + n].tolist(), size)

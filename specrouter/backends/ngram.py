"""Prompt-lookup (n-gram) drafter: proposes the continuation of the latest earlier
occurrence of the context's suffix. Model-free and deterministic, so the cascade
treats its proposals as one-hot q (exact verification above it)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

NGRAM_NAME = "ngram"


class NgramDrafter:
    name = NGRAM_NAME
    params_b = 0.0

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, context: Sequence[int], n: int) -> list[int]:
        """Up to n tokens; empty when no suffix of the context occurred before.

        Longer n-grams first: a longer matching suffix predicts its continuation better.
        """
        if n <= 0 or len(context) < 2:
            return []
        arr = np.asarray(context, dtype=np.int64)
        for size in range(min(self.max_ngram, len(arr) - 1), self.min_ngram - 1, -1):
            suffix = arr[-size:]
            # Windows that start before the suffix itself and have at least one token after them.
            windows = sliding_window_view(arr[:-1], size)
            hits = np.flatnonzero((windows == suffix).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + size
                return arr[start : start + n].tolist()
        return []

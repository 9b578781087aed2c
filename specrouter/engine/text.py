"""A request's text: tokens decoded incrementally, stop strings found and cut, and the tail
that could still become a stop string (or is an incomplete UTF-8 character) held back from a
stream until it is resolved.
"""

from __future__ import annotations

import bisect
import codecs
from collections.abc import Callable, Sequence


class TextTracker:
    """Decodes tokens to text incrementally and finds stop strings."""

    def __init__(self, token_bytes: Callable[[int], bytes], stop: Sequence[str]) -> None:
        self._bytes = token_bytes
        self._stop = list(stop)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""
        self.n_tokens = 0  # tokens that contribute to the emitted text
        self._ends: list[int] = []  # text length after each token
        self._shown = 0
        self._stopped = False

    def add(self, token: int) -> bool:
        """Append one token; True when a stop string completed (text is then cut before it)."""
        before = len(self.text)
        self.text += self._decoder.decode(self._bytes(token))
        self.n_tokens += 1
        self._ends.append(len(self.text))
        if not self._stop:
            return False
        # Only a stop string that ends in the new text can be new; search from just before it.
        window_start = max(0, before - max(len(s) for s in self._stop) + 1)
        hits = [i for i in (self.text.find(s, window_start) for s in self._stop) if i >= 0]
        if hits:
            cut = min(hits)
            self.text = self.text[:cut]
            # Keep the fewest tokens whose text covers the kept text (a straddling token stays).
            self.n_tokens = next((j + 1 for j, end in enumerate(self._ends) if end >= cut), 0) if cut else 0
            self._stopped = True
            return True
        return False

    def flush(self, final: bool) -> str:
        """The text not shown yet, minus a tail that may still turn into a stop string."""
        if final and not self._stopped:
            self.text += self._decoder.decode(b"", final=True)
        end = len(self.text) if final else len(self.text) - self._holdback()
        delta = self.text[self._shown : end]
        self._shown = max(self._shown, end)
        return delta

    def shown_tokens(self) -> int:
        """Tokens of the kept text whose text has been shown in full."""
        return bisect.bisect_right(self._ends, self._shown, hi=self.n_tokens)  # ends never decrease

    def _holdback(self) -> int:
        longest = 0
        for s in self._stop:
            for n in range(min(len(s) - 1, len(self.text)), 0, -1):
                if self.text.endswith(s[:n]):
                    longest = max(longest, n)
                    break
        return longest

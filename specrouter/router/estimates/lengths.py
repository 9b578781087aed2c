"""How many tokens a request will still write: the horizon over which a chain's one-time
costs (a drafter catching up on a prompt it has not seen) are amortised.

A chain whose drafter has not seen the prompt must first feed it, which pays only if enough
tokens follow. max_tokens bounds what follows, but an answer often ends long before, and the
answers a deployment gets tend to resemble each other. So the horizon of a request that has
written g tokens is what the process's recent answers that ran past g wrote beyond g (the
median of length - g over the last answers_window finished answers longer than g: a request
already past most of them is one of the long ones), at least 1 and at most the room;
default_horizon tokens before any answer ran past g (at most the room). Answers cut by
max_tokens count at that length: a lower bound of theirs, so the horizon errs short, which
keeps drafters out, the safe side.

One AnswerLengths is shared by the sessions of a router (thread-safe).
"""

from __future__ import annotations

import statistics
import threading
from collections import deque

from specrouter.router.config import DEFAULT_CONFIG, RouterConfig


class AnswerLengths:
    def __init__(self, window: int | None = None, config: RouterConfig = DEFAULT_CONFIG) -> None:
        """window: the answers remembered (default the config's answers_window)."""
        self.config = config
        self._lengths: deque[int] = deque(maxlen=config.answers_window if window is None else window)
        self._lock = threading.Lock()

    def copy(self) -> AnswerLengths:
        """Another record of answer lengths, starting from this one's."""
        twin = AnswerLengths(self._lengths.maxlen, self.config)
        with self._lock:
            twin._lengths.extend(self._lengths)
        return twin

    def record(self, length: int) -> None:
        """A request finished after writing `length` tokens."""
        with self._lock:
            self._lengths.append(length)

    def horizon(self, generated: int, room: int) -> int:
        """Tokens expected to follow once `generated` were written, `room` at most."""
        with self._lock:
            beyond = [n - generated for n in self._lengths if n > generated]
        expected = statistics.median_low(beyond) if beyond else self.config.default_horizon
        return max(1, min(room, expected))

"""Synchronized KV state: the only place that knows what each model's cache holds.

For every (model, sequence) we keep the exact token list the model's KV cache covers.
Before a model computes, its cache is made a prefix of the tokens it is asked about:
positions past the longest common prefix are removed (exact rollback, nothing of the
shared prefix is recomputed) and only the missing tokens are evaluated (lazy catch-up
for a model that sat out some cycles). After each commit, every model is rolled back
to its common prefix with the committed tokens, so rejected positions leave the cache
at once and a sequence never holds more KV cells than it needs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specrouter.backends.base import Backend, SavedKV


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix. Called for every model every cycle on contexts of
    thousands of tokens: slices compare in C, so the usual case (one is a prefix of the
    other) is one comparison and a mismatch is found by bisection, not a Python loop."""
    n = min(len(a), len(b))
    a, b = (x[:n] if type(x) is list else list(x[:n]) for x in (a, b))
    if a == b:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 32:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return next(i for i in range(lo, hi) if a[i] != b[i])


class SequenceState:
    """One request's KV bookkeeping across all models that ever computed for it."""

    def __init__(self) -> None:
        #: A sequence of the same prompt (another choice of the same request, set by the batch
        #: scheduler) whose caches this one may take a prefix of instead of computing it (adopt).
        self.donor: SequenceState | None = None
        self._slots: dict[int, int] = {}  # id(backend) -> sequence id in that backend
        self._saved: dict[int, SavedKV] = {}  # id(backend) -> its KV in host memory, in place of a slot
        self._cached: dict[int, list[int]] = {}  # id(backend) -> tokens in its KV (slot or saved copy)
        self._backends: dict[int, Backend] = {}
        #: Tokens each model evaluated, and how many of those were catch-up of committed text.
        self.evaluated: dict[str, int] = {}
        #: Per model name, positions taken from a finished sequence's cache (resume()), and
        #: the last state they were taken from.
        self.resumed: dict[str, int] = {}
        self.resumed_from: SequenceState | None = None

    def cached_tokens(self, backend: Backend) -> list[int]:
        return list(self._cached.get(id(backend), ()))

    def slot(self, backend: Backend) -> int | None:
        """This sequence's id in the backend's cache (None before the model first computed for it)."""
        return self._slots.get(id(backend))

    def kv_tokens(self) -> dict[str, int]:
        """Per model holding a slot for this sequence, the tokens its cells hold."""
        return {self._backends[key].name: len(self._cached[key]) for key in self._slots}

    def held_tokens(self) -> dict[str, int]:
        """Per model, the tokens this sequence holds: in its cells or in a saved copy."""
        return {b.name: len(self._cached[key]) for key, b in self._backends.items()}

    def committed_length(self, backend: Backend, committed: Sequence[int]) -> int:
        """How many committed tokens this model's cache already holds."""
        return common_prefix(self._cached.get(id(backend), ()), committed)

    def committed_lengths(self, committed: Sequence[int]) -> dict[str, int]:
        """Per model name, how many committed tokens its cache holds (what a switch must catch up)."""
        return {b.name: common_prefix(self._cached[key], committed) for key, b in self._backends.items()}

    def evaluate(self, backend: Backend, tokens: Sequence[int], n_logits: int) -> np.ndarray:
        """Logits (n_logits, n_vocab) after each of the last n_logits tokens, with the
        model's cache made to hold exactly `tokens` first."""
        item = self.prepare(backend, tokens, n_logits)
        logits = backend.decode(*item)
        self.fed(backend, item[1])
        return logits

    def to_feed(self, backend: Backend, tokens: Sequence[int], n_logits: int) -> int:
        """How many tokens prepare() would have the backend evaluate for this request."""
        return len(tokens) - self._keep(self._cached.get(id(backend), ()), tokens, n_logits)

    @staticmethod
    def _keep(cached: Sequence[int], tokens: Sequence[int], n_logits: int) -> int:
        """Cached positions a request for `tokens` keeps: what they share, less at least the
        last n_logits tokens to evaluate (their logits are not stored)."""
        return min(common_prefix(cached, tokens), len(tokens) - n_logits)

    def prepare(self, backend: Backend, tokens: Sequence[int], n_logits: int) -> tuple[int, list[int], int, int]:
        """Roll the cache back to what it shares with `tokens` and return the backend call
        that completes it, (seq, fresh tokens, position, n_logits); after the call, fed()."""
        key = id(backend)
        if key not in self._slots:
            self._slots[key] = backend.new_sequence()
            self._cached[key] = []
            self._backends[key] = backend
        cached = self._cached[key]
        keep = self._keep(cached, tokens, n_logits)
        if keep < len(cached):
            backend.remove(self._slots[key], keep)
            del cached[keep:]
        return self._slots[key], list(tokens[keep:]), keep, n_logits

    def adopt(self, backend: Backend, tokens: Sequence[int]) -> int:
        """Before this sequence's first forward on `backend`: take what the donor's cache of
        it holds of `tokens` (all but the last token at most: a forward needs one to feed) by
        sharing those positions (Backend.share_prefix) instead of computing them. Returns how
        many positions were taken (0: no donor, no donor cache, a slot already, or a backend
        that cannot share)."""
        donor = self.donor
        if donor is None or id(backend) not in donor._slots:
            return 0
        return self._take(donor, backend, tokens, take_over=False)

    def _take(self, donor: SequenceState, backend: Backend, tokens: Sequence[int], take_over: bool) -> int:
        """The prefix of `tokens` the donor's cache of `backend` holds (all but the last token
        at most), shared; where the backend cannot share, the donor's slot itself, cut back to
        it, if `take_over` (the donor loses that model), else nothing. The positions taken."""
        key = id(backend)
        if key in self._slots:
            return 0
        n = min(common_prefix(donor._cached[key], tokens), len(tokens) - 1)
        if n <= 0:
            return 0
        seq = backend.new_sequence()
        if key in donor._saved:  # a copy: the donor keeps it
            if not backend.restore(donor._saved[key], seq, n):
                backend.free_sequence(seq)
                return 0
        elif not backend.share_prefix(donor._slots[key], seq, n):
            backend.free_sequence(seq)
            if not take_over:
                return 0
            seq = donor._slots[key]
            backend.remove(seq, n)
            del donor._slots[key], donor._cached[key], donor._backends[key]
        self._slots[key], self._cached[key], self._backends[key] = seq, list(tokens[:n]), backend
        return n

    def held_prefix(self, tokens: Sequence[int]) -> int:
        """The longest prefix of `tokens` one of this sequence's caches holds."""
        return max((common_prefix(cached, tokens) for cached in self._cached.values()), default=0)

    def covers(self, other: SequenceState) -> bool:
        """Whether every cache of `other` holds a prefix of what this one's cache of the same
        model holds (other is then worth nothing beside this one)."""
        return all(key in self._cached and common_prefix(cached, self._cached[key]) == len(cached)
                   for key, cached in other._cached.items())

    def resume(self, finished: SequenceState, tokens: Sequence[int]) -> dict[str, int]:
        """Before this sequence's first forward: take from `finished` (a finished sequence's
        state that nothing computes with any more) the longest prefix of `tokens` each of its
        caches holds (all but the last token at most: a forward needs one to feed). Restored
        from a saved copy (save_shared; `finished` keeps it), shared where the backend shares
        (Backend.share_prefix; `finished` keeps its cache), else the slot itself, cut back to
        that prefix (`finished` gives that model up: the caller releases it). Returns the
        positions taken per model name (added to `resumed`)."""
        taken: dict[str, int] = {}
        self.resumed_from = finished
        for backend in list(finished._backends.values()):
            n = self._take(finished, backend, tokens, take_over=True)
            if n:
                taken[backend.name] = n
                self.resumed[backend.name] = self.resumed.get(backend.name, 0) + n
        return taken

    def adopt_all(self, tokens: Sequence[int]) -> int:
        """adopt() on every model the donor holds a cache of; the positions taken in all."""
        if self.donor is None:
            return 0
        return sum(self.adopt(backend, tokens) for backend in list(self.donor._backends.values()))

    def fed(self, backend: Backend, fresh: Sequence[int]) -> None:
        """The call from prepare() succeeded: the cache now also holds `fresh`."""
        self._cached[id(backend)].extend(fresh)
        self.evaluated[backend.name] = self.evaluated.get(backend.name, 0) + len(fresh)

    def save_shared(self) -> None:
        """Move every model's cells in a shared cache into a saved copy (Backend.save) and
        free its slot: for a finished sequence kept for later prompts, whose cells would
        otherwise cost every running sequence's attention. Later prompts restore the copy."""
        for key, seq in list(self._slots.items()):
            saved = self._backends[key].save(seq)
            if saved is not None:
                self._backends[key].free_sequence(seq)
                del self._slots[key]
                self._saved[key] = saved

    def forget(self, backend: Backend) -> None:
        """Free this sequence's slot of one model that is dropped (it failed or stalled)."""
        key = id(backend)
        if key in self._saved:
            del self._saved[key], self._cached[key], self._backends[key]
        elif key in self._slots:
            try:
                backend.free_sequence(self._slots[key])
            except Exception:  # noqa: BLE001 - a broken model may fail this too; the request goes on without it
                pass
            del self._slots[key], self._cached[key], self._backends[key]

    def rollback_to(self, committed: Sequence[int]) -> None:
        """Drop every cached position that is not part of the committed tokens (a saved copy
        keeps them: a restore takes only what the books still hold)."""
        for key, cached in self._cached.items():
            keep = common_prefix(cached, committed)
            if keep < len(cached):
                if key in self._slots:
                    self._backends[key].remove(self._slots[key], keep)
                del cached[keep:]

    def release(self) -> None:
        """Free every model's slot (finished or cancelled request)."""
        for key, seq in self._slots.items():
            self._backends[key].free_sequence(seq)
        self._slots.clear()
        self._saved.clear()
        self._cached.clear()
        self._backends.clear()

"""Cross-request suffix memory: a bounded store of the texts a process's requests wrote,
shared by all of them, that proposes what followed an earlier occurrence of a context's
suffix in another request's text (SuffixDecoding's global tree, Oliaro et al. 2024, as a
hash-chain index: agents and templated work write the same stretches request after request).

Store: a ring of the last `budget` tokens added (each text followed by a separator slot),
every slot with the partition of its text (a request reads and feeds only its own
partition: the API key's, or one shared by all). Index: LZ77's hash chains (as in zlib's
match finder) over windows of GRAM tokens: head[h] is the latest position whose window
(the GRAM tokens ending there, inside one text) hashes to h, prev[p] the previous position
with the same hash as p. The hash covers the partition too, so a chain seldom crosses
partitions; every candidate is verified (its tokens and its partition). Positions are
absolute and never reused: one older than the newest minus the capacity has been evicted
(its slot now holds a newer token), and a chain walk stops there, so eviction costs
nothing beyond overwriting the ring.

Query: the context's last GRAM tokens hashed and the chain walked (at most MAX_WALK
positions, latest first); each verified candidate's match is how far back its text agrees
with the context (at most MAX_MATCH); the candidates of the longest match (at most
MAX_CANDIDATES) vote the continuation as the request's own index does (suffix.py: the
token most of them continue with, a tie to the latest), a continuation ending with its text.

Memory: per slot a token (4 bytes), a chain link (8) and a partition id (4), plus 8 bytes
per head-table entry (a power of two >= the capacity): ~24-32 bytes per token of budget,
allocated up front (the default 2,000,000 tokens: ~48-64 MB). Thread-safe: one lock
around add and propose.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specrouter.drafters.lookup import Lookup
from specrouter.errors import InvalidParameterError

#: Tokens kept by default (the oldest are evicted beyond it).
DEFAULT_BUDGET = 2_000_000
#: Window length of the hash chains: a memory match is at least this long (a shorter match
#: into another request's text predicts little).
GRAM = 4
MAX_WALK = 256  # chain positions visited per query
MAX_MATCH = 64  # how far back a candidate's agreement is measured
MAX_CANDIDATES = 32  # the latest candidates of the longest match vote
_SEPARATOR = -1
_MULT_INT = 0x9E3779B97F4A7C15  # Fibonacci hashing
_PARTITION_MULT = 0x100000001B3  # a partition's id seeds its windows' hashes
_MULT = np.uint64(_MULT_INT)
_MASK = (1 << 64) - 1


@dataclass(frozen=True)
class MemoryScope:
    """What part of the memory a request reads and feeds: its partition (requests of one
    partition share their texts; "" is the one every request without a key shares), or
    none at all (`enabled` False: a request that opted out is neither proposed from the
    memory nor added to it)."""

    partition: str = ""
    enabled: bool = True


#: The scope of a request that opted out.
OPTED_OUT = MemoryScope(enabled=False)


class SuffixMemory:
    """The store (see the module docstring); `budget`: tokens kept, at least 1."""

    def __init__(self, budget: int = DEFAULT_BUDGET) -> None:
        self.budget = self.check_budget(budget)
        self._ring = np.full(budget, _SEPARATOR, dtype=np.int32)
        self._part = np.zeros(budget, dtype=np.int32)
        self._prev = np.full(budget, -1, dtype=np.int64)
        bits = max(4, (budget - 1).bit_length())
        self._shift = np.uint64(64 - bits)
        self._head = np.full(1 << bits, -1, dtype=np.int64)
        self._partitions: dict[str, int] = {}
        self.total = 0  # slots ever written (the next absolute position)
        self._lock = threading.Lock()

    @staticmethod
    def check_budget(budget: object) -> int:
        """The budget, if it is a whole number of tokens >= 1 (InvalidParameterError otherwise)."""
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise InvalidParameterError(f"the suffix memory's budget must be a whole number of tokens >= 1, got {budget!r}")
        return budget

    @property
    def nbytes(self) -> int:
        """Bytes the store holds (its arrays: allocated up front)."""
        return self._ring.nbytes + self._part.nbytes + self._prev.nbytes + self._head.nbytes

    @property
    def oldest(self) -> int:
        """The oldest absolute position still held."""
        return max(0, self.total - self.budget)

    @property
    def partitions(self) -> list[str]:
        """The partitions that hold (or held) texts, in order of their first text."""
        with self._lock:
            return list(self._partitions)

    def __len__(self) -> int:
        """Slots held (tokens and the separators after each text)."""
        return self.total - self.oldest

    def add(self, tokens: Sequence[int], scope: MemoryScope = MemoryScope()) -> None:
        """Remember a text (a request's output) in its scope's partition; nothing for an opted-out scope."""
        if not scope.enabled or not len(tokens):
            return
        arr = np.asarray(tokens, dtype=np.int64)
        if arr.min() < 0:
            raise InvalidParameterError("token ids must be >= 0")
        with self._lock:
            pid = self._partitions.setdefault(scope.partition, len(self._partitions))
            start = self.total
            slots = (start + np.arange(len(arr))) % self.budget  # a text longer than the budget wraps: its end is kept
            self._ring[slots] = arr
            self._part[slots] = pid
            if len(arr) >= GRAM:
                hashes = _hashes(arr, pid, self._shift)
                for i, h in enumerate(hashes.tolist(), GRAM - 1):
                    pos = start + i
                    self._prev[pos % self.budget] = self._head[h]
                    self._head[h] = pos
            end = start + len(arr)
            self._ring[end % self.budget] = _SEPARATOR
            self._prev[end % self.budget] = -1
            self.total = end + 1

    def propose(self, context: Sequence[int], n: int, scope: MemoryScope = MemoryScope()) -> Lookup:
        """Up to n tokens continuing `context`, from the texts of its scope's partition."""
        if not scope.enabled or n <= 0 or len(context) < GRAM:
            return Lookup([], 0)
        with self._lock:
            pid = self._partitions.get(scope.partition)
            if pid is None:
                return Lookup([], 0)
            h = _slot(context[-GRAM:], pid, int(self._shift))
            if self._head[h] < self.oldest:  # no text of any partition ends with this window
                return Lookup([], 0)
            found = self._candidates(np.asarray(context[-MAX_MATCH:], dtype=np.int64), h, pid)
            if not found:
                return Lookup([], 0)
            match = max(m for _, m in found)
            alive = [p for p, m in found if m == match][:MAX_CANDIDATES]
            return self._vote(alive, match, n)

    def _candidates(self, tail: np.ndarray, h: int, pid: int) -> list[tuple[int, int]]:
        """(position, match length) of the verified chain positions, latest first."""
        chain, pos, oldest = [], int(self._head[h]), self.oldest
        while pos >= oldest and len(chain) < MAX_WALK:
            chain.append(pos)
            pos = int(self._prev[pos % self.budget])
        if not chain:
            return []
        ends = np.asarray(chain, dtype=np.int64)
        ends = ends[self._part[ends % self.budget] == pid]
        # Row r, column b: the token b places before candidate r's end, against the context's.
        at = ends[:, None] - np.arange(len(tail))[None, :]
        tokens = np.where(at >= oldest, self._ring[at % self.budget], _SEPARATOR)  # evicted: no agreement
        agree = tokens == tail[::-1][None, :]  # a separator ends the agreement too
        match = np.where(agree.all(axis=1), len(tail), np.argmin(agree, axis=1))
        return [(int(e), int(m)) for e, m in zip(ends, match) if m >= GRAM]

    def _vote(self, alive: list[int], match: int, n: int) -> Lookup:
        ahead = np.arange(1, n + 1)
        rows = []
        for p in alive:  # latest first: a tie keeps the latest text's token
            pos = p + ahead
            row = np.where(pos < self.total, self._ring[pos % self.budget], _SEPARATOR).tolist()
            rows.append(row[:row.index(_SEPARATOR)] if _SEPARATOR in row else row)
        tokens: list[int] = []
        for j in range(n):
            votes: dict[int, int] = {}
            for row in rows:
                if j < len(row):
                    votes[row[j]] = votes.get(row[j], 0) + 1
            if not votes:
                break
            best = max(votes.values())
            token = next(t for t in votes if votes[t] == best)
            tokens.append(token)
            rows = [row for row in rows if j < len(row) and row[j] == token]
        return Lookup(tokens, match, len(rows), len(alive))


def _slot(window: Sequence[int], pid: int, shift: int) -> int:
    """_hashes of one GRAM-token window in plain integers (a query's one window: numpy's
    per-call overhead would cost more than the arithmetic)."""
    h = (pid * _PARTITION_MULT) & _MASK
    for token in window:
        h = ((h ^ (int(token) & _MASK)) * _MULT_INT) & _MASK
    return h >> shift


def _hashes(arr: np.ndarray, pid: int, shift: np.uint64) -> np.ndarray:
    """The head-table slot of every GRAM-token window of arr (window i ends at i + GRAM - 1)."""
    u = arr.astype(np.uint64)
    h = np.full(len(arr) - GRAM + 1, np.uint64(pid) * np.uint64(_PARTITION_MULT), dtype=np.uint64)
    for k in range(GRAM):
        h = (h ^ u[k:len(arr) - GRAM + 1 + k]) * _MULT
    return h >> shift

"""Suffix index over a request's tokens: the longest earlier occurrence of the context's
suffix (no cap on its length), and the continuation most of its occurrences agree on.

Index: a suffix automaton over the indexed tokens, extended one token at a time in O(1)
amortised time (Blumer et al. 1985; at most 2n states). A state v stands for the
substrings that end at the same set of positions endpos(v); len(v) is the longest of
them and link(v) the state of the longest suffix outside that set. Every state created
for a new prefix (not a clone) records that prefix's end position, so the end positions
of a substring in state v are those records over v's subtree of the link tree.

Query over `context` = the indexed tokens + a tail not indexed (tokens a middle level
accepted this cycle, which a rejection may still undo): walk the tail from the state of
the whole indexed text, keeping the longest suffix of what was read that occurs in the
indexed text (the matching statistics of the tail). Without a tail, the longest suffix
that occurred before is link(last). Its occurrences that end before the context does are
the candidates (occurrences inside the tail itself are not searched); occurrence e
continues with context[e + 1], context[e + 2], ...

Proposal: the token that most candidates continue with (a tie goes to the latest
occurrence's, as a plain prompt lookup would propose), then among the candidates that
agree so far the next, until n tokens (some candidate always agrees: the proposal's length
is the router's to choose, from the match class's acceptance). An occurrence that
runs into the context's end continues with the proposal itself (an overlapping copy:
text that repeats with period d goes on repeating). `support` is how
many candidates agree with the whole proposal, of `candidates` (at most MAX_CANDIDATES,
the latest ones): the router can read it as a confidence.
"""

from __future__ import annotations

from collections.abc import Sequence

from specrouter.drafters.lookup import Found, Lookup, LookupDrafter
from specrouter.drafters.memory import GRAM, OPTED_OUT, MemoryScope, SuffixMemory

#: Occurrences voted over: the latest ones (a 1-token match of a common token has hundreds).
MAX_CANDIDATES = 32


class SuffixIndex:
    """A suffix automaton over a growing token sequence (see the module docstring).

    `sync(context)` indexes what the context adds to the indexed tokens, or starts over
    when the context is not an extension of them (another request, or a rollback of
    tokens that were indexed: only committed tokens should be); `match`, `ends` and
    `propose` query after a sync."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        # State 0 is the empty string's.
        self._next: list[dict[int, int]] = [{}]
        self._link: list[int] = [-1]
        self._len: list[int] = [0]
        self._end: list[int] = [-1]  # the end position a prefix's state records; -1: a clone or the root
        self._children: list[list[int]] = [[]]
        self._last = 0

    def __len__(self) -> int:
        return len(self.tokens)

    def sync(self, context: Sequence[int]) -> None:
        n = len(self.tokens)
        if len(context) < n or list(context[:n]) != self.tokens:
            self.__init__()
            n = 0
        for token in context[n:]:
            self.append(int(token))

    def append(self, token: int) -> None:
        """Index one more token (the online construction)."""
        cur = self._new(self._len[self._last] + 1, len(self.tokens))
        self.tokens.append(token)
        p = self._last
        while p != -1 and token not in self._next[p]:
            self._next[p][token] = cur
            p = self._link[p]
        if p == -1:
            self._set_link(cur, 0)
        else:
            q = self._next[p][token]
            if self._len[p] + 1 == self._len[q]:
                self._set_link(cur, q)
            else:
                clone = self._new(self._len[p] + 1, -1)
                self._next[clone] = dict(self._next[q])
                self._set_link(clone, self._link[q])
                while p != -1 and self._next[p].get(token) == q:
                    self._next[p][token] = clone
                    p = self._link[p]
                self._set_link(q, clone)
                self._set_link(cur, clone)
        self._last = cur

    def _new(self, length: int, end: int) -> int:
        self._next.append({})
        self._link.append(-1)
        self._len.append(length)
        self._end.append(end)
        self._children.append([])
        return len(self._len) - 1

    def _set_link(self, state: int, link: int) -> None:
        old = self._link[state]
        if old != -1:
            self._children[old].remove(state)
        self._link[state] = link
        self._children[link].append(state)

    # Queries ------------------------------------------------------------------------------
    def match(self, context: Sequence[int]) -> tuple[int, int]:
        """(state, length) of the longest suffix of `context` (the indexed tokens + a tail)
        that occurs in the indexed tokens ending before the context's end; length 0: none."""
        n = len(self.tokens)
        if len(context) == n:
            state = self._link[self._last]
            return (state, self._len[state]) if state > 0 else (0, 0)
        state, length = self._last, n
        for token in context[n:]:
            while state > 0 and token not in self._next[state]:
                state = self._link[state]
                length = self._len[state]
            if token in self._next[state]:
                state, length = self._next[state][token], length + 1
            else:
                state, length = 0, 0
        return state, length

    def ends(self, state: int, before: int) -> list[int]:
        """End positions (< before) of the substrings of `state`, latest first."""
        out, todo = [], [state]
        while todo:
            s = todo.pop()
            if 0 <= self._end[s] < before:
                out.append(self._end[s])
            todo.extend(self._children[s])
        out.sort(reverse=True)
        return out

    def propose(self, context: Sequence[int], n: int) -> Lookup:
        """Up to n tokens continuing `context` (which must extend the indexed tokens: sync
        first), voted over the latest MAX_CANDIDATES occurrences of its longest earlier suffix."""
        if len(context) < len(self.tokens):
            raise ValueError("the context is shorter than the indexed tokens: sync() first")
        state, length = self.match(context)
        if length == 0 or n <= 0:
            return Lookup([], 0)
        size = len(context)
        alive = self.ends(state, size - 1)[:MAX_CANDIDATES]
        candidates = len(alive)
        tokens: list[int] = []
        for j in range(n):
            if len(alive) == 1:  # one occurrence left: the rest is its copy, no vote
                e = alive[0]
                tokens += [int(t) for t in context[e + 1 + j: min(e + 1 + n, size)]]
                while len(tokens) < n:  # it runs into the context's end: the copy overlaps itself
                    tokens.append(_at(context, tokens, e + 1 + len(tokens)))
                break
            votes: dict[int, int] = {}
            for e in alive:  # latest first: a tie keeps the latest occurrence's token
                t = _at(context, tokens, e + 1 + j)
                votes[t] = votes.get(t, 0) + 1
            if not votes:
                break
            best = max(votes.values())
            token = next(t for t in votes if votes[t] == best)
            tokens.append(int(token))
            alive = [e for e in alive if _at(context, tokens, e + 1 + j) == token]
        return Lookup(tokens, length, len(alive), candidates)


def _at(context: Sequence[int], proposed: list[int], pos: int) -> int:
    """Token `pos` of the context followed by the proposal so far: an occurrence that runs
    into the context's end goes on with what is being proposed (a copy that overlaps
    itself, as in LZ77: text of period d continues with its period)."""
    return context[pos] if pos < len(context) else proposed[pos - len(context)]


class SuffixDrafter(LookupDrafter):
    """A Proposer over the request's own tokens (prompt + committed output), and over the
    process's cross-request memory when it has one (with_memory): proposes what followed
    the longest earlier occurrence of the context's suffix, as long as the occurrences
    support it; a match in the memory is used when it is longer than the request's own, and
    is classed apart ("m16": another request's text is another bet). Its index grows with
    the committed tokens (Drafting.committed); the tentative tokens of a cycle are read as a
    tail, never indexed. Keeps one index: give each request its own drafter (a drafter
    shared by requests that alternate rebuilds its index at every switch)."""

    name = "suffix"
    #: Seconds of one lookup before any is timed.
    LOOKUP_SECONDS = 5e-5
    #: Match lengths 1, 2, 3, 4-7, 8-15, 16-31, 32 and more.
    match_classes = (1, 2, 3, 4, 8, 16, 32)
    #: A copied stretch is proposed as one block, not a few tokens at a time.
    longest = 64
    remembers = True

    def __init__(self) -> None:
        self.index = SuffixIndex()
        self.memory: SuffixMemory | None = None
        self.scope = OPTED_OUT

    def with_memory(self, memory: SuffixMemory, scope: MemoryScope) -> SuffixDrafter:
        """Read `memory` in `scope` too (its matches are at least GRAM tokens long)."""
        self.memory, self.scope = memory, scope
        self.memory_classes = tuple(c for c in self.match_classes if c >= GRAM)
        return self

    def lookup(self, context: Sequence[int], n: int, committed: int | None = None) -> Found:
        """Up to n tokens and the match behind them; the first `committed` tokens of the
        context (default: all) are indexed."""
        self.index.sync(context if committed is None else context[:committed])
        own = self.index.propose(context, n)
        if self.memory is not None and self.scope.enabled:
            recalled = self.memory.propose(context, n, self.scope)
            if recalled.match > own.match:
                return Found(recalled.tokens, recalled.match, remembered=True)
        return Found(own.tokens, own.match)

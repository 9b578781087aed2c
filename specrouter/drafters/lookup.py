"""What every model-free drafter shares: the Proposer methods around a lookup, and the
match classes its acceptance is learned per.

A request held to a grammar (cascade/grammar.py) may force its next tokens (a schema's next
key, the rest of a tool call's opening): where it does, the drafter proposes those instead
of looking anything up, filed under a class of their own (FORCED_CLASS), whose acceptance
is learned apart (near 1: the target's restricted rows leave it little else).

One find per cycle: a router that looks up before the cycle (its choice reads the match)
hands the result to the drafter (`hand`, a Handed), and the cycle's first draft proposes it
instead of looking up again. A lookup's first n tokens are what a lookup of n gives (every
drafter here proposes token by token, each from the ones before), so a lookup asked for the
longest draft serves a draft of any length up to it."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, replace

import numpy as np

from specrouter.cascade.proposer import Draft, Drafting, cut_after_eos
from specrouter.errors import InvalidParameterError


@dataclass(frozen=True)
class Lookup:
    """A suffix index's (or the cross-request memory's) proposal and its evidence: the
    length of the matched suffix and how many of the occurrences voted over agree with it."""

    tokens: list[int]
    match: int  # length of the matched suffix (0: none, no tokens)
    support: int = 0  # candidates that continue exactly as proposed
    candidates: int = 0  # occurrences voted over


#: The match class of a grammar-forced continuation.
FORCED_CLASS = "g"
#: Where a lookup's block came from, by its match class (match_source).
SOURCES = ("request", "memory", "forced")


def match_source(label: str) -> str:
    """The source of a match class's blocks, from its label (match_class's; a router's key
    `<lookup>#<class>` too): "memory" for the cross-request memory's classes ("m16"),
    "forced" for a grammar-forced continuation, "request" for the request's own text."""
    cls = label.rsplit("#", 1)[-1]
    return "forced" if cls == FORCED_CLASS else "memory" if cls.startswith("m") else "request"


@dataclass(frozen=True)
class Found:
    """A lookup's proposal and its evidence: the length of the suffix match behind it, and
    whether it was found in the cross-request memory (another request's text) rather than
    in the request's own."""

    tokens: list[int]
    match: int = 0  # 0: no match, no tokens
    remembered: bool = False
    forced: bool = False  # the request's grammar forces these tokens (no lookup was done)


@dataclass(frozen=True)
class Handed:
    """A lookup done before a cycle at its committed context (by the router, to choose): what
    the cycle's first draft proposes, for at most `n` tokens."""

    found: Found
    at: int  # the length of the committed context it continues
    n: int  # the tokens it was asked for

    def serves(self, context: Sequence[int], n: int, committed: int) -> bool:
        """Whether it is the proposal of a draft of n tokens after `context` of a cycle whose
        context is `committed` tokens long: that very context (not one a middle level extended
        within the cycle), and no more tokens than it was asked for."""
        return len(context) == committed == self.at and n <= self.n

    def take(self, n: int) -> Found:
        """Its proposal for a draft of n tokens."""
        return replace(self.found, tokens=self.found.tokens[:n])


class LookupDrafter:
    """A deterministic Proposer (q one-hot) that drafts by looking tokens up, no forward.
    A subclass names itself (`name`), states the seconds of one lookup before any is timed
    (`LOOKUP_SECONDS`), the match classes its acceptance is learned per (`match_classes`,
    and `memory_classes` for matches in the cross-request memory) and the longest draft
    worth asking of it (`longest`), and implements `lookup`."""

    name: str
    params_b = 0.0
    LOOKUP_SECONDS: float
    #: Match lengths that open a class: a match of length m belongs to the largest one <= m
    #: (a longer match predicts its continuation better; classes keep the estimates apart).
    match_classes: tuple[int, ...] = (1,)
    #: The same for matches in the cross-request memory (empty: the drafter has none).
    memory_classes: tuple[int, ...] = ()
    #: The longest draft the router may ask of it.
    longest: int = 24
    #: It can read a cross-request memory (with_memory).
    remembers: bool = False
    #: The lookup handed over for the next cycle's first draft (hand); None: look up then.
    handed: Handed | None = None

    @property
    def classes(self) -> list[str]:
        """Every class label match_class can return."""
        return [str(c) for c in self.match_classes] + [f"m{c}" for c in self.memory_classes] + [FORCED_CLASS]

    def match_class(self, found: Found) -> str:
        """The label of a match's class: its length's class ("4"), prefixed with "m" when it
        was found in the memory ("m16"), learned apart from the request's own text."""
        if found.forced:
            return FORCED_CLASS
        classes = self.memory_classes if found.remembered else self.match_classes
        size = max(c for c in classes if c <= max(found.match, classes[0]))
        return f"m{size}" if found.remembered else str(size)

    def with_memory(self, memory, scope) -> LookupDrafter:
        """This drafter reading (and its router feeding) a cross-request memory (memory.py)."""
        raise InvalidParameterError(f"the {self.name} drafter has no cross-request memory: use the suffix drafter")

    def lookup(self, context: Sequence[int], n: int, committed: int | None = None) -> Found:
        """Up to n tokens following the context, with the match behind them; the first
        `committed` tokens (default: all) are never rolled back."""
        raise NotImplementedError

    def find(self, context: Sequence[int], n: int, committed: int | None = None,
             forced: Sequence[int] = ()) -> Found:
        """What this drafter proposes after the context: the tokens a grammar forces there
        when there are any (`forced`), else the lookup's."""
        if forced and n > 0:
            return Found(list(forced[:n]), len(forced), forced=True)
        return self.lookup(context, n, committed)

    def hand(self, handed: Handed | None) -> None:
        """What the next cycle's first draft proposes where it serves (Handed.serves); None:
        nothing handed, it looks up. Whatever was handed before is dropped."""
        self.handed = handed

    def draft(self, context: list[int], n: int, drafting: Drafting) -> Generator[object, np.ndarray, Draft]:
        """The Proposer method: find's tokens (cut after EOS) with their match class; the
        handed lookup's instead where it serves (it is used once). The time reported is the
        draft's own: a handed lookup's time was the choice's."""
        start = drafting.clock()
        handed, self.handed = self.handed, None
        if handed is not None and handed.serves(context, n, drafting.committed):
            found = handed.take(n)
        else:
            found = self.find(context, n, drafting.committed, drafting.forced(context))
        drafting.lookup_took(drafting.clock() - start)
        return Draft(cut_after_eos(found.tokens, drafting.eos_ids), None,
                     self.match_class(found) if found.match else None)
        yield  # a generator (the Proposer protocol) that yields no forward

    def feedback(self, draft: Draft, n_accepted: int) -> None:
        """Nothing to learn here: the router learns acceptance per match class (on_verify)."""

"""How often the router deliberates: its own choice priced against the cycles it steers.

A routed sequence's choice (Router.choose: measure every pair, re-plan, rank, guard) is host
work of d seconds before every cycle. A batch's sequences choose one after another, so a step
of B sequences spends B d choosing before its forwards: next to a slow CPU forward that is
little, next to a fast GPU forward it can be most of the step.

ChoicePacing keeps the choices within pacing_fraction (F) of generation time per kind of
cycle. A session deliberates at most once every

    every = ceil(B d / (F s))                                                          (1)

choices of a kind (d: a deliberation's seconds, s: a cycle's, both exponential averages of
step pacing_alpha of what the engine timed; B: the batch), and in between it may reuse the
decision a session of the same router made within the last `every` choices of the same kind
of cycle (Kind: the request's row kind, which sets the acceptance tables and the row cost;
the batch size rounded up to a power of two, which prices every forward; the model-free
lookup's match class, which decides whether a model-free draft can run and how well it
does). Counted per kind, the deliberations are a 1 / every share of all choices, whatever
the mix of kinds (kinds alternate: a lookup's match class changes from cycle to cycle). A
decision older than pacing_stale spans of the router's choices is not reused (a kind that
comes rarely would otherwise keep a choice made long ago, on older evidence). A decision made
where the room cut the draft lengths (a request's last tokens: Planner.window) is reused only
where the room cuts them as far or further: its lengths were planned for that room, and at a
request's start they would draft short. A decision made with the full room serves any room.

The reusing session checks what is its own: the chain still runs (no model of it excluded)
and no model of it must first catch up on tokens it missed (a catch-up is the choice's to
weigh; planner.py prices it). Where the room is shorter than the decision's draft the chain
cuts the draft to the room (as it would have been planned for the room, a little less well).
Anything else deliberates: a request's first choice (decide.py), the cycle after a probe (whose
observations the next choice must read), a kind not decided recently.

With every = 1 (a forward slow against the choice: B d / (F s) <= 1) every choice
deliberates, as without pacing. A kind whose deliberations keep choosing the target alone by
a margin (no chain within pacing_margin of it, optimistic ones included) waits twice as long
after each, up to 2^pacing_agreed times every. Reused decisions are exact like any other
(any chain keeps the output's distribution); what they give up is the request's newest
evidence for at most a span of choices of their kind (pacing_stale spans in all), and their
counts (deliberated, reused) say how often.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from specrouter.router.config import DEFAULT_CONFIG, RouterConfig
from specrouter.smoothing import ema
from specrouter.router.policy.plan import Scored


def firm(chosen: Scored, rivals: Iterable[Scored], margin: float = DEFAULT_CONFIG.pacing_margin) -> bool:
    """Whether a deliberation that chose `chosen` over `rivals` (every chain it scored, the
    chosen one may be among them) chose firmly: the target alone, with every other chain's
    score at least (1 + margin) times its own."""
    return len(chosen.spec.names) == 1 and all(
        s.score >= (1 + margin) * chosen.score for s in rivals if s.spec != chosen.spec)


@dataclass(frozen=True)
class Kind:
    """What a decision was made for: another cycle of the same kind may reuse it."""

    row_kind: str
    batch: int  # rounded up to a power of two (Kind.of)
    match: str | None  # the lookup's match class (None: no match)

    @classmethod
    def of(cls, row_kind: str, batch: int, match: str | None) -> Kind:
        return cls(row_kind, 1 << max(0, batch - 1).bit_length(), match)


@dataclass(frozen=True)
class _Made:
    scored: Scored
    at: int  # the router's choice count when it was made
    kind_at: int  # its kind's choice count when it was made
    made: int  # deliberations for its kind so far, this one included
    agreed: int  # deliberations in a row before it that chose the target alone by the margin
    window: int | None = None  # the room where it cut the draft lengths (None: it did not)


class ChoicePacing:
    """Shared by a router's sessions: the timings of (1), the recent decisions per Kind, and
    plain counters. fraction 0: every choice deliberates."""

    def __init__(self, fraction: float | None = None, config: RouterConfig = DEFAULT_CONFIG) -> None:
        """fraction: the share of generation time choices may take (default the config's
        pacing_fraction)."""
        self.config = config
        self.fraction = config.pacing_fraction if fraction is None else fraction
        self.deliberation: float | None = None  # d of (1), seconds
        self.cycle: float | None = None  # s of (1), seconds
        self.choices = self.deliberated = self.reused = 0
        self._made: dict[Kind, _Made] = {}
        self._kind_choices: dict[Kind, int] = {}

    def every(self, batch: int) -> int:
        """(1); 1 until both timings are known."""
        if self.fraction <= 0 or not self.deliberation or not self.cycle:
            return 1
        return max(1, math.ceil(batch * self.deliberation / (self.fraction * self.cycle)))

    def recent(self, kind: Kind, window: int | None = None) -> Scored | None:
        """A decision for `kind` recent enough to reuse (None: deliberate): made within the
        last span choices of its kind, and within the router's last pacing_stale * span
        choices. The span is every(batch), doubled for each deliberation in a row before it that chose
        the target alone firmly, as it did (up to pacing_agreed times; where every > 1: a
        deliberation is then the share of a cycle worth saving), and at most 2^m where it
        is the kind's m-th (a kind's first decisions rest on little evidence: they are
        renewed after 2, 4, 8, ... of its choices); one made where the room cut the draft
        lengths only where `window` (this choice's, None: not cut) is at most its own.
        Counts the choice."""
        self.choices += 1
        own = self._kind_choices[kind] = self._kind_choices.get(kind, 0) + 1
        made = self._made.get(kind)
        if made is None or made.window is not None and (window is None or window > made.window):
            return None
        every = self.every(kind.batch)
        span = min(every << made.agreed if every > 1 else 1, 2**made.made)
        if own - made.kind_at >= span or self.choices - made.at >= self.config.pacing_stale * span:
            return None
        return made.scored

    def made(self, kind: Kind, scored: Scored, firmly: bool = False, window: int | None = None) -> None:
        """A deliberation chose `scored` for `kind`; `firmly`: as firm() says; `window`: the room
        where it cut the draft lengths (None: it did not)."""
        before = self._made.get(kind)
        again = firmly and before is not None and before.scored.spec == scored.spec
        agreed = min(before.agreed + 1, self.config.pacing_agreed) if again else 0
        self._made[kind] = _Made(scored, self.choices, self._kind_choices.get(kind, 0),
                                 before.made + 1 if before else 1, agreed, window)

    def timed(self, seconds: float, deliberated: bool) -> None:
        """The engine timed a choice: a deliberation's time feeds d, a reuse's is not d."""
        if deliberated:
            self.deliberated += 1
            self.deliberation = ema(self.deliberation, seconds, self.config.pacing_alpha)
        else:
            self.reused += 1

    def on_cycle(self, seconds: float) -> None:
        """A routed cycle took `seconds` (its forwards and the engine's work, not its choice)."""
        self.cycle = ema(self.cycle, seconds, self.config.pacing_alpha)

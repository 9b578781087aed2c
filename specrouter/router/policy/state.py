"""The typed data of the policy: what one choice is made from (CycleInputs), what the policy
remembers of a request between choices (SessionState, with the probes' account it shares
with the other sessions of its router), and what it chose (Decision)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from specrouter.router.config import DEFAULT_CONFIG
from specrouter.router.policy.pacing import ChoicePacing
from specrouter.router.policy.plan import Scored
from specrouter.router.policy.planner import Planner
from specrouter.router.policy.predictor import ChainSpec


@dataclass(frozen=True)
class CycleInputs:
    """What is known before a cycle, beside the estimates the planner reads."""

    position: int  # committed tokens (the context's length)
    room: int  # tokens the request may still emit
    cached: Mapping[str, int]  # per model, committed tokens its cache holds
    horizon: int  # tokens expected to follow (AnswerLengths.horizon): the span a catch-up is amortised over
    match: str | None  # the lookup's match class this cycle (plan.match_key; None: no match)
    row_kind: str  # what a logits row's work depends on (costs.row_kind)
    batch: int  # sequences advancing together

    def target_ready(self, target: str) -> bool:
        """Whether the target's cache holds the context but its last token (after the first
        cycle, which prefills the prompt)."""
        return self.cached.get(target, 0) >= self.position - 1


@dataclass
class ProbeBudget:
    """The probes' account of a router and its sessions: `elapsed`, the seconds of every
    cycle of every request (a cycle of B sequences advancing together counts B times, once
    per session, as a probe's extra does: it slows all of them); `spent`, the probes'
    measured extra time.
    Sessions running at once read it before any of their probes is counted, so the
    sequences of a batch may together overdraw it by the probes they start in one step."""

    fraction: float = DEFAULT_CONFIG.explore_fraction
    elapsed: float = 0.0
    spent: float = 0.0

    def left(self, expected: float) -> float:
        """What probes may still spend, with `expected` more seconds of generation to come."""
        return self.fraction * (self.elapsed + expected) - self.spent


class ProbeRun(NamedTuple):
    """A probe in flight: the chain it runs, and the seconds per token of the chain it
    stands in for (what its cycle is charged against)."""

    spec: ChainSpec
    best_rate: float


@dataclass
class SessionState:
    """What the policy remembers of one request: the plans (its planner), the chain it runs
    and a probe in flight, and the cycles chosen; with the objects its router's sessions
    share (the pacing's record of recent decisions, the probes' account)."""

    planner: Planner
    pacing: ChoicePacing
    budget: ProbeBudget
    current: ChainSpec | None = None
    probe: ProbeRun | None = None
    cycle: int = 0

    def start(self) -> None:
        """A new request: nothing chosen yet, its first plan a full search."""
        self.current, self.probe, self.cycle = None, None, 0
        self.planner.start()


class Reason(StrEnum):
    """Why a chain runs this cycle."""

    START = "start"  # the first deliberate choice of the request
    SWITCH = "switch"  # another chain than the one that ran
    KEEP = "keep"  # the chain that ran (at its lengths or its family's other member)
    PROBE = "probe"  # a chain run once to learn its pairs
    REUSE = "reuse"  # a recent decision of the router's sessions, not deliberated (pacing)
    PREFILL = "prefill"  # the target alone while it feeds the prompt, not deliberated (decide.py)


@dataclass(frozen=True)
class Decision:
    """What decide() chose for a cycle: the chain at its draft lengths as scored, why, and
    the candidates it ranked (best first; empty for a reuse)."""

    chosen: Scored
    reason: Reason
    ranked: tuple[Scored, ...] = field(default=())

    @property
    def deliberated(self) -> bool:
        return self.reason not in (Reason.REUSE, Reason.PREFILL)

    @property
    def probing(self) -> bool:
        return self.reason is Reason.PROBE

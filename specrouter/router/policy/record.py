"""What --explain shows of a decision: the chain chosen and why, the candidates ranked, and the
numbers they were ranked from (the pairs' acceptance, the models' costs), in milliseconds."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from specrouter.router.estimates.costs import OnlineCosts
from specrouter.router.policy.plan import Scored, level_key
from specrouter.router.policy.planner import Planner
from specrouter.router.policy.predictor import ChainSpec
from specrouter.router.policy.state import Decision, ProbeBudget

#: Candidates shown per decision (the best ones; a probe is shown beside them).
SHOWN = 8


@dataclass(frozen=True)
class DecisionInputs:
    """What a decision was made from, as `--explain` shows it (milliseconds, rounded)."""

    #: Per shown pair "proposer->verifier": {"rate": estimate, "count": observations}.
    acceptance: dict[str, dict[str, float]]
    #: Per shown model: {"n tokens": ms of one forward} at n = 1, 2, 4, 8.
    cost_ms: dict[str, dict[str, float]]
    mode: str  # "greedy" or "sampled": which acceptance tables
    ngram_match: str | None  # the match class of the cycle's lookup (None: no match)
    overhead_ms_per_forward: float
    row_ms: float
    probe_budget_used_ms: float  # what the probes of the router and its sessions spent so far


@dataclass
class DecisionRecord:
    """One recorded decision of a request (the first, every switch and every probe)."""

    cycle: int
    position: int
    chosen: ChainSpec
    reason: str  # Reason's value: "start", "switch", "probe", "keep"
    candidates: list[Scored]
    inputs: DecisionInputs | None = None

    def as_dict(self) -> dict:
        return {"cycle": self.cycle, "position": self.position, "chosen": str(self.chosen),
                "reason": self.reason, "candidates": [c.as_dict() for c in self.candidates],
                "inputs": dataclasses.asdict(self.inputs) if self.inputs is not None else {}}


def record(decision: Decision, cycle: int, position: int, planner: Planner, budget: ProbeBudget,
           names: Sequence[str], row_kind: str, match: str | None) -> DecisionRecord:
    """The record of `decision` (made at `cycle`, `position`), with the numbers of every pair
    and model among the chains it shows (`names`: every level, cheapest first)."""
    shown = list(decision.ranked[:SHOWN]) + ([decision.chosen] if decision.probing else [])
    levels = sorted({n for s in shown for n in s.spec.names}, key=list(names).index)
    acceptance, costs = planner.acceptance, planner.costs
    keys = [level_key(n, match, planner.lookup) for n in levels]
    pairs = {f"{j}->{i}": {"rate": round(planner.rate(j, i), 3), "count": round(acceptance.count(j, i), 1)}
             for j, i in itertools.combinations(keys, 2)}
    inputs = DecisionInputs(pairs, _cost_ms(costs, levels, planner.lookup), acceptance.mode, match,
                            round(costs.overhead_per_forward * 1e3, 3), round(costs.row_seconds(row_kind) * 1e3, 4),
                            round(budget.spent * 1e3, 3))
    return DecisionRecord(cycle, position, decision.chosen.spec, decision.reason.value, shown, inputs)


def _cost_ms(costs: OnlineCosts, levels: Sequence[str], lookup: str | None) -> dict[str, dict[str, float]]:
    return {n: {str(k): round(costs.seconds(n, k) * 1e3, 3) for k in (1, 2, 4, 8)} for n in levels if n != lookup}

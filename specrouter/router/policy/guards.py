"""Caution and hysteresis: the guards between a ranking of noisy estimates and a choice.

Picking the argmin of noisy estimates favours the chains whose estimates are high by chance
(the winner's curse). So a chain other than the target alone is moved to only if it beats the
target alone with every acceptance caution_z standard errors below its estimate (the
estimator's cautious rate), at its planned draft lengths or, where it is not sure there, at
the lengths that are best for the cautious rates (robust: what is barely known is drafted
short, and its lengths grow as its estimates firm up). It is kept until it loses to the
target alone even with every acceptance caution_z standard errors above its estimate (the
bold rate): the standard errors between the two rates are the hysteresis at the target
alone's border. Between chains that draft, a new best replaces the current one only when it
is more than `hysteresis` faster.

Chains that differ only by the model-free level form one family: moving inside a family
costs nothing (a lookup has no cache), so the family's other member replaces the current
chain whenever it is better, or when the current one cannot run (a lookup chain in a cycle
without a match).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specrouter.router.policy.plan import Plan, Rates, Scored
from specrouter.router.policy.planner import Planner
from specrouter.router.policy.predictor import ChainSpec
from specrouter.router.policy.state import CycleInputs


def family(names: Sequence[str], lookup: str | None) -> tuple[str, ...]:
    """A chain without its model-free level: chains of one family switch freely between cycles."""
    return tuple(n for n in names if n != lookup)


@dataclass(frozen=True)
class Scoring:
    """The scores of one deliberation: every chain's plan, its catch-up amortised over the
    cycle's horizon, and the guards' verdicts, from the planner's current plan."""

    planner: Planner
    inputs: CycleInputs

    @property
    def plan(self) -> Plan:
        return self.planner.plan

    @property
    def window(self) -> int | None:
        """The room where it cuts the longest draft (the request's last tokens), else None."""
        room = self.inputs.room
        return room if room <= self.planner.longest else None

    def score(self, s: Scored) -> Scored:
        """`s` with its catch-up (Planner.score)."""
        i = self.inputs
        return self.planner.score(s, i.position, i.horizon, i.cached, i.batch)

    def predict(self, spec: ChainSpec, kind: Rates = Rates.ESTIMATE):
        return self.plan.predict(spec, kind, self.window, self.inputs.match)

    def check_sure(self, s: Scored, alone: Scored) -> Scored:
        """Sets whether a chain beats the target alone even at the cautious acceptance; the
        draft lengths are still those of the estimate."""
        if len(s.spec.names) > 1:
            s.cautious = self.predict(s.spec, Rates.CAUTIOUS).seconds_per_token + s.catch_up_per_token
            s.sure = s.cautious < alone.score
        return s

    def robust(self, s: Scored, alone: Scored) -> Scored:
        """A chain that beats the target alone on its estimate but not for sure at its lengths,
        at the lengths that are best at the cautious acceptance, where it is sure there;
        scored at its estimate at those lengths."""
        if s.sure or s.score >= alone.score:
            return s
        robust = self.plan.best_lengths(s.spec.names, Rates.CAUTIOUS, None, self.inputs.match)
        cautious = robust.prediction.seconds_per_token + s.catch_up_per_token
        if robust.spec == s.spec or cautious >= alone.score:
            return s
        prediction = self.predict(robust.spec)
        return Scored(robust.spec, prediction, s.catch_up, prediction.seconds_per_token + s.catch_up_per_token,
                      cautious, True)

    def keep_current(self, ranked: list[Scored], alone: Scored, current: ChainSpec | None) -> Scored | None:
        """What keeping the current chain means this cycle: the chain itself at its draft
        lengths (lengths too change only past the hysteresis) while it beats the target alone
        at the bold acceptance, or the other member of its family (at planned lengths, for
        sure, as any chain moved to) when that is better or the current one cannot run.
        None: nothing to keep."""
        if current is None:
            return None
        lookup = self.planner.lookup
        kin = family(current.names, lookup)
        options = [s for s in ranked
                   if s.sure and family(s.spec.names, lookup) == kin and s.spec.names != current.names]
        if lookup not in current.names or self.inputs.match is not None:
            kept = self.check_sure(self.score(Scored(current, self.predict(current))), alone)
            if len(current.names) > 1:
                bold = self.predict(current, Rates.BOLD).seconds_per_token
                kept.holds = bold + kept.catch_up_per_token < alone.score
            if len(current.names) == 1 or kept.holds:
                options.append(kept)
        return min(options, key=lambda s: s.score) if options else None

"""Probes: a chain run for one cycle to learn its pairs, within a budget.

Candidates: a chain whose pairs are barely observed, scored optimistically (acceptance +
explore_bonus / sqrt(count + 1)); a chain left after a bad stretch of this request,
optimistically at the global estimate (AcceptanceEstimator.stale_low: the stretch may have
passed); and a chain that beats the choice on its estimate but not for sure (its probes are the
own data that make it sure, or show it is not). A chain that cannot beat the choice by the
hysteresis even optimistically is never probed: nothing would be learned that could change
the choice.

Budget: probes run only while their measured extra time stays within explore_fraction of the
generation time (elapsed plus the expected remaining, the horizon at the choice's rate). The
account (ProbeBudget) is the router's, shared by its sessions: a probe too costly for any one
request (a draft that must first feed a long prompt: its catch-up is part of its cost) is
taken once earlier requests have paid for it. A probe's cost is counted, not guessed: its
cycle's time minus what the chosen chain would have spent on the same tokens (nothing when
the probe did better; the session counts it, Router.end_cycle).
"""

from __future__ import annotations

from specrouter.router.policy.guards import Scoring
from specrouter.router.policy.plan import Scored
from specrouter.router.policy.predictor import ChainSpec


def pick_probe(scoring: Scoring, chosen: Scored, candidates: list[Scored], budget: float,
               hysteresis: float) -> Scored | None:
    """The most promising candidate (the lowest score, then the least extra time) that beats
    the choice by the hysteresis and whose expected extra time fits `budget` (seconds the
    probes may still spend): at its planned lengths, or where those cost more than the
    budget, at length 1 per level (one token tells less, but it tells). None: no probe."""
    best_rate = chosen.prediction.seconds_per_token
    options = []
    for scored in candidates:
        if scored.spec.names == chosen.spec.names or scored.score >= (1 - hysteresis) * chosen.score:
            continue  # even optimism does not beat the current choice: nothing to learn
        for spec in (scored.spec, ChainSpec(scored.spec.names, (1,) * len(scored.spec.draft_lengths))):
            real = scoring.predict(spec)
            extra = max(0.0, real.cycle_seconds - real.tokens_per_cycle * best_rate) + scored.catch_up
            if extra <= budget:
                probe = scored if spec == scored.spec else Scored(spec, real, scored.catch_up, scored.score)
                options.append((scored.score, extra, probe))
                break
    return min(options, key=lambda o: o[:2])[2] if options else None

"""decide(): the chain of the next cycle, from the plans, the guards, the probes and the pacing.

One choice, in order:
0. Prefill: while the target feeds the prompt (or whatever else of the context it lacks), it
   runs alone. A draft verified in that forward would make the request's first token wait
   for the draft's verification too (t(prompt + k) against t(prompt): on a CPU, where a
   forward's cost grows with its tokens, most of t(k)); fed apart, the draft costs one
   forward's fixed overhead more. vLLM and llama.cpp likewise draft only after the first token.
1. Pacing (pacing.py): after the request's first choice, while no probe is in flight, a
   recent decision of the router's sessions for this kind of cycle is reused where it costs
   this request nothing a deliberation would weigh (no model of it must first catch up).
2. Plans (planner.py): every candidate chain at its best draft lengths for the estimate, and
   optimistic plans where a pair is barely observed or stale; re-planned only when the
   inputs moved.
3. Scores: each plan's seconds per token plus its catch-up (a model that sat out feeds what
   it missed first) amortised over the horizon; ranked.
4. Guards (guards.py): the best chain sure to beat the target alone; the current chain kept
   unless the best is better by the hysteresis (and, to fall back to the target alone, until
   the current one loses even at its bold rate).
5. Probes (probes.py): a candidate that beats the choice optimistically, within the budget.

decide() does no I/O and reads no clock: it is a function of its arguments. It updates
`state` (the chain chosen, a probe in flight, the plans) and records a deliberation in the
shared pacing; the session does the rest (records, draft stop, learning).
"""

from __future__ import annotations

from specrouter.router.config import RouterConfig
from specrouter.router.policy.guards import Scoring
from specrouter.router.policy.pacing import Kind, firm
from specrouter.router.policy.plan import Scored
from specrouter.router.policy.predictor import ChainSpec, Prediction
from specrouter.router.policy.probes import pick_probe
from specrouter.router.policy.state import CycleInputs, Decision, ProbeRun, Reason, SessionState


def decide(inputs: CycleInputs, state: SessionState, config: RouterConfig) -> Decision:
    """The chain of the next cycle (the module docstring says how)."""
    planner = state.planner
    state.cycle += 1
    if not inputs.target_ready(planner.target):
        state.probe = None
        alone = ChainSpec((planner.target,))
        seconds = planner.costs.seconds(planner.target, 1)
        return Decision(Scored(alone, Prediction(seconds, seconds, 1.0)), Reason.PREFILL)
    kind = Kind.of(inputs.row_kind, inputs.batch, inputs.match)
    scoring = Scoring(planner, inputs)
    if state.current is not None and state.probe is None and (reused := _reusable(scoring, state, kind)) is not None:
        state.current = reused.spec
        return Decision(reused, Reason.REUSE)
    planner.refresh(inputs.room, inputs.batch, inputs.row_kind, state.cycle, now=state.probe is not None,
                    cls=inputs.match)
    best_plans, optimistic = planner.plans(inputs.match)
    ranked = sorted((scoring.score(s) for s in best_plans.values()), key=lambda s: s.score)
    alone = next(s for s in ranked if len(s.spec.names) == 1)
    ranked = sorted((scoring.robust(scoring.check_sure(s, alone), alone) for s in ranked), key=lambda s: s.score)
    chosen, reason = _guarded(scoring, ranked, alone, state, config)
    # Chains with a barely observed or stale pair, scored optimistically, and chains that
    # only the cautious guard kept out (their own data is what makes them sure).
    candidates = [scoring.score(opt) for opt in optimistic.values()]
    candidates += [s for s in ranked if not s.sure and planner.probe_teaches(s.spec.names, inputs.match)]
    budget = state.budget.left(inputs.horizon * chosen.prediction.seconds_per_token)
    probe = pick_probe(scoring, chosen, candidates, budget, config.hysteresis)
    if probe is not None:
        state.probe = ProbeRun(probe.spec, chosen.prediction.seconds_per_token)
        return Decision(probe, Reason.PROBE, tuple(ranked))
    state.probe = None
    state.current = chosen.spec
    # Optimistic candidates are rivals too: a chain worth probing soon is no firm "no".
    state.pacing.made(kind, chosen, firm(chosen, (*ranked, *candidates), config.pacing_margin), _window(scoring))
    return Decision(chosen, reason, tuple(ranked))


def _guarded(scoring: Scoring, ranked: list[Scored], alone: Scored, state: SessionState,
             config: RouterConfig) -> tuple[Scored, Reason]:
    """The best sure chain, or the current one (guards.py) where leaving it does not pay."""
    best = next(s for s in ranked if s.sure)
    current = scoring.keep_current(ranked, alone, state.current)
    if current is None:
        return best, Reason.START if state.current is None else Reason.SWITCH
    # The target alone replaces a chain that holds only once the chain loses for sure:
    # the standard errors between the cautious and the bold rate are the hysteresis there.
    leave = best.spec != current.spec and best.score < (1 - config.hysteresis) * current.score
    if leave and not (current.holds and len(best.spec.names) == 1):
        return best, Reason.SWITCH
    return current, Reason.KEEP


def _reusable(scoring: Scoring, state: SessionState, kind: Kind) -> Scored | None:
    """A recent decision of the router's sessions for this kind of cycle that costs this
    request nothing a deliberation would have weighed (pacing.py); None: deliberate. (A
    decision made with more room runs as the chain cuts its draft to the room: as it would
    have been planned for less, a little less well.)"""
    recent = state.pacing.recent(kind, _window(scoring))
    if recent is None or state.planner.plan is None or recent.spec.names not in state.planner.chains:
        return None
    return recent if scoring.score(recent).catch_up == 0 else None


def _window(scoring: Scoring) -> int | None:
    """The room as the plan sees it where it cuts the draft lengths (Planner.window), else None."""
    return None if scoring.window is None else scoring.planner.window(scoring.inputs.room)

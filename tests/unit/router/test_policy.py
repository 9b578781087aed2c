"""policy.decide as a function: the same inputs and state give the same decision, and what it
changes is the state it is given (the session's) and the shared pacing."""

from specrouter.cascade.sampling import SamplingParams
from specrouter.router.policy.decide import decide
from specrouter.router.policy.state import CycleInputs, ProbeRun, Reason

from ..router_synth import PROMPT, family, make_router

RATES = {("small", "mid"): 0.6, ("small", "target"): 0.5, ("mid", "target"): 0.9}


def seeded():
    """Two sessions of a router whose pairs are all well known (nothing to probe)."""
    target, mid, small = family()
    router = make_router(target, [mid, small], use_ngram=False)
    for (j, i), rate in RATES.items():
        router.acceptance.set_global(j, i, rate, count=1000, mode="greedy")
    sessions = router.session(), router.session()
    for session in sessions:
        session.start(SamplingParams())
    return sessions


def inputs(session, position=len(PROMPT), room=100):
    cached = {m.name: position - 1 for m in session.models}
    return CycleInputs(position, room, cached, 100, None, "greedy", 1)


def test_two_sessions_in_the_same_state_decide_alike_and_each_changes_only_its_own_state():
    first, second = seeded()
    a = decide(inputs(first), first.state, first.config)
    assert a.reason is Reason.START and a.deliberated and not a.probing
    assert first.state.current == a.chosen.spec and first.state.cycle == 1
    assert second.state.current is None and second.state.cycle == 0
    b = decide(inputs(second), second.state, second.config)
    assert (b.chosen.spec, b.reason, [s.spec for s in b.ranked]) == (a.chosen.spec, a.reason,
                                                                     [s.spec for s in a.ranked])
    assert a.chosen.spec.names[-2:] == ("mid", "target")  # the pair that agrees 9 times in 10
    again = decide(inputs(first, len(PROMPT) + 1, 99), first.state, first.config)
    assert again.reason in (Reason.KEEP, Reason.REUSE) and again.chosen.spec == a.chosen.spec


def test_a_paced_choice_reuses_the_last_decision_unless_a_probe_is_in_flight():
    """Choices as dear as the cycles they steer: the pacing reuses the last decision for the
    next cycle of the same kind; after a probe the next choice deliberates on what it measured."""
    for probing in (False, True):
        first, _ = seeded()
        first.pacing.timed(0.01, deliberated=True)
        first.pacing.on_cycle(0.01)
        chosen = decide(inputs(first), first.state, first.config)
        if probing:
            first.state.probe = ProbeRun(chosen.chosen.spec, chosen.chosen.prediction.seconds_per_token)
        after = decide(inputs(first, len(PROMPT) + 1, 99), first.state, first.config)
        assert after.reason is (Reason.KEEP if probing else Reason.REUSE), probing
        assert after.chosen.spec == chosen.chosen.spec and first.state.probe is None


def test_a_decision_planned_for_a_requests_last_tokens_is_not_reused_with_more_room():
    """A decision made where the room cuts the draft lengths (a request's last tokens) drafts
    short: a session with the room to draft in full does not reuse it (it deliberates, and
    keeps its full lengths); a decision made with the full room serves a session near its end
    (the chain cuts the draft to the room)."""
    first, second = seeded()
    first.pacing.timed(0.01, deliberated=True)
    first.pacing.on_cycle(0.01)
    full = decide(inputs(second), second.state, second.config)
    assert full.reason is Reason.START and max(full.chosen.spec.draft_lengths) >= 3
    end = decide(inputs(first, room=3), first.state, first.config)
    assert end.reason is Reason.START and max(end.chosen.spec.draft_lengths) < 3
    again = decide(inputs(second, len(PROMPT) + 1, 99), second.state, second.config)
    assert again.deliberated and again.chosen.spec == full.chosen.spec
    short = decide(inputs(first, len(PROMPT) + 1, room=3), first.state, first.config)
    assert short.reason is Reason.REUSE and short.chosen.spec == full.chosen.spec


def test_the_cycle_that_feeds_the_prompt_runs_the_target_alone_and_the_next_deliberates():
    """A draft verified in the prompt's forward would delay the request's first token by its
    verification: the target feeds the prompt alone, whatever is chosen right after. That is
    no choice (not deliberated, nothing kept for the pacing), and the request's first choice
    comes next, deliberated where a recent decision of its kind could be reused."""
    first, second = seeded()
    first.pacing.timed(0.01, deliberated=True)
    first.pacing.on_cycle(0.01)
    made = decide(inputs(first), first.state, first.config)  # a recent decision of this kind
    assert made.chosen.spec.names[-2:] == ("mid", "target")
    behind = CycleInputs(len(PROMPT), 100, {m.name: 0 for m in second.models}, 100, None, "greedy", 1)
    choices = (second.pacing.choices, second.pacing.deliberated, second.pacing.reused)
    prefill = decide(behind, second.state, second.config)
    assert prefill.reason is Reason.PREFILL and not prefill.deliberated and prefill.ranked == ()
    assert (second.pacing.choices, second.pacing.deliberated, second.pacing.reused) == choices
    assert prefill.chosen.spec.names == ("target",) and second.state.current is None
    after = decide(inputs(second, len(PROMPT) + 1, 99), second.state, second.config)
    assert after.reason is Reason.START and after.chosen.spec == made.chosen.spec
    reused = decide(inputs(second, len(PROMPT) + 2, 98), second.state, second.config)
    assert reused.reason is Reason.REUSE  # the pacing applies from the request's first choice on

"""The router's pacing (router/policy/pacing.py): how often a session deliberates, and when it may
reuse a recent decision instead."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from specrouter.cascade.chain import CycleRunner
from specrouter.cascade.sampling import SamplingParams
from specrouter.router.config import DEFAULT_CONFIG
from specrouter.router.policy.pacing import ChoicePacing, Kind, firm
from specrouter.router.policy.plan import Scored
from specrouter.router.policy.predictor import ChainSpec, Prediction
from specrouter.state import SequenceState

from ..router_synth import PROMPT, family, make_router

AGREED, ALPHA = DEFAULT_CONFIG.pacing_agreed, DEFAULT_CONFIG.pacing_alpha
MARGIN, STALE = DEFAULT_CONFIG.pacing_margin, DEFAULT_CONFIG.pacing_stale

SOME = Scored(ChainSpec(("d", "t"), (4,)), Prediction(0.01, 0.03, 3.0))
OTHER = Scored(ChainSpec(("d", "t"), (2,)), Prediction(0.01, 0.02, 2.0))


def differing():
    """Decisions that differ from the one before each time (none agrees: AGREED)."""
    return itertools.cycle((SOME, OTHER))


def test_a_choice_is_firm_only_for_the_target_alone_with_every_rival_margin_slower():
    alone = Scored(ChainSpec(("t",), ()), Prediction(0.02, 0.02, 1.0), score=0.02)
    at_margin = Scored(SOME.spec, SOME.prediction, score=0.02 * (1 + MARGIN))
    inside = Scored(OTHER.spec, OTHER.prediction, score=0.02 * (1 + MARGIN) * 0.999)
    assert firm(alone, [alone, at_margin])  # itself among the rivals: not its own rival
    assert firm(alone, [])
    assert not firm(alone, [at_margin, inside])
    far_behind = Scored(alone.spec, alone.prediction, score=1.0)
    assert not firm(at_margin, [far_behind])  # a drafted chain is never firm: its lengths move with its blocks


def test_every_is_the_choices_cost_over_its_share_of_a_cycle():
    pacing = ChoicePacing(0.05)
    assert pacing.every(32) == 1  # nothing timed yet
    pacing.timed(0.001, deliberated=True)
    assert pacing.every(32) == 1  # no cycle timed yet
    pacing.on_cycle(0.1)  # a CPU: a 1 ms choice next to a 100 ms cycle
    assert (pacing.every(1), pacing.every(5)) == (1, 1)
    pacing.cycle = 0.002  # a GPU: 2 ms cycles
    assert pacing.every(1) == 10 and pacing.every(32) == math.ceil(32 * 0.001 / (0.05 * 0.002))
    assert ChoicePacing(0).every(32) == 1 == ChoicePacing(0.0).every(1)


def test_only_a_deliberation_times_the_choice_and_cycles_are_averaged():
    pacing = ChoicePacing()
    pacing.timed(0.002, deliberated=True)
    pacing.timed(0.00001, deliberated=False)
    pacing.timed(0.004, deliberated=True)
    assert pacing.deliberation == pytest.approx(0.002 + ALPHA * 0.002, rel=1e-12)
    assert (pacing.deliberated, pacing.reused) == (2, 1)
    pacing.on_cycle(0.1)
    pacing.on_cycle(0.2)
    assert pacing.cycle == pytest.approx(0.1 + ALPHA * 0.1, rel=1e-12)


def test_a_kinds_decision_is_renewed_after_2_4_8_choices_then_every():
    pacing = ChoicePacing(0.05)
    pacing.timed(0.001, True)
    pacing.on_cycle(0.001)  # every = 20 at batch 1
    kind = Kind.of("greedy", 1, None)
    deliberated, decisions = [], differing()
    for choice in range(1, 80):
        if pacing.recent(kind) is None:
            deliberated.append(choice)
            pacing.made(kind, next(decisions))
    assert deliberated == [1, 3, 7, 15, 31, 51, 71]
    assert pacing.recent(Kind.of("greedy", 1, "suffix#4")) is None  # another kind: its own decisions
    assert pacing.recent(Kind.of("sampled", 1, None)) is None


def test_batches_of_similar_size_share_a_kind():
    assert [Kind.of("greedy", b, None).batch for b in (1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33)] == \
        [1, 2, 4, 4, 8, 8, 16, 16, 32, 32, 64]


def _router(params=SamplingParams()):
    """A session whose drafts are known to pay (seeded estimates): it deliberates its first
    choice, then its pacing says a choice costs 20 cycles' share."""
    target, mid, small = family()
    router = make_router(target, [mid, small], use_ngram=False)
    for mode in ("greedy", "sampled"):
        for j, i in (("small", "target"), ("mid", "target"), ("small", "mid")):
            router.acceptance.set_global(j, i, 0.9, count=500, mode=mode)
    session = router.session()
    session.start(params, len(PROMPT), 200)
    session.pacing.timed(0.001, True)
    session.pacing.on_cycle(0.001)
    return router, session


def _caught_up(session, behind: int = 0) -> dict[str, int]:
    return {m.name: len(PROMPT) - 1 - behind for m in session.models}


def test_a_session_reuses_a_recent_decision_where_nothing_of_its_own_differs():
    router, first = _router()
    position = len(PROMPT)
    chosen = first.choose(position, 200, _caught_up(first), PROMPT)
    assert first.deliberated and len(chosen.names) == 2 and len(first.decisions) == 1
    # Another session of the router, same kind of cycle: the decision, without deliberating.
    second = router.session()
    second.start(SamplingParams(), len(PROMPT), 200)
    second.choose(position, 200, _caught_up(second), PROMPT)  # its first plan is its own
    assert second.deliberated
    reused = second.choose(position, 200, _caught_up(second), PROMPT)
    second.on_choice(2e-5)  # what the engine does after every choice
    assert not second.deliberated and reused.names == chosen.names and second.current.names == tuple(chosen.names)
    assert len(second.decisions) == 1  # a reuse records no decision
    assert first.pacing is second.pacing and first.pacing.reused == 1
    assert first.pacing.deliberation == 0.001  # a reuse's time is not a deliberation's


@pytest.mark.parametrize("case", ["catch-up", "excluded", "other kind", "after a probe", "cpu"])
def test_a_decision_is_not_reused_where_this_session_would_weigh_it_otherwise(case):
    router, session = _router()
    position = len(PROMPT)
    chosen = session.choose(position, 200, _caught_up(session), PROMPT)
    draft = chosen.names[0]
    cached, room = _caught_up(session), 200
    if case == "catch-up":  # its draft sat out 5 tokens: a catch-up is the choice's to weigh
        cached[draft] -= 5
    elif case == "excluded":
        session.exclude(draft)
    elif case == "other kind":
        session.batch_size = 3
    elif case == "after a probe":
        session._probe = (ChainSpec(("mid", "target"), (2,)), 0.01)
    elif case == "cpu":
        session.pacing.on_cycle(10.0)  # a choice of 1 ms is nothing next to these cycles
    session.choose(position, room, cached, PROMPT)
    assert session.deliberated, case
    # Again, nothing changed since: a lagging draft lags until it runs, while a decision for
    # the other kind of cycle is now recent.
    session.choose(position, room, cached, PROMPT)
    assert session.deliberated == (case in ("catch-up", "cpu")), case


def test_a_decision_is_reused_where_the_room_cuts_its_draft():
    router, session = _router()
    position = len(PROMPT)
    session.choose(position, 200, _caught_up(session), PROMPT)
    planned = session.current
    room = 2
    chain = session.choose(position, room, _caught_up(session), PROMPT)
    assert not session.deliberated and session.current == planned and planned.draft_lengths[-1] >= room
    runner = CycleRunner(chain, SequenceState(), SamplingParams(), np.random.default_rng(0))
    assert len(runner.cycle(list(PROMPT), room)) <= room  # it drafts at most room - 1 for the target


def test_kinds_that_alternate_reuse_their_own_decisions_and_old_ones_are_made_again():
    """(1) bounds the deliberations per choice of a kind: two kinds that alternate (a
    lookup's match classes, cycle by cycle) deliberate every `every`-th choice of each, not
    every choice (counted over all choices, each found its own decision too old, and a
    fast CPU's sessions reused ~10% of their choices where every = 2 allows half). A kind
    that comes back after STALE * every choices of the router deliberates again."""
    pacing = ChoicePacing(0.05)
    pacing.timed(0.001, True)
    pacing.on_cycle(0.01)  # every = 2 at batch 1
    assert pacing.every(1) == 2
    a, b = Kind.of("greedy", 1, None), Kind.of("greedy", 1, "suffix#2")
    deliberated, decisions = [], {a: differing(), b: differing()}
    for choice in range(1, 21):
        kind = a if choice % 2 else b
        if pacing.recent(kind) is None:
            deliberated.append(choice)
            pacing.made(kind, next(decisions[kind]))
    assert deliberated == [1, 2, 5, 6, 9, 10, 13, 14, 17, 18]
    rare = Kind.of("greedy", 1, "suffix#8")
    pacing.made(rare, SOME)
    for _ in range(2 * STALE - 2):
        pacing.recent(a)
    assert pacing.recent(rare) is SOME  # the router's (STALE * every - 1)-th choice since
    pacing.made(rare, OTHER)
    for _ in range(2 * STALE - 1):
        pacing.recent(a)
    assert pacing.recent(rare) is None  # its (STALE * every)-th


@pytest.mark.parametrize("firm", [True, False])
def test_a_kind_whose_deliberations_firmly_agree_is_deliberated_ever_more_rarely(firm):
    """Each firm deliberation (the target alone by MARGIN) that chooses what the one before
    chose doubles the kind's span, up to every * 2^AGREED (a session running the target
    alone, on a fast CPU, deliberated every other choice to choose it again); one that
    chooses otherwise starts again from every. Decisions that are not firm keep the span at
    every, however often they agree (a drafted chain's lengths move with its own blocks).
    Where every = 1 (a choice is nothing next to a cycle) every choice still deliberates."""
    pacing = ChoicePacing(0.05)
    pacing.timed(0.001, True)
    pacing.on_cycle(0.01)  # every = 2 at batch 1
    kind = Kind.of("greedy", 1, None)
    deliberated = []
    for choice in range(1, 80):
        if pacing.recent(kind) is None:
            deliberated.append(choice)
            pacing.made(kind, SOME if choice < 40 else OTHER, firm)
    if firm:
        assert AGREED == 3 and deliberated == [1, 3, 7, 15, 31, 47, 49, 53, 61, 77]
    else:
        assert deliberated == list(range(1, 80, 2))
    slow = ChoicePacing(0.05)
    slow.timed(0.001, True)
    slow.on_cycle(1.0)  # every = 1
    for _ in range(8):
        assert slow.recent(kind) is None
        slow.made(kind, SOME, firm)


@pytest.mark.parametrize("acceptance", [0.9, 0.1, 0.02])
def test_a_session_backs_off_from_firm_choices_of_the_target_alone_only(acceptance):
    """Where no draft comes within MARGIN of the target alone (acceptance 0.02, every pair
    well observed: the small draft's best chain is ~12% slower) the session's deliberations
    are firm and spread out; where one comes close (0.1: ~4% slower) the target alone is
    chosen but every other choice deliberates (every = 2 here), as where a draft pays (0.9)."""
    target, mid, small = family()
    router = make_router(target, [mid, small], use_ngram=False)
    for mode in ("greedy", "sampled"):
        for j, i in (("small", "target"), ("mid", "target"), ("small", "mid")):
            router.acceptance.set_global(j, i, acceptance, count=500, mode=mode)
    session = router.session()
    session.start(SamplingParams(), len(PROMPT), 200)
    session.pacing.timed(0.001, True)
    session.pacing.on_cycle(0.025)
    assert session.pacing.every(1) == 2
    deliberated, chains = [], set()
    for choice in range(1, 17):
        chains.add(tuple(session.choose(len(PROMPT), 200, _caught_up(session), PROMPT).names))
        if session.deliberated:
            deliberated.append(choice)
    if acceptance == 0.9:
        assert all(len(names) > 1 for names in chains) and deliberated == list(range(1, 17, 2))
    else:
        assert chains == {("target",)}
        assert deliberated == ([1, 3, 7, 15] if acceptance == 0.02 else list(range(1, 17, 2)))

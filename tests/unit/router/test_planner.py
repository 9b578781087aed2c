"""The planner re-plans when what a choice depends on moved, and only then: the room as far as
it cuts the grid, model costs relative to the target's, and the pairs the cycle can use."""

from __future__ import annotations

import pytest

from specrouter.router.config import DEFAULT_CONFIG

from ..router_synth import family, make_router

PLAN_EVERY = DEFAULT_CONFIG.plan_every

GREEDY = dict(batch=1, row_kind="greedy")


def test_a_plan_sees_the_room_only_where_it_cuts_the_grid():
    """Every room between two draft lengths of the grids plans alike (a plan drafts only the
    lengths shorter than the room); window() is the least room that does, and the planner
    re-plans when the room crosses a length, not at every token of a request's end."""
    target, mid, _ = family()
    planner = make_router(target, [mid]).planner
    lengths = sorted({*planner.grid, *planner.lookup_grid})

    def cut(room: int) -> list[int]:
        return [k for k in lengths if k < max(room, 2)]

    for room in range(1, 2 * planner.longest):
        window = planner.window(room)
        assert window <= room and cut(window) == cut(room), room
        assert window <= 2 or cut(window - 1) != cut(window), room
    assert {15, 23} <= set(lengths)
    planner.refresh(room=20, cycle=1, **GREEDY)
    first = planner.replans
    for cycle, room in enumerate((19, 18, 17, 16), start=2):
        planner.refresh(room=room, cycle=cycle, **GREEDY)
    assert planner.replans == first and planner.plan.window == 16
    planner.refresh(room=15, cycle=6, **GREEDY)  # 15 itself is cut off the grid now
    assert planner.replans == first + 1 and planner.plan.window == 12


def test_a_session_running_the_target_alone_does_not_re_plan_on_its_jitter():
    """Only the target runs: its level moves with every forward (a slower one moves it ~9%),
    which changes no choice; its shapes are relative already, and a size timed for the first
    time adds a correction that was 1 until then. Neither re-plans."""
    target, _, _ = family()
    router = make_router(target, [])
    costs, planner = router.costs, router.planner
    for n in (1, 4, 1, 4):
        costs.observe("target", n, target.latency(n))
    planner.refresh(room=500, cycle=1, **GREEDY)
    first = planner.replans
    costs.observe("target", 1, 1.3 * target.latency(1))
    planner.refresh(room=500, cycle=1 + PLAN_EVERY, **GREEDY)
    costs.observe("target", 2, target.latency(2))
    planner.refresh(room=500, cycle=1 + 2 * PLAN_EVERY, **GREEDY)
    assert planner.replans == first
    costs.observe("target", 4, 6 * target.latency(4))  # a shape that does move (by ~8%)
    planner.refresh(room=500, cycle=1 + 3 * PLAN_EVERY, **GREEDY)
    assert planner.replans == first + 1


def test_a_match_class_that_moved_is_taken_up_when_a_cycle_of_it_comes():
    """A cycle measures the pairs it can use: the models' and its match class's. Another
    class's estimates that moved reach the plan in the first cycle of that class."""
    target, _, _ = family()
    router = make_router(target, [])
    planner, acceptance = router.planner, router.acceptance
    a, b = planner.ngram_keys[0], planner.ngram_keys[-1]
    planner.refresh(room=500, cycle=1, **GREEDY)
    before = planner.plan.inputs.rates[(b, "target")]
    acceptance.set_global(b, "target", 0.95, count=500, mode="greedy")
    moved = acceptance.rate(b, "target", planner.estimate_names())
    assert moved > before + 0.2
    planner.refresh(room=500, cycle=1 + PLAN_EVERY, cls=a, **GREEDY)
    assert planner.plan.inputs.rates[(b, "target")] == before
    planner.refresh(room=500, cycle=1 + 2 * PLAN_EVERY, cls=b, **GREEDY)
    assert planner.plan.inputs.rates[(b, "target")] == pytest.approx(moved)


def test_a_refit_re_plans_even_where_the_snapshot_looks_the_same():
    """A busy profile (the target at ~2 s a token) is planned with before anything is timed;
    the prompt's prefill, many times faster, refits the target's table. Its level and
    shapes start over, so the cost snapshot is what it was (none for the target either
    way), yet every prediction changed: the next refresh re-plans at once, and the target
    alone is priced by the new table (the old plans, left standing, had a 0.5B draft of 23
    tokens probed against a target priced at 2.1 s a token)."""
    target, mid, _ = family()
    router = make_router(target, [mid])
    costs, planner = router.costs, router.planner
    costs.profile.tables["target"] = {n: 2.1 + 0.9 * (n - 1) / 31 for n in costs.profile.tables["target"]}
    planner.refresh(room=500, cycle=1, **GREEDY)
    alone = planner.plans(None)[0][("target",)].prediction.seconds_per_token
    assert alone == pytest.approx(2.1, rel=0.01)
    first, snapshot = planner.replans, costs.snapshot()
    costs.observe("target", 100, target.latency(100))
    assert costs.refitted and costs.snapshot().keys() == snapshot.keys()
    planner.refresh(room=500, cycle=2, **GREEDY)
    assert planner.replans == first + 1
    alone = planner.plans(None)[0][("target",)].prediction.seconds_per_token
    assert alone == pytest.approx(costs.seconds("target", 1), rel=0.01) and alone < 0.01

"""The speculation counts (specrouter/metrics.py): observations, sums, since, rates and the
per-position acceptance, with exact numbers."""

import pytest

from specrouter.metrics import LevelStats, SpecStats


def observed() -> LevelStats:
    """Four blocks of `small`: 2 of 4 accepted, 3 of 3, an empty block, 0 of 2; two calls."""
    s = LevelStats("small")
    for proposed, accepted in ((4, 2), (3, 3), (0, 0), (2, 0)):
        s.observe_draft(proposed, accepted)
    s.observe_forward(0.25)
    s.observe_forward(0.5)
    return s


def test_observations_count_drafts_tokens_positions_and_calls():
    s = observed()
    assert s == LevelStats("small", proposed=9, accepted=5, forwards=2, seconds=0.75, drafts=3,
                           accepted_per_position=[2, 2, 1])


def test_rates_are_derived_from_the_counts():
    s = observed()
    assert s.acceptance == 5 / 9
    assert s.accepted_per_draft == 5 / 3
    assert s.position_acceptance == [2 / 3, 2 / 3, 1 / 3]
    assert s.seconds_per_forward == 0.375
    empty = LevelStats("target", forwards=0)
    assert (empty.acceptance, empty.accepted_per_draft, empty.position_acceptance, empty.seconds_per_forward) == (
        None, None, [], None)


def test_a_draft_cannot_accept_more_than_it_proposed():
    s = LevelStats("small")
    with pytest.raises(ValueError, match=r"^a draft of 2 tokens cannot have 3 accepted$"):
        s.observe_draft(2, 3)
    with pytest.raises(ValueError, match=r"^a draft of 2 tokens cannot have -1 accepted$"):
        s.observe_draft(2, -1)
    assert s == LevelStats("small")


def test_the_sum_of_two_counts_adds_every_count_and_aligns_positions():
    a = observed()
    b = LevelStats("small", proposed=6, accepted=6, forwards=1, seconds=0.125, drafts=1,
                   accepted_per_position=[1, 1, 1, 1, 1, 1])
    total = a + b
    assert total == LevelStats("small", proposed=15, accepted=11, forwards=3, seconds=0.875, drafts=4,
                               accepted_per_position=[3, 3, 2, 1, 1, 1])
    assert b + a == total
    total.accepted_per_position[0] = 99  # a new object: the terms are untouched
    assert a.accepted_per_position == [2, 2, 1] and b.accepted_per_position == [1] * 6


def test_counts_of_two_levels_do_not_add():
    with pytest.raises(ValueError, match=r"^counts of level 'mid' cannot join those of 'small'$"):
        LevelStats("small") + LevelStats("mid")
    with pytest.raises(ValueError, match=r"^counts of level 'mid' cannot join those of 'small'$"):
        LevelStats("small").since(LevelStats("mid"))


def test_since_is_what_was_observed_after_the_copy():
    s = observed()
    before = s.copy()
    s.observe_draft(5, 4)
    s.observe_forward(0.125)
    added = s.since(before)
    assert added == LevelStats("small", proposed=5, accepted=4, forwards=1, seconds=0.125, drafts=1,
                               accepted_per_position=[1, 1, 1, 1])
    assert before + added == s
    assert before == observed()  # a copy: what came later did not reach it


def test_as_dict_is_the_levels_json_entry():
    assert observed().as_dict() == {"name": "small", "proposed": 9, "accepted": 5, "acceptance": 5 / 9,
                                    "forwards": 2, "seconds": 0.75, "drafts": 3,
                                    "accepted_per_position": [2, 2, 1]}


def test_spec_stats_sum_per_level_in_the_order_levels_appeared():
    ngram = LevelStats("ngram", proposed=4, accepted=4, drafts=1, accepted_per_position=[1, 1, 1, 1])
    small, target = observed(), LevelStats("target", forwards=3, seconds=0.5)
    one = SpecStats.of([small, target])
    two = SpecStats.of([ngram, LevelStats("target", forwards=1, seconds=0.25), small])
    total = one + two
    assert list(total) == ["small", "target", "ngram"]
    assert total["small"] == small + small
    assert total["target"] == LevelStats("target", forwards=4, seconds=0.75)
    assert total["ngram"] == ngram and total["ngram"] is not ngram
    assert SpecStats.of([small, small]) == SpecStats({"small": small + small})
    assert len(total) == 3 and "mid" not in total and dict(total.items())["ngram"] == ngram


def test_spec_stats_since_takes_every_level_and_a_new_one_whole():
    run = SpecStats()
    run.level("small").observe_draft(3, 1)
    run.level("target").observe_forward(0.5)
    before = run.copy()
    run.level("small").observe_draft(2, 2)
    run.level("ngram").observe_draft(4, 0)
    added = run.since(before)
    assert added == SpecStats({"small": LevelStats("small", proposed=2, accepted=2, drafts=1,
                                                   accepted_per_position=[1, 1]),
                               "target": LevelStats("target"),
                               "ngram": LevelStats("ngram", proposed=4, drafts=1)})
    assert before + added == run

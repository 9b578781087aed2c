"""RouterConfig: the defaults, validation with errors that name the key, TOML files, and that
every part of a router takes the config it is given (flags: tests/unit/test_router_cli.py)."""

import dataclasses

import pytest

from specrouter.cascade.sampling import SamplingParams
from specrouter.errors import InvalidParameterError
from specrouter.router.estimates.acceptance import AcceptanceEstimator
from specrouter.router.config import DEFAULT_CONFIG, RouterConfig
from specrouter.router.estimates.costs import CostProfile, OnlineCosts

from ..router_synth import PROMPT, family, make_router

#: The router's tuning as it stood before it was gathered into RouterConfig: a default that
#: moves must move here too, on purpose.
DEFAULTS = {
    "draft_grid": (1, 2, 3, 4, 5, 6, 7, 8, 11, 15, 23), "lookup_grid": (1, 2, 3, 4, 5, 6, 7, 8, 11, 15, 23, 31, 47, 63),
    "hysteresis": 0.05, "caution_z": 1.0, "max_exhaustive": 100, "max_decisions": 200,
    "explore_fraction": 0.03, "explore_bonus": 0.5, "optimistic_cap": 0.98, "confident": 48.0,
    "plan_every": 4, "big_move": 2.0, "full_search_every": 16, "rate_tolerance": 0.04, "fill_tolerance": 0.1,
    "cost_tolerance": 0.05, "lookup_cost_tolerance": 2e-4, "overhead_tolerance": 5e-4, "row_tolerance": 2e-4,
    "pacing_fraction": 0.02, "pacing_agreed": 3, "pacing_margin": 0.1, "pacing_stale": 4, "pacing_alpha": 0.1,
    "default_prior": 0.4, "shrink": 8.0, "alpha_request": 0.1, "alpha_global": 0.01, "change_window": 6,
    "change_z": 3.0, "min_jump": 0.15, "variance_alpha": 0.02, "min_variance_count": 10, "prior_weight": 4.0,
    "stale_half_life": 32.0, "stretch": 8, "persist_cap": 200.0,
    "cost_alpha": 0.3, "shape_alpha": 0.1, "row_alpha": 0.1, "overhead_alpha": 0.2, "disagree": 2.0,
    "min_observed": 8, "early_disagree": 4.0, "early_observed": 3, "cost_samples": 64,
    "stop_edges": (0.3, 0.5, 0.7, 0.9, 0.99), "stop_centers": (0.2, 0.4, 0.6, 0.8, 0.95, 0.995),
    "stop_prior_count": 4.0, "stop_alpha": 0.05, "default_horizon": 256, "answers_window": 64,
    "profile_repeats": 3, "non_physical_drop": 0.75, "repeat_spread": 1.5, "busy_share": 0.25, "min_timed": 1e-3,
    "min_span": 1.0,
}


def test_the_defaults_are_the_routers_tuning_and_every_key_has_its_unit_and_meaning():
    assert dataclasses.asdict(DEFAULT_CONFIG) == DEFAULTS
    assert [key for key, _, _ in RouterConfig.describe()] == list(DEFAULTS)
    for key, default, meaning in RouterConfig.describe():
        unit, _, what = meaning.partition(": ")
        assert unit and what and default == DEFAULTS[key], key
    assert DEFAULT_CONFIG.changed() == {}


def test_the_reference_lists_every_key_with_its_default_unit_and_meaning():
    from pathlib import Path

    text = (Path(__file__).parents[3] / "docs" / "router.md").read_text()
    for key, default, meaning in RouterConfig.describe():
        shown = "[" + ", ".join(map(str, default)) + "]" if isinstance(default, tuple) else str(default)
        unit, _, what = meaning.partition(": ")
        assert f"| `{key}` | {shown} | {unit} | {what} |" in text, key


@pytest.mark.parametrize(("table", "message"), [
    ({"hystersis": 0.1}, "unknown key 'hystersis' (did you mean 'hysteresis'?)"),
    ({"hysteresis": 1.5}, "hysteresis: Input should be less than 1 (got 1.5)"),
    ({"hysteresis": "0.1"}, "hysteresis: Input should be a valid number (got '0.1')"),
    ({"plan_every": 4.5}, "plan_every: Input should be a valid integer (got 4.5)"),
    ({"plan_every": True}, "plan_every: Input should be a valid integer (got True)"),
    ({"draft_grid": [4, 2]}, "draft_grid must be increasing draft lengths >= 1, got [4, 2]"),
    ({"lookup_grid": [0, 2]}, "lookup_grid must be increasing draft lengths >= 1, got [0, 2]"),
    ({"stop_edges": [0.5, 1.0]}, "stop_edges must be increasing confidences in (0, 1), got [0.5, 1.0]"),
    ({"stop_centers": [0.5]}, "stop_centers must be 6 acceptances in [0, 1] (one per bin), got [0.5]"),
])
def test_a_bad_table_is_refused_naming_the_key(table, message):
    with pytest.raises(InvalidParameterError) as raised:
        RouterConfig.from_dict(table, "router config f.toml")
    assert str(raised.value) == f"invalid router config f.toml: {message}" + (
        "; the keys are in docs/router.md" if message.startswith("unknown") else "")


def test_a_toml_file_sets_its_keys_and_leaves_the_others_at_their_defaults(tmp_path):
    file = tmp_path / "router.toml"
    file.write_text("hysteresis = 0.1\nshrink = 16\ndraft_grid = [1, 2, 4, 8]\n")
    config = RouterConfig.load(file)
    assert config.changed() == {"draft_grid": (1, 2, 4, 8), "hysteresis": 0.1, "shrink": 16.0}
    assert config.replace(hysteresis=0.05).changed() == {"draft_grid": (1, 2, 4, 8), "shrink": 16.0}
    file.write_text("hysteresis = [")
    with pytest.raises(InvalidParameterError, match=f"cannot read the router config {file}: "):
        RouterConfig.load(file)
    with pytest.raises(InvalidParameterError, match="cannot read the router config .*missing.toml"):
        RouterConfig.load(tmp_path / "missing.toml")


def test_a_router_and_what_it_builds_take_the_config():
    config = DEFAULT_CONFIG.replace(draft_grid=(1, 2, 3), lookup_grid=(2, 30), default_prior=0.25,
                                    pacing_fraction=0.5, answers_window=3, stop_prior_count=2.0)
    target, mid, small = family()
    router = make_router(target, [mid, small], config=config)
    assert router.grid == (1, 2, 3) and router.lookup_grid == (2,) and router.longest == 3  # the n-gram drafts at most 24
    assert router.acceptance.rate("small", "target") == 0.4  # make_router's estimator: the defaults
    assert AcceptanceEstimator(config=config).rate("small", "target") == 0.25
    assert router.pacing.fraction == 0.5 and router.lengths._lengths.maxlen == 3
    assert router.draft_stop.config is config and router.planner.config is config
    session = router.session()
    assert session.config is config and session.pacing is router.pacing
    chain = router.choose(len(PROMPT), 100, {m.name: len(PROMPT) for m in router.models}, PROMPT)
    assert all(k in (1, 2, 3) for k in chain.draft_lengths[1:]) and chain.draft_lengths[0] in (1, 2, 3)


def test_costs_follow_the_configs_level_weight():
    """One forward twice as slow as profiled: at weight 1 the level takes it whole; at the
    default 0.3 the level goes to 1.3 and the shape's 0.1 of the rest (2 / 1.3 - 1) joins it:
    1.3 + 0.1 * 0.7 = 1.37."""
    profile = CostProfile({"m": {1: 0.01, 2: 0.02}})
    fast, slow = OnlineCosts(profile, config=DEFAULT_CONFIG.replace(cost_alpha=1.0)), OnlineCosts(profile)
    for costs in (fast, slow):
        costs.observe("m", 1, 0.02)
    assert fast.seconds("m", 1) == pytest.approx(0.02) and slow.seconds("m", 1) == pytest.approx(0.0137)


def test_a_session_records_at_most_max_decisions():
    target, mid, small = family()
    router = make_router(target, [mid, small], config=DEFAULT_CONFIG.replace(max_decisions=1))
    from specrouter.engine import generate

    result = generate(router, PROMPT, SamplingParams(), 40)
    assert len(result.decisions) == 1 and result.decisions[0]["reason"] == "start"

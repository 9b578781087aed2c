"""CLI flags of the router (no models needed: these fail before anything is loaded)."""

import json

import pytest
from click.testing import CliRunner

from specrouter.cli import DEFAULT_CHAIN, main


def test_auto_is_the_default_chain():
    assert DEFAULT_CHAIN == "auto"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prompt", "x", "--draft-lengths", "3"], "draft_lengths needs an explicit chain, not 'auto'"),
        (["--prompt", "x", "--chain", "ngram,qwen2.5-coder-1.5b", "--target", "qwen2.5-coder-1.5b"],
         "--target, --explain, --lookup and --profile work with --chain auto"),
        (["--prompt", "x", "--chain", "ngram,qwen2.5-coder-1.5b", "--explain"],
         "--target, --explain, --lookup and --profile work with --chain auto"),
        (["--prompt", "x", "--chain", "ngram,qwen2.5-coder-1.5b", "--profile", "costs.json"],
         "--target, --explain, --lookup and --profile work with --chain auto"),
        (["--prompt", "x", "--chain", "ngram,qwen2.5-coder-1.5b", "--lookup", "suffix"],
         "--target, --explain, --lookup and --profile work with --chain auto"),
        (["--prompt", "x", "--target", "no-such-model"], "unknown model 'no-such-model'"),
    ],
)
def test_router_flags_fail_with_one_clear_line(args, message):
    result = CliRunner().invoke(main, ["generate", *args])
    assert result.exit_code == 2
    assert f"error: {message}" in result.output
    assert "Traceback" not in result.output


def test_an_unknown_lookup_drafter_is_refused_with_the_known_ones():
    result = CliRunner().invoke(main, ["generate", "--prompt", "x", "--lookup", "nope"])
    assert result.exit_code == 2 and "'nope' is not one of 'ngram', 'suffix'" in result.output


def test_profile_refuses_bad_input():
    result = CliRunner().invoke(main, ["profile", "--repeats", "0"])
    assert result.exit_code == 2 and "error: --repeats must be >= 1, got 0" in result.output
    result = CliRunner().invoke(main, ["profile", "--models", "no-such-model"])
    assert result.exit_code == 2 and "error: unknown model 'no-such-model'" in result.output


def test_explain_lists_decisions_candidates_and_inputs():
    from specrouter.cascade.sampling import SamplingParams
    from specrouter.cli import _explain

    from .router_synth import family, make_router, seconds_per_token

    target, mid, small = family()
    _, result = seconds_per_token(make_router(target, [small, mid]), [target, mid, small], SamplingParams(), 60)
    text = _explain(result)
    assert text.startswith(f"-- router: {len(result.decisions)} decisions over {result.cycles} cycles")
    assert "cycle 2 (position 6):" in text and "pred ms/tok" in text  # cycle 1 feeds the prompt: no choice
    assert "acceptance (greedy): " in text and "cost ms target: t(1)=54.0" in text
    assert "cycles: " in text


class _FamilyPool:
    """The synthetic family behind the `model` lookup auto_router uses, with model files
    (the profile cache key reads them)."""

    def __init__(self, models):
        self.models = {m.name: m for m in models}

    def model(self, name):
        return self.models[name]


def _pool_of_family(tmp_path):
    from .router_synth import family

    models = family()
    for m in models:
        m.path = tmp_path / f"{m.name}.gguf"
        m.path.write_bytes(m.name.encode())
    return _FamilyPool(models), models


def test_auto_router_targets_the_largest_candidate_and_keeps_estimates_between_runs(tmp_path):
    from specrouter.cascade.sampling import SamplingParams
    from specrouter.router import auto_router

    from .router_synth import seconds_per_token

    pool, (target, mid, small) = _pool_of_family(tmp_path)
    (tmp_path / "acceptance.json").write_text("{broken")  # damaged estimates: start from priors
    router = auto_router(pool, None, ["small", "mid", "target"], profile_dir=tmp_path, progress=False)
    assert router.target is target and router.drafts == [small, mid] and router.message is None
    seconds_per_token(router, [target, mid, small], SamplingParams(), 40)
    router.save_estimates()
    again = auto_router(pool, None, ["small", "mid", "target"], profile_dir=tmp_path, progress=False)
    learned = {k for k, e in router.acceptance.global_.items() if e.count}
    assert learned and {k for k, e in again.acceptance.global_.items() if e.count} == learned


GPU_PROFILE = {"device": {"name": "NVIDIA H200"}, "models": {"target": {"1": 0.004, "2": 0.0041, "4": 0.0042,
                                                                      "8": 0.0045, "16": 0.005, "32": 0.006}}}


def test_profile_load_prints_a_saved_profile_without_measuring(tmp_path):
    file = tmp_path / "gpu.json"
    file.write_text(json.dumps(GPU_PROFILE))
    result = CliRunner().invoke(main, ["profile", "--load", str(file)])
    assert result.exit_code == 0, result.output
    header, row, ngram = result.output.splitlines()[:3]
    assert header.split()[-12:] == ["1", "2", "3", "4", "6", "8", "12", "16", "24", "32", "48", "64"]
    cells = row.split()
    assert cells[0] == "target" and [cells[i] for i in (1, 2, 4, 8, 10)] == ["4.0", "4.1", "4.2", "5.0", "6.0"]
    assert cells[11:] == ["7.0", "8.0"]  # the sizes it lacks, as the router reads them: extrapolated
    assert ngram.split()[:2] == ["ngram", "0.020"] and "batched" not in result.output
    result = CliRunner().invoke(main, ["profile", "--load", str(file), "--models", "qwen2.5-coder-1.5b"])
    assert result.exit_code == 2 and "error: --load shows a saved profile: it measures nothing" in result.output


def test_profile_load_prints_the_context_table_beside_the_profile(tmp_path):
    file = tmp_path / "cpu.json"
    file.write_text(json.dumps({**GPU_PROFILE, "context": {"tokens": 1024, "models": {"target": {
        "1": 0.005, "4": 0.0052, "16": 0.0064, "32": 0.009}}}}))
    result = CliRunner().invoke(main, ["profile", "--load", str(file)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    at = lines.index(next(line for line in lines if line.startswith("ms per forward after 1024 tokens")))
    assert lines[at].split()[-5:] == ["1", "4", "16", "32", "64"]
    assert lines[at + 1].split() == ["target", "5.0", "5.2", "6.4", "9.0", "14.2"]


@pytest.mark.parametrize("command", [["profile", "--load"], ["generate", "--prompt", "x", "--profile"]])
def test_a_bad_profile_file_fails_before_any_model_loads(tmp_path, command):
    file = tmp_path / "costs.json"
    file.write_text('{"models": {}}')
    result = CliRunner().invoke(main, [*command, str(file)])
    assert result.exit_code == 2
    assert result.output.startswith(f"error: {file} is not a cost profile (ValueError: no model")
    assert "Traceback" not in result.output


def test_auto_router_takes_the_costs_a_profile_file_names(tmp_path):
    from specrouter.router import auto_router

    pool, (target, mid, small) = _pool_of_family(tmp_path)
    file = tmp_path / "gpu.json"
    file.write_text(json.dumps(GPU_PROFILE))
    router = auto_router(pool, None, ["small", "mid", "target"], profile_dir=tmp_path, progress=False,
                         profile_file=file)
    assert router.costs.profile.tables["target"] == {1: 0.004, 2: 0.0041, 4: 0.0042, 8: 0.0045, 16: 0.005, 32: 0.006}
    assert target.decode_calls == 0 and mid.decode_calls > 0  # the others are measured here


def test_router_config_flag_is_checked_before_any_model_loads(tmp_path):
    bad = tmp_path / "router.toml"
    bad.write_text("hysteresis = 2\n")
    result = CliRunner().invoke(main, ["generate", "--prompt", "x", "--router-config", str(bad)])
    assert result.exit_code == 2
    assert result.output == f"error: invalid router config {bad}: hysteresis: Input should be less than 1 (got 2)\n"
    result = CliRunner().invoke(main, ["generate", "--prompt", "x", "--chain", "ngram,qwen2.5-coder-1.5b",
                                       "--router-config", str(bad)])
    assert result.exit_code == 2
    assert result.output == "error: --router-config works with --chain auto: an explicit chain is not routed\n"
    result = CliRunner().invoke(main, ["simulate", str(tmp_path / "t.json"), "--record", str(tmp_path / "p.jsonl"),
                                       "--router-config", str(bad)])
    assert result.exit_code == 2 and "error: --router-config goes with a replay" in result.output


def test_explain_shows_what_the_router_config_changed():
    from pathlib import Path

    from specrouter.cascade.sampling import SamplingParams
    from specrouter.cli import _explain
    from specrouter.router.config import DEFAULT_CONFIG

    from .router_synth import family, make_router, seconds_per_token

    target, mid, small = family()
    config = DEFAULT_CONFIG.replace(hysteresis=0.1, draft_grid=(1, 2, 4))
    _, result = seconds_per_token(make_router(target, [small, mid], config=config), [target, mid, small],
                                  SamplingParams(), 30)
    lines = _explain(result, config, Path("r.toml")).splitlines()
    assert lines[1] == ("   config (r.toml): draft_grid = [1, 2, 4], hysteresis = 0.1; every other key at its "
                        "default (docs/router.md)")
    assert _explain(result, DEFAULT_CONFIG).splitlines()[1] == "   config: the defaults (docs/router.md)"


def test_auto_router_builds_everything_with_the_config(tmp_path):
    from specrouter.router import auto_router
    from specrouter.router.config import DEFAULT_CONFIG

    pool, _ = _pool_of_family(tmp_path)
    config = DEFAULT_CONFIG.replace(shrink=3.0, cost_alpha=0.5, profile_repeats=2)
    router = auto_router(pool, None, ["small", "mid", "target"], profile_dir=tmp_path, progress=False, config=config)
    assert router.config is config and router.acceptance.config is config and router.costs.config is config
    assert router.acceptance.shrink == 3.0 and router.session().acceptance.config is config

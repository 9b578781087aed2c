"""The router benchmark's pure parts: summaries, acceptance fit, predictor error, report, plots."""

from __future__ import annotations

import pytest

from benchmarks.args import profile_line
from benchmarks.plots import write_plots
from benchmarks.report import markdown
from benchmarks.chains import run_order
from benchmarks.summary import (baseline_drift, baseline_speeds, error_table, fit_acceptance, pair_inputs,
                                predictor_errors, ratio_table, ratio_to_baseline, summarise)
from benchmarks.sweep import best_lengths
from specrouter.router.estimates.costs import CostProfile
from specrouter.router.policy.predictor import expected_tokens

TARGET = "qwen2.5-coder-1.5b"


def _run(method, dataset, prompt, mode, tps, same=True, **extra):
    tokens = 32
    return {"dataset": dataset, "prompt": prompt, "mode": mode, "method": method, "tokens": tokens,
            "seconds": tokens / tps, "tokens_per_second": tps, "cycles": tokens,
            "same_as_target": same if mode == "greedy" else None, "accepted_per_block": [],
            "chains_used": [method], **extra}


def _fixed(method, dataset, prompt, mode, tps, chain, lengths, pairs, accepted):
    return _run(method, dataset, prompt, mode, tps, chain=chain, draft_lengths=lengths, pairs=pairs,
                accepted_per_block=accepted, prefill_seconds=0.5)


def _runs():
    runs = []
    for mode in ("greedy", "T=0.7"):
        for dataset in ("humaneval", "gsm8k"):
            for i, base in enumerate((10.0, 8.0, 12.0)):
                pid = f"{dataset}/{i}"
                runs.append(_fixed("target alone", dataset, pid, mode, base, [TARGET], [], [], []))
                runs.append(_fixed("ngram -> 1.5b", dataset, pid, mode, base * 0.8, ["ngram", TARGET], [2],
                                   [{"proposed": 10, "accepted": 5, "requested": 20, "blocks": 10}], [0.5]))
                runs.append(_run("auto", dataset, pid, mode, base * 0.98, same=i != 1,
                                 chains_per_cycle=[0, 0, 1, 0], chain_labels=["1.5b", "ngram -> 1.5b [2]"]))
    return runs


def test_summary_ratios_per_prompt_dataset_and_mode():
    summary = summarise(_runs())
    s = summary["auto | humaneval | greedy"]
    assert s["median_ratio_to_target"] == pytest.approx(0.98)
    assert s["median_tokens_per_second"] == pytest.approx(9.8)
    assert s["identical_outputs"] == "2/3"
    assert summary["auto | all | T=0.7"]["identical_outputs"] is None  # sampled output has no reference
    assert summary["ngram -> 1.5b | gsm8k | T=0.7"]["mean_accepted_per_block"] == [0.5]
    assert ratio_table(summary)["ngram -> 1.5b"]["all | greedy"] == pytest.approx(0.8)


@pytest.mark.parametrize("a", [0.0, 0.3, 0.7, 0.95])
@pytest.mark.parametrize("m", [1, 3, 6])
def test_fit_acceptance_inverts_expected_accepted_per_block(a, m):
    assert fit_acceptance(expected_tokens(a, m) - 1, m) == pytest.approx(a, abs=1e-6)


def test_fit_acceptance_edges():
    assert fit_acceptance(4.0, 4.0) == 1.0
    assert fit_acceptance(0.0, 4.0) == 0.0


def test_pair_inputs_fill_is_proposed_over_requested():
    rates, fills = pair_inputs([{"proposed": 10, "accepted": 5, "requested": 20, "blocks": 10}])
    assert fills == [0.5]
    assert rates[0] == pytest.approx(fit_acceptance(0.5, 2.0))


def test_predictor_error_of_target_alone_is_its_one_token_cost():
    runs = [_fixed("target alone", "gsm8k", "p", "greedy", 10.0, [TARGET], [], [], [])]
    # 32 tokens in 3.2 s with 0.5 s prefill: 84.4 ms per decoded token; the cost says 100 ms.
    errors = predictor_errors(runs, lambda name, n: 0.1 * n)
    assert errors[0]["measured_ms"] == pytest.approx(84.38, abs=0.01)
    assert errors[0]["relative_error"] == pytest.approx((100 - 84.375) / 84.375, abs=1e-3)
    table = error_table(errors)
    assert table["all"]["runs"] == 1 and table["target alone"]["median_signed_error"] > 0


def test_best_lengths_takes_the_fastest_per_method():
    rows = [{"method": "a", "draft_lengths": [1], "tokens_per_second": 5.0},
            {"method": "a", "draft_lengths": [3], "tokens_per_second": 6.0},
            {"method": "b", "draft_lengths": [2, 2], "tokens_per_second": 1.0}]
    assert best_lengths(rows) == {"a": (3,), "b": (2, 2)}


def test_markdown_and_plots(tmp_path):
    runs = _runs()
    cost = lambda name, n: 0.0 if name == "ngram" else 0.08 + 0.02 * n  # noqa: E731
    errors = predictor_errors(runs, cost)
    summary = summarise(runs)
    result = {
        "machine": {"date": "2026-12-01 10:00 UTC", "cpu": "cpu", "cores": 2, "python": "3.11",
                    "llama_cpp_python": "0.3.36", "command": "python -m benchmarks.chains"},
        "settings": {"per_dataset": 3, "max_tokens": 32, "datasets": ["humaneval", "gsm8k"],
                     "modes": ["greedy", "T=0.7"], "sweep_per_dataset": 1, "sweep_tokens": 8,
                     "grid": {"ngram -> 1.5b": [[1], [2]]}, "native_n_ctx": 2048, "n_threads": 2},
        "phase_seconds": {"setup": 10.0, "sweep": 20.0, "main": 30.0},
        "methods": {"target alone": {"chain": [TARGET], "draft_lengths": []},
                    "ngram -> 1.5b": {"chain": ["ngram", TARGET], "draft_lengths": [2]},
                    "auto": {"chain": "auto", "draft_lengths": "chosen per cycle"}},
        "native_error": "RuntimeError: no",
        "sweep": [{"method": "ngram -> 1.5b", "draft_lengths": [2], "tokens": 8, "seconds": 1.0,
                   "tokens_per_second": 8.0}],
        "forward_ms": {TARGET: {1: 70.0, 2: 110.0}},
        "runs": runs, "summary": summary, "ratios": ratio_table(summary),
        "predictor_errors": errors, "predictor_error_table": error_table(errors),
    }
    result["plots"] = write_plots(result, tmp_path, "router-test")
    assert all((tmp_path / name).read_bytes()[:4] == b"\x89PNG" for name in result["plots"])
    md = markdown(result)
    assert "`auto` meets >= 0.97x" in md
    assert "could not run: RuntimeError: no" in md
    assert "| ngram -> 1.5b | [2] | 8 | 1.0 | 8.0 | **chosen** |" in md
    assert "![router-test-auto-chains.png](router-test-auto-chains.png)" in md


def test_auto_only_report_has_no_sweep_and_no_predictor_table(tmp_path):
    runs = [r for r in _runs() if r["method"] in ("target alone", "auto")]
    summary = summarise(runs)
    result = {
        "machine": {"date": "2026-12-01 10:00 UTC", "cpu": "cpu", "cores": 2, "python": "3.11",
                    "llama_cpp_python": "0.3.36", "command": "python -m benchmarks.chains --auto-only"},
        "settings": {"auto_only": True, "per_dataset": 3, "max_tokens": 32, "datasets": ["humaneval", "gsm8k"],
                     "modes": ["greedy", "T=0.7"], "sweep_per_dataset": 1, "sweep_tokens": 8, "grid": {},
                     "native_n_ctx": 2048, "n_threads": 2},
        "phase_seconds": {"setup": 10.0, "sweep": 0.0, "main": 30.0},
        "methods": {"target alone": {"chain": [TARGET], "draft_lengths": []},
                    "auto": {"chain": "auto", "draft_lengths": "chosen per cycle"}},
        "native_error": "not run (--auto-only)", "sweep": [], "forward_ms": {TARGET: {1: 70.0}},
        "runs": runs, "summary": summary, "ratios": ratio_table(summary),
        "predictor_errors": [], "predictor_error_table": {},
    }
    result["plots"] = write_plots(result, tmp_path, "router-auto-test")
    md = markdown(result)
    assert md.startswith("# Router benchmark: auto only vs the target alone")
    assert "## Draft-length sweep" not in md and "## Predictor error" not in md and "Draft lengths" not in md
    assert "`auto` meets >= 0.97x" in md and "Auto-only check (`--auto-only`)" in md


def test_report_names_each_miss_and_the_noise_of_target_only_auto_runs(tmp_path):
    runs = _runs()
    for r in runs:
        if r["method"] == "auto":
            r["chains_used"] = [TARGET]  # routed, but never left the target alone
            if r["dataset"] == "gsm8k" and r["mode"] == "greedy":
                r["tokens_per_second"] *= 0.9
    result = {"runs": runs, "ratios": ratio_table(summarise(runs)),
              "methods": {"target alone": {"chain": [TARGET]}}}
    from benchmarks.report import _ratios

    text = _ratios(result)
    assert "`auto` is under 0.97x on 1 of 4 datasets and modes: gsm8k, greedy 0.882." in text
    assert ("Control: 12 auto runs never left the target alone; their ratio to the baseline: median 0.980, "
            "range 0.882-0.980 (middle 80%: 0.882-0.980).") in text
    assert "Noise:" not in text  # one target-alone run per prompt: no drift to report


def test_the_target_alone_run_twice_is_pooled_and_its_drift_reported():
    runs = _runs()
    # A second target-alone run per prompt and mode, 20% slower than the first (8 s vs 10 s
    # of the same work): the baseline is total tokens over total seconds, not a mean of speeds.
    runs += [{**r, "tokens_per_second": r["tokens_per_second"] * 0.8, "seconds": r["seconds"] / 0.8}
             for r in _runs() if r["method"] == "target alone"]
    base = baseline_speeds(runs)
    assert base[("humaneval", "humaneval/0", "greedy")] == pytest.approx(64 / (3.2 + 4.0))
    assert baseline_drift(runs) == pytest.approx([0.8] * 12)
    auto = next(r for r in runs if r["method"] == "auto")
    assert ratio_to_baseline(auto, base) == pytest.approx(9.8 / (64 / 7.2))
    from benchmarks.report import _ratios

    result = {"runs": runs, "ratios": ratio_table(summarise(runs)), "methods": {"target alone": {"chain": [TARGET]}}}
    assert ("Noise: the target alone's last run over its first on the same prompt: median 0.800, range "
            "0.800-0.800") in _ratios(result)


def test_run_order_puts_the_target_alone_first_and_last_and_rotates_the_rest():
    methods = ["target alone", "a", "b", "auto"]
    orders = [run_order(methods, turn) for turn in range(6)]
    assert orders[0] == ["target alone", "a", "b", "auto", "target alone"]
    assert orders[1] == ["target alone", "b", "auto", "a", "target alone"]
    assert orders[3] == orders[0]
    # Over a full rotation every method takes every place between the two baseline runs.
    assert {o.index("auto") for o in orders[:3]} == {1, 2, 3}


def test_scaled_predictor_error_uses_the_target_alones_speed_on_that_prompt():
    pair = [{"proposed": 20, "accepted": 10, "requested": 20, "blocks": 10}]
    runs = [_fixed("target alone", "gsm8k", "p", "greedy", 10.0, [TARGET], [], [], []),
            _fixed("0.5b -> 1.5b", "gsm8k", "p", "greedy", 12.0, ["small", TARGET], [2], pair, [1.0])]

    def cost(name, n):
        return 0.1 * n if name == TARGET else 0.01 * n

    errors = {e["method"]: e for e in predictor_errors(runs, cost)}
    # The target alone: 84.375 ms measured per token, 100 predicted -> the machine ran at 0.84375.
    factor = 84.375 / 100
    chain = errors["0.5b -> 1.5b"]
    assert chain["machine_factor"] == pytest.approx(factor, abs=1e-4)
    expected = abs(chain["predicted_ms"] * factor - chain["measured_ms"]) / chain["measured_ms"]
    assert chain["scaled_relative_error"] == pytest.approx(expected, abs=1e-3)
    assert "scaled_relative_error" not in errors["target alone"]
    assert error_table(list(errors.values()))["target alone"]["median_scaled_relative_error"] is None


def test_a_report_states_the_profile_its_router_started_from():
    profile = CostProfile({"t": {1: 0.025, 2: 0.04, 4: 0.0758, 16: 0.1497, 64: 0.4335}, "d": {1: 0.01}}).as_dict()
    assert profile_line(profile, "t", "auto") == (
        "auto started from t's profile 25.0 / 75.8 / 149.7 / 433.5 ms for 1 / 4 / 16 / 64 tokens "
        "(`profile` in the JSON: every size and model).")
    assert profile_line(profile, "d", "auto (suffix)", key="profiles") == (
        "auto (suffix) started from d's profile 10.0 ms for 1 token (`profiles` in the JSON: every size and model).")
    assert profile_line(profile, "x", "auto") == "auto started from a profile that did not time x."

"""Pure numbers from benchmark runs: medians and ratios per method, dataset and mode, and
the predictor's error against measured decode speed. No models, no timing here.

A run is a dict as benchmarks.chains records it: dataset, prompt, mode, method,
tokens, seconds, tokens_per_second, same_as_target, accepted_per_block, chains_used,
and for fixed chains `chain`, `draft_lengths`, `pairs` (per adjacent level pair the
counts the predictor needs) and `prefill_seconds`.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Iterable

from specrouter.router.policy.predictor import ChainSpec, predict

BASELINE = "target alone"


def _unique(values: Iterable) -> list:
    return list(dict.fromkeys(values))


def _key(run: dict) -> tuple:
    return run["dataset"], run["prompt"], run["mode"]


def _baseline_runs(runs: list[dict]) -> dict[tuple, list[dict]]:
    """The target alone's runs per (dataset, prompt, mode), in run order (first and last of
    the prompt's turn)."""
    grouped: dict[tuple, list[dict]] = {}
    for r in runs:
        if r["method"] == BASELINE:
            grouped.setdefault(_key(r), []).append(r)
    return grouped


def baseline_speeds(runs: list[dict]) -> dict[tuple, float]:
    """The target alone's tokens/s per (dataset, prompt, mode): its runs there pooled, total
    tokens over total seconds."""
    return {k: sum(r["tokens"] for r in rs) / sum(r["seconds"] for r in rs) for k, rs in _baseline_runs(runs).items()}


def baseline_drift(runs: list[dict]) -> list[float]:
    """Per (dataset, prompt, mode) with two target-alone runs: the second's tokens/s over
    the first's. The same work twice, minutes apart: the noise floor of any ratio here."""
    return [rs[-1]["tokens_per_second"] / rs[0]["tokens_per_second"]
            for rs in _baseline_runs(runs).values() if len(rs) >= 2]


def ratio_to_baseline(run: dict, baseline: dict[tuple, float]) -> float:
    return run["tokens_per_second"] / baseline[_key(run)]


def routed_chains(runs: list[dict], key: Callable[[dict], str | None]) -> dict[str, dict[str, int]]:
    """Per key(run) (None: a run not counted) of routed runs: cycles per chain they ran, most
    used first (chains_per_cycle holds the index of each cycle's chain in chain_labels)."""
    out: dict[str, Counter] = {}
    for r in runs:
        k = key(r)
        if k is not None:
            out.setdefault(k, Counter()).update(r["chain_labels"][i] for i in r["chains_per_cycle"])
    return {k: dict(v.most_common()) for k, v in out.items()}


def summarise(runs: list[dict]) -> dict[str, dict]:
    """Per 'method | dataset | mode' (dataset 'all' pools the datasets): median tok/s, median
    per-prompt ratio to the target alone, mean accepted per block, greedy identical outputs."""
    baseline = baseline_speeds(runs)
    out = {}
    for mode in _unique(r["mode"] for r in runs):
        for method in _unique(r["method"] for r in runs):
            for dataset in ("all", *_unique(r["dataset"] for r in runs)):
                rows = [r for r in runs if r["method"] == method and r["mode"] == mode
                        and dataset in ("all", r["dataset"])]
                if rows:
                    out[f"{method} | {dataset} | {mode}"] = _summary(rows, baseline)
    return out


def _summary(rows: list[dict], baseline: dict) -> dict:
    depth = len(rows[0]["accepted_per_block"])
    compared = [r["same_as_target"] for r in rows if r["same_as_target"] is not None]
    return {
        "median_tokens_per_second": round(statistics.median(r["tokens_per_second"] for r in rows), 2),
        "median_ratio_to_target": round(statistics.median(ratio_to_baseline(r, baseline) for r in rows), 3),
        "mean_accepted_per_block": [round(statistics.fmean(r["accepted_per_block"][i] for r in rows), 2)
                                    for i in range(depth)],
        # Only greedy output has one right answer to compare with.
        "identical_outputs": f"{sum(compared)}/{len(compared)}" if compared else None,
        "chains_used": sorted({c for r in rows for c in r["chains_used"]}),
    }


def ratio_table(summary: dict[str, dict]) -> dict[str, dict[str, float]]:
    """method -> {'dataset | mode': median ratio to the target alone}."""
    table: dict[str, dict[str, float]] = {}
    for key, s in summary.items():
        method, dataset, mode = key.split(" | ")
        table.setdefault(method, {})[f"{dataset} | {mode}"] = s["median_ratio_to_target"]
    return table


# Predictor error ---------------------------------------------------------------------
def fit_acceptance(accepted_per_block: float, requested_per_block: float) -> float:
    """The per-position rate a of the predictor's i.i.d. model whose expected accepted
    tokens per block, a + a^2 + ... + a^m (m = proposals asked per block), equals the
    measured mean: the acceptance of a run in the predictor's own terms."""
    m = requested_per_block
    if m <= 0 or accepted_per_block <= 0:
        return 0.0
    if accepted_per_block >= m:
        return 1.0

    def expected(a: float) -> float:
        return a * (1 - a**m) / (1 - a)

    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected(mid) < accepted_per_block else (lo, mid)
    return (lo + hi) / 2


def pair_inputs(pairs: list[dict]) -> tuple[list[float], list[float]]:
    """Acceptance rate and fill per adjacent level pair, from a run's block counts."""
    rates, fills = [], []
    for p in pairs:
        blocks, requested = p["blocks"], p["requested"]
        rates.append(fit_acceptance(p["accepted"] / blocks, requested / blocks) if blocks else 0.0)
        fills.append(p["proposed"] / requested if requested else 1.0)
    return rates, fills


def predicted_seconds_per_token(run: dict, cost: Callable[[str, float], float]) -> float:
    names, ks = tuple(run["chain"]), tuple(run["draft_lengths"])
    rates, fills = pair_inputs(run["pairs"])
    index = {(names[j], names[j + 1]): j for j in range(len(names) - 1)}
    spec = ChainSpec(names, ks)
    return predict(spec, cost, lambda j, i: rates[index[(j, i)]], lambda j, i: fills[index[(j, i)]]).seconds_per_token


def measured_seconds_per_token(run: dict) -> float:
    """Decode time per token: the prompt's prefill is not what the predictor models."""
    return (run["seconds"] - run["prefill_seconds"]) / run["tokens"]


def machine_factors(runs: list[dict], cost: Callable[[str, float], float]) -> dict[tuple, float]:
    """Per (dataset, prompt, mode): the target alone's measured decode time per token over
    its predicted one (its runs there pooled). The profile is measured on an idle machine
    at a short context; this is how much slower the machine ran beside those runs."""
    factors = {}
    for k, rs in _baseline_runs(runs).items():
        rs = [r for r in rs if "pairs" in r and r["tokens"]]
        predicted = sum(predicted_seconds_per_token(r, cost) for r in rs)
        if predicted > 0:
            factors[k] = sum(measured_seconds_per_token(r) for r in rs) / predicted
    return factors


def predictor_errors(runs: list[dict], cost: Callable[[str, float], float]) -> list[dict]:
    """Per fixed-chain run: predicted and measured decode ms/token and the relative error;
    for chains, also the error once every cost is scaled by the prompt's machine factor
    (the prediction is linear in the costs, so the scaled prediction is factor x predicted)."""
    factors = machine_factors(runs, cost)
    out = []
    for r in runs:
        if "pairs" not in r or not r["tokens"]:
            continue
        predicted, measured = predicted_seconds_per_token(r, cost), measured_seconds_per_token(r)
        entry = {"method": r["method"], "dataset": r["dataset"], "mode": r["mode"], "prompt": r["prompt"],
                 "predicted_ms": round(predicted * 1e3, 2), "measured_ms": round(measured * 1e3, 2),
                 "relative_error": round(abs(predicted - measured) / measured, 4),
                 "signed_error": round((predicted - measured) / measured, 4)}
        factor = factors.get(_key(r))
        if r["pairs"] and factor is not None:  # the target alone would be compared with itself
            scaled = predicted * factor
            entry["machine_factor"] = round(factor, 4)
            entry["scaled_relative_error"] = round(abs(scaled - measured) / measured, 4)
        out.append(entry)
    return out


def error_table(errors: list[dict]) -> dict[str, dict]:
    """Per method and overall: median relative error (per mode and pooled), median signed error."""
    table = {}
    for method in (*_unique(e["method"] for e in errors), "all"):
        rows = [e for e in errors if method in ("all", e["method"])]
        entry = {"runs": len(rows),
                 "median_predicted_ms": round(statistics.median(e["predicted_ms"] for e in rows), 1),
                 "median_measured_ms": round(statistics.median(e["measured_ms"] for e in rows), 1),
                 "median_relative_error": round(statistics.median(e["relative_error"] for e in rows), 3),
                 "median_signed_error": round(statistics.median(e["signed_error"] for e in rows), 3)}
        scaled = [e["scaled_relative_error"] for e in rows if "scaled_relative_error" in e]
        entry["median_scaled_relative_error"] = round(statistics.median(scaled), 3) if scaled else None
        for mode in _unique(e["mode"] for e in errors):
            per_mode = [e["relative_error"] for e in rows if e["mode"] == mode]
            entry[f"median_relative_error | {mode}"] = round(statistics.median(per_mode), 3) if per_mode else None
        table[method] = entry
    return table

"""The markdown report of a router benchmark result (see benchmarks.chains)."""

from __future__ import annotations

import statistics

from benchmarks.summary import BASELINE, baseline_drift, baseline_speeds, ratio_to_baseline

AUTO_FLOOR = 0.97  # what auto must reach against the target alone on every dataset and mode


def markdown(result: dict) -> str:
    sections = [_header(result), _ratios(result), _details(result)]
    if not result["settings"].get("auto_only"):  # auto-only: no sweep and no fixed chain to predict
        sections += [_sweep(result), _predictor(result)]
    sections += [_forward(result), _plots(result), _notes(result)]
    return "\n\n".join(sections) + "\n"


def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _header(result: dict) -> str:
    m, s = result["machine"], result["settings"]
    total = sum(result["phase_seconds"].values()) / 60
    phases = ", ".join(f"{k} {v / 60:.1f}" for k, v in result["phase_seconds"].items())
    compared = "auto only" if s.get("auto_only") else "static chains, llama.cpp prompt lookup and auto"
    return (f"# Router benchmark: {compared} vs the target alone ({m['date']})\n\n"
            f"Machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}, llama-cpp-python {m['llama_cpp_python']}, "
            f"{s['n_threads']} threads. Command: `{m['command']}`. Run time {total:.1f} min ({phases}).\n\n"
            f"{s['per_dataset']} prompts each of {', '.join(s['datasets'])} (HumanEval as raw completion, GSM8K and "
            f"MT-Bench first turn through the chat template), {s['max_tokens']} new tokens, modes {', '.join(s['modes'])} "
            "(temperature 0.7: no top-k/top-p, one seed per prompt for every method). " + _order(result)
            + " Tokens/s is wall time of the whole generation, prompt included."
            + (f" Router at the start: {s['router_start']}." if "router_start" in s else "")
            + (f" Auto's lookup drafter: {s['lookup']}"
               + (f" (its cross-request memory held {s['memory_tokens']:,} tokens at the end)."
                  if s.get("memory_tokens") is not None else ".") if "lookup" in s else "")
            + (" Kernels: exact for every llama.cpp model, the target alone included "
               "(docs/cascade-and-exactness.md: greedy output of every method must equal the target alone's)."
               if s.get("exact") else ""))


def _order(result: dict) -> str:
    if any("position" in r for r in result["runs"]):
        return ("Per prompt and mode the target alone runs first and last (its speed there: both runs pooled, the "
                "reference of every ratio) and every other method once in between, in an order rotated by one "
                "place from turn to turn.")
    return "One run per prompt, mode and method, methods interleaved per prompt (target alone first, auto last)."


def _ratios(result: dict) -> str:
    ratios = result["ratios"]
    columns = list(next(iter(ratios.values())))
    rows = [[method, *(values.get(c, "") for c in columns)] for method, values in ratios.items()]
    auto = {c: v for c, v in ratios.get("auto", {}).items() if not c.startswith("all")}
    verdict = ""
    if auto:
        worst = min(auto, key=auto.get)
        under = {c: v for c, v in auto.items() if v < AUTO_FLOOR}
        if under:
            verdict = (f"\n\n`auto` is under {AUTO_FLOOR}x on {len(under)} of {len(auto)} datasets and modes: "
                       + "; ".join(f"{c.replace(' | ', ', ')} {v}" for c, v in under.items()) + ".")
        else:
            verdict = f"\n\n`auto` meets >= {AUTO_FLOOR}x on every dataset and mode (lowest: {auto[worst]} on {worst})."
        verdict += _noise(result)
    # Column keys are "dataset | mode": a pipe would split the markdown cell.
    header = ["method", *(c.replace(" | ", ", ") for c in columns)]
    return "## Median ratio to the target alone (per prompt)\n\n" + _table(header, rows) + verdict


def _spread(values: list[float]) -> str:
    values = sorted(values)
    tenth = len(values) // 10
    return (f"median {statistics.median(values):.3f}, range {values[0]:.3f}-{values[-1]:.3f} "
            f"(middle 80%: {values[tenth]:.3f}-{values[-1 - tenth]:.3f})")


def _noise(result: dict) -> str:
    """Two measures of what one run's noise does to a ratio on this machine: the target
    alone's second run over its first, and auto runs that never left the target alone
    (the baseline's work plus the router's bookkeeping) against the baseline."""
    runs = result["runs"]
    target = result["methods"][BASELINE]["chain"][-1]
    base = baseline_speeds(runs)
    ratios = [ratio_to_baseline(r, base) for r in runs if r["method"] == "auto" and set(r["chains_used"]) == {target}]
    drift = baseline_drift(runs)
    out = ""
    if len(drift) >= 5:
        out += f" Noise: the target alone's last run over its first on the same prompt: {_spread(drift)}."
    if len(ratios) >= 5:
        out += (f" Control: {len(ratios)} auto runs never left the target alone; their ratio to the baseline: "
                f"{_spread(ratios)}.")
    return out


def _details(result: dict) -> str:
    rows = []
    for key, s in result["summary"].items():
        method, dataset, mode = key.split(" | ")
        rows.append([method, dataset, mode, s["median_tokens_per_second"], s["median_ratio_to_target"],
                     s["mean_accepted_per_block"] or "", s["identical_outputs"] or "n/a", "; ".join(s["chains_used"])])
    lengths = "; ".join(f"{m}: {v['draft_lengths']}" for m, v in result["methods"].items()
                        if m not in (BASELINE, "auto"))
    return ("## Per method, dataset and mode\n\n"
            + (f"Draft lengths (from the sweep): {lengths}. " if lengths else "")
            + "\"accepted per block\": mean tokens the level above accepted per verification block, per "
            "proposing level (bottom first). \"greedy output = target\": identical over all generated tokens.\n\n"
            + _table(["method", "dataset", "mode", "median tok/s", "median ratio to target", "accepted per block",
                      "greedy output = target", "chains run"], rows))


def _sweep(result: dict) -> str:
    s = result["settings"]
    chosen = {m: v["draft_lengths"] for m, v in result["methods"].items()}
    rows = [[r["method"], r["draft_lengths"], r["tokens"], r["seconds"], r["tokens_per_second"],
             "**chosen**" if chosen.get(r["method"]) == r["draft_lengths"] else ""] for r in result["sweep"]]
    return ("## Draft-length sweep\n\n"
            f"Greedy, {s['sweep_tokens']} new tokens, the first {s['sweep_per_dataset']} prompt(s) of each dataset, "
            "configurations interleaved per prompt; tokens/s = tokens / seconds summed over those prompts.\n\n"
            + _table(["method", "draft lengths", "tokens", "seconds", "tokens/s", ""], rows))


def _predictor(result: dict) -> str:
    table = result["predictor_error_table"]
    modes = result["settings"]["modes"]
    rows = [[method, e["runs"], e["median_predicted_ms"], e["median_measured_ms"],
             *(e.get(f"median_relative_error | {m}", "") for m in modes), e["median_relative_error"],
             e["median_signed_error"], e.get("median_scaled_relative_error") or ""] for method, e in table.items()]
    return ("## Predictor error\n\n"
            "Per fixed-chain run of the main comparison: `specrouter.router.policy.predictor.predict` at the chain's draft "
            "lengths, with the profiled forward costs (the router's cached profile) and, per level pair, the "
            "acceptance measured in that run (the per-position rate whose expected accepted tokens per block, "
            "a + ... + a^m with m the proposals asked per block, equals the run's mean) and fill (proposals given / "
            "asked), against the measured decode time per token (wall time minus each model's prefill of the "
            "prompt, timed separately). Relative error |predicted - measured| / measured; signed error > 0 means "
            "the predictor is slower than reality. Scaled: every cost times the prompt's machine factor (the target "
            "alone's measured decode time per token beside the run over its profiled one): the predictor's error "
            "once the costs are at the machine's speed of the moment, as the router's online costs track it; not "
            "given for the target alone, whose factor it is.\n\n"
            + _table(["chain", "runs", "median predicted ms/token", "median measured ms/token",
                      *(f"median rel. error {m}" for m in modes), "median rel. error (all)", "median signed error",
                      "median rel. error, scaled"],
                     rows))


def _forward(result: dict) -> str:
    ks = list(next(iter(result["forward_ms"].values())))
    rows = [[name, *(row[k] for k in ks)] for name, row in result["forward_ms"].items()]
    return ("## Cost of one forward over k tokens\n\nms, median of 5, cached 64-token prefix.\n\n"
            + _table(["model", *(f"k={k}" for k in ks)], rows))


def _plots(result: dict) -> str:
    return "## Plots\n\n" + "\n\n".join(f"![{name}]({name})" for name in result.get("plots", []))


#: Prompts per dataset the router issue asks for; fewer is reported as a reduction.
FULL_PER_DATASET = 10


def _notes(result: dict) -> str:
    s = result["settings"]
    if s.get("auto_only"):
        scope = ("- Auto-only check (`--auto-only`): the target alone and auto, no sweep, no static chain, no "
                 f"llama.cpp prompt lookup; {s['per_dataset']} prompts per dataset: a check of auto's floor, not the "
                 "full comparison.\n")
    else:
        native = ("llama-cpp-python's prompt-lookup speculation ran (high-level `Llama` with "
                  "`LlamaPromptLookupDecoding`, logits for every position as it requires, "
                  f"n_ctx {s['native_n_ctx']}); it stops at EOS like the engine."
                  if result["native_error"] is None else
                  f"llama-cpp-python's prompt-lookup speculation could not run: {result['native_error']}.")
        main = ("the main comparison is not reduced." if s["per_dataset"] >= FULL_PER_DATASET else
                f"the main comparison too: {s['per_dataset']} prompts per dataset instead of {FULL_PER_DATASET}.")
        scope = (f"- {native}\n"
                 f"- Reduced to fit the time budget: the sweep uses {s['sweep_per_dataset']} prompt(s) per dataset, "
                 f"greedy only, {s['sweep_tokens']} new tokens, and a grid of {sum(len(g) for g in s['grid'].values())} "
                 f"configurations (listed above); {main}\n")
    return ("## Notes\n\n"
            + scope +
            "- Greedy divergences from the target come from llama.cpp evaluating a run of k tokens with other "
            "kernels than one token (near-ties of the top two logits flip); tests/real checks that they sit at "
            "near-ties, this benchmark does not.")

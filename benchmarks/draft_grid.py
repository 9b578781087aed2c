"""Draft lengths on the kernels' tiles: what a forward of n tokens costs the target, n = 1 to
69, and the router with its coarse draft lengths before (k = 10, 12, 16, 24, 32, 48, 64:
verified in forwards of 11, 13, 17, 25, 33, 49, 65 tokens, the profile timed to 32 and
interpolated or extrapolated at those) against now (k = 11, 15, 23, 31, 47, 63: forwards
of 12, 16, 24, 32, 48, 64 tokens, each one a size the profile times).

    python -m benchmarks draft-grid [--trace FILE] [--per-group 4] [--curve-repeats 3] [--stem NAME]

1. The cost curve: the target's forward over n tokens after 32 and after 512 cached tokens
   (profiler.time_forwards, --curve-repeats per size, medians).
2. Per request of the trace's first --per-group requests of each group (the committed copy
   trace by default: code editing, MT-Bench second turns, documents; its prompts, its
   max_tokens, greedy): the target alone first and last, between them, rotated from request
   to request, the fixed chains suffix -> target [15], [16], [63] and [64], and auto with
   the grids before and now (each a router of its own, fresh, serving the requests in
   order, over the trace's drafts and the suffix drafter). Both routers start from one
   profile measured at the start (PROFILE_NS, the default repeats) in a fresh folder; the
   router before takes it at the sizes it timed then (to 32; context table to 32).
   Timed from the first streamed text to the end (sim.simulate.decode_seconds: the prefill
   is outside). Ratio: the mean of the target alone's two runs over the method's.
Writes <stem>.json and .md to benchmarks/results/ (or --out).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from benchmarks.args import benchmark_parser, result_stem
from benchmarks.machine import machine_info
from benchmarks.output import RESULTS, write_result
from specrouter.cascade.chain import Chain
from specrouter.drafters import MODEL_FREE
from specrouter.pool import Pool
from specrouter.router import AcceptanceEstimator, OnlineCosts
from specrouter.router.build import build_router
from specrouter.router.estimates.costs import CostProfile
from specrouter.router.estimates.profiler import time_forwards
from specrouter.router.estimates.profile_cache import load_or_profile
from specrouter.router.config import DEFAULT_CONFIG
from specrouter.sim.simulate import decode_seconds
from specrouter.sim.trace import Trace

TRACE = RESULTS / "simulation-2026-12-05-epyc2-copy8-trace.json"
#: The grids and profiled sizes before this change (2026-12-05).
BEFORE_DRAFT_GRID = (*range(1, 9), 10, 12, 16, 24)
BEFORE_LOOKUP_GRID = (*BEFORE_DRAFT_GRID, 32, 48, 64)
BEFORE_PROFILE_NS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
BEFORE_CONTEXT_NS = (1, 4, 16, 32)
CURVE_NS = range(1, 70)
CURVE_CONTEXTS = (32, 512)
SHOWN_NS = (8, 9, 11, 12, 13, 15, 16, 17, 23, 24, 25, 31, 32, 33, 47, 48, 49, 63, 64, 65)
LOOKUP = "suffix"
ALONE, AUTO_BEFORE, AUTO_NOW = "target alone", "auto, grid before", "auto, grid now"


def before(profile: CostProfile) -> CostProfile:
    """The profile as the router before took it: timed at the sizes it timed then."""
    out = profile.copy()
    out.tables = {m: {n: s for n, s in t.items() if n in BEFORE_PROFILE_NS} for m, t in out.tables.items()}
    out.context_tables = {m: {n: s for n, s in t.items() if n in BEFORE_CONTEXT_NS}
                          for m, t in out.context_tables.items()}
    return out


def main(argv: Sequence[str] | None = None) -> None:
    ap = benchmark_parser("draft-grid", __doc__, trace=TRACE, per=("group", 4))
    ap.add_argument("--curve-repeats", type=int, default=3, help="timings per size of the cost curve (the median is kept)")
    args = ap.parse_args(argv)
    result = run(args.trace, args.per_group, args.curve_repeats)
    write_result(result, markdown, out=args.out, stem=result_stem(args, "draft-grid", result))


def run(trace_file: Path, per_group: int, curve_repeats: int) -> dict:
    """The cost curve, then every method on the trace's first `per_group` requests of each group."""
    started = time.time()
    trace = Trace.load(trace_file)
    requests = [r for g in trace.groups for r in [r for r in trace.requests if r.group == g][:per_group]]
    pool = Pool(n_ctx=4096, n_seq_max=1)
    target = pool.model(trace.target)
    drafts = [pool.model(d) for d in trace.drafts]
    curve = {}
    for context in CURVE_CONTEXTS:
        times = time_forwards(target, CURVE_NS, curve_repeats, context=context)
        curve[context] = {n: statistics.median(t) for n, t in times.items()}
    with tempfile.TemporaryDirectory() as fresh:
        profile = load_or_profile([*drafts, target], Path(fresh), progress=False)
    routers = {AUTO_BEFORE: build_router(target, drafts, OnlineCosts(before(profile)), AcceptanceEstimator(),
                                         lookup=LOOKUP, config=DEFAULT_CONFIG.replace(
                                             draft_grid=BEFORE_DRAFT_GRID, lookup_grid=BEFORE_LOOKUP_GRID)),
               AUTO_NOW: build_router(target, drafts, OnlineCosts(profile), AcceptanceEstimator(), lookup=LOOKUP)}
    fixed = {f"suffix [{k}]": k for k in (15, 16, 63, 64)}
    methods = [*fixed, *routers]
    rows = []
    for i, request in enumerate(requests):
        order = methods[i % len(methods):] + methods[:i % len(methods)]
        alone = [decode_seconds(Chain([target], []), request.prompt, trace.max_tokens)]
        runs = {}
        for method in order:
            chain = routers.get(method) or Chain([MODEL_FREE[LOOKUP](), target], [fixed[method]])
            runs[method] = decode_seconds(chain, request.prompt, trace.max_tokens)
        alone.append(decode_seconds(Chain([target], []), request.prompt, trace.max_tokens))
        reference = statistics.mean(s for s, _ in alone)
        text = alone[0][1].token_ids
        rows.append({"group": request.group, "id": request.id, "alone_seconds": [round(s, 4) for s, _ in alone],
                     "methods": {m: {"seconds": round(s, 4), "ratio": round(reference / s, 4),
                                     "same_text": r.token_ids == text,
                                     "chains": dict(Counter(f"{' -> '.join(n)} {list(k)}" for n, k in
                                                            (r.chains_used[c] for c in r.chains_per_cycle)))}
                                 for m, (s, r) in runs.items()}})
        print(request.group, request.id, {m: v["ratio"] for m, v in rows[-1]["methods"].items()}, flush=True)
    return {"machine": machine_info(), "trace": str(trace_file.name), "trace_note": trace.note,
            "max_tokens": trace.max_tokens,
            "grids": {"before": [BEFORE_DRAFT_GRID, BEFORE_LOOKUP_GRID], "now": [DEFAULT_CONFIG.draft_grid, DEFAULT_CONFIG.lookup_grid]},
            "profile": profile.as_dict(), "curve": {str(c): {str(n): s for n, s in t.items()} for c, t in curve.items()},
            "rows": rows, "methods": methods, "minutes": round((time.time() - started) / 60, 1)}


def markdown(result: dict) -> str:
    m = result["machine"]
    groups = list(dict.fromkeys(r["group"] for r in result["rows"]))
    shown = [str(n) for n in SHOWN_NS]
    lines = [f"# Draft lengths on the kernels' tiles ({m['date']})", "",
             f"Machine: {m['cpu']}, {m['cores']} cores. Command: `{m['command']}`. Run time "
             f"{result['minutes']} min. Trace {result['trace']} ({result['trace_note']}), {result['max_tokens']} new "
             "tokens, greedy. Timed from the first streamed text to the end; ratio: the target alone's mean "
             "(first and last run) over the method's; medians per request. Routers fresh, one profile measured "
             "at the start (the router before takes it at the sizes it timed then).", "",
             "## A forward of the target over n tokens (ms, median)", "",
             "| n | " + " | ".join(shown) + " |",
             "|---|" + "---|" * len(SHOWN_NS)]
    for context, table in result["curve"].items():
        lines.append(f"| after {context} | " + " | ".join(f"{table[n] * 1e3:.0f}" for n in shown) + " |")
    lines += ["", "## Median ratio to the target alone", "",
              "| method | all | " + " | ".join(groups) + " | same text as the target alone |",
              "|---|---|" + "---|" * len(groups) + "---|"]
    for method in result["methods"]:
        per = {g: [r["methods"][method]["ratio"] for r in result["rows"] if r["group"] == g] for g in groups}
        every = [x for v in per.values() for x in v]
        same = sum(r["methods"][method]["same_text"] for r in result["rows"])
        lines.append(f"| {method} | {statistics.median(every):.3f} | "
                     + " | ".join(f"{statistics.median(v):.3f}" for v in per.values()) + f" | {same}/{len(every)} |")
    lines += ["", "## Chains the routers ran (cycles, all requests)", ""]
    for method in (AUTO_BEFORE, AUTO_NOW):
        total = Counter()
        for r in result["rows"]:
            total.update(r["methods"][method]["chains"])
        lines.append(f"- {method}: " + ", ".join(f"{c} {n}" for c, n in total.most_common(10)))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

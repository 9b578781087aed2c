"""How fast could suffix drafting be on the copy workloads, and which draft-length policy gets
there: a replay of the target's own greedy text, on this machine's measured forward costs.

    python -m benchmarks copy-ceiling [--per-workload 10] [--max-tokens 256] [--stem NAME]
    python -m benchmarks copy-ceiling --measure benchmarks/results/NAME.json [--repeats 1]  # validation, real models
    python -m benchmarks copy-ceiling --render benchmarks/results/NAME.json    # report only

Recording (once, real models): per task of the copy workloads (benchmarks/workloads.py), the
target's greedy answer, and at every position i of it the suffix drafter's proposal of up to
MAX_DRAFT tokens over prompt + answer[:i] (its match length, support and candidates) and L_i,
how many of its tokens equal the answer's next ones: under greedy verification a block of k
proposals at i commits min(L_i, k) + 1 tokens (near-ties aside). Also the target's forward
cost t(n) for n = 1..65 tokens after a cached prefix (median of 3).

Replay (no model): a policy picks k at each cycle from what the drafter shows there (k = 0:
the target alone); the cycle costs t(k + 1) (t(1) alone) plus LOOKUP_MS and moves
min(L_i, k) + 1 tokens on. Speed-up = the target alone's time (t(1) per token) / the policy's.
No Python overhead, no prefill: an upper bound on what that policy would measure.
- oracle: the least total time over every choice of k per cycle (dynamic program over
  positions): the ceiling of any drafter that proposes these tokens.
- fixed k (any match, or matches of 4 tokens or more: llama.cpp's ngram-simple 4/16 drafts
  16 after a 4-token match).
- per match class (the router's classes 1, 2, 3, 4, 8, 16, 32), k chosen from statistics
  of the same run (in-sample: the best such a policy could learn): under the i.i.d. model
  (a = accepted / (accepted + rejections), E[G] = (1 - a^(k+1)) / (1 - a)) and under the
  positional model (E[G] = 1 + sum_{j<=k} P(L >= j)), per workload and pooled.
- auto, replayed: the real router (suffix level, no cross-request memory, fresh at the first
  task and warm after, tasks in order) over the recorded answers (backends/replay.py), its
  cost profile measured on the simulated clock. Its output must equal the recorded answer.

Validation (`--measure`, real models again): the same router setup and the target alone run
for real on the recorded prompts (per task: alone, then --repeats x (auto, alone)), timed
from the first token to the last (the replay prices no prefill), with the forward costs
measured again at the start of that run; the replay with those costs is set beside the
measured speed-ups, and the share of auto's cycles that drafted beside the replay's (its
choices compared; a real run whose text left the recorded one at a near-tie is counted as
it ran).
"""

from __future__ import annotations

import json
import statistics
import tempfile
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks.args import benchmark_parser, result_stem
from benchmarks.chains import TARGET
from benchmarks.copy_drafting import build_prompts
from benchmarks.machine import machine_info
from benchmarks.measure import forward_costs
from benchmarks.output import write_result
from benchmarks.workloads import WORKLOADS
from specrouter.cascade.chain import Chain
from specrouter.cascade.sampling import SamplingParams
from specrouter.backends.replay import ReplayBackend, Script
from specrouter.drafters.suffix import SuffixDrafter, SuffixIndex
from specrouter.engine import generate
from specrouter.engine.request import GenerationResult
from specrouter.pool import Pool
from specrouter.router import auto_router
from specrouter.router.estimates.acceptance import AcceptanceEstimator
from specrouter.router.estimates.costs import CostProfile, OnlineCosts
from specrouter.router.estimates.profiler import profile_model
from specrouter.router.session import Router
from specrouter.sim.simulate import drafted_cycles
from specrouter.sim.validate import decode_seconds

MAX_DRAFT = 64
LOOKUP_MS = 0.05
GRID = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 64)
COST_POINTS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 17, 24, 25, 32, 33, 48, 49, 64, 65)
#: One recorded position: (match length, support, candidates, tokens proposed, L).
Row = list[int]


def record(per_workload: int, max_tokens: int) -> dict:
    pool = Pool(n_ctx=4096, n_seq_max=1)
    try:
        target = pool.level(TARGET)
        costs = forward_costs(pool, [TARGET], COST_POINTS, repeats=3)[TARGET]
        tasks = []
        for workload, task_id, prompt in build_prompts(target, per_workload)[0]:
            r = generate(Chain([target], []), prompt, SamplingParams(), max_tokens)
            out = list(r.token_ids)
            # the answer ended at EOS (not in token_ids) rather than at max_tokens
            tasks.append({"workload": workload, "id": task_id, "prompt": prompt, "answer": out,
                          "eos": r.finish_reason == "stop", "rows": rows(prompt, out)})
    finally:
        pool.close()
    return {"costs_ms": costs, "tasks": tasks}


def measure(result: dict, repeats: int = 1) -> dict:
    """The validation run (module docstring): per task, the target alone, then `repeats`
    times auto and the target alone again (decode seconds), for real; the forward costs
    measured first. Per auto run also its cycles, the cycles it drafted in, and whether its
    text was the recorded answer (a near-tie may make it another)."""
    pool = Pool(n_ctx=4096, n_seq_max=1)
    try:
        target = pool.level(TARGET)
        costs = forward_costs(pool, [TARGET], COST_POINTS, repeats=7)[TARGET]
        with tempfile.TemporaryDirectory() as fresh:  # no saved profile or estimates
            router = auto_router(pool, TARGET, [TARGET], profile_dir=Path(fresh), progress=False, lookup="suffix")
            runs = []
            for task in result["tasks"]:
                n = len(task["answer"]) + task["eos"]
                alone = [decode_seconds(Chain([target], []), task["prompt"], n)[0]]
                auto = []
                for _ in range(repeats):
                    seconds, r = decode_seconds(router, task["prompt"], n)
                    auto.append({"seconds": seconds, **cycle_counts(r), "same": r.token_ids == task["answer"]})
                    alone.append(decode_seconds(Chain([target], []), task["prompt"], n)[0])
                runs.append({"workload": task["workload"], "id": task["id"], "alone": alone, "auto": auto})
    finally:
        pool.close()
    return {"machine": machine_info(), "costs_ms": costs, "repeats": repeats, "runs": runs}


def cycle_counts(r: GenerationResult) -> dict[str, int]:
    """A generation's cycles, and those whose chain drafted (more than the target alone)."""
    return {"cycles": r.cycles, "drafted": drafted_cycles(r)}


def validation(result: dict) -> dict[str, dict[str, float]]:
    """Per workload: the measured speed-up of auto (decode time; per task the mean of its
    alone runs and of its auto runs) and the replay's with the costs measured in the same
    run; where the run kept them, the share of auto's cycles that drafted, measured and
    replayed (the router's choices, compared), and how many of auto's real runs wrote the
    recorded answer."""
    measured = result["measured"]
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    cycles: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])  # drafted, cycles, same text, runs
    for run in measured["runs"]:
        auto = run["auto"] if isinstance(run["auto"], list) else [{"seconds": run["auto"]}]  # files before repeats
        for group in (run["workload"], "all"):
            sums[group][0] += statistics.fmean(run["alone"])
            sums[group][1] += statistics.fmean(a["seconds"] for a in auto)
            for a in auto:
                if "cycles" in a:
                    cycles[group][0] += a["drafted"]
                    cycles[group][1] += a["cycles"]
                    cycles[group][2] += a["same"]
                    cycles[group][3] += 1
    replayed, replayed_cycles = router_replay(result["tasks"], Costs(measured["costs_ms"]))
    out = {}
    for group, (alone, auto) in sums.items():
        out[group] = {"measured": round(alone / auto, 3), "replayed": replayed[group],
                      "error": round(replayed[group] / (alone / auto) - 1, 3)}
        if cycles[group][1]:
            drafted, total = replayed_cycles[group]
            out[group]["drafted_measured"] = round(cycles[group][0] / cycles[group][1], 3)
            out[group]["drafted_replayed"] = round(drafted / total, 3)
            out[group]["same_text"] = f"{cycles[group][2]}/{cycles[group][3]}"
    return out


def rows(prompt: list[int], out: list[int]) -> list[Row]:
    index, recorded = SuffixIndex(), []
    for i in range(len(out)):
        context = prompt + out[:i]
        index.sync(context)
        found = index.propose(context, MAX_DRAFT)
        run = 0
        for a, b in zip(found.tokens, out[i:]):
            if a != b:
                break
            run += 1
        recorded.append([found.match, found.support, found.candidates, len(found.tokens), run])
    return recorded


# Replay -----------------------------------------------------------------------------------------
class Costs:
    def __init__(self, ms: dict) -> None:
        self.points = sorted((int(n), float(v)) for n, v in ms.items())

    def __call__(self, n: int) -> float:
        """ms of a forward of n tokens, interpolated between the measured points."""
        for (a, ta), (b, tb) in zip(self.points, self.points[1:]):
            if a <= n <= b:
                return ta + (tb - ta) * (n - a) / (b - a)
        last, t = self.points[-1]
        return t * n / last


Policy = Callable[[Row], int]


def replay(rows: Sequence[Row], policy: Policy, t: Costs, lookup_ms: float = LOOKUP_MS) -> float:
    """ms to commit the whole recorded answer under `policy`."""
    i, total, n = 0, 0.0, len(rows)
    while i < n:
        match, _, _, proposed, run = rows[i]
        k = min(policy(rows[i]), proposed, n - i - 1) if match else 0
        if k <= 0:
            total, i = total + t(1), i + 1
        else:
            total, i = total + t(k + 1) + lookup_ms, i + min(run, k) + 1
    return total


def oracle(rows: Sequence[Row], t: Costs) -> float:
    n = len(rows)
    best = [0.0] * (n + 1)
    for i in range(n - 1, -1, -1):
        match, _, _, proposed, run = rows[i]
        value = t(1) + best[i + 1]
        for k in GRID if match else ():
            k = min(k, proposed, n - i - 1)
            if k > 0:
                value = min(value, t(k + 1) + LOOKUP_MS + best[min(n, i + min(run, k) + 1)])
        best[i] = value
    return best[0]


CLASSES = SuffixDrafter.match_classes


def match_class(row: Row) -> int:
    return max(c for c in CLASSES if c <= row[0])


def class_policies(rows: Sequence[Row], t: Costs) -> dict[str, dict[int, int]]:
    """k per match class, from these rows' statistics: i.i.d. and positional."""
    reached: dict[int, list[int]] = defaultdict(lambda: [0] * (MAX_DRAFT + 1))
    count, accepted, rejected = defaultdict(int), defaultdict(int), defaultdict(int)
    for row in rows:
        if row[0]:
            c = match_class(row)
            count[c] += 1
            accepted[c] += row[4]
            rejected[c] += row[4] < row[3]
            for j in range(1, row[4] + 1):
                reached[c][j] += 1
    out: dict[str, dict[int, int]] = {"i.i.d.": {}, "positional": {}}
    for c in count:
        a = accepted[c] / (accepted[c] + rejected[c])
        iid = {k: (1 - a ** (k + 1)) / (1 - a) if a < 1 else k + 1 for k in GRID}
        survival = [r / count[c] for r in reached[c]]
        positional = {k: 1 + sum(survival[1:k + 1]) for k in GRID}
        for name, tokens in (("i.i.d.", iid), ("positional", positional)):
            k, per_token = min(((k, (t(k + 1) + LOOKUP_MS) / e) for k, e in tokens.items()), key=lambda x: x[1])
            out[name][c] = k if per_token < t(1) else 0
    return out


def router_replay(tasks: list[dict], t: Callable[[int], float],
                  groups: Callable[[dict], Sequence[str]] = lambda task: (task["workload"],),
                  ) -> tuple[dict[str, float], dict[str, tuple[int, int]]]:
    """Per group (a task's workload, or what `groups` names for it; and "all"), the target
    alone's simulated time over auto's, replayed (module docstring); and auto's (drafted
    cycles, cycles) there. t(n): ms of a forward of n tokens."""
    target = ReplayBackend(TARGET, [Script(task["prompt"], task["answer"], task["eos"]) for task in tasks],
                           latency=lambda n: t(n) / 1e3)

    def clock() -> float:
        return target.simulated_seconds

    router = Router(target, [], OnlineCosts(CostProfile({target.name: profile_model(target, clock=clock)})),
                    AcceptanceEstimator(), lookup="suffix")
    seconds: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    cycles: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for i, task in enumerate(tasks):
        prompt, answer = target.play(i)
        n = len(answer) + task["eos"]
        for j, method in enumerate((Chain([target], []), router)):
            start = clock()
            r = generate(method, prompt, SamplingParams(), n, clock=clock)
            if r.token_ids != answer:
                raise AssertionError(f"{task['id']}: the replay did not reproduce the recorded answer")
            for group in (*groups(task), "all"):
                seconds[group][j] += clock() - start
                if method is router:
                    counts = cycle_counts(r)
                    cycles[group][0] += counts["drafted"]
                    cycles[group][1] += counts["cycles"]
    target.play(None)
    return ({group: round(alone / routed, 3) for group, (alone, routed) in seconds.items()},
            {group: (drafted, total) for group, (drafted, total) in cycles.items()})


def evaluate(result: dict) -> dict:
    t = Costs(result["costs_ms"])
    groups = {w: [task for task in result["tasks"] if task["workload"] == w] for w in WORKLOADS}
    groups["all"] = result["tasks"]
    pooled = class_policies([r for task in result["tasks"] for r in task["rows"]], t)
    table, chosen = {}, {}
    for name, tasks in groups.items():
        alone = sum(len(task["rows"]) * t(1) for task in tasks)

        def speedup(policy: Policy) -> float:
            return round(alone / sum(replay(task["rows"], policy, t) for task in tasks), 3)

        own = class_policies([r for task in tasks for r in task["rows"]], t)
        row = {"oracle": round(alone / sum(oracle(task["rows"], t) for task in tasks), 3)}
        for k in (4, 16, 32):
            row[f"fixed {k}"] = speedup(lambda r, k=k: k)
            row[f"fixed {k}, match >= 4"] = speedup(lambda r, k=k: k if r[0] >= 4 else 0)
        for model in ("i.i.d.", "positional"):
            row[f"per class, {model} (own stats)"] = speedup(lambda r, p=own[model]: p.get(match_class(r), 0))
            row[f"per class, {model} (pooled stats)"] = speedup(lambda r, p=pooled[model]: p.get(match_class(r), 0))
        table[name] = row
        chosen[name] = {model: {str(c): k for c, k in sorted(own[model].items())} for model in own}
    replayed = router_replay(result["tasks"], t)[0]
    for name, row in table.items():
        row["auto, replayed"] = replayed[name]
    return {"speedups": table, "draft_lengths": chosen}


def markdown(result: dict) -> str:
    m, s, ev = result["machine"], result["settings"], result["evaluation"]
    t = Costs(result["costs_ms"])
    methods = list(next(iter(ev["speedups"].values())))
    names = list(ev["speedups"])
    lines = [
        f"# Copy-drafting ceiling: replay of the target's greedy text ({m['date']})", "",
        f"Machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}, llama-cpp-python {m['llama_cpp_python']}. "
        f"Command: `{m['command']}`.", "",
        f"Target {s['target']} (q4 llama.cpp), greedy, {s['max_tokens']} new tokens, {s['per_workload']} tasks per "
        f"workload ({', '.join(WORKLOADS)}; MT-Bench first answers the target's own). Suffix drafter over the "
        "request's own text (no cross-request memory). Simulated time: the measured forward costs below, "
        f"{LOOKUP_MS} ms per lookup, no Python overhead or prefill (benchmarks/copy_ceiling.py says how).", "",
        "Forward of n tokens (ms): " + ", ".join(f"{n}: {t(n):.0f}" for n in (1, 2, 4, 8, 17, 33, 65)) + ".", "",
        "## Speed-up over the target alone (simulated)", "",
        "| policy | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|",
    ]
    lines += [f"| {method} | " + " | ".join(str(ev["speedups"][n][method]) for n in names) + " |" for method in methods]
    if "validation" in result:
        v, mm = result["validation"], result["measured"]["machine"]
        tm = Costs(result["measured"]["costs_ms"])
        lines += ["", f"## Validation: replayed against measured ({mm['date']}, {mm['cpu']})", "",
                  f"Command: `{mm['command']}`. Decode time (first token to last), per workload the sum over its "
                  f"tasks; per task the target alone first, then {result['measured'].get('repeats', 1)} x (auto, the "
                  "target alone), "
                  "each method's runs averaged. Forward of n tokens "
                  "in that run (ms): " + ", ".join(f"{n}: {tm(n):.0f}" for n in (1, 2, 4, 8, 17, 33, 65)) + ".", "",
                  "| workload | measured | replayed | replay error | cycles that drafted, measured / replayed | "
                  "auto runs that wrote the recorded answer |", "|---|---|---|---|---|---|"]
        lines += [f"| {g} | {r['measured']} | {r['replayed']} | {r['error']:+.1%} | "
                  + (f"{r['drafted_measured']:.1%} / {r['drafted_replayed']:.1%} | {r['same_text']} |"
                     if "drafted_measured" in r else "| |")
                  for g, r in v.items()]
    lines += ["", "## Draft length per match class (own stats; 0: the target alone)", "",
              "| workload | model | " + " | ".join(str(c) for c in CLASSES) + " |", "|---" * (len(CLASSES) + 2) + "|"]
    for name, models in ev["draft_lengths"].items():
        for model, ks in models.items():
            lines.append(f"| {name} | {model} | " + " | ".join(str(ks.get(str(c), "")) for c in CLASSES) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    ap = benchmark_parser("copy-ceiling", __doc__, per=("workload", 10), max_tokens=256, render=True, repeats=1,
                          repeats_help="--measure: runs of auto per task (each followed by the target alone)")
    ap.add_argument("--measure", type=Path, metavar="JSON",
                    help="run the validation on a saved result's prompts and add it to that result "
                         "(default stem: the file's)")
    args = ap.parse_args(argv)
    saved = args.render or args.measure
    if saved is not None:
        result = json.loads(saved.read_text())
        if args.measure:
            result["measured"] = measure(result, args.repeats)
        if "measured" in result:
            result["validation"] = validation(result)
    else:
        result = {"machine": machine_info(),
                  "settings": {"per_workload": args.per_group, "max_tokens": args.max_tokens, "target": TARGET,
                               "max_draft": MAX_DRAFT},
                  **record(args.per_group, args.max_tokens)}
    result["evaluation"] = evaluate(result)
    stem = args.stem or (saved.stem if saved is not None else result_stem(args, "copy-ceiling", result))
    write_result(result, markdown, out=args.out, stem=stem)


if __name__ == "__main__":
    main()

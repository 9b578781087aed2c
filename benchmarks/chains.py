"""The router benchmark: the target alone, every static chain at its best fixed draft
lengths, llama.cpp's own prompt-lookup speculation and `--chain auto`, in one run.

    python -m benchmarks chains [--per-dataset 10] [--max-tokens 128]
                                [--sweep-per-dataset 1] [--sweep-tokens 48]
    python -m benchmarks chains --render results/router-DATE.json   # plots + markdown again
    python -m benchmarks chains --auto-only --per-dataset 4   # a quick check of auto's floor

With --auto-only only the target alone and auto run (no sweep, no static chains): the
check, after a change to the router, that auto still holds its floor against the target
alone, in a quarter of an hour instead of an hour and a half.

1. Forward costs: one decode over k tokens per model (what decides whether verifying pays).
2. Sweep (benchmarks/sweep.py): each static method on a grid of draft lengths over a
   few prompts per dataset, greedy; the fastest lengths go on.
3. Main comparison: HumanEval (raw completion), GSM8K and MT-Bench (first turn, chat),
   greedy and temperature 0.7; for every prompt and mode every method runs in turn, so
   drift of the machine hits all alike: the target alone first and last (its speed is the
   two runs pooled), the others between them in an order that rotates from turn to turn.
   One auto router serves the whole run.
4. Predictor error: predicted vs measured decode ms/token of every fixed-chain run, with
   the idle profile's costs and with those costs scaled to the machine's speed during the
   prompt (measured by the target alone's runs beside it).
Writes router-<date>.json, router-<date>.md and PNG plots to benchmarks/results/.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tqdm import tqdm

from benchmarks.args import ROUTER_DIR, benchmark_parser, result_stem, router_start
from benchmarks.machine import machine_info
from benchmarks.measure import fixed_chain, forward_costs, prefill_seconds, run_fixed, run_routed
from benchmarks.native import NativeLookup
from benchmarks.output import save_json, write_result
from benchmarks.plots import write_plots
from benchmarks.prompts import load
from benchmarks.report import markdown
from benchmarks.summary import BASELINE, error_table, predictor_errors, ratio_table, summarise
from benchmarks.sweep import Runner, sweep
from specrouter.cascade.sampling import SamplingParams
from specrouter.chat import chat_prompt_tokens
from specrouter.drafters import MODEL_FREE
from specrouter.drafters.memory import SuffixMemory
from specrouter.drafters.ngram import NGRAM_NAME
from specrouter.models import resolve_model
from specrouter.pool import Pool
from specrouter.router import auto_router, load_or_profile

SMALL, TARGET = "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"
STATIC = {
    "0.5b -> 1.5b": [SMALL, TARGET],
    "ngram -> 1.5b": ["ngram", TARGET],
    "ngram -> 0.5b -> 1.5b": ["ngram", SMALL, TARGET],
}
NATIVE = "llama.cpp prompt lookup"
GRID = {
    "0.5b -> 1.5b": [(1,), (2,), (3,), (4,)],
    "ngram -> 1.5b": [(1,), (2,), (3,), (4,)],
    "ngram -> 0.5b -> 1.5b": [(1, 2), (2, 2), (2, 3), (3, 3)],
    NATIVE: [(1,), (2,), (4,), (10,)],
}
DATASETS = ("humaneval", "gsm8k", "mtbench")
MODES: dict[str, Callable[[int], SamplingParams]] = {
    "greedy": lambda seed: SamplingParams(),
    "T=0.7": lambda seed: SamplingParams(temperature=0.7, seed=seed),
}
NATIVE_CTX = 2048


def load_prompts(target, per_dataset: int) -> list[tuple[str, str, list[int]]]:
    """(dataset, id, prompt tokens): HumanEval continues raw text, the others are one chat turn."""
    prompts = []
    for dataset in DATASETS:
        for p in load(dataset, per_dataset):
            tokens = (target.tokenize(p.text) if p.kind == "completion"
                      else chat_prompt_tokens(target, [{"role": "user", "content": p.text}]))
            prompts.append((dataset, p.id, tokens))
    return prompts


def open_native(target, n_ctx: int = NATIVE_CTX) -> tuple[NativeLookup | None, str | None]:
    """llama-cpp-python's speculative setup on the target's file, or why it is unavailable."""
    try:
        return NativeLookup(resolve_model(TARGET), target.n_threads, n_ctx), None
    except Exception as exc:  # any failure is a result to report, not a reason to stop the benchmark
        return None, f"{type(exc).__name__}: {exc}"


def native_runner(native: NativeLookup, k: int, eos_ids: frozenset[int]) -> Runner:
    def run(tokens: list[int], params: SamplingParams, max_tokens: int) -> tuple[dict, list[int]]:
        native.set_draft_length(k)
        ids, seconds = native.generate(tokens, params, max_tokens, eos_ids)
        return {"tokens": len(ids), "seconds": seconds, "tokens_per_second": len(ids) / seconds if seconds else 0.0,
                "cycles": None, "chains_used": [f"{NATIVE} [{k}]"], "accepted_per_block": [],
                "draft_lengths": [k]}, ids
    return run


def static_runner(pool: Pool, names: list[str], lengths: tuple[int, ...]) -> Runner:
    chain = fixed_chain(pool, names, lengths)
    return lambda tokens, params, max_tokens: run_fixed(chain, tokens, params, max_tokens)


def sweep_subset(prompts: list, per_dataset: int) -> list[list[int]]:
    return [tokens for d in DATASETS for tokens in [t for ds, _, t in prompts if ds == d][:per_dataset]]


def run_order(methods: list[str], turn: int) -> list[str]:
    """The target alone first and last (ABBA: drift of the machine over a prompt's runs hits
    its pooled speed as it hits the methods in between), the others in between, rotated
    by one place per turn so that no method always runs next to the same neighbours or last."""
    others = [m for m in methods if m != BASELINE]
    shift = turn % len(others) if others else 0
    return [BASELINE, *others[shift:], *others[:shift], BASELINE]


def compare(methods: dict[str, Runner], prompts: list, pool: Pool, max_tokens: int,
            modes: dict[str, Callable[[int], SamplingParams]] = MODES,
            prefilled: tuple[str, ...] = (SMALL, TARGET)) -> list[dict]:
    """Every method on every prompt and mode, interleaved (see run_order); one record per run.
    The models in `prefilled` have their prefill of each prompt timed (the predictor's error
    table subtracts it: it models decoding only)."""
    runs = []
    turn = 0
    with tqdm(total=len(prompts) * len(modes) * (len(methods) + 1), desc="main", unit="run") as bar:
        for seed, (dataset, pid, tokens) in enumerate(prompts, 1):
            prefill = {name: prefill_seconds(pool.level(name), tokens) for name in prefilled}
            for mode, make_params in modes.items():
                params = make_params(seed)
                reference = None
                for position, method in enumerate(run_order(list(methods), turn)):
                    bar.set_postfix_str(f"{dataset} {mode} {method}")
                    record, ids = methods[method](tokens, params, max_tokens)
                    reference = ids if reference is None else reference
                    record.update(dataset=dataset, prompt=pid, mode=mode, method=method, position=position,
                                  same_as_target=(ids == reference) if params.greedy else None)
                    if "chain" in record:
                        record["prefill_seconds"] = sum(prefill[n] for n in record["chain"] if n in prefill)
                    runs.append(record)
                    bar.update(1)
                turn += 1
    return runs


def run(per_dataset: int, max_tokens: int, sweep_per_dataset: int, sweep_tokens: int, auto_only: bool = False,
        router_dir: Path | None = None, corrupt_profile: bool = False, lookup: str = NGRAM_NAME,
        exact: bool = False) -> dict:
    """router_dir: the router's starting profile and estimates (benchmarks.args.router_start);
    corrupt_profile: the target's cached profile there is replaced by a busy machine's
    (corrupt_target_profile) before the router reads it; lookup: auto's model-free drafter
    (one that reads a cross-request memory gets one of the default budget); exact: every
    llama.cpp model with exact kernels (docs/cascade-and-exactness.md), the target alone included."""
    started = time.perf_counter()
    router_dir, router_state = router_start(router_dir)
    phases = {}
    pool = Pool(n_ctx=4096, n_seq_max=1, exact=exact)
    target = pool.level(TARGET)
    prompts = load_prompts(target, per_dataset)
    costs = forward_costs(pool, (SMALL, TARGET))
    profile = load_or_profile([pool.level(SMALL), target], router_dir)
    if corrupt_profile:
        router_state += "; " + corrupt_target_profile(target, router_dir)
    native, native_error = (None, "not run (--auto-only)") if auto_only else open_native(target)
    phases["setup"] = time.perf_counter() - started

    factories = {} if auto_only else {m: (lambda ks, names=names: static_runner(pool, names, ks))
                                      for m, names in STATIC.items()}
    if native is not None:
        factories[NATIVE] = lambda ks: native_runner(native, ks[0], target.eos_ids)
    sweep_rows, best = sweep(factories, GRID, sweep_subset(prompts, sweep_per_dataset), sweep_tokens)
    phases["sweep"] = time.perf_counter() - started - sum(phases.values())

    methods = {BASELINE: static_runner(pool, [TARGET], ())}
    methods.update({m: factories[m](best[m]) for m in factories})
    # One router for the whole run, as a server would keep it: its estimates carry over.
    memory = SuffixMemory() if MODEL_FREE[lookup].remembers else None
    router = auto_router(pool, TARGET, [SMALL, TARGET], profile_dir=router_dir, progress=False, lookup=lookup,
                         memory=memory)
    methods["auto"] = lambda tokens, params, n: run_routed(router, tokens, params, n)
    runs = compare(methods, prompts, pool, max_tokens)
    phases["main"] = time.perf_counter() - started - sum(phases.values())
    if native is not None:
        native.close()
    pool.close()

    errors = predictor_errors(runs, profile.seconds)
    summary = summarise(runs)
    return {
        "machine": machine_info(),
        "settings": {"auto_only": auto_only, "per_dataset": per_dataset, "max_tokens": max_tokens,
                     "datasets": list(DATASETS),
                     "modes": list(MODES), "sweep_per_dataset": sweep_per_dataset, "sweep_tokens": sweep_tokens,
                     "grid": {m: [list(k) for k in g] for m, g in GRID.items()}, "native_n_ctx": NATIVE_CTX,
                     "n_threads": target.n_threads,
                     "router_start": router_state, "lookup": lookup, "exact": exact,
                     "memory_tokens": None if memory is None else len(memory)},
        "phase_seconds": {k: round(v, 1) for k, v in phases.items()},
        "methods": {BASELINE: {"chain": [TARGET], "draft_lengths": []},
                    **{m: {"chain": STATIC.get(m, NATIVE), "draft_lengths": list(best[m])} for m in best},
                    "auto": {"chain": "auto", "draft_lengths": "chosen per cycle"}},
        "native_error": native_error,
        "sweep": sweep_rows,
        "forward_ms": costs,
        "profile": profile.as_dict(),
        "runs": runs,
        "summary": summary,
        "ratios": ratio_table(summary),
        "predictor_errors": errors,
        "predictor_error_table": error_table(errors),
    }


#: A profile of the 1.5B once measured while other heavy work ran (the real figures: 71 and
#: 437 ms): 2.1 s for one token, 3.0 s for 32, linear between (and beyond, at the sizes
#: timed past 32).
def busy_seconds(n: int) -> float:
    return 2.1 + 0.9 * (n - 1) / 31


def corrupt_target_profile(target, router_dir: Path) -> str:
    """Overwrite the target's cached profile in router_dir with busy_seconds at every size it
    was timed at, under its valid cache key (as a profile measured on a busy machine would
    be): a table missing a size the router reads would be re-profiled as stale
    (profiler._read_cached), and the check would test nothing. Says what it did."""
    file = router_dir / f"{target.name}.json"
    data = json.loads(file.read_text())
    data["table"] = {n: busy_seconds(int(n)) for n in data["table"]}
    file.write_text(json.dumps(data))
    return ("the target's cached profile replaced by a busy machine's at every size timed "
            f"(2.1 s at 1 token, 3.0 s at 32; {len(data['table'])} sizes)")


def write_report(result: dict, out: Path, stem: str) -> None:
    """JSON first (the measurements survive a failing plot), then plots and markdown."""
    save_json(result, out / f"{stem}.json")
    result["plots"] = write_plots(result, out, stem)
    write_result(result, markdown, out=out, stem=stem)


def main(argv: Sequence[str] | None = None) -> None:
    parser = benchmark_parser("chains", __doc__, stem="router[-auto]-<date>", per=("dataset", 10), max_tokens=128,
                              sweep=True, render=True, router_dir=ROUTER_DIR)
    parser.add_argument("--auto-only", action="store_true", help="only the target alone and auto (no sweep, no static chains)")
    parser.add_argument("--lookup", choices=list(MODEL_FREE), default=NGRAM_NAME,
                        help="auto's model-free drafter (suffix: with a cross-request memory)")
    parser.add_argument("--corrupt-profile", action="store_true",
                        help="start the router from a busy machine's profile of the target (the sanity check must catch it)")
    parser.add_argument("--exact", action="store_true",
                        help="exact kernels for every llama.cpp model (docs/cascade-and-exactness.md): greedy identity must be total")
    args = parser.parse_args(argv)
    if args.render is not None:
        result = json.loads(args.render.read_text())
    else:
        result = run(args.per_group, args.max_tokens, args.sweep_per_dataset, args.sweep_tokens, args.auto_only,
                     args.router_dir, args.corrupt_profile, args.lookup, args.exact)
    kind = "router-auto" if result["settings"].get("auto_only") else "router"
    write_report(result, args.out, result_stem(args, kind, result))


if __name__ == "__main__":
    main()

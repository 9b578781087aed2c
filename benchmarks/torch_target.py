"""The torch fp32 target benchmark: the Qwen2.5-Coder 1.5B in float32 through torch, alone,
under Hugging Face assisted generation, under our chains (torch and llama.cpp q4 drafts)
and under `--chain auto`, with the oracle ceiling of verification.

    python -m benchmarks torch-target [--per-dataset 10] [--max-tokens 128]
                                      [--sweep-per-dataset 1] [--sweep-tokens 48]
    python -m benchmarks torch-target --resume benchmarks/results/torch-target-DATE.json [--extend-to N]

1. Sweep: every fixed chain on a small grid of draft lengths over a few prompts, greedy;
   the fastest lengths go on.
2. Main comparison: HumanEval (raw completion) and GSM8K (one chat turn), greedy; for
   every prompt every method runs in turn, so drift of the machine hits all alike. One
   auto router serves the whole run. The oracle ceiling is the target verifying its own
   greedy continuation (from the target-alone run) in blocks of k, all accepted: what a
   free drafter that is never wrong would reach.
Writes torch-target-<date>.json and .md to benchmarks/results/.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from benchmarks.args import ROUTER_DIR, benchmark_parser, result_stem, router_start
from benchmarks.machine import machine_info
from benchmarks.output import save_json, write_result
from benchmarks.prompts import load
from specrouter.cascade.chain import Chain
from specrouter.cascade.sampling import SamplingParams
from specrouter.chat import chat_prompt_tokens
from specrouter.engine import generate
from specrouter.pool import Pool
from specrouter.router import auto_router, load_or_profile

TARGET = "qwen2.5-coder-1.5b:torch-fp32"
TORCH_DRAFT = "qwen2.5-coder-0.5b:torch-fp32"
SMALL, MID = "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"  # llama.cpp q4
ALONE = "torch fp32 1.5B alone"
HF = "HF assisted (0.5B fp32)"
AUTO = "auto"
TORCH_CHAIN = "0.5B fp32 -> 1.5B fp32"
MIXED = {
    "0.5B q4 -> 1.5B fp32": [SMALL, TARGET],
    "ngram -> 0.5B q4 -> 1.5B fp32": ["ngram", SMALL, TARGET],
}
CHAINS = {TORCH_CHAIN: [TORCH_DRAFT, TARGET], **MIXED}
# A q4 draft token costs a few % of an fp32 forward, a torch fp32 0.5B one about a third:
# the q4 chains get longer drafts to choose from. Kept small: a sweep run costs ~20 s here.
# The fp32 target verifies 16 tokens for about what 3 cost on an EPYC (profile below),
# so the q4 chain is swept up to 24, as far as the router's own grid goes; on a Xeon
# 3 cost 40% of 17 and auto mostly ran 2-token q4 drafts, so 2 is swept too.
GRID = {
    TORCH_CHAIN: [(2,), (4,)],
    "0.5B q4 -> 1.5B fp32": [(2,), (4,), (8,), (16,), (24,)],
    "ngram -> 0.5B q4 -> 1.5B fp32": [(3, 8), (3, 16)],
}
ORACLE_KS = (4, 8, 16)
DATASETS = ("humaneval", "gsm8k")
GREEDY = SamplingParams()

Runner = Callable[[list[int], int], tuple[dict, list[int]]]


def load_prompts(target, per_dataset: int) -> list[tuple[str, str, list[int]]]:
    """(dataset, id, prompt tokens), alternating datasets so that a run stopped early stays
    balanced: HumanEval continues raw text, GSM8K is one chat turn."""
    prompts = []
    for pair in zip(*(load(d, per_dataset) for d in DATASETS)):
        for p in pair:
            tokens = (target.tokenize(p.text) if p.kind == "completion"
                      else chat_prompt_tokens(target, [{"role": "user", "content": p.text}]))
            prompts.append((p.dataset, p.id, tokens))
    return prompts


def _record(n_tokens: int, seconds: float, **extra) -> dict:
    return {"tokens": n_tokens, "seconds": round(seconds, 3),
            "ms_per_token": round(1000 * seconds / n_tokens, 1) if n_tokens else None, **extra}


def chain_runner(chain: Chain) -> Runner:
    def run(tokens: list[int], max_tokens: int) -> tuple[dict, list[int]]:
        r = generate(chain, tokens, GREEDY, max_tokens)
        levels = r.levels
        # A forward of the level above is one block verifying this level's proposals.
        accepted = [levels[i].accepted / levels[i + 1].forwards if levels[i + 1].forwards else 0.0
                    for i in range(len(levels) - 1)]
        return _record(len(r.token_ids), r.wall_seconds, cycles=r.cycles, accepted_per_block=accepted,
                       levels=[s.as_dict() for s in levels]), r.token_ids
    return run


def routed_runner(router) -> Runner:
    def run(tokens: list[int], max_tokens: int) -> tuple[dict, list[int]]:
        r = generate(router, tokens, GREEDY, max_tokens)
        # Per-level numbers of a routed run mix chains: keep how many cycles each chain ran.
        used = {_label(names, ks): r.chains_per_cycle.count(i) for i, (names, ks) in enumerate(r.chains_used)}
        return _record(len(r.token_ids), r.wall_seconds, cycles=r.cycles, chains_used=used), r.token_ids
    return run


def _label(names: Sequence[str], lengths: Sequence[int]) -> str:
    short = [n.removeprefix("qwen2.5-coder-").replace(":torch-fp32", " fp32") for n in names]
    return " -> ".join(short) + (f" [{','.join(map(str, lengths))}]" if lengths else "")


def hf_runner(target, assistant) -> Runner:
    """transformers' assisted generation on the already loaded HF models, its default schedule."""
    import torch

    model, draft = target._model, assistant._model
    eos = sorted(target.eos_ids)
    pad = target._tok.pad_token_id if target._tok.pad_token_id is not None else eos[0]

    def run(tokens: list[int], max_tokens: int) -> tuple[dict, list[int]]:
        ids = torch.tensor([tokens], dtype=torch.long)
        forwards = {"target": 0, "assistant": 0}
        hooks = [m.register_forward_hook(lambda *_, k=k: forwards.__setitem__(k, forwards[k] + 1))
                 for k, m in (("target", model), ("assistant", draft))]
        try:
            start = time.perf_counter()
            out = model.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=draft, do_sample=False,
                                 max_new_tokens=max_tokens, eos_token_id=eos, pad_token_id=pad)
            seconds = time.perf_counter() - start
        finally:
            for h in hooks:
                h.remove()
        new = out[0, len(tokens):].tolist()
        # Our engine does not emit the EOS token: cut there to compare like with like.
        cut = next((i for i, t in enumerate(new) if t in target.eos_ids), len(new))
        # Each target forward verifies one block and emits its accepted tokens plus one.
        accepted = len(new) / forwards["target"] - 1 if forwards["target"] else 0.0
        return _record(cut, seconds, target_forwards=forwards["target"], assistant_forwards=forwards["assistant"],
                       accepted_per_block=[accepted]), new[:cut]
    return run


def oracle(target, prompt: list[int], continuation: list[int], ks: Sequence[int]) -> list[dict]:
    """Seconds of the target's forwards when every block of k proposals is its own greedy
    continuation: each block feeds the last committed token and k proposals and emits k + 1
    tokens. The prompt (all but its last token) is prefilled once and counted in every k."""
    seq = target.new_sequence()
    try:
        start = time.perf_counter()
        target.decode(seq, prompt[:-1], 0, 1)
        prefill = time.perf_counter() - start
        records = []
        for k in ks:
            target.remove(seq, len(prompt) - 1)
            seconds, mismatches = _oracle_blocks(target, seq, prompt + continuation, len(prompt), k)
            records.append(_record(len(continuation), prefill + seconds, k=k, argmax_mismatches=mismatches))
        return records
    finally:
        target.free_sequence(seq)


def _oracle_blocks(target, seq: int, full: list[int], n_prompt: int, k: int) -> tuple[float, int]:
    emitted, fed, mismatches = 0, n_prompt - 1, 0
    start = time.perf_counter()
    while n_prompt + emitted < len(full):
        drafts = min(k, len(full) - n_prompt - emitted - 1)
        end = n_prompt + emitted + drafts
        logits = target.decode(seq, full[fed:end], fed, drafts + 1)
        # A mismatch would be an fp32 batch-shape difference at a near-tie; it does not change the cost.
        mismatches += int((np.argmax(logits, axis=1) != full[end - drafts:end + 1]).sum())
        fed, emitted = end, emitted + drafts + 1
    return time.perf_counter() - start, mismatches


def sweep(factories: dict[str, Callable[[tuple[int, ...]], Runner]], prompts: list[list[int]],
          max_tokens: int) -> tuple[list[dict], dict[str, tuple[int, ...]]]:
    """Every method on its grid over the prompts; the lengths with the least ms/token win."""
    rows, best = [], {}
    for method, make in factories.items():
        scores = {}
        for lengths in GRID[method]:
            runner = make(lengths)
            records = [runner(tokens, max_tokens)[0] for tokens in prompts]
            tokens, seconds = sum(r["tokens"] for r in records), sum(r["seconds"] for r in records)
            scores[lengths] = seconds / tokens
            rows.append({"method": method, "draft_lengths": list(lengths), "tokens": tokens,
                         "seconds": round(seconds, 2), "ms_per_token": round(1000 * seconds / tokens, 1),
                         "accepted_per_block": [round(statistics.mean(a), 2) for a in
                                                zip(*(r["accepted_per_block"] for r in records))]})
            print(f"sweep {method} {lengths}: {1000 * seconds / tokens:.0f} ms/token", flush=True)
        best[method] = min(scores, key=scores.get)
    return rows, best


def compare(methods: dict[str, Runner], target, prompts: list, max_tokens: int,
            checkpoint: Callable[[list[dict]], None]) -> list[dict]:
    """Every method on every prompt, interleaved; the target alone first (the reference and
    the oracle's continuation), the oracle last. One record per run; `checkpoint` gets the
    runs so far after every prompt (a long run stopped early keeps what it measured)."""
    runs = []
    for n, (dataset, pid, tokens) in enumerate(prompts, 1):
        reference = None
        for method, runner in methods.items():
            record, ids = runner(tokens, max_tokens)
            reference = ids if reference is None else reference
            runs.append({"dataset": dataset, "prompt": pid, "method": method, "identical": ids == reference, **record})
            print(f"[{n}/{len(prompts)}] {dataset} {pid} {method}: {record['ms_per_token']} ms/token", flush=True)
        runs += [{"dataset": dataset, "prompt": pid, "method": f"oracle k={r['k']}", **r}
                 for r in oracle(target, tokens, reference, ORACLE_KS)]
        checkpoint(runs)
    return runs


def summarise(runs: list[dict]) -> dict[str, dict]:
    """Per method: median ms/token and tokens/s, median per-prompt speedup over the target
    alone (all prompts and per dataset), mean accepted per block per level, identical outputs."""
    alone = {(r["dataset"], r["prompt"]): r["ms_per_token"] for r in runs if r["method"] == ALONE}
    summary = {}
    for method in dict.fromkeys(r["method"] for r in runs):
        rows = [r for r in runs if r["method"] == method]
        speedups = {d: [alone[(r["dataset"], r["prompt"])] / r["ms_per_token"] for r in rows if d in ("all", r["dataset"])]
                    for d in ("all", *DATASETS)}
        levels = [r["accepted_per_block"] for r in rows if r.get("accepted_per_block")]
        summary[method] = {
            "runs": len(rows),
            "ms_per_token": round(statistics.median(r["ms_per_token"] for r in rows), 1),
            "tokens_per_second": round(1000 / statistics.median(r["ms_per_token"] for r in rows), 2),
            "speedup": {d: round(statistics.median(s), 2) for d, s in speedups.items() if s},
            "accepted_per_block": [round(statistics.mean(a), 2) for a in zip(*levels)] if levels else [],
            "identical": sum(r["identical"] for r in rows) if "identical" in rows[0] else None,
        }
    return summary


def verdicts(summary: dict[str, dict], runs: list[dict]) -> dict:
    """The issues' claims: the best mixed chain against the target alone and HF assisted;
    auto against the best static chain (the target alone or any fixed chain)."""
    ms = {m: s["ms_per_token"] for m, s in summary.items()}
    best_mixed = min(MIXED, key=ms.get)
    best_static = min([ALONE, *CHAINS], key=ms.get)
    oracle_best = min((m for m in ms if m.startswith("oracle")), key=ms.get)
    per_prompt = {(r["dataset"], r["prompt"], r["method"]): r["ms_per_token"] for r in runs}
    auto_vs_static = [per_prompt[(d, p, best_static)] / per_prompt[(d, p, AUTO)]
                      for d, p, m in per_prompt if m == AUTO]
    return {
        "best_mixed_chain": best_mixed,
        "mixed_beats_torch_alone": ms[best_mixed] < ms[ALONE],
        "mixed_beats_hf_assisted": ms[best_mixed] < ms[HF],
        "mixed_vs_hf_speedup": round(ms[HF] / ms[best_mixed], 2),
        "best_static_chain": best_static,
        # Paired per prompt (the machine drifts between prompts more than between methods).
        "auto_beats_best_static": statistics.median(auto_vs_static) > 1,
        "auto_vs_best_static_speedup_median": round(statistics.median(auto_vs_static), 3),
        "auto_vs_best_static_ms": [ms[AUTO], ms[best_static]],
        "oracle_best": oracle_best,
    }


def run(per_dataset: int, max_tokens: int, sweep_per_dataset: int, sweep_tokens: int, checkpoint: Path,
        resume: dict | None = None, extend_to: int | None = None, router_dir: Path | None = None) -> dict:
    """The whole benchmark, or with `resume` (a saved, stopped result) the prompts it had not
    measured yet: same settings and swept draft lengths, costs profiled afresh, one part
    more in `parts` (a run of ~4-8 min a prompt may not fit one sitting); `extend_to` raises
    the saved run's prompts per dataset (the next prompts of each set); router_dir: the
    router's starting profile and estimates (benchmarks.args.router_start). The result so far
    is saved to `checkpoint` after every prompt."""
    started = time.perf_counter()
    router_dir, router_state = router_start(router_dir)
    phases = {}
    if resume is not None:
        resume = extended(resume, extend_to)
        per_dataset, max_tokens = resume["settings"]["per_dataset"], resume["settings"]["max_tokens"]
    # One slot per model: runs are sequential (and the profiler then skips batched timings).
    pool = Pool(n_ctx=4096, n_seq_max=1)
    target, assistant = pool.level(TARGET), pool.level(TORCH_DRAFT)
    prompts = load_prompts(target, per_dataset)
    # The torch models' costs are measured afresh, under this run's conditions, for the router.
    load_or_profile([target, assistant], router_dir, force=True, progress=False)
    # One router for the whole run, as a server would keep it.
    router = auto_router(pool, TARGET, [SMALL, MID, TARGET], profile_dir=router_dir, progress=False)
    profile = load_or_profile([pool.level(n) for n in (SMALL, MID, TORCH_DRAFT, TARGET)], router_dir, progress=False)
    profile_ms = {m: {n: round(1000 * s, 1) for n, s in sorted(t.items())} for m, t in profile.tables.items()}
    hf = hf_runner(target, assistant)
    hf(prompts[0][2], 4)  # transformers' first generate sets things up: keep that out of the runs
    phases["setup"] = time.perf_counter() - started

    factories = {m: (lambda ks, names=names: chain_runner(pool.chain(names, ks))) for m, names in CHAINS.items()}
    if resume is None:
        sweep_prompts = [t for d in DATASETS for t in [t for ds, _, t in prompts if ds == d][:sweep_per_dataset]]
        sweep_rows, best = sweep(factories, sweep_prompts, sweep_tokens)
        phases["sweep"] = time.perf_counter() - started - sum(phases.values())
    else:
        best = {m: tuple(resume["methods"][m]["draft_lengths"]) for m in CHAINS}

    methods = {ALONE: chain_runner(pool.chain([TARGET], [])), HF: hf}
    methods.update({m: factories[m](best[m]) for m in CHAINS})
    methods[AUTO] = routed_runner(router)
    info = machine_info()
    part = {"date": info["date"], "command": info["command"], "phase_seconds": {}, "profile_ms": profile_ms,
            "router_start": router_state}
    if resume is None:
        result = {
            "machine": {**info, **_versions()},
            "settings": {"per_dataset": per_dataset, "max_tokens": max_tokens, "datasets": list(DATASETS),
                         "sweep_per_dataset": sweep_per_dataset, "sweep_tokens": sweep_tokens,
                         "grid": {m: [list(k) for k in g] for m, g in GRID.items()}, "oracle_ks": list(ORACLE_KS),
                         "torch_threads": target.n_threads, "router_start": router_state},
            "phase_seconds": {k: round(v, 1) for k, v in phases.items()},
            "methods": {ALONE: {"chain": [TARGET]}, HF: {"target": TARGET, "assistant": TORCH_DRAFT},
                        **{m: {"chain": CHAINS[m], "draft_lengths": list(best[m])} for m in CHAINS},
                        AUTO: {"chain": "auto", "candidates": [SMALL, MID, TARGET]}},
            "profile_ms": profile_ms,
            "sweep": sweep_rows,
            "parts": [],
            "runs": [],
        }
    else:
        result = {**resume, "parts": resume.get("parts") or [_first_part(resume)]}
    done = measured_prompts(result["runs"], list(methods))
    kept = [r for r in result["runs"] if (r["dataset"], r["prompt"]) in done]
    todo = [p for p in prompts if (p[0], p[1]) not in done]
    part["prompts"] = len(todo)
    parts = [*result["parts"], part]
    result["runs"] = kept + compare(
        methods, target, todo, max_tokens,
        lambda runs: save_json({**result, "parts": parts, "runs": kept + runs, "complete": False}, checkpoint))
    phases["main"] = time.perf_counter() - started - sum(phases.values())
    part["phase_seconds"] = {k: round(v, 1) for k, v in phases.items()}
    result["parts"] = parts
    if resume is None:
        result["phase_seconds"] = part["phase_seconds"]
    result["complete"] = True
    pool.close()
    return result


def extended(resume: dict, extend_to: int | None) -> dict:
    """A saved run whose prompts per dataset are raised to extend_to (never lowered)."""
    settings = {**resume["settings"]}
    if extend_to is not None:
        settings["per_dataset"] = max(extend_to, settings["per_dataset"])
    return {**resume, "settings": settings}


def measured_prompts(runs: list[dict], methods: Sequence[str]) -> set[tuple[str, str]]:
    """Prompts with a run of every method and every oracle k (a prompt cut short is redone)."""
    wanted = {*methods, *(f"oracle k={k}" for k in ORACLE_KS)}
    seen: dict[tuple[str, str], set[str]] = {}
    for r in runs:
        seen.setdefault((r["dataset"], r["prompt"]), set()).add(r["method"])
    return {key for key, got in seen.items() if wanted <= got}


def _first_part(result: dict) -> dict:
    """A result written before parts were recorded: its one part."""
    return {"date": result["machine"]["date"], "command": result["machine"]["command"],
            "phase_seconds": result.get("phase_seconds", {}),
            "profile_ms": result["profile_ms"], "prompts": len({(r["dataset"], r["prompt"]) for r in result["runs"]})}


def _versions() -> dict:
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__}


def markdown(result: dict) -> str:
    m, s, v = result["machine"], result["settings"], result["verdicts"]
    counts = {d: len({r["prompt"] for r in result["runs"] if r["dataset"] == d}) for d in s["datasets"]}
    n_prompts = sum(counts.values())
    stopped = "" if result.get("complete", True) else " (stopped early: the runs measured until then)"
    lines = [
        f"# Torch fp32 target: {m['date']}",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores; Python {m['python']}, torch {m['torch']}, "
        f"transformers {m['transformers']}, llama-cpp-python {m['llama_cpp_python']}; torch threads {s['torch_threads']}.",
        f"Command: `{m['command']}`. Phases (s): {result['phase_seconds']}."
        + (f" Router at the start: {s['router_start']}." if "router_start" in s else ""),
        *[f"Resumed {p['date']}: `{p['command']}`, for the {p['prompts']} prompts not measured before. "
          f"Phases (s): {p['phase_seconds']}."
          for p in result.get("parts", [])[1:]],
        "",
        f"{counts['humaneval']} HumanEval + {counts['gsm8k']} GSM8K prompts{stopped}, {s['max_tokens']} new tokens, greedy, "
        "one run; methods interleaved per prompt. Speedup = the target alone's ms/token / the method's, "
        "per prompt, median. Accepted per block: level i's accepted tokens / level i+1's forwards, "
        "mean over prompts (HF: new tokens / target forwards - 1).",
        "",
        "| method | draft lengths | ms/token | tokens/s | speedup (all / HumanEval / GSM8K) | accepted per block | identical |",
        "|---|---|---|---|---|---|---|",
    ]
    for method, row in result["summary"].items():
        lengths = result["methods"].get(method, {}).get("draft_lengths", "")
        sp = row["speedup"]
        speedup = " / ".join(f"{sp[d]:.2f}" for d in ("all", *s["datasets"]) if d in sp)
        identical = "" if row["identical"] is None else f"{row['identical']}/{n_prompts}"
        lines.append(f"| {method} | {','.join(map(str, lengths))} | {row['ms_per_token']} | {row['tokens_per_second']} "
                     f"| {speedup} | {', '.join(map(str, row['accepted_per_block']))} | {identical} |")
    lines += [
        "",
        f"- Best mixed chain: **{v['best_mixed_chain']}**; beats the torch target alone: "
        f"**{v['mixed_beats_torch_alone']}**; beats HF assisted generation: **{v['mixed_beats_hf_assisted']}** "
        f"({v['mixed_vs_hf_speedup']}x its speed).",
        f"- Best static chain: **{v['best_static_chain']}**; auto beats it (median over prompts of its speed over "
        f"that chain's on the same prompt > 1): **{v['auto_beats_best_static']}** "
        f"({v['auto_vs_best_static_speedup_median']}x; median ms/token "
        f"{' vs '.join(map(str, v.get('auto_vs_best_static_ms', [])))}).",
        f"- Oracle ceiling: **{v['oracle_best']}**, {result['summary'][v['oracle_best']]['ms_per_token']} ms/token.",
        "",
        "## Chains auto ran (cycles, all prompts)",
        "",
        *[f"- {label}: {n}" for label, n in _auto_chains(result["runs"]).items()],
        "",
        f"## Sweep ({s['sweep_per_dataset']} prompt per dataset, {s['sweep_tokens']} tokens)",
        "",
        "| method | draft lengths | ms/token | accepted per block |",
        "|---|---|---|---|",
        *[f"| {r['method']} | {','.join(map(str, r['draft_lengths']))} | {r['ms_per_token']} "
          f"| {', '.join(map(str, r['accepted_per_block']))} |" for r in result["sweep"]],
        "",
        "## Forward costs (router profile, ms per forward of n tokens)",
        "",
        _profile_table(result["profile_ms"]),
    ]
    return "\n".join(lines) + "\n"


def _auto_chains(runs: list[dict]) -> dict[str, int]:
    total: dict[str, int] = {}
    for r in runs:
        for label, n in r.get("chains_used", {}).items():
            total[label] = total.get(label, 0) + n
    return dict(sorted(total.items(), key=lambda kv: -kv[1]))


def _profile_table(profile: dict) -> str:
    ns = sorted({int(n) for t in profile.values() for n in t})
    head = "| model | " + " | ".join(map(str, ns)) + " |\n|---|" + "---|" * len(ns)
    rows = [f"| {m} | " + " | ".join(str(t.get(n, t.get(str(n), ""))) for n in ns) + " |" for m, t in profile.items()]
    return "\n".join([head, *rows])


def _stem(result: dict) -> str:
    return f"torch-target-{result['machine']['date'][:10]}"


def write_report(result: dict, out: Path, stem: str | None = None) -> None:
    """Summary and verdicts from the runs (so a checkpoint renders too), then JSON and markdown,
    named `stem` (default: torch-target-<date of the run>)."""
    result["summary"] = summarise(result["runs"])
    result["verdicts"] = verdicts(result["summary"], result["runs"])
    write_result(result, markdown, out=out, stem=stem or _stem(result))


def main(argv: Sequence[str] | None = None) -> None:
    ap = benchmark_parser("torch-target", __doc__, per=("dataset", 10), max_tokens=128, sweep=True, render=True,
                          router_dir=ROUTER_DIR)
    ap.add_argument("--resume", type=Path, metavar="JSON",
                    help="measure the prompts a stopped run (its JSON) had not reached, with its settings and draft "
                         "lengths (default stem: the file's)")
    ap.add_argument("--extend-to", type=int, metavar="N", help="with --resume: prompts per dataset to reach")
    args = ap.parse_args(argv)
    if args.render is not None:
        result = json.loads(args.render.read_text())
        stem = result_stem(args, "torch-target", result)
    else:
        resume = json.loads(args.resume.read_text()) if args.resume is not None else None
        stem = args.stem or (args.resume.stem if args.resume is not None else result_stem(args, "torch-target"))
        result = run(args.per_group, args.max_tokens, args.sweep_per_dataset, args.sweep_tokens,
                     args.out / f"{stem}.json", resume, args.extend_to, args.router_dir)
    write_report(result, args.out, stem)


if __name__ == "__main__":
    main()

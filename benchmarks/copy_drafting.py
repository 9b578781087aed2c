"""The copy-drafting benchmark: workloads whose answers repeat text that is already there
(benchmarks/workloads.py: code editing, MT-Bench second turns, documentation), on the
default q4 llama.cpp 1.5B target, against the target alone.

    python -m benchmarks copy-drafting [--per-workload 10] [--max-tokens 256] [--modes greedy,T=0.7]
                                       [--router-dir DIR] [--methods all] [--native-servers all] [--stem NAME]

Methods: the target alone (first and last per prompt and mode, as in the router
benchmark), fixed chains with the n-gram (4 tokens) and the suffix drafter (16 tokens),
llama-cpp-python's prompt lookup on the same model file (10 tokens, its default),
llama.cpp's own server with each of its speculation settings (benchmarks/native_server.py;
`make native-peers` builds it; --native-servers none leaves them out), and
`auto` with each model-free drafter as its lookup level (one router per drafter for the
whole run, as a server keeps it; both start as --router-dir says; the suffix drafter's
with a cross-request memory of the default budget, fed by every auto run before, as a
server's `per-key` memory with one key would be). The MT-Bench first
answers are the target's own, generated greedily before the runs. Writes
copy-drafting-<date>.json and .md to benchmarks/results/ (or --out).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.args import benchmark_parser, profile_line, result_stem, router_start
from benchmarks.chains import MODES, NATIVE, TARGET, compare, native_runner, open_native, static_runner
from benchmarks.machine import machine_info
from benchmarks.measure import run_routed
from benchmarks.native_server import PEERS, Peer, draft_counts, open_peers, server_runner
from benchmarks.output import write_result
from benchmarks.summary import ratio_table, routed_chains, summarise
from benchmarks.workloads import WORKLOADS, load
from specrouter.cascade.chain import Chain
from specrouter.cascade.sampling import SamplingParams
from specrouter.chat import chat_prompt_tokens
from specrouter.engine import generate
from specrouter.drafters import MODEL_FREE
from specrouter.drafters.memory import SuffixMemory
from specrouter.models import resolve_model
from specrouter.pool import Pool
from specrouter.router import auto_router

FIXED = {"ngram -> 1.5b [4]": (["ngram", TARGET], (4,)), "suffix -> 1.5b [16]": (["suffix", TARGET], (16,))}
NATIVE_K = 10
AUTO = {"auto (ngram)": "ngram", "auto (suffix)": "suffix"}
FIRST_TURN_TOKENS = 256


def build_prompts(target, per_workload: int) -> tuple[list[tuple[str, str, list[int]]], dict[str, str]]:
    """(workload, id, prompt tokens) per task, and the MT-Bench first answers (the target's, greedy)."""
    prompts, first_answers = [], {}
    for workload in WORKLOADS:
        for task in load(workload, per_workload):
            answer = None
            if task.first_turn is not None:
                tokens = chat_prompt_tokens(target, task.first_turn)
                answer = first_answers[task.id] = generate(Chain([target], []), tokens, SamplingParams(),
                                                           FIRST_TURN_TOKENS).text
            prompts.append((workload, task.id, chat_prompt_tokens(target, task.messages(answer))))
    return prompts, first_answers


def run(per_workload: int, max_tokens: int, modes: list[str], router_dir: Path | None, native_peer: bool = True,
        peers: tuple[Peer, ...] = PEERS, ours: tuple[str, ...] = (*FIXED, *AUTO)) -> dict:
    """ours: which of FIXED and AUTO run (the target alone always does)."""
    started = time.perf_counter()
    router_dir, router_state = router_start(router_dir)
    pool = Pool(n_ctx=4096, n_seq_max=1)
    target = pool.level(TARGET)
    prompts, first_answers = build_prompts(target, per_workload)
    phases = {"first answers": time.perf_counter() - started}
    methods = {"target alone": static_runner(pool, [TARGET], ())}
    methods.update({m: static_runner(pool, names, ks) for m, (names, ks) in FIXED.items() if m in ours})
    # A document and its answer outgrow 2,048 tokens. llama-cpp-python 0.3.36's lookup raises
    # a ValueError (Llama.eval's scores array) where its context fills instead of stopping, as
    # on the docs workload's longest prompts, even at 4,107: --no-native leaves it out.
    native, native_error = open_native(target, n_ctx=4096) if native_peer else (None, "not run (--no-native)")
    if native is not None:
        methods[NATIVE] = native_runner(native, NATIVE_K, target.eos_ids)
    files = {"target": resolve_model(TARGET), **{p.draft_model: resolve_model(p.draft_model)
                                                 for p in peers if p.draft_model is not None}}
    servers, server_errors = open_peers(peers, files, target.n_threads, n_ctx=4096)
    methods.update({label: server_runner(server, target.eos_ids) for label, server in servers.items()})
    memories, profiles = {}, {}
    try:
        for method, lookup in AUTO.items():
            if method not in ours:
                continue
            if MODEL_FREE[lookup].remembers:
                memories[method] = SuffixMemory()
            # Each router its own folder under router_dir: their estimates must not mix.
            router = auto_router(pool, TARGET, [TARGET], profile_dir=router_dir / lookup, progress=False,
                                 lookup=lookup, memory=memories.get(method))
            # The profile it starts from decides close calls between draft lengths (a suffix
            # draft of 15 or of 31 tokens): recorded, so runs can be told apart by it.
            profiles[method] = router.costs.profile.as_dict()
            methods[method] = lambda tokens, params, n, router=router: run_routed(router, tokens, params, n)
        runs = compare(methods, prompts, pool, max_tokens, {m: MODES[m] for m in modes}, prefilled=())
    finally:  # a failed run must not leave its servers idling beside the next one
        if native is not None:
            native.close()
        for server in servers.values():
            server.close()
        pool.close()
    phases["main"] = time.perf_counter() - started - sum(phases.values())
    summary = summarise(runs)
    return {
        "machine": machine_info(),
        "settings": {"per_workload": per_workload, "max_tokens": max_tokens, "modes": modes,
                     "workloads": list(WORKLOADS), "target": TARGET, "n_threads": target.n_threads,
                     "fixed": {m: {"chain": names, "draft_lengths": list(ks)} for m, (names, ks) in FIXED.items()
                               if m in ours},
                     "native": {"method": NATIVE, "draft_length": NATIVE_K, "error": native_error},
                     "native_servers": {p.label: {"flags": list(p.flags), "draft_model": p.draft_model,
                                                  "error": server_errors.get(p.label)} for p in peers},
                     "router_start": router_state, "first_turn_tokens": FIRST_TURN_TOKENS},
        "phase_seconds": {k: round(v, 1) for k, v in phases.items()},
        "first_answers": first_answers,
        "runs": runs,
        "summary": summary,
        "ratios": ratio_table(summary),
        "auto_chains": auto_chains(runs),
        "server_drafts": draft_counts(runs),
        "lookup_sources": lookup_sources(runs),
        "profiles": profiles,
        "memory": {m: {"tokens_held": len(mem), "budget": mem.budget, "megabytes": round(mem.nbytes / 2**20, 1)}
                   for m, mem in memories.items()},
    }


def auto_chains(runs: list[dict]) -> dict[str, dict[str, int]]:
    """Per auto method and workload: cycles per chain it ran."""
    return routed_chains(runs, lambda r: f"{r['method']} | {r['dataset']}" if r["method"] in AUTO else None)


def lookup_sources(runs: list[dict]) -> dict[str, dict[str, dict[str, float]]]:
    """Per auto method and workload, per source of the lookup's blocks (the request's own
    text, or the cross-request memory: match classes m4..m32): the share of the method's
    cycles it drafted and its mean accepted tokens per block."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for key in dict.fromkeys(f"{r['method']} | {r['dataset']}" for r in runs if "lookup_blocks" in r):
        rows = [r for r in runs if f"{r['method']} | {r['dataset']}" == key]
        cycles = sum(len(r["chains_per_cycle"]) for r in rows)
        sources: dict[str, list[int]] = {}
        for r in rows:
            for cls, blocks in r["lookup_blocks"].items():
                source = "memory" if cls.split("#")[-1].startswith("m") else "own text"
                counts = sources.setdefault(source, [0, 0])
                counts[0] += blocks
                counts[1] += r["lookup_accepted"].get(cls, 0)
        out[key] = {s: {"cycle_share": round(b / cycles, 3) if cycles else 0.0,
                        "accepted_per_block": round(a / b, 2) if b else 0.0} for s, (b, a) in sources.items()}
    return out


def markdown(result: dict) -> str:
    m, s = result["machine"], result["settings"]
    total = sum(result["phase_seconds"].values()) / 60
    lines = [
        f"# Copy-drafting benchmark ({m['date']})", "",
        f"Machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}, llama-cpp-python {m['llama_cpp_python']}, "
        f"{s['n_threads']} threads. Command: `{m['command']}`. Run time {total:.1f} min "
        f"({', '.join(f'{k} {v / 60:.1f}' for k, v in result['phase_seconds'].items())}).", "",
        f"Target {s['target']} (q4 llama.cpp). {s['per_workload']} tasks per workload ({', '.join(s['workloads'])}), "
        f"{s['max_tokens']} new tokens, modes {', '.join(s['modes'])}. Per task and mode the target alone runs first "
        "and last (both runs pooled: the reference of every ratio), every other method once in between, rotated "
        "from turn to turn. Tokens/s is wall time of the whole generation, prompt included. "
        f"Router at the start: {s['router_start']}."
        + (f" Native peer unavailable: {s['native']['error']}." if s["native"]["error"] else "")
        + "".join(f" {label} unavailable: {v['error']}." for label, v in s.get("native_servers", {}).items()
                  if v["error"]), "",
        "## Median ratio to the target alone (per task)", "",
    ]
    ratios = result["ratios"]
    columns = list(next(iter(ratios.values())))
    lines.append("| method | " + " | ".join(c.replace(" | ", ", ") for c in columns) + " |")
    lines.append("|---|" + "---|" * len(columns))
    for method, values in ratios.items():
        lines.append(f"| {method} | " + " | ".join(str(values.get(c, "")) for c in columns) + " |")
    lines += ["", "## Details (all workloads pooled)", "",
              "| method | mode | median tok/s | accepted per block | greedy identical |", "|---|---|---|---|---|"]
    for key, v in result["summary"].items():
        method, dataset, mode = key.split(" | ")
        if dataset == "all":
            lines.append(f"| {method} | {mode} | {v['median_tokens_per_second']} | "
                         f"{', '.join(map(str, v['mean_accepted_per_block']))} | {v['identical_outputs'] or ''} |")
    if result.get("server_drafts"):
        lines += ["", "## llama-server's drafts (its own counters, all runs)", "",
                  "| peer | flags | drafted | accepted | accepted share |", "|---|---|---|---|---|"]
        for label, v in result["server_drafts"].items():
            peer = s["native_servers"][label]
            flags = " ".join(peer["flags"] + (["-md", peer["draft_model"]] if peer["draft_model"] else []))
            lines.append(f"| {label} | `{flags}` | {v['drafted']} | {v['accepted']} | {v['accepted_share']:.0%} |")
    lines += ["", "## Chains auto ran (cycles)", ""]
    for key, chains in result["auto_chains"].items():
        lines.append(f"- {key}: " + ", ".join(f"{c} {n}" for c, n in chains.items()))
    if result.get("lookup_sources"):
        lines += ["", "## What the lookup drafted, by source", "",
                  "| auto, workload | source | share of cycles | accepted per block |", "|---|---|---|---|"]
        for key, sources in result["lookup_sources"].items():
            for source, v in sources.items():
                lines.append(f"| {key} | {source} | {v['cycle_share']:.0%} | {v['accepted_per_block']} |")
    for method, mem in result.get("memory", {}).items():
        lines.append(f"\nCross-request memory of {method} at the end: {mem['tokens_held']:,} tokens held of a "
                     f"{mem['budget']:,}-token budget, {mem['megabytes']} MB (allocated at the start).")
    for method, profile in result.get("profiles", {}).items():
        lines.append("\n" + profile_line(profile, s["target"], method, key="profiles"))
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    ap = benchmark_parser("copy-drafting", __doc__, per=("workload", 10), max_tokens=256, render=True,
                          router_dir="the routers' starting profiles and estimates, one folder per lookup drafter "
                                     "under it (default: none saved, profiles measured at the start)")
    ap.add_argument("--modes", default="greedy,T=0.7", help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--no-native", action="store_true", help="leave out llama-cpp-python's prompt lookup (0.3.36 "
                    "fails with a ValueError where a long document's answer fills its context)")
    ap.add_argument("--methods", default="all", help="our methods beside the target alone: all, or comma-separated "
                    f"of {', '.join((*FIXED, *AUTO))}")
    ap.add_argument("--native-servers", default="all", help="llama-server peers: all, none, or comma-separated "
                    f"labels of {', '.join(p.label for p in PEERS)}")
    args = ap.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",")]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        ap.error(f"unknown modes {unknown}: use {', '.join(MODES)}")
    chosen = {"all": PEERS, "none": ()}.get(args.native_servers)
    if chosen is None:
        by_label = {p.label: p for p in PEERS}
        wanted = [w.strip() for w in args.native_servers.split(",")]
        if unknown := [w for w in wanted if w not in by_label]:
            ap.error(f"unknown llama-server peers {unknown}: use all, none or {', '.join(by_label)}")
        chosen = tuple(by_label[w] for w in wanted)
    ours = (*FIXED, *AUTO) if args.methods == "all" else tuple(m.strip() for m in args.methods.split(","))
    if unknown := [m for m in ours if m not in (*FIXED, *AUTO)]:
        ap.error(f"unknown methods {unknown}: use all or {', '.join((*FIXED, *AUTO))}")
    result = (json.loads(args.render.read_text()) if args.render is not None
              else run(args.per_group, args.max_tokens, modes, args.router_dir, not args.no_native, chosen, ours))
    write_result(result, markdown, out=args.out, stem=result_stem(args, "copy-drafting", result))


if __name__ == "__main__":
    main()

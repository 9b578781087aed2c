"""The sessions benchmark's report: tables (markdown) and per-turn curves (PNG) of a result
of benchmarks/sessions.py. Every ratio is to the target alone's first run on the default
server (prefix cache on; another server's where the default did not run) in the same mode
and at the same concurrency: of throughput for a run, of the same session's same turn for a
turn (the median over sessions), of the workload's tokens over its turns' seconds for a
workload. A method run more than once on a server (memory-ab's ABBA) is pooled too: its
tokens over its runs' seconds, to its server's target alone's pooled the same way."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from pathlib import Path

REFERENCE = "target alone"
SOURCES = ("request", "memory")


def label(run: dict) -> str:
    """A run's method as the report names it: ours by method and server setting, a peer by its label."""
    if run["method"] == "llama-server":
        return run["server"]
    return run["method"] if run["server"] == "default" else f"{run['method']}, {run['server']}"


def _median(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def _fmt(value: float | None, pattern: str = "{:.2f}") -> str:
    return "" if value is None else pattern.format(value)


def _speed(turn: dict) -> float:
    return turn["completion_tokens"] / turn["seconds"] if turn["seconds"] > 0 else 0.0


def _share(turns: list[dict], source: str) -> float | None:
    cycles = sum(t["cycles"] for t in turns)
    return sum(t["drafts"].get(source, 0) for t in turns) / cycles if cycles else None


def _cached(turns: list[dict]) -> float | None:
    prompt = sum(t["prompt_tokens"] for t in turns)
    return sum(t["cached_tokens"] for t in turns) / prompt if prompt else None


def _all_runs(result: dict) -> list[dict]:
    return [*result["runs"], *result.get("peer_runs", [])]


def _references(result: dict) -> dict[tuple[str, int], dict]:
    """Per (mode, concurrency), the target alone's first run: the default server's, else the first server's."""
    refs: dict[tuple[str, int], dict] = {}
    for r in sorted(result["runs"], key=lambda r: r["server"] != "default"):  # stable: run order kept
        if r["method"] == REFERENCE:
            refs.setdefault((r["mode"], r["concurrency"]), r)
    return refs


def pooled_table(result: dict) -> list[str]:
    """Methods run more than once on a server: each one's runs pooled (tokens over seconds),
    the ratio to the same server's target alone pooled (empty when no method repeats)."""
    groups: dict[tuple[str, str, int], list[dict]] = {}
    for r in result["runs"]:
        groups.setdefault((label(r), r["mode"], r["concurrency"]), []).append(r)
    if all(len(runs) == 1 for runs in groups.values()):
        return []

    def totals(runs: list[dict]) -> tuple[int, float]:
        return sum(t["completion_tokens"] for r in runs for t in r["turns"]), sum(r["seconds"] for r in runs)

    lines = ["| method | mode | c | runs | tokens | seconds | tok/s | ratio | per run tok/s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (name, mode, c), runs in groups.items():
        tokens, seconds = totals(runs)
        base = groups.get((label({"server": runs[0]["server"], "method": REFERENCE}), mode, c))
        base_tokens, base_seconds = totals(base) if base else (0, 0.0)
        ratio = tokens / seconds / (base_tokens / base_seconds) if base_tokens else None
        lines.append(f"| {name} | {mode} | {c} | {len(runs)} | {tokens:,} | {seconds:.0f} | {tokens / seconds:.2f} | "
                     f"{_fmt(ratio, '{:.3f}')} | " + ", ".join(f"{r['tokens_per_s']:.2f}" for r in runs) + " |")
    return lines


def _identical(run: dict, reference: dict | None) -> str:
    """Greedy answers equal to the target alone's (by digest), of those both runs have."""
    if reference is None or run["mode"] != "greedy" or not run.get("answers") or run is reference:
        return ""
    pairs = [(a, b) for sid, mine in run["answers"].items() for a, b in zip(mine, reference["answers"].get(sid, []))]
    return f"{sum(a == b for a, b in pairs)} of {len(pairs)}"


def runs_table(result: dict) -> list[str]:
    refs = _references(result)
    lines = ["| method | mode | c | turns | tokens | tok/s | ratio | TTFT median ms | prompt from cache | "
             "cycles from request | cycles from memory | memory growth (tokens) | greedy answers = target alone's |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in _all_runs(result):
        ref = refs.get((r["mode"], r["concurrency"]))
        ratio = r["tokens_per_s"] / ref["tokens_per_s"] if ref and ref["tokens_per_s"] else None
        ttft = _median(t["ttft_s"] for t in r["turns"])
        last = [t["memory_tokens"] for t in r["turns"] if t["memory_tokens"] is not None]
        growth = max(last) - r["memory_before"] if last and r["memory_before"] is not None else None
        shares = [_fmt(_share(r["turns"], s), "{:.0%}") for s in SOURCES]
        lines.append(f"| {label(r)} | {r['mode']} | {r['concurrency']} | {len(r['turns'])} | "
                     f"{sum(t['completion_tokens'] for t in r['turns']):,} | {r['tokens_per_s']:.2f} | "
                     f"{_fmt(ratio, '{:.3f}')} | {_fmt(ttft and ttft * 1e3, '{:.0f}')} | "
                     f"{_fmt(_cached(r['turns']), '{:.0%}')} | {' | '.join(shares)} | {_fmt(growth, '{:,}')} | "
                     f"{_identical(r, ref)} |" + (f" error: {r['error']}" if r.get("error") else ""))
    return lines


def _workload_speed(turns: list[dict], workload: str, keys: set[tuple[str, int]] | None = None) -> float | None:
    """Tokens over seconds of the workload's turns (those of `keys` (session, turn) where given)."""
    mine = [t for t in turns if t["workload"] == workload and (keys is None or (t["session"], t["turn"]) in keys)]
    seconds = sum(t["seconds"] for t in mine)
    return sum(t["completion_tokens"] for t in mine) / seconds if seconds else None


def workloads_table(result: dict) -> list[str]:
    """Per run and workload, tok/s over its turns and the ratio to the reference's same turns
    (a peer does not replay a forced tool call's turn)."""
    refs, workloads = _references(result), result["settings"]["workloads"]
    lines = ["| method | mode | c | " + " | ".join(f"{w} tok/s (ratio)" for w in workloads) + " |",
             "|---|---|---|" + "---|" * len(workloads)]
    for r in _all_runs(result):
        ref = refs.get((r["mode"], r["concurrency"]))
        both = {(t["session"], t["turn"]) for t in r["turns"]} & {(t["session"], t["turn"]) for t in ref["turns"]} \
            if ref else set()
        cells = []
        for w in workloads:
            mine, base = _workload_speed(r["turns"], w), _workload_speed(ref["turns"], w, both) if ref else None
            shared = _workload_speed(r["turns"], w, both)
            ratio = shared / base if shared and base else None
            cells.append(f"{_fmt(mine)} ({_fmt(ratio, '{:.3f}')})")
        lines.append(f"| {label(r)} | {r['mode']} | {r['concurrency']} | " + " | ".join(cells) + " |")
    return lines


def per_turn(result: dict, mode: str) -> dict[str, dict[tuple[str, int], dict[str, float | None]]]:
    """At the lowest concurrency, per method label and (workload, turn): medians over the
    sessions of tokens/s, ratio to the target alone's same turn, TTFT (s), memory tokens,
    and the shares (prompt from cache, cycles from request and memory) over the sessions."""
    c = min(result["settings"]["concurrency"])
    ref = _references(result).get((mode, c))
    base = {(t["session"], t["turn"]): _speed(t) for t in ref["turns"]} if ref else {}
    by_label: dict[str, dict[tuple[str, int], list[dict]]] = {}
    for r in _all_runs(result):
        if r["mode"] == mode and r["concurrency"] == c:
            groups = by_label.setdefault(label(r), {})  # a repeated method's runs: one curve
            for t in r["turns"]:
                groups.setdefault((t["workload"], t["turn"]), []).append(t)
    out: dict[str, dict[tuple[str, int], dict[str, float | None]]] = {}
    for name, groups in by_label.items():
        out[name] = {key: {
            "tokens_per_s": _median(_speed(t) for t in turns),
            "ratio": _median(_speed(t) / base[t["session"], t["turn"]] if base.get((t["session"], t["turn"]))
                             else None for t in turns),
            "ttft_s": _median(t["ttft_s"] for t in turns),
            "memory_tokens": _median(t["memory_tokens"] for t in turns),
            "cached": _cached(turns), **{s: _share(turns, s) for s in SOURCES}} for key, turns in sorted(groups.items())}
    return out


def turns_table(result: dict, mode: str) -> list[str]:
    lines = ["| workload | turn | method | tok/s median | ratio median | TTFT median ms | prompt from cache | "
             "cycles from request | cycles from memory | memory tokens |", "|---|---|---|---|---|---|---|---|---|---|"]
    curves = per_turn(result, mode)
    keys = sorted({k for by_turn in curves.values() for k in by_turn})
    for workload, turn in keys:
        for method, by_turn in curves.items():
            v = by_turn.get((workload, turn))
            if v is None:
                continue
            lines.append(f"| {workload} | {turn + 1} | {method} | {_fmt(v['tokens_per_s'])} | "
                         f"{_fmt(v['ratio'], '{:.3f}')} | {_fmt(v['ttft_s'] and v['ttft_s'] * 1e3, '{:.0f}')} | "
                         f"{_fmt(v['cached'], '{:.0%}')} | {_fmt(v['request'], '{:.0%}')} | "
                         f"{_fmt(v['memory'], '{:.0%}')} | {_fmt(v['memory_tokens'], '{:,.0f}')} |")
    return lines


def markdown(result: dict, plots: list[str]) -> str:
    m, s = result["machine"], result["settings"]
    servers = "; ".join(f"`{k}` ({' '.join(v['flags']) or 'defaults'}: {', '.join(v['methods'])})"
                        for k, v in s["servers"].items())
    c = min(s["concurrency"])
    order = ("up together, one session at a time: the target alone, each llama-server peer's replay of its "
             "transcript, then auto" if s.get("interleaved") else "one up at a time")
    lines = [
        f"# Sessions through the server ({m['date']})", "",
        f"Machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}, llama-cpp-python {m['llama_cpp_python']}. "
        f"Command: `{m['command']}`. Run time {result.get('minutes', '?')} min.", "",
        f"Target {s['target']} (q4, llama.cpp), context {s['n_ctx']} per sequence. Workloads "
        f"{', '.join(s['workloads'])}, {s['sessions_per_workload']} sessions each, at most "
        + ", ".join(f"{w} {n}" for w, n in s["max_tokens"].items()) + " new tokens per turn; the target's own "
        f"answers fed into later turns (the agent loop's reads scripted). Modes {', '.join(s['modes'])}; "
        f"sessions {', '.join(map(str, s['concurrency']))} at once (the memory-off and prefix-cache-off servers: "
        f"{', '.join(map(str, s.get('ablation_concurrency', s['concurrency'])))}; llama-server: "
        f"{', '.join(map(str, s.get('peer_concurrency', s['concurrency'])))}). Servers, {order}: {servers}. "
        f"Router: {s['router_start']}. Every run has its own API key (its own memory partition and prefix "
        "caches). Ratios: to the target alone's first run on the default server (else the first server that ran it), "
        "same mode and concurrency.",
        "", "llama-server peers: " + (s["peers_missing"] or ", ".join(s["native_servers"]) or "none asked for")
        + "".join(f"; {k} unavailable: {v}" for k, v in result.get("peer_errors", {}).items()) + ".", "",
        "## Runs", "", *runs_table(result), "",
        "Tok/s: the run's tokens over its wall time. TTFT: to a turn's first visible output (a streamed "
        "write_file call shows only when it closes). Cycles from request / memory: the share of auto's cycles "
        "whose block its model-free lookup drafted from the request's own text / from the cross-request memory. "
        "Memory growth: what the run added to the memory (all partitions).", "",
        "## Per workload (tokens over the turns' seconds)", "", *workloads_table(result), ""]
    if pooled := pooled_table(result):
        lines += ["## Repeated methods, pooled (tokens over the runs' seconds)", "", *pooled, ""]
    for mode in s["modes"]:
        lines += [f"## Per turn, {mode}, {c} session{'s' if c > 1 else ''} at once (medians over sessions)", "",
                  *turns_table(result, mode), ""]
    lines += [f"![{name}]({name})" for name in plots]
    return "\n".join(lines) + "\n"


def write_plots(result: dict, out: Path, stem: str) -> list[str]:
    """Per mode, per-turn curves (tokens/s and TTFT per workload, at the lowest concurrency),
    and throughput against concurrency; returns the files' names (none without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        return []
    out.mkdir(parents=True, exist_ok=True)
    names = []
    workloads = result["settings"]["workloads"]
    for mode in result["settings"]["modes"]:
        curves = per_turn(result, mode)
        fig, axes = plt.subplots(2, len(workloads), figsize=(5 * len(workloads), 7), squeeze=False)
        for col, workload in enumerate(workloads):
            for method, by_turn in curves.items():
                keys = sorted(k for k in by_turn if k[0] == workload)
                turns = [k[1] + 1 for k in keys]
                _line(axes[0][col], turns, [by_turn[k]["tokens_per_s"] for k in keys], method)
                _line(axes[1][col], turns, [by_turn[k]["ttft_s"] for k in keys], method)
            axes[0][col].set(title=f"{workload}, {mode}", ylabel="tokens/s (median)")
            axes[1][col].set(xlabel="turn", ylabel="time to first output, s (median)")
            for ax in axes[:, col]:
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        _save(fig, axes[0][0], out / f"{stem}-turns-{mode.replace('=', '').replace('.', '')}.png", names, plt)
    fig, axes = plt.subplots(1, len(result["settings"]["modes"]), figsize=(6 * len(result["settings"]["modes"]), 4),
                             squeeze=False)
    for ax, mode in zip(axes[0], result["settings"]["modes"]):
        for method in dict.fromkeys(label(r) for r in _all_runs(result)):
            rows = sorted((r["concurrency"], r["tokens_per_s"]) for r in _all_runs(result)
                          if label(r) == method and r["mode"] == mode)
            _line(ax, [c for c, _ in rows], [v for _, v in rows], method)
        ax.set(title=f"throughput, {mode}", xlabel="sessions at once", ylabel="total tokens/s")
    _save(fig, axes[0][0], out / f"{stem}-concurrency.png", names, plt)
    return names


def _line(ax, xs: list, ys: list, name: str) -> None:
    points = [(x, y) for x, y in zip(xs, ys) if y is not None]
    if points:
        ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=name)


def _save(fig, ax, file: Path, names: list[str], plt) -> None:
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(file, dpi=110)
    plt.close(fig)
    names.append(file.name)

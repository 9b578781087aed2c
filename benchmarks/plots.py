"""PNG plots of a benchmark result (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

def write_plots(result: dict, out: Path, stem: str) -> list[str]:
    """Writes the plots next to the report; returns their file names."""
    figures = {
        "tokens-per-second": tokens_per_second(result),
        "accepted-per-block": accepted_per_block(result),
        "auto-chains": auto_chains(result),
    }
    names = []
    for suffix, fig in figures.items():
        name = f"{stem}-{suffix}.png"
        fig.savefig(out / name, dpi=110, bbox_inches="tight")
        plt.close(fig)
        names.append(name)
    return names


def _split(result: dict) -> tuple[list[str], list[str], list[str]]:
    """Methods, datasets (without 'all') and modes, in run order."""
    keys = [k.split(" | ") for k in result["summary"]]
    unique = lambda i: list(dict.fromkeys(k[i] for k in keys if k[1] != "all"))  # noqa: E731
    return unique(0), unique(1), unique(2)


def _grouped_bars(ax, groups: list[str], series: dict[str, list[float]]) -> None:
    width = 0.8 / max(len(series), 1)
    for i, (label, values) in enumerate(series.items()):
        ax.bar([g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))], values, width, label=label)
    ax.set_xticks(range(len(groups)), groups)


def _legend(fig, ax) -> None:
    """One legend under the panels, where it hides no bar."""
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3, fontsize=8, frameon=False)


def tokens_per_second(result: dict):
    methods, datasets, modes = _split(result)
    s = result["summary"]
    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 4.2), sharey=True, squeeze=False)
    for ax, mode in zip(axes[0], modes):
        _grouped_bars(ax, datasets, {m: [s[f"{m} | {d} | {mode}"]["median_tokens_per_second"] for d in datasets]
                                     for m in methods})
        ax.set_title(f"median tokens/s, {mode}")
    axes[0][0].set_ylabel("tokens/s")
    _legend(fig, axes[0][0])
    return fig


def accepted_per_block(result: dict):
    """Mean tokens accepted per verification block, per proposing level of each fixed chain."""
    methods, datasets, modes = _split(result)
    s = result["summary"]
    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 4.2), sharey=True, squeeze=False)
    for ax, mode in zip(axes[0], modes):
        series = {}
        for m in methods:
            names = result["methods"][m]["chain"]
            for level, value in enumerate(s[f"{m} | all | {mode}"]["mean_accepted_per_block"]):
                label = f"{m}: {_short(names[level])} by {_short(names[level + 1])}"
                series[label] = [s[f"{m} | {d} | {mode}"]["mean_accepted_per_block"][level] for d in datasets]
        _grouped_bars(ax, datasets, series)
        ax.set_title(f"accepted tokens per block, {mode}")
    axes[0][0].set_ylabel("mean accepted per block")
    _legend(fig, axes[0][0])
    return fig


def auto_chains(result: dict):
    """The chain auto ran at every cycle, for the first prompt of each dataset in each mode."""
    first: dict[tuple[str, str], dict] = {}
    for r in result["runs"]:
        if r["method"] == "auto":
            first.setdefault((r["mode"], r["dataset"]), r)
    picked = list(first.values())
    fig, axes = plt.subplots(len(picked), 1, figsize=(9, 1.5 * len(picked) + 0.5), squeeze=False)
    for ax, r in zip(axes[:, 0], picked):
        cycles = r["chains_per_cycle"]
        ax.step(range(len(cycles) + 1), [*cycles, cycles[-1]], where="post")  # the last cycle gets its width
        ax.set_yticks(range(len(r["chain_labels"])), r["chain_labels"], fontsize=7)
        ax.set_ylim(-0.5, len(r["chain_labels"]) - 0.5)
        ax.set_title(f"auto: {r['dataset']} {r['prompt']}, {r['mode']}", fontsize=9)
    axes[-1][0].set_xlabel("cycle")
    fig.tight_layout()
    return fig


def _short(name: str) -> str:
    return name.removeprefix("qwen2.5-coder-")

"""Host work per cycle: what the engine spends outside the models, with and without freed pages kept.

The models are fixed-row synthetic backends of Qwen2.5's vocabulary (151,936) that cost
nothing (a row is returned, not computed), so every second measured is the engine's own:
scheduling the cycle, the KV bookkeeping, copying logits, warping and sampling each row,
verifying. The draft and the target agree (the same row, one token far ahead), so every
proposal is accepted and a cycle is one full block. Each allocator mode runs in a process of
its own (the setting is process-wide), the modes alternated, REPEATS processes each;
reported: the median per configuration of host milliseconds per cycle and per token.

`--rows cuda` (or `cpu`) hands the cascade its rows as torch tensors on that device instead
of numpy (ops/rows_torch.py: warped, sampled and verified there), what a torch model
on a GPU hands over: the row lives on the device once and every forward returns a view of
it (no copy, no compute: the forward's own work is not the engine's).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

import numpy as np

from benchmarks.args import benchmark_parser, result_stem
from benchmarks.machine import machine_info
from benchmarks.output import write_result

VOCAB = 151_936
TOKENS = 200
#: (label, drafter or None for a model draft, draft length; 0: the target alone)
CONFIGS = [("target alone", None, 0), ("model -> target [1]", None, 1), ("model -> target [4]", None, 4),
           ("model -> target [16]", None, 16), ("suffix -> target [16]", "suffix", 16)]
TEMPERATURES = (0.0, 0.7)
MODES = ("default", "kept")


def measure(mode: str, generations: int, rows: str = "host") -> list[dict]:
    """In this process: every configuration at every temperature, rows on the host (numpy)
    or on a torch device."""
    from specrouter.allocator import keep_freed_pages
    from specrouter.backends.synthetic import SyntheticBackend
    from specrouter.cascade.chain import Chain
    from specrouter.cascade.sampling import SamplingParams
    from specrouter.drafters import MODEL_FREE
    from specrouter.engine import generate

    if mode == "kept" and not keep_freed_pages():
        raise SystemExit("the allocator thresholds could not be set here (not glibc)")

    class FixedRow(SyntheticBackend):
        def __init__(self, name: str, row: np.ndarray) -> None:
            super().__init__(name, vocab=VOCAB, order=0, n_ctx=100_000)
            self._row = row

        def logits_for(self, context) -> np.ndarray:
            return self._row

    class DeviceRow(FixedRow):
        def __init__(self, name: str, row: np.ndarray) -> None:
            import torch

            super().__init__(name, row)
            self._device_row = torch.from_numpy(row).to(rows)

        def _extend(self, seq, tokens, pos, n_logits):
            super()._extend(seq, tokens, pos, 0)  # the KV's books only
            return self._device_row.unsqueeze(0).expand(n_logits, -1)

    model = FixedRow
    if rows != "host":
        from specrouter.ops.rows_torch import register_tensors

        register_tensors()
        model = DeviceRow
    row = (np.random.default_rng(0).normal(size=VOCAB) * 3).astype(np.float32)
    row[7] += 30.0  # token 7 far ahead: drafts are accepted at any temperature
    out = []
    for temperature in TEMPERATURES:
        params = SamplingParams(temperature=temperature)
        for label, drafter, k in CONFIGS:
            target = model("target", row)
            below = MODEL_FREE[drafter]() if drafter else model("draft", row)
            chain = Chain([target], []) if k == 0 else Chain([below, target], [k])
            generate(chain, [1, 2, 3], params, 20, rng=np.random.default_rng(1))  # warm-up
            start, tokens, cycles = time.perf_counter(), 0, 0
            for g in range(generations):
                r = generate(chain, [1, 2, 3], params, TOKENS, rng=np.random.default_rng(g))
                tokens, cycles = tokens + len(r.token_ids), cycles + r.cycles
            seconds = time.perf_counter() - start
            out.append({"config": label, "temperature": temperature, "tokens": tokens, "cycles": cycles,
                        "ms_per_cycle": 1e3 * seconds / cycles, "ms_per_token": 1e3 * seconds / tokens})
    return out


def rows_info(rows: str) -> str:
    """Where the rows were, in words (the GPU's name for a CUDA device)."""
    if rows == "host":
        return "numpy on the host"
    import torch

    name = torch.cuda.get_device_name(torch.device(rows)) if torch.device(rows).type == "cuda" else "the CPU"
    return f"torch tensors on {rows} ({name})"


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [f"# Host work per cycle, freed pages kept or not ({m['date']})", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}. Command: `{m['command']}`. "
             f"Models cost nothing (fixed rows of a {VOCAB:,}-token vocabulary, every proposal accepted); "
             f"rows as {result.get('rows', 'numpy on the host')}; "
             f"{TOKENS} tokens per generation, {result['generations']} generation(s) per configuration, "
             f"{result['repeats']} processes per allocator mode, alternated; medians over the processes.", "",
             "| temperature | chain | tokens per cycle | default: ms/cycle | kept: ms/cycle | default: ms/token "
             "| kept: ms/token | kept / default |",
             "|---|---|---|---|---|---|---|---|"]
    for row in result["table"]:
        lines.append(f"| {row['temperature']:g} | {row['config']} | {row['tokens_per_cycle']:.1f} "
                     f"| {row['default']['ms_per_cycle']:.2f} | {row['kept']['ms_per_cycle']:.2f} "
                     f"| {row['default']['ms_per_token']:.3f} | {row['kept']['ms_per_token']:.3f} "
                     f"| {row['kept']['ms_per_token'] / row['default']['ms_per_token']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    ap = benchmark_parser("host-work", __doc__, repeats=3, repeats_help="processes per allocator mode")
    ap.add_argument("--generations", type=int, default=5, help="generations per configuration and process")
    ap.add_argument("--rows", default="host", help="host (numpy), or a torch device (cpu, cuda) holding the rows")
    ap.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        json.dump(measure(args.worker, args.generations, args.rows), sys.stdout)
        return
    runs: dict[str, list[list[dict]]] = {mode: [] for mode in MODES}
    for i in range(args.repeats):
        for mode in MODES:
            done = subprocess.run([sys.executable, "-m", "benchmarks.host_work", "--worker", mode, "--rows", args.rows,
                                   "--generations", str(args.generations)], capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"worker {mode} failed:\n{done.stderr[-3000:]}")
            runs[mode].append(json.loads(done.stdout))
            print(f"process {i + 1}/{args.repeats} {mode} done", file=sys.stderr)
    table = []
    for j, first in enumerate(runs[MODES[0]][0]):
        entry = {"config": first["config"], "temperature": first["temperature"],
                 "tokens_per_cycle": first["tokens"] / first["cycles"]}
        for mode in MODES:
            entry[mode] = {key: statistics.median(run[j][key] for run in runs[mode]) for key in ("ms_per_cycle", "ms_per_token")}
        table.append(entry)
    result = {"machine": machine_info(), "rows": rows_info(args.rows), "repeats": args.repeats, "generations": args.generations, "table": table, "runs": runs}
    write_result(result, markdown, out=args.out, stem=result_stem(args, "host-work", result))


if __name__ == "__main__":
    main()

"""The router's own host time: what auto's choice before every cycle costs, alone and in
batches, deliberating every cycle or paced (router/pacing.py).

    python -m benchmarks router-work [--trace FILE] [--device h200] [--overhead-ms 0.5]
                                     [--batches 1,8,32] [--fractions 0,0.05] [--repeats 3] [--stem NAME]

The committed q4 trace (benchmarks/results/simulation-2026-12-03-epyc-trace.json: the
target's answers and every draft's rows, recorded once) is replayed through the batch
scheduler on a roofline profile (sim/roofline.py), so the router decides as it would on
that device while every model call costs nothing on this host: each sequence-cycle's wall
time is the engine's own work (the replay backends' bookkeeping included), and the time
inside each choice (Router.choose, timed around the call) is the router's. Each choice's
measured wall time is also charged to the replay's clock (Replay.charge), where it is what it
would be on that device's host: outside every forward, paid by the batch one sequence after
another, and timed by the request, so the router's pacing reads it (its d). The pacing's
FRACTION is each run's (0: every choice deliberates, the router without pacing). The target
alone runs the same requests (its choice is a fixed chain's: none). Every repeat starts a
fresh router (no saved estimates); reported per batch size and fraction: the median over
repeats of the mean milliseconds per choice (all, deliberations, reuses), the share of
choices that deliberated, the wall milliseconds per sequence-cycle of auto and of the target
alone, and auto's simulated speed-up over the target alone with its choices priced at this
host's measured time (SIMULATION: the device's forwards, this CPU's Python).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from benchmarks.args import benchmark_parser, int_list, result_stem
from benchmarks.machine import machine_info
from benchmarks.output import RESULTS, write_result
from specrouter.cascade.chain import Chain
from specrouter.engine.chain_router import ChainRouter
from specrouter.router.policy.pacing import ChoicePacing
from specrouter.sim.batched import serve
from specrouter.sim.host import PricedChoices
from specrouter.sim.roofline import device, roofline_profile
from specrouter.sim.simulate import ChainChoice, Replay
from specrouter.sim.trace import Trace

TRACE = RESULTS / "simulation-2026-12-03-epyc-trace.json"


class TimedChoices(PricedChoices):
    """A router whose every choice is timed on the wall clock and charged to the replay's
    clock; `record` gets (seconds, whether it deliberated) of every choice but a request's
    first cycle's (the target feeds the prompt alone: nothing is chosen)."""

    def __init__(self, router: ChainRouter, charge: Callable[[float], None],
                 record: Callable[[float, bool], None]) -> None:
        super().__init__(router, 0.0, charge)
        self.record = record

    def choose(self, position: int, room: int, cached: Mapping[str, int], context: Sequence[int],
               forced: Sequence[int] = ()) -> Chain:
        start = time.perf_counter()
        chain = self.router.choose(position, room, cached, context, forced)
        seconds = time.perf_counter() - start
        self.charge(seconds)
        if not self.router.prefill:
            self.record(seconds, self.router.deliberated)
        return chain


def once(replay: Replay, batch: int, fraction: float) -> dict:
    """One fresh router's sessions (pacing at `fraction`), then the target alone, through a
    batch of `batch`."""
    choices: list[tuple[float, bool]] = []
    router = replay.router(pacing=ChoicePacing(fraction))
    start, sim_start = time.perf_counter(), replay.clock()
    auto = serve(replay, lambda: TimedChoices(router.session(), replay.charge,
                                              lambda s, d: choices.append((s, d))), batch)
    auto_wall, auto_sim = time.perf_counter() - start, replay.clock() - sim_start
    start, sim_start = time.perf_counter(), replay.clock()
    alone = serve(replay, lambda: replay.chain(ChainChoice((replay.trace.target,), ())), batch)
    alone_wall, alone_sim = time.perf_counter() - start, replay.clock() - sim_start
    ms = 1e3 * np.array([s for s, _ in choices])
    deliberated = np.array([d for _, d in choices])
    return {"choices": len(choices), "deliberated_share": float(deliberated.mean()),
            "choice_mean_ms": float(ms.mean()), "choice_median_ms": float(np.median(ms)),
            "choice_p90_ms": float(np.percentile(ms, 90)),
            "deliberation_mean_ms": float(ms[deliberated].mean()),
            "reuse_mean_ms": float(ms[~deliberated].mean()) if (~deliberated).any() else 0.0,
            "auto_ms_per_cycle": 1e3 * auto_wall / auto.cycles, "alone_ms_per_cycle": 1e3 * alone_wall / alone.cycles,
            "auto_cycles": auto.cycles, "alone_cycles": alone.cycles,
            "choice_share_of_auto": float(ms.sum() / 1e3 / auto_wall),
            "simulated_speedup": (alone_sim / alone.tokens) / (auto_sim / auto.tokens)}


def run(trace_file: Path, device_name: str, overhead_ms: float, batches: list[int], fractions: list[float],
        repeats: int) -> dict:
    trace = Trace.load(trace_file)
    dev = device(device_name, overhead_ms)
    replay = Replay(trace, roofline_profile(dev, trace.params_b))
    cells = [(b, f) for b in batches for f in fractions]
    rows: dict[tuple[int, float], list[dict]] = {cell: [] for cell in cells}
    for r in range(repeats):
        for cell in cells:  # interleaved: every batch size and fraction in every repeat
            rows[cell].append(once(replay, *cell))
            print(r, cell, {k: round(v, 3) for k, v in rows[cell][-1].items()}, flush=True)
    summary = [{"batch": b, "fraction": f, **{k: statistics.median(x[k] for x in rows[(b, f)]) for k in rows[(b, f)][0]}}
               for b, f in cells]
    return {"machine": machine_info(), "trace": trace_file.name, "device": f"{dev.name}, {overhead_ms} ms per forward",
            "repeats": repeats, "runs": {f"{b}/{f}": runs for (b, f), runs in rows.items()}, "summary": summary}


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [f"# The router's own host time per choice ({m['date']})", "",
             f"Machine: {m['cpu']}, {m['cores']} cores. Command: `{m['command']}`. Trace `{result['trace']}` "
             f"replayed through the batch scheduler, the router deciding on the roofline profile of "
             f"{result['device']} (SIMULATION for the decisions and the speed-up; every model call free on this "
             f"host, so every wall second measured is the engine's own, and each choice's is charged to the "
             f"simulated clock). Pacing fraction 0: every choice deliberates (no pacing). Fresh router per repeat "
             f"(no saved estimates); {result['repeats']} repeats, medians.", "",
             "| batch | pacing | choices | deliberated | per choice: mean / median / p90 (ms) | per deliberation / "
             "reuse (ms) | auto: ms per sequence-cycle | target alone | choices' share of auto's time | "
             "auto / target alone (SIMULATION, choices priced) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["summary"]:
        lines.append(f"| {r['batch']} | {r['fraction']:g} | {r['choices']:.0f} | {100 * r['deliberated_share']:.0f}% | "
                     f"{r['choice_mean_ms']:.3f} / {r['choice_median_ms']:.3f} / {r['choice_p90_ms']:.3f} | "
                     f"{r['deliberation_mean_ms']:.3f} / {r['reuse_mean_ms']:.3f} | {r['auto_ms_per_cycle']:.3f} | "
                     f"{r['alone_ms_per_cycle']:.3f} | {100 * r['choice_share_of_auto']:.0f}% | "
                     f"{r['simulated_speedup']:.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    ap = benchmark_parser("router-work", __doc__, trace=TRACE, repeats=3)
    ap.add_argument("--device", default="h200", help="the roofline device the router decides for")
    ap.add_argument("--overhead-ms", type=float, default=0.5, help="its fixed cost per forward")
    ap.add_argument("--batches", type=int_list, default=[1, 8, 32], help="comma-separated batch sizes")
    ap.add_argument("--fractions", default="0,0.05", help="the pacing's FRACTION per run (0: no pacing)")
    args = ap.parse_args(argv)
    result = run(args.trace, args.device, args.overhead_ms, args.batches,
                 [float(f) for f in args.fractions.split(",")], args.repeats)
    write_result(result, markdown, out=args.out, stem=result_stem(args, "router-work", result))


if __name__ == "__main__":
    main()

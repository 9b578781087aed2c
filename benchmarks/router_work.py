"""The router's own host time: what auto's choice before every cycle costs, alone and in batches.

    python -m benchmarks.router_work [--trace FILE] [--device h200] [--overhead-ms 0.5]
                                     [--batches 1,8,32] [--repeats 3] [--stem NAME]

The committed q4 trace (benchmarks/results/simulation-2026-12-03-epyc-trace.json: the
target's answers and every draft's rows, recorded once) is replayed through the batch
scheduler on a roofline profile (sim/roofline.py), so the router decides as it would on
that device while every model call costs nothing on this host: each sequence-cycle's wall
time is the engine's own work (the replay backends' bookkeeping included), and the time
inside each choice (ChainRouter.choose, timed around the call) is the router's. The
target alone runs the same requests (its choice is a fixed chain's: none). Every repeat
starts a fresh router (no saved estimates); reported: per batch size the median over
repeats of the mean, median and p90 milliseconds per choice, and of the wall
milliseconds per sequence-cycle of auto and of the target alone. The mean per choice is
what `benchmarks/simulation.py --host-ms CALL,ROW,CHOICE` prices (sim/host.py).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from benchmarks.machine import machine_info, write_result
from specrouter.cascade.chain import Chain
from specrouter.engine.request import ChainRouter
from specrouter.sim.batched import serve
from specrouter.sim.host import PricedChoices
from specrouter.sim.roofline import device, roofline_profile
from specrouter.sim.simulate import ChainChoice, Replay
from specrouter.sim.trace import Trace

RESULTS = Path(__file__).parent / "results"
TRACE = RESULTS / "simulation-2026-12-03-epyc-trace.json"


class TimedChoices(PricedChoices):
    """A router whose every choice is timed on the wall clock (`charge` gets the seconds)."""

    def __init__(self, router: ChainRouter, charge: Callable[[float], None]) -> None:
        super().__init__(router, 0.0, charge)

    def choose(self, position: int, room: int, cached: Mapping[str, int], context: Sequence[int],
               forced: Sequence[int] = ()) -> Chain:
        start = time.perf_counter()
        chain = self.router.choose(position, room, cached, context, forced)
        self.charge(time.perf_counter() - start)
        return chain


def once(replay: Replay, batch: int) -> dict:
    """One fresh router's sessions, then the target alone, through a batch of `batch`."""
    choices: list[float] = []
    router = replay.router()
    start = time.perf_counter()
    auto = serve(replay, lambda: TimedChoices(router.session(), choices.append), batch)
    auto_wall = time.perf_counter() - start
    start = time.perf_counter()
    alone = serve(replay, lambda: replay.chain(ChainChoice((replay.trace.target,), ())), batch)
    alone_wall = time.perf_counter() - start
    ms = 1e3 * np.array(choices)
    return {"choices": len(choices), "choice_mean_ms": float(ms.mean()), "choice_median_ms": float(np.median(ms)),
            "choice_p90_ms": float(np.percentile(ms, 90)), "auto_ms_per_cycle": 1e3 * auto_wall / auto.cycles,
            "alone_ms_per_cycle": 1e3 * alone_wall / alone.cycles, "auto_cycles": auto.cycles,
            "alone_cycles": alone.cycles, "choice_share_of_auto": float(ms.sum() / 1e3 / auto_wall)}


def run(trace_file: Path, device_name: str, overhead_ms: float, batches: list[int], repeats: int) -> dict:
    trace = Trace.load(trace_file)
    dev = device(device_name, overhead_ms)
    replay = Replay(trace, roofline_profile(dev, trace.params_b))
    rows = {b: [] for b in batches}
    for r in range(repeats):
        for b in batches:  # interleaved: every batch size in every repeat
            rows[b].append(once(replay, b))
            print(r, b, {k: round(v, 3) for k, v in rows[b][-1].items()}, flush=True)
    summary = [{"batch": b, **{k: statistics.median(x[k] for x in runs) for k in runs[0]}} for b, runs in rows.items()]
    return {"machine": machine_info(), "trace": trace_file.name, "device": f"{dev.name}, {overhead_ms} ms per forward",
            "repeats": repeats, "runs": {str(b): runs for b, runs in rows.items()}, "summary": summary}


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [f"# The router's own host time per choice ({m['date']})", "",
             f"Machine: {m['cpu']}, {m['cores']} cores. Command: `{m['command']}`. Trace `{result['trace']}` "
             f"replayed through the batch scheduler, the router deciding on the roofline profile of "
             f"{result['device']} (SIMULATION for the decisions; every model call free on this host, so every "
             f"second measured is the engine's own). Fresh router per repeat (no saved estimates); "
             f"{result['repeats']} repeats, medians.", "",
             "| batch | choices | per choice: mean / median / p90 (ms) | auto: ms per sequence-cycle | "
             "target alone: ms per sequence-cycle | choices' share of auto's time |",
             "|---|---|---|---|---|---|"]
    for r in result["summary"]:
        lines.append(f"| {r['batch']} | {r['choices']:.0f} | {r['choice_mean_ms']:.3f} / {r['choice_median_ms']:.3f} / "
                     f"{r['choice_p90_ms']:.3f} | {r['auto_ms_per_cycle']:.3f} | {r['alone_ms_per_cycle']:.3f} | "
                     f"{100 * r['choice_share_of_auto']:.0f}% |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--device", default="h200", help="the roofline device the router decides for")
    ap.add_argument("--overhead-ms", type=float, default=0.5, help="its fixed cost per forward")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--stem", help="name of the result files (default: router-work-<date>)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    result = run(args.trace, args.device, args.overhead_ms, [int(b) for b in args.batches.split(",")], args.repeats)
    stem = args.stem or f"router-work-{result['machine']['date'][:10]}"
    write_result(args.out, stem, result, markdown(result))


if __name__ == "__main__":
    main()

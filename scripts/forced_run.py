"""The engine in trace-forced mode on one device: real forwards of random-weight models of a
trace's shapes, the trace's tokens (specrouter/backends/forced.py, specrouter/sim/forced.py).

With random weights, acceptance on a device means nothing; forced, every forward, batch and
line of the engine's host work runs for real while what is drafted, accepted and committed
is what the trace's real models did. Per batch size (concurrent requests through the batch
scheduler), it times the target alone, the best fixed 2-level and 3-level chains (the
simulator's choice on the profile at that batch) and auto, in milliseconds per committed
token, beside the simulator's prediction of the same runs on the profile (the prompts
priced) and the ratio measured/predicted. Each run is cut once --time-limit seconds have
passed (then compared with the simulator over the same scheduler steps); the JSON is written
after every run, so a command cut short keeps what it measured.

The profile: --profile FILE (the router's format: scripts/torch_profile.py, `specrouter
profile --json`), else timed here on the same models first.

    python scripts/forced_run.py benchmarks/results/simulation-2026-12-03-epyc-trace.json \\
        --device cuda --dtype bfloat16 --time-limit 40 --out forced.json
    python scripts/forced_run.py TRACE --device cpu --dtype float32 --tiny --requests 2 \\
        --batches 1,2 --time-limit 5 --out /tmp/forced.json                 # a CPU smoke test

Nothing is downloaded: the script works offline.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, installed or not
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def shape_of(name: str, shapes: dict[str, str], known) -> str:
    """The published shape a trace's model is built with: --shape's, else its name up to ':'."""
    shape = shapes.get(name, name.split(":")[0])
    if shape not in known:
        raise SystemExit(f"no shape for the trace's model {name!r}: give --shape {name}=one of {', '.join(known)}")
    return shape


def build_models(trace, args) -> dict:
    """A TorchBackend of random weights per model of the trace, under the trace's names."""
    import torch

    from specrouter.backends.torch import TorchBackend
    from torch_profile import SHAPES, _Tokenizer, random_model

    shapes = dict(item.split("=", 1) for item in args.shape)
    rows = None if args.rows == "default" else args.rows == "device"
    models = {}
    for name in (trace.target, *trace.drafts):
        model = random_model(shape_of(name, shapes, SHAPES), args.tiny, args.device, getattr(torch, args.dtype))
        models[name] = TorchBackend.from_model(model, _Tokenizer(model.config.vocab_size), name=name,
                                               device=args.device, dtype=args.dtype, n_ctx=args.n_ctx,
                                               n_seq_max=max(args.batches) + 2, rows_on_device=rows,
                                               runtime=args.torch_runtime)
    return models


def show(run) -> str:
    m, p = run.measured, run.predicted
    ms = lambda r: f"{1e3 * r.seconds / r.tokens:9.3f}" if r.tokens else f"{'-':>9}"  # noqa: E731
    ratio = f"{run.ratio:6.3f}" if m.tokens and p.tokens else f"{'-':>6}"
    cut = "" if m.complete else f"  (cut after {m.steps} steps, {m.sequences} requests finished)"
    return f"B={run.batch:<3} {run.role:<13} {ms(m)} {ms(p)} {ratio}  {run.method}{cut}"


def main(argv: list[str] | None = None) -> dict:
    from specrouter.drafters import DEFAULT_LOOKUP, MODEL_FREE

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path, help="a trace (specrouter simulate --record)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--tiny", action="store_true", help="cut the shapes down (CPU smoke test)")
    ap.add_argument("--shape", action="append", default=[], metavar="MODEL=SHAPE",
                    help="the published shape of a trace's model (default: its name up to ':')")
    ap.add_argument("--rows", choices=("default", "host", "device"), default="default",
                    help="where the models leave their rows (default: the backend's, on the device on a GPU)")
    ap.add_argument("--requests", type=int, default=None, help="the trace's first N requests, in turn per group")
    ap.add_argument("--batches", type=_ints, default=(1, 8, 32), help="comma-separated batch sizes")
    ap.add_argument("--time-limit", type=float, default=None, help="seconds each forced run may take before it is cut")
    ap.add_argument("--profile", type=Path, default=None, help="the cost profile (default: timed here first)")
    ap.add_argument("--repeats", type=int, default=5, help="timed forwards per size of a profile timed here")
    ap.add_argument("--lookup", choices=list(MODEL_FREE), default=DEFAULT_LOOKUP,
                    help="auto's and the fixed chains' model-free drafter")
    ap.add_argument("--host-ms", default=None, metavar="CALL,ROW[,CHOICE[,REUSE]]",
                    help="the engine's work the prediction prices (specrouter simulate --host-ms)")
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--torch-runtime", choices=("eager", "static"), default=None,
                    help="the models' KV runtime (default: static on cuda, eager on a CPU)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if not args.batches or min(args.batches) < 1:
        ap.error(f"--batches must be whole numbers >= 1, got {args.batches}")

    from specrouter.router.estimates.profile_cache import read_profile
    from specrouter.sim.forced import compare, measure_profile
    from specrouter.sim.host import NO_HOST, HostCosts
    from specrouter.sim.trace import Trace
    from torch_profile import device_info, save

    trace = Trace.load(args.trace)
    if args.requests is not None:
        trace = trace.take(args.requests)
    host = HostCosts.parse_ms(args.host_ms) if args.host_ms else NO_HOST
    start = time.perf_counter()
    models = build_models(trace, args)
    result: dict = {"device": device_info(args.device), "settings": {
        "trace": str(args.trace), "requests": len(trace.requests), "tokens": sum(len(r.answer) for r in trace.requests),
        "max_tokens": trace.max_tokens, "dtype": args.dtype, "tiny": args.tiny, "rows": args.rows,
        "torch_runtime": next(iter(models.values())).runtime,
        "batches": list(args.batches), "time_limit_seconds": args.time_limit, "host": host.label(),
        "weights": "random (torch.manual_seed(0)), the trace's tokens forced",
        "profile": str(args.profile) if args.profile else f"timed here, {args.repeats} repeats per size"},
        "load_seconds": round(time.perf_counter() - start, 2)}
    if args.profile:
        profile = read_profile(args.profile).nondecreasing()
    else:
        print("timing the profile", flush=True)
        profile = measure_profile(list(models.values()), args.batches, args.repeats)
    result["profile"] = profile.as_dict()
    save(result, args.out)

    def done(comparison) -> None:
        result.update(comparison.as_dict())
        save(result, args.out)
        print(show(comparison.runs[-1]), flush=True)

    print(f"{'batch':<5} {'role':<13} {'measured':>9} {'predicted':>9} {'ratio':>6}  (ms per token) method", flush=True)
    compare(trace, profile, models, args.batches, args.time_limit, args.lookup, host=host,
            progress=lambda what: print(f"  {what}", file=sys.stderr, flush=True), done=done)
    if args.out:
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()

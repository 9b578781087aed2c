"""The benchmarks `python -m benchmarks` lists and runs: a name, the module that runs it, and
what it measures in one line. Listing imports none of them (a benchmark's module may import
torch or start models)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Benchmark:
    name: str  # as `python -m benchmarks NAME` takes it, and the default prefix of its result files
    module: str  # benchmarks.<module>, whose main(argv) runs it
    summary: str  # what it measures, in one line

    def main(self) -> Callable[[Sequence[str] | None], None]:
        return importlib.import_module(f"benchmarks.{self.module}").main


BENCHMARKS = (
    Benchmark("chains", "chains", "the router benchmark: target alone, static chains, llama.cpp lookup and auto"),
    Benchmark("chat-turns", "chat_turns", "two-turn chats with and without the prefix cache"),
    Benchmark("copy-ceiling", "copy_ceiling", "replayed suffix drafting on the copy workloads: draft-length policies"),
    Benchmark("copy-drafting", "copy_drafting", "copy workloads (code edits, second turns, docs): ours and llama.cpp's"),
    Benchmark("draft-grid", "draft_grid", "forward costs over n tokens and draft lengths on the kernels' tiles"),
    Benchmark("draft-stop-replay", "draft_stop_replay", "the confidence draft stop replayed on recorded text"),
    Benchmark("fleet", "fleet", "the single-process server against `serve --ray`, over HTTP"),
    Benchmark("host-work", "host_work", "the engine's own work per cycle, on models that cost nothing"),
    Benchmark("hostile", "hostile", "the server driven as a hostile client: answers, hangs and drops per item"),
    Benchmark("prefill-stall", "prefill_stall", "a stream's gaps while a long prompt arrives (chunked prefill)"),
    Benchmark("router-work", "router_work", "the router's own host time per choice, alone and in batches"),
    Benchmark("serving", "serving", "throughput and latency against concurrency: target alone and auto"),
    Benchmark("sessions", "sessions", "edit loops, agent loops and document QA through the server, turn by turn"),
    Benchmark("sessions-replay", "sessions_replay", "the sessions' greedy turns replayed through the router, per turn"),
    Benchmark("simulation", "simulation", "the trace-driven simulator: record, validate, predict GPUs and batches"),
    Benchmark("structured", "structured", "forced tool calls and JSON schema answers, with and without speculation"),
    Benchmark("suffix-memory", "suffix_memory", "the cross-request suffix memory's size and speed"),
    Benchmark("torch-auto", "torch_auto", "auto over the fp32 torch target on short chat and summary answers"),
    Benchmark("torch-runtime", "torch_runtime", "the static torch runtime against the eager one, fp32 1.5B target"),
    Benchmark("torch-target", "torch_target", "the fp32 torch target: chains, HF assisted generation, auto, oracle"),
)


def find(name: str) -> Benchmark | None:
    """The benchmark called `name`, also as its module is spelt (copy_drafting, or
    benchmarks.copy_drafting as the results' commands quote it); None if there is none."""
    wanted = name.removeprefix("benchmarks.")
    return next((b for b in BENCHMARKS if wanted in (b.name, b.module)), None)


def listing() -> str:
    """What `python -m benchmarks` prints: how to run one, then each benchmark on a line."""
    width = max(len(b.name) for b in BENCHMARKS)
    return "\n".join(["usage: python -m benchmarks NAME [options]   (NAME --help: what it does, its options)", "",
                      *(f"  {b.name:<{width}}  {b.summary}" for b in BENCHMARKS)])

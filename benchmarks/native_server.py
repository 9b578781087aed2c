"""llama.cpp's own server as a benchmark peer: `llama-server`, built by `make native-peers`
from the llama.cpp source that the pinned llama-cpp-python release vendors (its source
distribution, the same flags as the Python build), with its own speculative decoding.

Peers (`PEERS`; llama.cpp's defaults unless stated, from common/common.h and common/arg.cpp
of that source):
- no speculation: llama.cpp's target alone, to show how far the engine's own target alone
  is from it (every ratio is to the engine's target alone);
- `--spec-default`: ngram-mod (n_match 24, n_min 48, n_max 64), the configuration llama.cpp
  enables as its default;
- `--spec-type ngram-simple` (a 12-token lookup n-gram, 48-token drafts) and the same with a
  4-token n-gram and 16-token drafts (prompt lookup's usual setting; our fixed chains');
- `--spec-type ngram-map-k` (keys of 12, values of 48 tokens);
- draft-model speculation with the 0.5B (`--spec-type draft-simple -md`, up to 3 drafted tokens;
  `-md` alone infers no type from this GGUF and never drafts).

Every server has one slot, the engine's context (4,096) and threads, and no prompt cache
(`--cache-ram 0`; requests send `cache_prompt: false`): every request starts cold, as the
engine's do. A request sends the prompt's token ids (the same tokens as every other method)
to /completion with `n_predict` and `return_tokens`; greedy is temperature 0, T=0.7 keeps
every other filter off as the engine does (top_k 0, top_p 1, min_p 0, typical_p 1,
repeat_penalty 1). Its time is the request's wall time on loopback (prompt included, as the
engine's runs are timed); the server's own timings and draft counters go into the record.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchmarks.servers import free_port, stop, wait_healthy
from benchmarks.sweep import Runner
from specrouter.cascade.sampling import SamplingParams

#: Where `make native-peers` puts the binary.
LLAMA_SERVER = Path(__file__).resolve().parents[1] / "build" / "native" / "llama-server"


@dataclass(frozen=True)
class Peer:
    """One llama-server configuration: its method label, its speculation flags, and the model
    (by pool name) that drafts for it, if any."""

    label: str
    flags: tuple[str, ...] = ()
    draft_model: str | None = None


PEERS = (
    Peer("llama-server"),
    Peer("llama-server ngram-mod (spec-default)", ("--spec-default",)),
    Peer("llama-server ngram-simple 12/48", ("--spec-type", "ngram-simple")),
    Peer("llama-server ngram-simple 4/16", ("--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "4",
                                             "--spec-ngram-simple-size-m", "16")),
    Peer("llama-server ngram-map-k", ("--spec-type", "ngram-map-k")),
    Peer("llama-server draft 0.5b [3]", ("--spec-type", "draft-simple"), draft_model="qwen2.5-coder-0.5b"),
)


class NativeServer:
    """A running llama-server for one peer; `generate` is one cold request."""

    def __init__(self, peer: Peer, model: Path, draft: Path | None, n_threads: int, n_ctx: int,
                 binary: Path = LLAMA_SERVER) -> None:
        if not binary.is_file():
            raise FileNotFoundError(f"{binary} is missing: build it with `make native-peers`")
        self.peer = peer
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        argv = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", str(n_ctx),
                "-np", "1", "-t", str(n_threads), "-tb", str(n_threads), "--cache-ram", "0", *peer.flags]
        if draft is not None:
            argv += ["-md", str(draft), "-td", str(n_threads), "-tbd", str(n_threads)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_healthy(self.proc, self.url, f"llama-server ({peer.label})", timeout=300)
        self.client = httpx.Client(base_url=self.url, timeout=3600)

    def generate(self, tokens: list[int], params: SamplingParams, max_tokens: int,
                 eos_ids: frozenset[int]) -> tuple[list[int], float, dict]:
        """Generated ids (EOS not included, as in the engine), wall seconds, and the server's
        timings (prompt_ms, predicted_ms, draft_n, draft_n_accepted...)."""
        body = {"prompt": tokens, "n_predict": max_tokens, "cache_prompt": False, "return_tokens": True,
                "seed": params.seed if params.seed is not None else 0, "repeat_penalty": 1.0,
                **_sampler_fields(params)}
        start = time.perf_counter()
        r = self.client.post("/completion", json=body)
        seconds = time.perf_counter() - start
        r.raise_for_status()
        answer = r.json()
        ids = [t for t in answer["tokens"] if t not in eos_ids]
        return ids, seconds, answer.get("timings", {})

    def close(self) -> None:
        self.client.close()
        stop(self.proc)


def _sampler_fields(params: SamplingParams) -> dict:
    if params.greedy:
        return {"temperature": 0.0}
    return {"temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p, "min_p": 0.0,
            "typical_p": 1.0}


def open_peers(peers: tuple[Peer, ...], models: dict[str, Path], n_threads: int,
               n_ctx: int) -> tuple[dict[str, NativeServer], dict[str, str]]:
    """A running server per peer that starts, and why each other one did not; models maps
    pool names (the target's and the drafts') to their files."""
    servers, errors = {}, {}
    for peer in peers:
        try:
            draft = models[peer.draft_model] if peer.draft_model is not None else None
            servers[peer.label] = NativeServer(peer, models["target"], draft, n_threads, n_ctx)
        except Exception as exc:  # a peer that cannot run is a result to report, not a reason to stop
            errors[peer.label] = f"{type(exc).__name__}: {exc}"
    return servers, errors


def server_runner(server: NativeServer, eos_ids: frozenset[int]) -> Runner:
    def run(tokens: list[int], params: SamplingParams, max_tokens: int) -> tuple[dict, list[int]]:
        ids, seconds, timings = server.generate(tokens, params, max_tokens, eos_ids)
        return {"tokens": len(ids), "seconds": seconds, "tokens_per_second": len(ids) / seconds if seconds else 0.0,
                "cycles": None, "chains_used": [server.peer.label], "accepted_per_block": [], "draft_lengths": [],
                "server_timings": timings}, ids
    return run


def draft_counts(runs: list[dict]) -> dict[str, dict[str, float]]:
    """Per peer that speculated: tokens drafted and accepted over all its runs (the servers'
    own counters) and the accepted share."""
    out: dict[str, list[int]] = {}
    for r in runs:
        timings = r.get("server_timings") or {}
        if timings.get("draft_n"):
            counts = out.setdefault(r["method"], [0, 0])
            counts[0] += timings["draft_n"]
            counts[1] += timings.get("draft_n_accepted", 0)
    return {m: {"drafted": d, "accepted": a, "accepted_share": round(a / d, 3)} for m, (d, a) in out.items()}

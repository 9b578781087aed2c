"""llama.cpp's own server as a peer of the sessions benchmark: `llama-server` (built by `make
native-peers`, benchmarks/native_server.py) with its speculation settings and its own prompt
cache on, the sessions replayed through it, one server at a time.

A peer replays the conversations the target alone had on our server in the same mode (the
transcript of its run at concurrency 1): turn i of a session is the session's request after
the target alone's first i answers, rendered by the target's chat template into the same
token ids as our server tokenizes (the prompt sent as ids to /completion, streamed). The
peer's own answer is timed, not fed back: llama-server's output under its speculation is the
target's (greedy) or a sample of it (T=0.7), so the timings are of the same work, and every
peer gets the same prompts. A turn that forces a tool call (every agent-loop turn forces its
write_file) is not replayed: nothing forces the call there, so the peer's answer would not
be the same work (the report compares a peer with the target alone over the turns both played).

Every server has as many slots (`-np`) as the sessions in flight, each with the engine's
context, and its prompt cache on: requests send `cache_prompt: true` (a slot keeps its last
prompt's KV; llama-server gives a request the slot whose prompt it shares most of), and the
host-memory prompt cache stays at llama-server's default. Sampling as in native_server.py
(greedy: temperature 0; T=0.7 with every other filter off).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from benchmarks.native_server import LLAMA_SERVER, PEERS, Peer, _sampler_fields
from benchmarks.servers import free_port, stop, wait_healthy
from benchmarks.sessions_client import TURN_SECONDS, RunRecord, TurnRecord
from benchmarks.sessions_workloads import Turn
from specrouter.cascade.sampling import SamplingParams

#: The peers the sessions run: llama.cpp alone, its default n-gram speculation (ngram-mod),
#: its n-gram lookup (12-token keys, 48-token drafts), and the 0.5B drafting.
SESSION_PEERS = tuple(p for p in PEERS if p.label in ("llama-server", "llama-server ngram-mod (spec-default)",
                                                      "llama-server ngram-simple 12/48",
                                                      "llama-server draft 0.5b [3]"))


def peers_missing(binary: Path = LLAMA_SERVER) -> str | None:
    """Why no peer can run here (None: the binary is built)."""
    return None if binary.is_file() else f"{binary} is missing: build it with `make native-peers`"


class CachedServer:
    """A running llama-server for one peer with `slots` slots and its prompt cache on."""

    def __init__(self, peer: Peer, model: Path, draft: Path | None, n_threads: int, n_ctx: int, slots: int,
                 binary: Path = LLAMA_SERVER) -> None:
        if (missing := peers_missing(binary)) is not None:
            raise FileNotFoundError(missing)
        self.peer = peer
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        argv = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", str(n_ctx * slots),
                "-np", str(slots), "-t", str(n_threads), "-tb", str(n_threads), *peer.flags]
        if draft is not None:
            argv += ["-md", str(draft), "-td", str(n_threads), "-tbd", str(n_threads)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_healthy(self.proc, self.url, f"llama-server ({peer.label})", timeout=300)

    def close(self) -> None:
        stop(self.proc)


async def play_turn(http: httpx.AsyncClient, turn: Turn, tokens: list[int], temperature: float) -> TurnRecord:
    """One turn as a streamed /completion of its prompt's ids."""
    body = {"prompt": tokens, "n_predict": turn.max_tokens, "cache_prompt": True, "stream": True, "seed": 0,
            "repeat_penalty": 1.0, **_sampler_fields(SamplingParams(temperature=temperature))}
    sent = time.perf_counter()
    first, last = None, {}
    async with http.stream("POST", "/completion", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event.get("content") and first is None:
                first = time.perf_counter()
            if event.get("stop"):
                last = event
    done = time.perf_counter()
    timings = last.get("timings") or {}
    return TurnRecord(turn.session, turn.workload, turn.index, len(tokens), timings.get("cache_n", 0),
                      timings.get("predicted_n", last.get("tokens_predicted", 0)),
                      None if first is None else first - sent, done - sent, last.get("stop_type"),
                      draft_n=timings.get("draft_n"), draft_accepted=timings.get("draft_n_accepted"))


async def replay(url: str, sessions: Sequence[Sequence[tuple[Turn, list[int]]]], concurrency: int,
                 temperature: float, run: RunRecord) -> RunRecord:
    """Every session's turns (its requests and their prompt ids) in order, `concurrency`
    sessions at once (a closed loop); a failed turn ends the run with its error recorded. A
    run replayed in parts (a session at a time) adds up their seconds."""
    todo = list(sessions)

    async def worker(http: httpx.AsyncClient) -> None:
        while todo:
            for turn, tokens in todo.pop(0):
                run.turns.append(await play_turn(http, turn, tokens, temperature))

    start = time.perf_counter()
    # A connection per request: llama-server may close a connection after a streamed
    # answer, and a request sent on it as it closes gets no response.
    async with httpx.AsyncClient(base_url=url, timeout=TURN_SECONDS,
                                 limits=httpx.Limits(max_keepalive_connections=0)) as http:
        try:
            async with asyncio.TaskGroup() as group:
                for _ in range(concurrency):
                    group.create_task(worker(http))
        except* httpx.HTTPError as failed:
            exc = failed.exceptions[0]
            run.error = f"{type(exc).__name__}: {exc}"
    run.seconds += time.perf_counter() - start
    return run

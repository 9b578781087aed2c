"""The hostile list's items about connections and processes: slow clients and the
connection bound (item 4), bodies far over the limit (turn 2), a drain on SIGTERM (turn 2)
and two servers that exit together on one profile folder (item 7)."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

import httpx

from benchmarks.hostile_client import Client, ItemResult, StreamResult, error_code, read_sse
from benchmarks.hostile_raw import PARTIAL_BODY, big_body, idle_connections, slow_clients
from benchmarks.hostile_servers import Running, ServerSpec, start, terminate
from specrouter.router.estimates.learned import read_estimates, save_estimates

TARGET = "qwen2.5-coder-1.5b"
#: Seconds past its timeout within which the server must have closed a slow client (an
#: event loop on two shared cores is late by up to this much).
SLACK_S = 5.0


@dataclass(frozen=True)
class Timeouts:
    """The read timeouts and connection bound the servers were started with."""

    header_s: float
    body_s: float
    max_connections: int

    def flags(self) -> tuple[str, ...]:
        return ("--header-timeout", str(self.header_s), "--body-timeout", str(self.body_s),
                "--max-connections", str(self.max_connections))


def _normal_request(run: Running, result: ItemResult, what: str) -> None:
    client = Client(run.url, run.key)
    started = time.monotonic()
    client.send(result.tally, what, "POST", "/v1/completions", {200},
                json={"model": TARGET, "prompt": "def add(a, b):", "max_tokens": 4, "temperature": 0})
    result.figures[f"{what} seconds"] = round(time.monotonic() - started, 2)
    client.close()


def slow_clients_closed(run: Running, timeouts: Timeouts, n: int = 400) -> ItemResult:
    """Item 4, read timeouts: n clients stall in their headers or body; each gets a 408 and is
    closed within its timeout (plus SLACK_S); a normal request meanwhile is served (its
    latency reported beside the same request's just before)."""
    result = ItemResult("4 slow clients", run.label, f"{n} clients stalling in their headers or body: each "
                        f"closed with a 408 within its timeout ({timeouts.header_s:g} s headers, {timeouts.body_s:g} "
                        f"s body) + {SLACK_S:g} s; a normal request meanwhile gets its 200")
    slowest = timeouts.header_s + timeouts.body_s + 4 * SLACK_S
    normal = threading.Thread(target=_normal_request, args=(run, result, "normal request meanwhile"))

    async def both():
        pending = asyncio.ensure_future(slow_clients(run.url, run.key, n, slowest))
        await asyncio.sleep(0.5)  # the slow clients are connected
        normal.start()
        return await pending

    _normal_request(run, result, "normal request before")
    answers = asyncio.run(both())
    normal.join()
    for kind, closed in answers:
        limit = (timeouts.body_s if kind == PARTIAL_BODY else timeouts.header_s) + SLACK_S
        if closed.seconds is None:
            result.tally.hang(kind)
        else:
            result.tally.status(kind, closed.status or 0, {408})
            if closed.seconds > limit:
                result.tally.unexpected.append(f"{kind}: closed after {closed.seconds:.1f} s, over {limit:g} s")
    for kind in sorted({k for k, _ in answers}):
        times = [c.seconds for k, c in answers if k == kind and c.seconds is not None]
        result.figures[kind] = {"clients": sum(k == kind for k, _ in answers), "closed": len(times),
                                "first_close_s": round(min(times), 2) if times else None,
                                "last_close_s": round(max(times), 2) if times else None}
    return result


def connection_bound(run: Running, timeouts: Timeouts, extra: int = 10) -> ItemResult:
    """Item 4, the bound: max_connections + extra idle connections opened at once: at least
    `extra` get a 503 at once, at most max_connections are held (each then closed by the
    header timeout with a 408); a normal request afterwards is served."""
    bound = timeouts.max_connections
    result = ItemResult("4 connection bound", run.label, f"{bound + extra} idle connections at once against "
                        f"--max-connections {bound}: at least {extra} answered 503 at once, at most {bound} held "
                        "and closed with a 408 by the header timeout, none left open; then a normal request is served")
    answers = asyncio.run(idle_connections(run.url, bound + extra, timeouts.header_s + 4 * SLACK_S))
    refused = [a for a in answers if a.status == 503]
    held = [a for a in answers if a.status == 408]
    for closed in answers:
        if closed.seconds is None:
            result.tally.hang("idle connection")
        else:
            result.tally.status("idle connection", closed.status or 0, {408, 503})
    result.figures.update({"connections": len(answers), "503": len(refused), "408": len(held),
                           "503 slowest_s": round(max((a.seconds for a in refused), default=0), 2)})
    result.check(f"{len(refused)} refused with 503 (at least {extra})", len(refused) >= extra)
    result.check(f"{len(held)} held (at most {bound})", len(held) <= bound)
    _normal_request(run, result, "normal request after")
    return result


def big_bodies(run: Running) -> ItemResult:
    """Turn 2: bodies far over the limit are refused as soon as their headers (or the limit's
    worth of a body without Content-Length) arrived; without the key, before any is read."""
    cases = [("32 MB", 32 * 10**6, run.key, False, 413), ("200 MB", 200 * 10**6, run.key, False, 413),
             ("32 MB chunked, no Content-Length", 32 * 10**6, run.key, True, 413)]
    if run.key:
        cases.append(("100 MB without the key", 100 * 10**6, None, False, 401))
    result = ItemResult("turn 2: bodies", run.label, "32 MB and 200 MB bodies: 413 within 2 s, before the body "
                        "is read; a 32 MB chunked body: 413 once the limit is passed"
                        + ("; a 100 MB body without the key: 401 before it is read" if run.key else ""))
    for what, size, key, chunked, status in cases:
        answer = asyncio.run(big_body(run.url, size, key, chunked))
        if answer.status is None:
            result.tally.hang(what)
            continue
        result.tally.status(what, answer.status, {status})
        result.figures[what] = {"status": answer.status, "seconds": round(answer.seconds, 3),
                                "sent_mib_before_the_answer": round(answer.sent_mib, 1)}
        result.check(f"{what}: answered in {answer.seconds:.2f} s (under 2)", answer.seconds < 2)
        if not chunked:
            result.check(f"{what}: answered after {answer.sent_mib:.0f} MiB of {size / 2**20:.0f} sent",
                         answer.sent_mib < size / 2**20 / 2)
    return result


def drain_on_sigterm(run: Running) -> ItemResult:
    """Turn 2: SIGTERM while a long stream runs: the stream gets an error event
    (shutting_down), then [DONE]; a newcomer gets a 503 with Retry-After; the process exits 0."""
    result = ItemResult("turn 2: drain on SIGTERM", run.label, "an in-flight stream gets an error event "
                        "(shutting_down) then [DONE]; a newcomer gets a 503 with Retry-After; exit status 0")
    started = threading.Event()
    stream: list[StreamResult | None] = []

    def long_stream():
        client = Client(run.url, run.key)
        body = {"model": TARGET, "messages": [{"role": "user", "content": "Count from 1 to 2000, one per line."}],
                "max_tokens": 1500, "temperature": 0, "stream": True, "speculation": "off"}
        try:
            with client.http.stream("POST", "/v1/chat/completions", json=body) as response:
                got = StreamResult(response.status_code)
                result.tally.status("in-flight stream", response.status_code, {200})
                lines = response.iter_lines()
                read_sse(lines, got, hang_up_after=2)
                started.set()
                got.hung_up = False
                stream.append(read_sse(lines, got))
        except httpx.TimeoutException:
            result.tally.hang("in-flight stream")
        except httpx.HTTPError as exc:
            result.tally.drop("in-flight stream", exc)
        finally:
            started.set()
            client.close()

    reader = threading.Thread(target=long_stream)
    reader.start()
    started.wait(600)
    began = time.monotonic()
    run.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    newcomer = Client(run.url, run.key)
    r = newcomer.send(result.tally, "newcomer", "POST", "/v1/completions", {503},
                      json={"model": TARGET, "prompt": "x", "max_tokens": 2})
    newcomer.close()
    reader.join(120)
    status = terminate(run)
    got = stream[0] if stream else None
    if got is not None and not got.done:
        result.tally.dropped += 1
        result.tally.unexpected.append("in-flight stream: it ended without [DONE]")
    result.figures.update({"exit_status": status, "seconds_to_exit": round(time.monotonic() - began, 1),
                           "stream_events": len(got.events) if got else None,
                           "stream_error": got.error if got else None,
                           "newcomer_code": error_code(r), "retry_after": r.headers.get("retry-after") if r else None})
    result.check("the stream: an error event shutting_down, then [DONE]",
                 got is not None and got.done and (got.error or {}).get("code") == "shutting_down")
    result.check("the newcomer: Retry-After", r is not None and r.headers.get("retry-after") is not None)
    result.check(f"exit status {status}", status == 0)
    return result


REPEAT = ("Rewrite this function with the variable `total` renamed to `acc`, changing nothing else:\n\n"
          "def sum_list(xs):\n    total = 0\n    for x in xs:\n        total = total + x\n    return total\n")


def _store(file: Path) -> dict[str, tuple[float, float]]:
    return {e.key: (e.mean, e.count) for e in read_estimates(file) or []}


def _serve_some(run: Running, result: ItemResult, temperature: float) -> None:
    client = Client(run.url, run.key)
    for i in range(2):
        client.send(result.tally, f"{run.label} request", "POST", "/v1/chat/completions", {200},
                    json={"model": TARGET, "messages": [{"role": "user", "content": REPEAT + " " * i}],
                          "max_tokens": 16, "temperature": temperature})  # unseeded: seeded ones teach nothing
    client.close()


def two_servers_merge(spec: ServerSpec, folder: Path, logs: Path, seed_from: Path | None) -> ItemResult:
    """Item 7: two servers on one profile folder, one serving only greedy requests (it learns
    greedy pairs), the other only sampled ones (sampled pairs), SIGTERM to both at once: the
    store then holds every pair it held before, at a count no lower, and both modes' counts
    grew (the second to save did not overwrite the first)."""
    result = ItemResult("7 two servers, one store", spec.label, "two servers on one profile folder exit together "
                        "(SIGTERM): every pair of the store before is kept (count no lower), and the greedy pairs "
                        "(one server's) and the sampled pairs (the other's) both grew")
    store = folder / "profiles" / "acceptance.json"
    store.parent.mkdir(parents=True, exist_ok=True)
    if seed_from is not None and read_estimates(seed_from):  # a small store, as a short earlier run leaves
        small = [replace(e, count=min(e.count, 2.0)) for e in read_estimates(seed_from)]
        save_estimates(store, [], small)
    before = _store(store)
    greedy = start(ServerSpec(f"{spec.label} (greedy)", spec.flags, spec.key), folder, logs / "item7-greedy.log")
    sampled = start(ServerSpec(f"{spec.label} (sampled)", spec.flags, spec.key), folder, logs / "item7-sampled.log")
    threads = [threading.Thread(target=_serve_some, args=(greedy, result, 0.0)),
               threading.Thread(target=_serve_some, args=(sampled, result, 1.0))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for running in (greedy, sampled):
        running.proc.send_signal(signal.SIGTERM)
    statuses = [terminate(greedy), terminate(sampled)]
    after = _store(store)
    result.figures.update({"before": before, "after": after, "exit_statuses": statuses})
    kept = [k for k in before if k not in after or after[k][1] < before[k][1]]
    result.check(f"every pair before kept at a count no lower ({len(before)} pairs; lost or lower: {kept})",
                 not kept)
    for mode in ("greedy", "sampled"):
        total_before = sum(c for k, (_, c) in before.items() if k.startswith(mode))
        total_after = sum(c for k, (_, c) in after.items() if k.startswith(mode))
        result.check(f"{mode} pairs' counts grew ({total_before:g} -> {total_after:g})", total_after > total_before)
    result.check(f"exit statuses {statuses}", statuses == [0, 0])
    return result

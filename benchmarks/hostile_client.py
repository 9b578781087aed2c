"""The hostile client's instruments: what an item sent and got back (Tally, ItemResult), one
request sent and classified (Client.send), a stream's events (read_sse), a kept-alive
connection that tells whether the server kept it (KeptConnection), and the server's process
as /proc shows it.

Every request ends in exactly one of: a status (2xx, 4xx or 5xx), a hang (no answer within
the client's timeout) or a drop (the server closed or reset the connection without an
answer). A request whose status is not among those its item expects is recorded with what
came back.
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

#: What a client waits for an answer before it counts a hang (generation on two shared cores is slow).
ANSWER_SECONDS = 600.0
#: Exceptions that mean the server closed or reset the connection without an answer.
DROPS = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError, httpx.ConnectError,
         http.client.RemoteDisconnected, ConnectionError)


@dataclass
class Tally:
    """Counts of what one item sent and got back."""

    sent: int = 0
    ok: int = 0  # 2xx
    client_errors: int = 0  # 4xx
    server_errors: int = 0  # 5xx
    unexpected_5xx: int = 0  # 5xx that the item did not expect (any 500 is one)
    hangs: int = 0
    dropped: int = 0
    #: "what: got X, expected Y" per request whose answer its item did not expect.
    unexpected: list[str] = field(default_factory=list)

    def status(self, what: str, status: int, expect: Collection[int]) -> bool:
        self.sent += 1
        if 200 <= status < 300:
            self.ok += 1
        elif 400 <= status < 500:
            self.client_errors += 1
        elif status >= 500:
            self.server_errors += 1
            self.unexpected_5xx += status not in expect
        if status not in expect:
            self.unexpected.append(f"{what}: got {status}, expected {'/'.join(map(str, sorted(expect)))}")
            return False
        return True

    def hang(self, what: str) -> None:
        self.sent += 1
        self.hangs += 1
        self.unexpected.append(f"{what}: no answer within the timeout")

    def drop(self, what: str, exc: BaseException) -> None:
        self.sent += 1
        self.dropped += 1
        self.unexpected.append(f"{what}: connection dropped ({type(exc).__name__})")

    def add(self, other: Tally) -> None:
        for name in ("sent", "ok", "client_errors", "server_errors", "unexpected_5xx", "hangs", "dropped"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.unexpected += other.unexpected


@dataclass(frozen=True)
class Check:
    """One expectation of an item beyond its statuses, and whether it held."""

    what: str
    held: bool


@dataclass
class ItemResult:
    """One item of the hostile list on one server: its counts, its checks and its figures."""

    item: str
    server: str
    expectation: str
    tally: Tally = field(default_factory=Tally)
    checks: list[Check] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    def check(self, what: str, held: bool) -> bool:
        self.checks.append(Check(what, bool(held)))
        return bool(held)

    @property
    def held(self) -> bool:
        t = self.tally
        return not t.unexpected and not t.hangs and not t.dropped and all(c.held for c in self.checks)


@dataclass
class StreamResult:
    """A stream as the client read it: its status, its data events, whether [DONE] came,
    and the error event if one came."""

    status: int
    events: list[dict] = field(default_factory=list)
    done: bool = False
    error: dict | None = None
    hung_up: bool = False  # the client left on purpose

    @property
    def text(self) -> str:
        out = []
        for e in self.events:
            for c in e.get("choices", []):
                out.append(c.get("text") or (c.get("delta") or {}).get("content") or "")
        return "".join(out)


def read_sse(lines: Iterable[str], result: StreamResult, hang_up_after: int | None = None) -> StreamResult:
    """Fill `result` from a stream's lines; stop after `hang_up_after` data events (the
    caller then closes the connection: a deliberate disconnect)."""
    for line in lines:
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            result.done = True
            break
        event = json.loads(line[6:])
        if "error" in event:
            result.error = event["error"]
        else:
            result.events.append(event)
        if hang_up_after is not None and len(result.events) >= hang_up_after:
            result.hung_up = True
            break
    return result


class Client:
    """httpx against one server (its API key sent unless told otherwise), every request
    classified into an item's tally."""

    def __init__(self, url: str, key: str | None, timeout: float = ANSWER_SECONDS) -> None:
        self.url, self.key = url, key
        self.http = httpx.Client(base_url=url, timeout=timeout, headers=self.auth(key))

    @staticmethod
    def auth(key: str | None) -> dict[str, str]:
        return {"authorization": f"Bearer {key}"} if key else {}

    def send(self, tally: Tally, what: str, method: str, path: str, expect: Collection[int],
             **kwargs) -> httpx.Response | None:
        """The response (its status recorded against `expect`), or None after a hang or a drop."""
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TimeoutException:
            tally.hang(what)
            return None
        except DROPS as exc:
            tally.drop(what, exc)
            return None
        tally.status(what, response.status_code, expect)
        return response

    def close(self) -> None:
        self.http.close()


class KeptConnection:
    """One HTTP/1.1 connection (http.client) that tells whether the server kept it open
    after each answer: a request on it after the server closed it is never silently sent
    on a new one."""

    def __init__(self, url: str, timeout: float = ANSWER_SECONDS) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
        self.conn.connect()
        self.sock: socket.socket | None = self.conn.sock

    def request(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> tuple[int, bytes]:
        """Status and body; raises ConnectionError when the server had closed this connection."""
        if self.conn.sock is not self.sock or self.sock is None:
            raise ConnectionError("the server closed the connection after its previous answer")
        self.conn.request(method, path, body=body, headers=headers)
        response = self.conn.getresponse()
        data = response.read()
        if response.will_close:
            self.sock = None
        return response.status, data

    def close(self) -> None:
        self.conn.close()


def rss_mib(pid: int) -> float:
    """The process's resident set size in MiB (VmRSS of /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def error_code(response: httpx.Response | None) -> str | None:
    """The OpenAI error body's code, or None where the answer is not one."""
    if response is None:
        return None
    try:
        return response.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None

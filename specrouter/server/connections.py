"""What a connection may hold of the server: read timeouts and a bound on open connections
(uvicorn's HTTP protocol, httptools' parser, with three deadlines and a count).

A client that sends a request slowly (headers or body a few bytes at a time, or nothing
at all after connecting) holds a socket and, once the application runs, a task; uvicorn
bounds only the idle time between requests (keep-alive). Here, per connection:
- the headers of each request must be complete within `header_seconds` of the connection
  opening or of the previous response completing;
- the body must be complete within `body_seconds` of the headers;
- past either deadline the connection gets a 408 (when no response has started) and is
  closed; a request already running sees its client disconnect and is cancelled;
- a connection beyond `max_connections` open at once gets a 503 and is closed at once.
Idle keep-alive connections are closed after uvicorn's `timeout_keep_alive`. None of this
touches a response in progress: a long stream is never cut by these deadlines.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


@dataclass(frozen=True)
class ConnectionLimits:
    header_seconds: float = 10.0
    body_seconds: float = 30.0
    keep_alive_seconds: float = 5.0
    max_connections: int = 512

    def protocol(self) -> type[asyncio.Protocol]:
        """uvicorn's HTTP protocol class with these limits (uvicorn.Config's `http`)."""
        return type("LimitedHttpProtocol", (_Limited,), {"limits": self})


def _raw_error(status: int, reason: str, message: str, code: str) -> bytes:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                 "code": code}}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n").encode()
    return head + body


class _Limited(HttpToolsProtocol):
    limits: ConnectionLimits
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            transport.write(_raw_error(503, "Service Unavailable", f"more than {self.limits.max_connections} "
                                       "connections are open: retry later", "too_many_connections"))
            transport.close()
            return
        self._arm(self.limits.header_seconds)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._arm(self.limits.body_seconds)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        idle = self.cycle is None or self.cycle.response_complete  # no pipelined request running
        if idle and not self.transport.is_closing():
            self._arm(self.limits.header_seconds)  # for the next request on this connection

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete or not self.cycle.response_started:
            self.transport.write(_raw_error(408, "Request Timeout", "the request was not received in time",
                                            "request_timeout"))
        self.transport.close()

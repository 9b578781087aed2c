"""What a request must pass before the application reads it: the Host allow-list, the API
key, and the body size (an ASGI middleware in front of FastAPI).

FastAPI reads and parses a body before its dependencies run, so a key check there comes
after a 64 MB body was read and parsed. Here, in order, at the cost of headers only:
1. Host: a name outside `allowed_hosts` is a 400 (a DNS-rebinding page reaches a loopback
   server under its own name); "*" allows any;
2. API key on /v1: a missing or wrong `Authorization: Bearer` is a 401 before the body;
3. body size: a Content-Length over `max_body_bytes` is a 413 at once; a body without one
   is read up to the limit and refused past it, never further. The application then gets
   the body it was sent, from a buffer.
Errors are OpenAI's body {"error": {message, type, param, code}}, as every other error.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence

from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: The names a loopback-bound server answers to when no allow-list is configured.
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def default_allowed_hosts(bind: str) -> list[str]:
    """Loopback names when the server listens on loopback (a browser page cannot reach it
    under another name), any host otherwise (its network is its boundary)."""
    return list(LOOPBACK_NAMES) if bind in LOOPBACK_NAMES else ["*"]


class RequestGuard:
    def __init__(self, app: ASGIApp, max_body_bytes: int, api_key: str | None, allowed_hosts: Sequence[str]) -> None:
        self.app, self.max_body_bytes, self.api_key = app, max_body_bytes, api_key
        self.allowed = {h.lower() for h in allowed_hosts}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host = _host_name(headers.get("host", ""))
        if "*" not in self.allowed and host not in self.allowed:
            await _error(send, 400, f"host {host!r} is not served here (allowed: {', '.join(sorted(self.allowed))})",
                         code="invalid_host")
            return
        if self.api_key is not None and scope["path"].startswith("/v1"):
            scheme, _, given = headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not secrets.compare_digest(given.encode(), self.api_key.encode()):
                await _error(send, 401, "missing or wrong API key: send `Authorization: Bearer <key>`",
                             code="invalid_api_key", extra=[(b"www-authenticate", b"Bearer")])
                return
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await _too_large(send, self.max_body_bytes)
            return
        body, more = bytearray(), True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_body_bytes:
                await _too_large(send, self.max_body_bytes)
                return
        await self.app(scope, _replay(bytes(body), receive), send)


def _host_name(value: str) -> str:
    """The host of a Host header, without its port ("[::1]:8000" -> "::1")."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # then the client's disconnect, which streams watch for

    return replay


async def _too_large(send: Send, limit: int) -> None:
    await _error(send, 413, f"the request body exceeds the server's limit of {limit:,} bytes", code="body_too_large")


async def _error(send: Send, status: int, message: str, code: str, extra: list | None = None) -> None:
    kind = "invalid_request_error"
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})

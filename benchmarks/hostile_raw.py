"""Clients below the HTTP libraries (asyncio sockets), for what no well-behaved client does:
requests that never finish arriving, more connections than the server allows, bodies far
over its limit. Each reports what the server answered (the status line, if any) and when
it closed the connection."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

#: How a slow client of `slow_clients` stalls.
PARTIAL_HEADERS, PARTIAL_BODY = "partial headers", "partial body"
_MIB = 1 << 20


@dataclass(frozen=True)
class Closed:
    """What one raw connection got: the status of the answer (None: no answer) and seconds
    from its start until the server closed it (None: still open at the deadline)."""

    status: int | None
    seconds: float | None


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def _status(line: bytes) -> int | None:
    parts = line.split()
    return int(parts[1]) if len(parts) >= 2 and parts[0].startswith(b"HTTP/") and parts[1].isdigit() else None


async def _until_closed(reader: asyncio.StreamReader, started: float, wait_s: float) -> Closed:
    """Read everything the server sends until it closes the connection (or `wait_s` passes)."""
    received = b""
    try:
        async with asyncio.timeout(wait_s):
            while chunk := await reader.read(65536):
                received += chunk
    except TimeoutError:
        return Closed(_status(received.split(b"\r\n", 1)[0]), None)
    except ConnectionError:
        pass
    return Closed(_status(received.split(b"\r\n", 1)[0]), time.monotonic() - started)


async def _slow(url: str, kind: str, key: str | None, wait_s: float) -> Closed:
    host, port = _address(url)
    started = time.monotonic()
    reader, writer = await asyncio.open_connection(host, port)
    head = f"POST /v1/completions HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
    if kind == PARTIAL_HEADERS:
        writer.write(head.encode())  # the blank line never comes
    else:
        auth = f"authorization: Bearer {key}\r\n" if key else ""
        writer.write(f"{head}{auth}content-length: 200\r\n\r\n{{\"model\": \"qwen".encode())  # 186 bytes never come
    await writer.drain()
    try:
        return await _until_closed(reader, started, wait_s)
    finally:
        writer.close()


async def slow_clients(url: str, key: str | None, n: int, wait_s: float) -> list[tuple[str, Closed]]:
    """n connections, alternately stalling in their headers and in their body; what each got."""
    kinds = [PARTIAL_HEADERS if i % 2 == 0 else PARTIAL_BODY for i in range(n)]
    closed = await asyncio.gather(*(_slow(url, kind, key, wait_s) for kind in kinds))
    return list(zip(kinds, closed))


async def _idle(url: str, wait_s: float) -> Closed:
    host, port = _address(url)
    started = time.monotonic()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        return await _until_closed(reader, started, wait_s)
    finally:
        writer.close()


async def idle_connections(url: str, n: int, wait_s: float) -> list[Closed]:
    """n connections opened at once that send nothing; what each got."""
    return list(await asyncio.gather(*(_idle(url, wait_s) for _ in range(n))))


@dataclass(frozen=True)
class BodyAnswer:
    """The answer to a body far over the limit: its status (None: none), seconds from the
    headers to the status line, and how much of the body the client had sent by then."""

    status: int | None
    seconds: float | None
    sent_mib: float


async def big_body(url: str, size: int, key: str | None, chunked: bool = False, wait_s: float = 30) -> BodyAnswer:
    """POST /v1/completions with a body of `size` bytes (declared in Content-Length, or sent
    chunked without one), written 1 MiB at a time until the server answers or stops reading."""
    host, port = _address(url)
    reader, writer = await asyncio.open_connection(host, port)
    framing = "transfer-encoding: chunked" if chunked else f"content-length: {size}"
    auth = f"authorization: Bearer {key}\r\n" if key else ""
    writer.write(f"POST /v1/completions HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
                 f"{auth}{framing}\r\n\r\n".encode())
    started, sent, arrived = time.monotonic(), 0, []
    status_line = asyncio.ensure_future(reader.readline())
    status_line.add_done_callback(lambda _: arrived.append(time.monotonic()))
    piece = b"x" * _MIB
    try:
        while sent < size and not status_line.done():
            data = piece[: min(_MIB, size - sent)]
            writer.write(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
            drained = asyncio.ensure_future(writer.drain())
            await asyncio.wait({drained, status_line}, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
            if not drained.done():
                drained.cancel()
                break  # the server stopped reading
            drained.result()
            sent += len(data)
        if chunked and sent >= size and not status_line.done():
            writer.write(b"0\r\n\r\n")
    except ConnectionError:
        pass  # the server closed the connection: its answer may be in the buffer
    try:
        line = await asyncio.wait_for(status_line, wait_s)
    except (TimeoutError, ConnectionError):
        return BodyAnswer(None, None, sent / _MIB)
    finally:
        writer.close()
    return BodyAnswer(_status(line), arrived[0] - started, sent / _MIB)

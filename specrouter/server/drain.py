"""Graceful shutdown: uvicorn's server, draining the service before it closes.

uvicorn's own shutdown (on SIGTERM or SIGINT) stops listening, waits for connections up to
its graceful timeout, then cancels the request tasks, and only then runs the app's lifespan
shutdown: a long request was cut off without finish_reason, error event or [DONE], and a
plain request got a bare 500. DrainingServer first drains the service (Service.drain):
new requests get 503 with Retry-After, those in flight may finish for `grace` seconds, and
each one left then ends with a clean error (a stream: an error event then [DONE]; a plain
request: a 503 body). uvicorn's shutdown then only waits FLUSH_SECONDS for those last
responses to be written.
"""

from __future__ import annotations

import socket

import uvicorn

from specrouter.server.service import Service

#: Seconds uvicorn waits for the responses still being written once the service is drained.
FLUSH_SECONDS = 5.0


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, service: Service, grace: float) -> None:
        super().__init__(config)
        self.service, self.grace = service, grace

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self.service.drain(self.grace)
        await super().shutdown(sockets)

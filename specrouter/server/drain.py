"""Graceful shutdown: uvicorn's server, draining the service before it closes.

uvicorn's own shutdown (on SIGTERM or SIGINT) stops listening, waits for connections up to
its graceful timeout, then cancels the request tasks, and only then runs the app's lifespan
shutdown: a long request would be cut off without finish_reason, error event or [DONE], and
a plain request would get a bare 500. DrainingServer first drains the service
(Service.drain): new requests get 503 with Retry-After, those in flight may finish for
`grace` seconds, and each one left then ends with a clean error (a stream: an error event
then [DONE]; a plain request: a 503 body). uvicorn's shutdown then only waits FLUSH_SECONDS
for those last responses to be written.

uvicorn re-raises the signal it handled once it has shut down (so that an embedding program
learns of it): SIGINT would become a KeyboardInterrupt (exit 130) and SIGTERM would kill the
process before `specrouter serve` could save its router estimates and close its models.
DrainingServer handles the signal and returns: the command finishes its own shutdown and
exits 0.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from collections.abc import Iterator

import uvicorn
from uvicorn.server import HANDLED_SIGNALS

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

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's handlers for the shutdown signals while serving, without re-raising the
        signal afterwards (see the module docstring)."""
        if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in HANDLED_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

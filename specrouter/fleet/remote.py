"""The ingress's view of the fleet: the surface the HTTP app serves from (server/app.py's
`service`), with the requests running on engine replicas.

The app is the single-process server's, unchanged: it checks and tokenizes a request with
the target's vocabulary (loaded in the ingress), then calls submit(). Here submit() opens
one stream on one replica for all of a request's choices (their prompt KV is shared there)
and returns once that replica admitted them, so admission errors (400, 429, 503) are
raised where the app expects them. A pump task then hands each choice's deltas and result
to its RemoteHandle. A replica that dies mid-request ends each unfinished choice with
ReplicaLostError (a 503 for a plain request; a stream's error event then [DONE]); requests
sent afterwards go to the replicas still alive while Ray Serve restarts the dead one.
drain() is the single-process Service.drain's graceful shutdown, for the fleet's requests.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError

from specrouter.backends.base import Backend
from specrouter.engine.batch import Delta, SeqRequest
from specrouter.engine.request import GenerationResult
from specrouter.server.service import ReplicaLostError, ServiceStoppedError, final_result

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Admitted:
    """A replica's first stream item: the request's choices are admitted."""


@dataclass(frozen=True)
class ChoiceItem:
    """One of a replica's stream items after Admitted: choice `index`'s next delta, or its result."""

    index: int
    item: Delta | GenerationResult


class ReplicaStream(Protocol):
    """A request's stream from its replica (Ray Serve's DeploymentResponseGenerator):
    Admitted, then ChoiceItems; cancel() stops the request there."""

    def __aiter__(self) -> AsyncIterator[Admitted | ChoiceItem]: ...

    def __anext__(self) -> Awaitable[Admitted | ChoiceItem]: ...

    def cancel(self) -> None: ...


#: Opens a replica stream for (request, n choices, affinity key).
OpenStream = Callable[[SeqRequest, int, str | None], ReplicaStream]


class RemoteHandle:
    """One choice of a request running on a replica (server/service.Handle's surface)."""

    def __init__(self, request_id: str, cancel: Callable[[], None]) -> None:
        self.id = request_id
        self.queue: asyncio.Queue[Delta | GenerationResult | BaseException] = asyncio.Queue()
        self.done = False
        self._cancel = cancel

    async def events(self) -> AsyncIterator[Delta | GenerationResult]:
        while True:
            item = await self.queue.get()
            if isinstance(item, BaseException):
                self.done = True
                raise item
            if isinstance(item, GenerationResult):
                self.done = True
                yield item
                return
            yield item

    async def result(self) -> GenerationResult:
        return await final_result(self.events())

    def cancel(self) -> None:
        """Stop the request on its replica unless this choice already ended (idempotent): the
        replica cancels all of the request's choices, as a disconnected client does there."""
        if not self.done:
            self.done = True
            self._cancel()


class RemoteService:
    """server/service.Serving for a fleet. open_stream starts a request on a replica,
    serving() counts the replicas serving, exposition() is the fleet's /metrics."""

    def __init__(self, target: Backend, levels: Sequence[str], open_stream: OpenStream,
                 serving: Callable[[], Awaitable[int]], exposition: Callable[[], Awaitable[bytes]],
                 poll_seconds: float = 1.0) -> None:
        self.target, self.levels = target, list(levels)
        self.model_name = target.name
        self.created = int(time.time())
        self._open, self._serving, self._exposition, self._poll = open_stream, serving, exposition, poll_seconds
        self._alive = False
        self._tasks: set[asyncio.Task] = set()  # the pumps of the requests in flight
        self._admitting = 0  # requests waiting for their replica's admission
        self._draining = False
        self._ending: ServiceStoppedError | None = None  # set once drain's grace period is over
        self._watch: asyncio.Task | None = None

    @property
    def alive(self) -> bool:
        """Some replica serves (as the fleet heard at the last poll) and no drain has begun."""
        return self._alive and not self._draining

    async def drain(self, grace: float, poll: float = 0.02) -> None:
        """Service.drain's contract for the fleet's requests: admit nothing more (a new
        request gets ServiceStoppedError: 503 with Retry-After), let those in flight finish
        for `grace` seconds, then cancel each one left on its replica and end its unfinished
        choices with ServiceStoppedError (a stream: an error event, then [DONE]; a plain
        request: a 503); returns once all were told."""
        loop = asyncio.get_running_loop()
        self._draining = True
        deadline = loop.time() + grace
        while (self._tasks or self._admitting) and loop.time() < deadline:
            await asyncio.sleep(poll)
        self._ending = ServiceStoppedError("the server is shutting down")
        for pump in list(self._tasks):
            pump.cancel()
        while self._tasks or self._admitting:
            await asyncio.sleep(poll)

    async def exposition(self) -> bytes:
        return await self._exposition()

    def start(self) -> None:
        self._watch = asyncio.get_running_loop().create_task(self._watch_fleet())

    def stop(self) -> None:
        if self._watch is not None:
            self._watch.get_loop().call_soon_threadsafe(self._watch.cancel)

    async def _watch_fleet(self) -> None:
        while True:
            try:
                self._alive = await self._serving() > 0
            except Exception:  # noqa: BLE001 - the fleet's actor is unreachable: nothing serves
                log.warning("the fleet's state could not be read", exc_info=True)
                self._alive = False
            await asyncio.sleep(self._poll)

    async def submit(self, request: SeqRequest, n: int = 1, affinity: str | None = None) -> list[RemoteHandle]:
        """Start the request's n choices on one replica; raises its admission error (the
        replica's own exception: bad input, QueueFullError, ServiceStoppedError)."""
        if self._draining:
            raise ServiceStoppedError("the server is shutting down")
        stream = self._open(request, n, affinity)
        self._admitting += 1
        try:
            first = await stream.__anext__()
        except StopAsyncIteration:
            raise ReplicaLostError("the replica ended the request before admitting it") from None
        except asyncio.CancelledError:  # the client left while the replica admitted it
            stream.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - the replica's admission error, unwrapped
            raise _cause(exc) from None
        finally:
            self._admitting -= 1
        assert isinstance(first, Admitted), f"a replica stream began with {first!r}"
        if self._ending is not None:  # admitted after the drain's grace period ran out
            stream.cancel()
            raise ServiceStoppedError("the server is shutting down")
        pump: asyncio.Task | None = None

        def cancel() -> None:
            if pump is not None and not pump.done():
                pump.cancel()

        handles = [RemoteHandle(uuid.uuid4().hex, cancel) for _ in range(n)]
        pump = asyncio.get_running_loop().create_task(_pump(stream, handles, lambda: self._ending))
        self._tasks.add(pump)  # held until done (the loop keeps only weak references)
        pump.add_done_callback(self._tasks.discard)
        return handles


async def _pump(stream: ReplicaStream, handles: list[RemoteHandle],
                ending: Callable[[], BaseException | None]) -> None:
    """Hand the stream's items to their choices; any failure of the stream ends each choice
    still running with the replica's error (ReplicaLostError when the replica is gone).
    Cancelled, closing the stream cancels the request on its replica: a client left (the
    cancellation goes on), or a drain ran out of time (`ending()` is the error that ends
    each choice still running)."""
    finished: set[int] = set()
    try:
        async for item in stream:
            handles[item.index].queue.put_nowait(item.item)
            if isinstance(item.item, GenerationResult):
                finished.add(item.index)
        error: BaseException | None = None
        if len(finished) < len(handles):
            error = ReplicaLostError("the replica ended the request before it finished")
    except asyncio.CancelledError:
        stream.cancel()
        error = ending()
        if error is None:
            raise
    except Exception as exc:  # noqa: BLE001 - delivered to the choices, which raise it
        error = _cause(exc)
    if error is not None:
        for i, handle in enumerate(handles):
            if i not in finished:
                handle.queue.put_nowait(error)


def _cause(exc: BaseException) -> BaseException:
    """The replica's own exception, as raised there (Ray wraps it with the remote traceback,
    which must not reach a client), or ReplicaLostError when the replica itself failed."""
    if isinstance(exc, RayTaskError):
        return exc.cause if isinstance(exc.cause, Exception) else ReplicaLostError("the replica failed")
    if isinstance(exc, ActorDiedError | ActorUnavailableError | RayActorError):
        return ReplicaLostError("the replica serving this request stopped before it finished; retry")
    return exc

"""The bridge between the event loop (HTTP) and the BatchScheduler (one worker thread).

The scheduler and its backends are not thread-safe, so one worker thread owns them: it
applies the inbox (adds, cancels) and calls step() while there is work, and sleeps on a
condition when there is none. The event loop only posts to the inbox; the worker hands
results back with loop.call_soon_threadsafe (admission answers to futures, events to
each request's asyncio queue). Admission is decided in the worker, where the scheduler's
queue length is exact.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Protocol, TypeVar

from specrouter.backends.base import Backend
from specrouter.engine.batch import BatchScheduler, Delta, Event, Failed, Finished, SeqRequest
from specrouter.engine.request import GenerationResult
from specrouter.errors import SpecRouterError, log_failure
from specrouter.server.metrics import Metrics

log = logging.getLogger(__name__)
T = TypeVar("T")


class QueueFullError(SpecRouterError):
    """max_queue requests are already waiting for a batch slot."""


class ServiceStoppedError(SpecRouterError):
    """The server is shutting down."""


class ReplicaLostError(ServiceStoppedError):
    """The engine replica running the request stopped (died, or was taken down) before it
    finished (a fleet: specrouter/fleet/remote.py)."""


class RequestTimeoutError(SpecRouterError):
    """The request ran longer than request_timeout and was cancelled."""


class ChoiceHandle(Protocol):
    """One admitted choice of a request, on the event loop (Handle here; RemoteHandle for a fleet)."""

    id: str

    def events(self) -> AsyncIterator[Delta | GenerationResult]:
        """Deltas, then the result; raises the request's error."""

    async def result(self) -> GenerationResult: ...

    def cancel(self) -> None:
        """Stop the choice unless it already ended (idempotent)."""


class Serving(Protocol):
    """What the HTTP app (app.py) serves from: a Service here, or a fleet's RemoteService
    (specrouter/fleet/remote.py) whose requests run on Ray Serve replicas."""

    target: Backend  # the served model's vocabulary: tokenizer, chat template, context size
    model_name: str
    levels: list[str]  # names a request's speculation chain may use
    created: int

    @property
    def alive(self) -> bool: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    async def submit(self, request: SeqRequest, n: int = 1, affinity: str | None = None) -> list[ChoiceHandle]: ...

    async def exposition(self) -> bytes: ...


class Service:
    def __init__(self, scheduler: BatchScheduler, target: Backend, levels: Sequence[str], max_queue: int,
                 request_timeout: float | None = None, metrics: Metrics | None = None) -> None:
        self.scheduler, self.target = scheduler, target
        self.model_name = target.name
        self.levels = list(levels)  # names a request's speculation chain may use
        self.max_queue, self.request_timeout = max_queue, request_timeout
        self.metrics = metrics or Metrics()
        self.created = int(time.time())
        self._cond = threading.Condition()
        self._inbox: list[tuple] = []
        self._stopping = False
        self._draining = False  # graceful shutdown: no new requests, those in flight may finish
        self._handles: dict[str, Handle] = {}  # worker-side: requests the scheduler holds
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # Event-loop side ----------------------------------------------------------------------
    def start(self) -> None:
        """Called on the running event loop that will consume the events."""
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="specrouter-worker", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Serving: the worker runs and no shutdown has begun (what /health answers)."""
        return self._worker_alive and not (self._stopping or self._draining)

    @property
    def _worker_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def live_sequences(self) -> int:
        """Requests the scheduler still holds (waiting or running): 0 when idle, else a leak."""
        return len(self._handles)

    async def submit(self, request: SeqRequest, n: int = 1, affinity: str | None = None) -> list[Handle]:
        """Queue a request's n choices, all or none: choice i is its own sequence with its own
        random stream, and the later ones take the first's prompt KV (SeqRequest.shares_prompt_with).
        They are added in one go, before the scheduler steps again (so the first cannot have
        finished and freed its prompt's cells first). Raises the admission error (bad input,
        QueueFullError, ServiceStoppedError); then none of them runs. `affinity` (a session
        key) places a request among a fleet's replicas (specrouter.fleet); one process has
        one place for all."""
        del affinity
        assert self._loop is not None, "Service.start() was not called"
        handles = [Handle(self, uuid.uuid4().hex, self._loop) for _ in range(n)]
        requests = [dataclasses.replace(request, choice=i, shares_prompt_with=handles[0].id if i else None)
                    for i in range(n)]
        admitted = self._loop.create_future()
        self._post(("add", handles, requests, admitted))
        try:
            await admitted
        except asyncio.CancelledError:
            for handle in handles:  # the client left while we waited for admission
                self._post(("cancel", handle.id))
            raise
        except QueueFullError:
            self.metrics.failure.labels("queue_full").inc()
            raise
        except ServiceStoppedError:
            self.metrics.failure.labels("stopped").inc()
            raise
        except SpecRouterError:
            self.metrics.failure.labels("invalid").inc()
            raise
        except Exception:
            self.metrics.failure.labels("error").inc()
            raise
        return handles

    async def drain(self, grace: float, poll: float = 0.02) -> None:
        """Graceful shutdown's first part: admit nothing more (a new request gets
        ServiceStoppedError: 503 with Retry-After), let the requests in flight finish for
        `grace` seconds, then end each one left with ServiceStoppedError (a stream: an error
        event, then [DONE]; a plain request: a 503), and return once all were told."""
        loop = asyncio.get_running_loop()
        with self._cond:
            self._draining = True
        deadline = loop.time() + grace
        while self._handles and loop.time() < deadline:
            await asyncio.sleep(poll)
        if self._handles:
            self._post(("end_all",))
            while self._handles and self._worker_alive:
                await asyncio.sleep(poll)

    async def exposition(self) -> bytes:
        """The Prometheus metrics (text format)."""
        return self.metrics.exposition()

    def stop(self) -> None:
        """Cancel whatever is still running and end the worker (blocking: call it off the loop)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()

    def _post(self, op: tuple) -> None:
        with self._cond:
            if (self._stopping or self._draining) and op[0] == "add":
                _resolve(op[3], ServiceStoppedError("the server is shutting down"))
                return
            self._inbox.append(op)
            self._cond.notify()

    # Worker side -------------------------------------------------------------------------
    def _run(self) -> None:
        sched = self.scheduler
        while True:
            with self._cond:
                while not (self._inbox or self._stopping or sched.n_active or sched.n_waiting):
                    self._cond.wait()
                ops, self._inbox = self._inbox, []
                stopping = self._stopping
            for op in ops:
                self._apply(op, stopping)
            if stopping:
                self._shutdown()
                return
            if sched.n_active or sched.n_waiting:
                self._step()
            self.metrics.running.set(sched.n_active)
            self.metrics.waiting.set(sched.n_waiting)
            self.metrics.kv(sched.kv_use())
            self.metrics.spec(sched.take_spec_counts())  # what cancelled requests ran

    def _apply(self, op: tuple, stopping: bool) -> None:
        if op[0] == "end_all":
            self._end_all()
            return
        if op[0] == "cancel":
            if self._handles.pop(op[1], None) is not None:
                self.scheduler.cancel(op[1])
            return
        _, handles, requests, admitted = op
        if admitted.cancelled():
            return
        added: list[str] = []
        try:
            if stopping:
                raise ServiceStoppedError("the server is shutting down")
            for handle, request in zip(handles, requests):
                # Waiting means beyond the free batch slots: a request that will take a free slot at
                # the next step waits for nothing (max_queue 0: no waiting room, not no service).
                queued = self.scheduler.n_waiting - (self.scheduler.max_batch - self.scheduler.n_active)
                if queued >= self.max_queue:
                    raise QueueFullError(f"{queued} requests are already waiting for a batch slot "
                                         f"(max_queue {self.max_queue}); retry later")
                self.scheduler.add(handle.id, request)
                added.append(handle.id)
        except Exception as exc:  # noqa: BLE001 - every admission error goes back to its request
            for rid in added:  # all choices or none
                self.scheduler.cancel(rid)
            self._call(_resolve, admitted, exc)
            return
        for handle in handles:
            self._handles[handle.id] = handle
        self._call(_resolve, admitted, None)

    def _step(self) -> None:
        try:
            events = self.scheduler.step()
        except Exception as exc:  # noqa: BLE001 - a failed step fails its requests, the server goes on
            log_failure(log, "scheduler step failed", exc)
            events = [Failed(rid, exc) for rid in self._handles]
            self.scheduler.close()
        ended = sum(not isinstance(e, Delta) for e in events)
        self.metrics.batch_size.observe(self.scheduler.n_active + ended)
        self.metrics.spec(self.scheduler.take_spec_counts())  # before a client can see its request end
        deliveries = []
        for event in events:
            handle = self._handles.get(event.request_id)
            if handle is None:
                continue
            if not isinstance(event, Delta):
                del self._handles[event.request_id]
            deliveries.append((handle, event))
        if deliveries:
            self._call(_deliver, deliveries)

    def _end_all(self) -> None:
        """End every request the scheduler holds with ServiceStoppedError (slots freed)."""
        stopped = ServiceStoppedError("the server shut down before the request finished")
        for rid in self._handles:
            self.scheduler.cancel(rid)
        self._call(_deliver, [(h, Failed(rid, stopped)) for rid, h in self._handles.items()])
        self._handles.clear()

    def _shutdown(self) -> None:
        self._end_all()
        self.scheduler.close()
        self.metrics.kv({})
        self.metrics.running.set(0)
        self.metrics.waiting.set(0)

    def _call(self, fn, *args) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nobody is left to tell
            pass


def _resolve(future: asyncio.Future, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is None:
        future.set_result(None)
    else:
        future.set_exception(exc)


def _deliver(deliveries: list[tuple[Handle, Event]]) -> None:
    for handle, event in deliveries:
        handle.queue.put_nowait(event)


async def final_result(events: AsyncIterator[Delta | GenerationResult]) -> GenerationResult:
    """The result that ends a choice's events (its deltas skipped); raises the choice's error."""
    async for item in events:
        if isinstance(item, GenerationResult):
            return item
    raise AssertionError("the events ended without a result")


_END = object()


async def interleave(streams: Sequence[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """(index of the stream, item) for every item of the streams, as they come (one task per
    stream); the first error of any stream is raised and ends it all (the others are
    cancelled). A request's choices travel this way to its response, and on a fleet's
    replica to the ingress."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[T]) -> None:
        try:
            async for item in stream:
                await queue.put((index, item))
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            await queue.put(exc)
        await queue.put(_END)

    tasks = [asyncio.ensure_future(pump(i, stream)) for i, stream in enumerate(streams)]
    try:
        ended = 0
        while ended < len(tasks):
            item = await queue.get()
            if item is _END:
                ended += 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()


class Handle:
    """One admitted request, on the event loop: its events, its deadline, its cancel."""

    def __init__(self, service: Service, request_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.service, self.id = service, request_id
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.arrival = loop.time()
        timeout = service.request_timeout
        self.deadline = self.arrival + timeout if timeout else None
        self.done = False

    async def events(self) -> AsyncIterator[Delta | GenerationResult]:
        """Deltas (text, with its tokens' logprobs when asked for), then the GenerationResult;
        raises the request's error or RequestTimeoutError."""
        metrics, loop = self.service.metrics, asyncio.get_running_loop()
        last = None
        while True:
            try:
                async with asyncio.timeout_at(self.deadline):
                    event = await self.queue.get()
            except TimeoutError:
                self.done = True
                self.service._post(("cancel", self.id))
                metrics.failure.labels("timeout").inc()
                raise RequestTimeoutError(f"the request ran longer than {self.service.request_timeout} s") from None
            now = loop.time()
            if isinstance(event, Delta):
                if last is None:
                    metrics.ttft.observe(now - self.arrival)
                elif event.tokens:  # a cycle commits several tokens at once: each waited gap / k
                    for _ in range(event.tokens):
                        metrics.itl.observe((now - last) / event.tokens)
                last = now
                yield event
            elif isinstance(event, Finished):
                self.done = True
                metrics.e2e.observe(now - self.arrival)
                metrics.finished(event.result)
                yield event.result
                return
            else:
                self.done = True
                metrics.failure.labels("stopped" if isinstance(event.error, ServiceStoppedError) else "error").inc()
                raise event.error

    async def result(self) -> GenerationResult:
        return await final_result(self.events())

    def cancel(self) -> None:
        """Free the sequence unless it already ended (idempotent)."""
        if not self.done:
            self.done = True
            self.service.metrics.failure.labels("cancelled").inc()
            self.service._post(("cancel", self.id))

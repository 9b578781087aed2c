"""The ingress's RemoteService over scripted replica streams (no Ray Serve): admission
errors raised before any handle exists, each choice's items to its handle, a lost replica
ending every unfinished choice cleanly, a client's cancel reaching the replica, a drain."""

import asyncio
import time

import pytest
from ray.exceptions import ActorDiedError, RayTaskError

from specrouter.engine.batch import Delta, SeqRequest
from specrouter.engine.request import GenerationResult
from specrouter.fleet.remote import Admitted, ChoiceItem, RemoteService
from specrouter.server.service import QueueFullError, ReplicaLostError, ServiceStoppedError

from ..server_synth import family


def result(text: str) -> GenerationResult:
    return GenerationResult(text, [0] * len(text), "length", ["target"], [], [], 1, 1, 0.1)


class Scripted:
    """A replica stream yielding `items` (an exception item is raised there, an asyncio.Event
    is waited for), then waiting forever if `hang`; records cancel()."""

    def __init__(self, items, hang: bool = False) -> None:
        self.items, self.hang, self.cancelled = list(items), hang, False

    def __aiter__(self):
        return self

    async def __anext__(self):
        while self.items and isinstance(self.items[0], asyncio.Event):
            await self.items.pop(0).wait()
        if self.items:
            item = self.items.pop(0)
            if isinstance(item, BaseException):
                raise item
            return item
        if self.hang:
            await asyncio.Event().wait()
        raise StopAsyncIteration

    def cancel(self) -> None:
        self.cancelled = True


def service_over(*streams: Scripted) -> RemoteService:
    """A service whose requests get `streams` in turn."""
    async def serving() -> int:
        return 1

    async def exposition() -> bytes:
        return b""

    opened = iter(streams)
    return RemoteService(family()[2], ["target"], lambda request, n, affinity: next(opened), serving, exposition)


def run(coro):
    return asyncio.run(coro)


async def collect(handle):
    items = []
    try:
        async for item in handle.events():
            items.append(item)
    except Exception as exc:  # noqa: BLE001 - recorded for the assertion
        items.append(exc)
    return items


def test_choices_get_their_own_items_in_order():
    stream = Scripted([Admitted(), ChoiceItem(1, Delta("x", "b")), ChoiceItem(0, Delta("x", "a")),
                       ChoiceItem(0, result("a")), ChoiceItem(1, Delta("x", "c")), ChoiceItem(1, result("bc"))])

    async def main():
        handles = await service_over(stream).submit(SeqRequest([1, 2]), 2)
        return [await collect(h) for h in handles]

    first, second = run(main())
    assert [i.text for i in first] == ["a", "a"] and [i.text for i in second] == ["b", "c", "bc"]


def test_an_admission_error_is_the_replicas_own_exception_without_its_traceback():
    cause = QueueFullError("4 requests are already waiting")
    wrapped = RayTaskError("generate", "Traceback (most recent call last): secret internals", cause)

    async def main():
        await service_over(Scripted([wrapped])).submit(SeqRequest([1]), 1)

    with pytest.raises(QueueFullError) as info:
        run(main())
    assert type(info.value) is QueueFullError and "secret" not in str(info.value)


@pytest.mark.parametrize("failure", [ActorDiedError(), None], ids=["replica died", "stream ended short"])
def test_a_lost_replica_ends_every_unfinished_choice_with_replica_lost(failure):
    items = [Admitted(), ChoiceItem(0, Delta("x", "a")), ChoiceItem(1, result("b"))]
    stream = Scripted(items + ([failure] if failure else []))

    async def main():
        handles = await service_over(stream).submit(SeqRequest([1]), 2)
        return [await collect(h) for h in handles]

    first, second = run(main())
    assert first[0].text == "a" and isinstance(first[1], ReplicaLostError) and len(first) == 2
    assert second == [result("b")]  # the finished choice is untouched


def test_a_stream_that_fails_before_admitting_is_replica_lost():
    async def main():
        await service_over(Scripted([ActorDiedError()])).submit(SeqRequest([1]), 1)

    with pytest.raises(ReplicaLostError):
        run(main())


def test_cancelling_a_handle_cancels_the_request_on_its_replica():
    stream = Scripted([Admitted(), ChoiceItem(0, Delta("x", "a"))], hang=True)

    async def main():
        (handle,) = await service_over(stream).submit(SeqRequest([1]), 1)
        events = handle.events()
        assert (await anext(events)).text == "a"
        handle.cancel()
        handle.cancel()  # idempotent
        for _ in range(10):
            await asyncio.sleep(0)
        return stream.cancelled

    assert run(main())


def test_a_client_that_leaves_before_admission_cancels_the_request_on_its_replica():
    stream = Scripted([], hang=True)

    async def main():
        task = asyncio.ensure_future(service_over(stream).submit(SeqRequest([1]), 1))
        for _ in range(5):
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return stream.cancelled

    assert run(main())


def test_a_drain_refuses_new_requests_lets_those_in_time_finish_and_ends_the_rest_cleanly():
    """RemoteService.drain (serve --ray's graceful shutdown, as Service.drain): a request
    that finishes within the grace period finishes; past it, each unfinished choice ends with
    ServiceStoppedError (not replica_lost) and its request is cancelled on its replica; a
    request sent meanwhile is refused before any replica sees it."""
    release = asyncio.Event()
    in_time = Scripted([Admitted(), ChoiceItem(0, Delta("x", "a")), release, ChoiceItem(0, result("ab"))])
    cut = Scripted([Admitted(), ChoiceItem(1, result("b")), ChoiceItem(0, Delta("x", "c"))], hang=True)
    never_opened = Scripted([Admitted()])

    async def main():
        service = service_over(in_time, cut, never_opened)
        service._alive = True
        (finishing,) = await service.submit(SeqRequest([1]), 1)
        cut_off = await service.submit(SeqRequest([2]), 2)
        outcomes = [asyncio.ensure_future(collect(h)) for h in [finishing, *cut_off]]
        started = time.monotonic()
        drain = asyncio.ensure_future(service.drain(0.3, poll=0.01))
        await asyncio.sleep(0.05)
        assert not service.alive
        with pytest.raises(ServiceStoppedError):
            await service.submit(SeqRequest([3]), 1)
        release.set()
        await drain
        return time.monotonic() - started, [await asyncio.wait_for(o, 5) for o in outcomes]

    took, (finished, choice0, choice1) = run(main())
    assert 0.3 <= took < 1.0, took
    assert finished == [Delta("x", "a"), result("ab")] and not in_time.cancelled
    assert choice1 == [result("b")]
    assert choice0[0] == Delta("x", "c") and type(choice0[1]) is ServiceStoppedError and len(choice0) == 2
    assert cut.cancelled and never_opened.items == [Admitted()]  # the refused request never reached a replica

"""Streams and waits of the HTTP API: a request's choices as server-sent events, or its
results unless the client leaves first. A stream or request whose client disconnects
cancels its sequences, which frees their KV state at once. Once a stream has started, an
error is sent as one `data: {"error": ...}` event (the openai client raises it), then
`data: [DONE]`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from starlette.background import BackgroundTask

from specrouter.engine.batch import Delta
from specrouter.engine.request import GenerationResult
from specrouter.server import api_responses as r
from specrouter.server.api_errors import from_exception
from specrouter.server.service import ChoiceHandle, interleave
from specrouter.server.tool_use import ToolUse
from specrouter.server.tools import ToolCallStream


async def results_unless_disconnected(handles: list[ChoiceHandle], request: Request) -> list[GenerationResult] | None:
    """The choices' results, or None (and the sequences cancelled) if the client left first;
    one choice's error cancels the others and is raised."""
    tasks = [asyncio.ensure_future(h.result()) for h in handles]
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        pending: set[asyncio.Future] = set(tasks)
        while pending and not gone.done():
            done, pending = await asyncio.wait(pending | {gone}, return_when=asyncio.FIRST_COMPLETED)
            pending.discard(gone)
            if any(t is not gone and not t.cancelled() and t.exception() is not None for t in done):
                break
    finally:
        gone.cancel()
        unfinished = [t for t in tasks if not t.done()]
        for task in unfinished:
            task.cancel()
        if unfinished:
            for handle in handles:
                handle.cancel()  # idempotent: a finished one is left as it is
    failed = next((t.exception() for t in tasks if t.done() and not t.cancelled() and t.exception()), None)
    if failed is not None:
        raise failed
    return None if unfinished else [t.result() for t in tasks]


async def _disconnected(request: Request) -> None:
    # After the body is read, the server's receive() answers only when the client leaves.
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def merged(streams: list[AsyncIterator], usage=None) -> AsyncIterator[BaseModel]:
    """The chunks of every choice's stream as they come (each stream yields its chunks, then
    its GenerationResult), then usage(results) when given. One stream's error ends it all."""
    results: list[GenerationResult] = []
    async with contextlib.aclosing(interleave(streams)) as items:  # closed with this stream: the pumps end
        async for _, item in items:
            if isinstance(item, GenerationResult):
                results.append(item)
            else:
                yield item
    if usage is not None:
        yield usage(results)


def sse(handles: list[ChoiceHandle], chunks: AsyncIterator[BaseModel]) -> StreamingResponse:
    async def body() -> AsyncIterator[str]:
        try:
            async for chunk in chunks:
                yield f"data: {chunk.model_dump_json()}\n\n"
        except Exception as exc:  # noqa: BLE001 - after the headers, an error can only travel in the stream
            yield f"data: {from_exception(exc).body.model_dump_json()}\n\n"
        yield "data: [DONE]\n\n"

    async def cancel() -> None:  # async: it runs on the event loop, as everything else touching the handles
        for handle in handles:
            handle.cancel()

    # The background task runs after the stream ends, also when the client disconnected.
    return StreamingResponse(body(), media_type="text/event-stream", background=BackgroundTask(cancel))


async def completion_chunks(handle: ChoiceHandle, ident: str, created: int, model: str, index: int,
                             texts: r.TokenText | None) -> AsyncIterator[r.Completion | GenerationResult]:
    """Choice `index`'s chunks, then its result (for the usage chunk). texts: None when the
    request asked for no logprobs."""
    def chunk(choices):
        return r.Completion(id=ident, created=created, model=model, choices=choices)

    offset = 0  # the text offset of the next token (text_offset counts from the completion's start)
    async for item in handle.events():
        if isinstance(item, Delta):
            logprobs = None
            if texts is not None:
                logprobs = r.CompletionLogprobs.of(item.logprobs, texts, offset)
                offset += sum(len(t) for t in logprobs.tokens)
            yield chunk([r.CompletionChoice(index=index, text=item.text, finish_reason=None, logprobs=logprobs)])
        else:
            yield chunk([r.CompletionChoice(index=index, text="", finish_reason=item.finish_reason)])
            yield item


async def chat_chunks(handle: ChoiceHandle, ident: str, created: int, model: str, index: int,
                       texts: r.TokenText | None, tool_use: ToolUse | None = None) -> AsyncIterator[r.ChatCompletionChunk | GenerationResult]:
    """Choice `index`'s chunks, then its result (for the usage chunk). texts: None when the
    request asked for no logprobs. With tools, text is passed on until a tool call may start
    (ToolCallStream); the calls come in one chunk at the end."""
    def chunk(choices):
        return r.ChatCompletionChunk(id=ident, created=created, model=model, choices=choices)

    calls = ToolCallStream(tool_use.functions) if tool_use is not None else None
    yield chunk([r.ChatChunkChoice(index=index, delta=r.ChatDelta(role="assistant", content=""))])
    async for item in handle.events():
        if isinstance(item, Delta):
            logprobs = r.ChatLogprobs.of(item.logprobs, texts) if texts is not None else None
            text = calls.feed(item.text) if calls is not None else item.text
            if text or logprobs is not None:
                yield chunk([r.ChatChunkChoice(index=index, delta=r.ChatDelta(content=text), logprobs=logprobs)])
        else:
            finish = item.finish_reason
            if calls is not None:
                answer = calls.finish()
                tool_calls = [r.ToolCallDelta(index=i, **c.model_dump()) for i, c in
                              enumerate(tool_use.calls(answer.calls))] or None
                if answer.content or tool_calls:
                    yield chunk([r.ChatChunkChoice(index=index, delta=r.ChatDelta(content=answer.content,
                                                                                 tool_calls=tool_calls))])
                finish = "tool_calls" if tool_calls else finish
            yield chunk([r.ChatChunkChoice(index=index, delta=r.ChatDelta(), finish_reason=finish)])
            yield item

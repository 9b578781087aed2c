"""The HTTP API (FastAPI): OpenAI's completions and chat completions, models, health, metrics.

Every error leaves as OpenAI's body {"error": {message, type, param, code}}: bad input
400, a missing or wrong API key 401, another model 404, a full queue 429, a timeout 504,
shutting down 503. Once a stream has started, an error is sent as one `data: {"error":
...}` event (the openai client raises it). A stream or request whose client disconnects
cancels its sequence, which frees the sequence's KV state at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException

from specrouter.cascade.grammar import Grammar
from specrouter.cascade.grammar import prepare as grammar_vocabulary
from specrouter.cascade.sampling import SamplingParams
from specrouter.chat import chat_prompt_tokens, supports_tools
from specrouter.drafters.memory import OPTED_OUT, MemoryScope
from specrouter.engine.batch import Delta, SeqRequest
from specrouter.engine.request import GenerationResult
from specrouter.engine.speculation import Speculation
from specrouter.errors import (BackendError, ChatTemplateError, InvalidChainError, InvalidGrammarError,
                               InvalidLogitBiasError, InvalidTokenIdError, PromptTooLongError, SpecRouterError)
from specrouter.server import schemas as s
from specrouter.server.config import ServeConfig
from specrouter.server.guard import RequestGuard, default_allowed_hosts
from specrouter.server.service import (ChoiceHandle, QueueFullError, ReplicaLostError, RequestTimeoutError, Serving,
                                       ServiceStoppedError, interleave)
from specrouter.server.tools import ToolCall, ToolCallStream, forced_calls, parse_tool_calls


log = logging.getLogger(__name__)


class APIError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.body = status, s.ErrorResponse(error=s.ErrorDetail(message=message, type=type, param=param,
                                                                             code=code))


#: The request field (OpenAI's `param`) that an engine error points to.
_PARAMS: dict[type[Exception], str] = {InvalidChainError: "speculation.chain", InvalidTokenIdError: "prompt",
                                        InvalidLogitBiasError: "logit_bias", ChatTemplateError: "messages"}


def _from_exception(exc: Exception) -> APIError:
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, QueueFullError):
        return APIError(429, str(exc), "rate_limit_error", code="queue_full")
    if isinstance(exc, ReplicaLostError):
        return APIError(503, str(exc), "service_unavailable", code="replica_lost")
    if isinstance(exc, ServiceStoppedError):
        return APIError(503, str(exc), "service_unavailable", code="shutting_down")
    if isinstance(exc, RequestTimeoutError):
        return APIError(504, str(exc), "timeout_error", code="request_timeout")
    if isinstance(exc, SpecRouterError) and not isinstance(exc, BackendError):
        # EmptyPromptError -> "empty_prompt": the error type names the problem.
        code = re.sub(r"(?<!^)(?=[A-Z])", "_", type(exc).__name__.removesuffix("Error")).lower()
        return APIError(400, str(exc), param=_PARAMS.get(type(exc)), code=code)
    log.error("request failed", exc_info=exc)  # the details go to the log, never to the client
    return APIError(500, "internal error (the server's log has the details)", "server_error")


#: The header that names a client's session (a conversation): with a fleet, the session's
#: requests prefer one replica (specrouter/fleet/affinity.py). Without it the body's
#: `prompt_cache_key` (OpenAI's routing hint for prompts that share a prefix), else `user`.
SESSION_HEADER = "X-Session-ID"

#: Seconds a client is told to wait before retrying a 429 (queue full) or a 503 (shutting down).
RETRY_AFTER = 1


def _error_json(err: APIError, headers: dict | None = None) -> JSONResponse:
    if err.status in (429, 503):
        headers = {**(headers or {}), "Retry-After": str(RETRY_AFTER)}
    return JSONResponse(err.body.model_dump(), status_code=err.status, headers=headers)


#: What an unknown field is told (nothing a request sends is silently ignored).
_UNKNOWN = "not a parameter this server supports (nothing is silently ignored)"


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        if errors[0].get("type") == "json_invalid":
            detail = errors[0].get("ctx", {}).get("error", "")
            return _error_json(APIError(400, f"the body is not valid JSON: {detail}", code="json_invalid"))
        locs = [[str(p) for p in e.get("loc", ()) if p != "body"] for e in errors]
        message = "; ".join(f"{'.'.join(loc) or 'body'}: {_UNKNOWN if e.get('type') == 'extra_forbidden' else e.get('msg', 'invalid')}"
                            for loc, e in zip(locs, errors))
        code = errors[0].get("type")
        # param: the top-level field (deeper parts of a loc include pydantic's union member tags).
        return _error_json(APIError(400, message, param=locs[0][0] if locs[0] else None,
                                    code="unsupported_parameter" if code == "extra_forbidden" else code))

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return _error_json(APIError(exc.status_code, str(exc.detail), kind), getattr(exc, "headers", None))

    # Expected errors get handlers of their own: Starlette re-raises (and logs) what only
    # the catch-all Exception handler answers.
    @app.exception_handler(APIError)
    @app.exception_handler(SpecRouterError)
    @app.exception_handler(Exception)
    async def known_error(_: Request, exc: Exception) -> JSONResponse:
        err = _from_exception(exc)
        headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else None
        return _error_json(err, headers)


_MIN_TEMPERATURE = 1e-5
_ERRORS = {code: {"model": s.ErrorResponse} for code in (400, 401, 404, 429, 503, 504)}


def create_app(service: Serving, config: ServeConfig) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI):
        service.start()
        try:
            yield
        finally:
            await asyncio.to_thread(service.stop)

    app = FastAPI(title="specrouter", summary="Lossless speculative decoding, OpenAI-compatible API",
                  lifespan=lifespan)
    _install_error_handlers(app)
    app.add_middleware(RequestGuard, max_body_bytes=config.max_body_bytes, api_key=config.api_key,
                       allowed_hosts=config.allowed_hosts or default_allowed_hosts(config.host))
    if config.cors_origins:  # outermost: a browser's preflight is answered before the key is asked for
        app.add_middleware(CORSMiddleware, allow_origins=config.cors_origins, allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])
    limit = PromptLimit.of(service.target, config.max_prompt_tokens)
    # The API key is checked by RequestGuard, before the body is read; this only reads it.
    bearer = HTTPBearer(auto_error=False)

    def memory_scope(body, creds: HTTPAuthorizationCredentials | None) -> MemoryScope:
        """The request's part of the cross-request memory: none when it or the server opts out;
        with `per-key`, the texts of requests that presented the same key (a digest of it)."""
        if not body.suffix_memory or config.memory == "off":
            return OPTED_OUT
        if config.memory == "shared" or creds is None:
            return MemoryScope()
        return MemoryScope(hashlib.sha256(creds.credentials.encode()).hexdigest())

    def cache_partition(body, creds: HTTPAuthorizationCredentials | None) -> str:
        """The request's partition of the prefix cache (engine/prefix_cache.py): requests
        resume only from caches that requests with the same key and the same `cache_salt`
        left; "" for those with neither."""
        if creds is None and body.cache_salt is None:
            return ""
        return hashlib.sha256(json.dumps([creds.credentials if creds else None, body.cache_salt]).encode()).hexdigest()

    v1 = APIRouter(prefix="/v1", responses=_ERRORS)
    names = config.served_model_name or [service.model_name]
    model = names[0]  # what responses report

    def check_request(body) -> None:
        """What a request must pass before its prompt is tokenized: the served model, and
        the kernels the server runs (one kind for every request)."""
        _check_model(body.model, names)
        if body.exact is not None and body.exact != config.exact:
            raise APIError(400, f"this server runs {'exact' if config.exact else 'default'} kernels for every request: "
                                f"exact={str(body.exact).lower()} cannot be honoured "
                                f"({'restart it without' if config.exact else 'start it with'} --exact)",
                           param="exact", code="unsupported_value")

    @v1.get("/models")
    async def models() -> s.ModelList:
        return s.ModelList(data=[s.ModelCard(id=name, created=service.created) for name in names])

    texts = s.TokenText(service.target.token_bytes)

    async def generate(body, request: Request, tokens: list[int], max_tokens: int, logprobs: int | None,
                       prefix: str, chunks, whole, usage_chunk, grammar: Grammar | None):
        """Submit the request's n choices (their output held to grammar, None: free), then
        stream chunks(handle, ident, created, model, index, texts) of every choice (and
        usage_chunk(ident, created, results) when asked), or answer whole(ident, created, results)."""
        speculation = body.engine_speculation(service.levels, config.served)
        if grammar is not None:  # the grammar's vocabulary is built once, here rather than in the scheduler's step
            await asyncio.to_thread(grammar_vocabulary, service.target)
        creds = await bearer(request)
        session = request.headers.get(SESSION_HEADER) or body.prompt_cache_key or body.user
        handles = await service.submit(_seq_request(body, tokens, max_tokens, speculation,
                                                     memory_scope(body, creds), cache_partition(body, creds),
                                                     logprobs, grammar), body.n,
                                       affinity=session)
        ident, created = f"{prefix}-{handles[0].id}", int(time.time())
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            streams = [chunks(h, ident, created, model, i, texts if logprobs is not None else None)
                       for i, h in enumerate(handles)]
            usage = functools.partial(usage_chunk, ident, created) if include_usage else None
            return _sse(handles, _merged(streams, usage))
        results = await _results_unless_disconnected(handles, request)
        if results is None:
            return Response(status_code=499)  # nobody is listening; the sequences are cancelled
        return whole(ident, created, results)

    @v1.post("/completions", response_model=s.Completion,
             responses={200: {"content": {"text/event-stream": {}}, "description": "with stream: server-sent events"}})
    async def completions(body: s.CompletionRequest, request: Request):
        check_request(body)
        if isinstance(body.prompt, str):
            limit.check_text([body.prompt])
            tokens = await asyncio.to_thread(service.target.tokenize, body.prompt)
        else:
            tokens = body.prompt  # ids are checked with the rest of the prompt (engine.request.check_prompt)
        limit.check_tokens(tokens)

        def whole(ident: str, created: int, results: list[GenerationResult]) -> s.Completion:
            choices = [s.CompletionChoice(index=i, text=r.text, finish_reason=r.finish_reason,
                                          logprobs=s.CompletionLogprobs.of(r.logprobs, texts) if r.logprobs is not None
                                          else None) for i, r in enumerate(results)]
            return s.Completion(id=ident, created=created, model=model, usage=s.Usage.of(results), choices=choices)

        def usage_chunk(ident: str, created: int, results: list[GenerationResult]) -> s.Completion:
            return s.Completion(id=ident, created=created, model=model, choices=[], usage=s.Usage.of(results))

        return await generate(body, request, tokens, body.max_tokens or config.max_tokens, body.logprobs, "cmpl",
                              _completion_chunks, whole, usage_chunk, body.engine_grammar)

    @v1.post("/chat/completions", response_model=s.ChatCompletion,
             responses={200: {"content": {"text/event-stream": {}}, "description": "with stream: server-sent events"}})
    async def chat_completions(body: s.ChatCompletionRequest, request: Request):
        check_request(body)
        if body.top_logprobs and not body.logprobs:  # 0 asks for nothing
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs", code="invalid_value")
        tool_use = _tool_use(body, service.target)
        messages = [m.for_template() for m in body.messages]
        tools = body.template_tools()
        tools_text = [json.dumps(tools, ensure_ascii=False)] if tools else []
        limit.check_text([m.text or "" for m in body.messages] + tools_text)
        tokens = await asyncio.to_thread(chat_prompt_tokens, service.target, messages, tools,
                                         body.chat_template_kwargs)
        limit.check_tokens(tokens)

        def choice(i: int, r: GenerationResult) -> s.ChatChoice:
            logprobs = s.ChatLogprobs.of(r.logprobs, texts) if r.logprobs is not None else None
            message, finish = s.AssistantMessage(content=r.text), r.finish_reason
            if tool_use is not None:
                answer = parse_tool_calls(r.text, tool_use.functions)
                if answer.calls:
                    message = s.AssistantMessage(content=answer.content, tool_calls=tool_use.calls(answer.calls))
                    finish = "tool_calls"
            return s.ChatChoice(index=i, message=message, finish_reason=finish, logprobs=logprobs)

        def whole(ident: str, created: int, results: list[GenerationResult]) -> s.ChatCompletion:
            return s.ChatCompletion(id=ident, created=created, model=model, usage=s.Usage.of(results),
                                    choices=[choice(i, r) for i, r in enumerate(results)])

        def usage_chunk(ident: str, created: int, results: list[GenerationResult]) -> s.ChatCompletionChunk:
            return s.ChatCompletionChunk(id=ident, created=created, model=model, choices=[], usage=s.Usage.of(results))

        max_tokens = body.max_completion_tokens or body.max_tokens or config.max_tokens
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        grammar = tool_use.grammar if tool_use is not None and tool_use.grammar is not None else body.engine_grammar
        return await generate(body, request, tokens, max_tokens, logprobs, "chatcmpl",
                              functools.partial(_chat_chunks, tool_use=tool_use), whole, usage_chunk, grammar)

    app.include_router(v1)

    @app.get("/health", responses={503: {"model": s.ErrorResponse}})
    async def health() -> dict[str, str]:
        if not service.alive:
            raise APIError(503, "the scheduler is not running", "service_unavailable")
        return {"status": "ok"}

    @app.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
    async def metrics() -> Response:
        return Response(await service.exposition(), media_type=CONTENT_TYPE_LATEST)

    return app


@dataclass(frozen=True)
class PromptLimit:
    """The longest prompt a request may send, in tokens, and the bound on its characters that
    already tells, before tokenizing: no token of the vocabulary spells more than
    `chars_per_token` characters (its longest text in bytes, which is at least its
    characters), so a text of more than tokens x chars_per_token characters has more than
    `tokens` tokens, whatever it says: a huge text is refused without the CPU time of
    tokenizing it."""

    tokens: int
    chars_per_token: int

    @classmethod
    def of(cls, target, max_prompt_tokens: int | None) -> PromptLimit:
        """max_prompt_tokens, or the target's context less the one position generation needs."""
        longest = max((len(text) for text in target.vocab_texts()), default=1)
        return cls(max_prompt_tokens or target.n_ctx - 1, max(1, longest))

    def check_text(self, texts: list[str]) -> None:
        chars = sum(len(t) for t in texts)
        if chars > self.tokens * self.chars_per_token:
            raise PromptTooLongError(f"the prompt has {chars} characters: more than the {self.tokens} tokens a prompt "
                                     f"may have, whatever they are (no token spells more than "
                                     f"{self.chars_per_token}); shorten it")

    def check_tokens(self, tokens: list[int]) -> None:
        if len(tokens) > self.tokens:
            raise PromptTooLongError(f"the prompt has {len(tokens)} tokens; at most {self.tokens} are accepted")


@dataclass(frozen=True)
class ToolUse:
    """A chat request's tools: the functions the model was told about, and whether it may
    return several calls (parallel_tool_calls false: the first only)."""

    functions: list[str]
    parallel: bool
    #: The answer's grammar when the calls are forced (tool_choice required or named), else None.
    grammar: Grammar | None = None

    def calls(self, found: list[ToolCall]) -> list[s.ToolCall]:
        kept = found if self.parallel else found[:1]
        return [s.ToolCall(id=c.id, function=s.FunctionCall(name=c.name, arguments=c.arguments)) for c in kept]


def _tool_use(body: s.ChatCompletionRequest, target) -> ToolUse | None:
    """The request's tools, checked (a 400 naming the field), or None when it offers none.
    tool_choice required or a named function constrains the answer to calls (forced_calls)."""
    choice = body.tool_choice
    names = [t.function.name for t in body.tools or ()]
    if len(set(names)) != len(names):
        raise APIError(400, "tools must have distinct function names", param="tools", code="invalid_value")
    named = choice.function.name if isinstance(choice, s.NamedToolChoice) else None
    if (choice == "required" or named is not None) and not names:
        raise APIError(400, "tool_choice required or a named function needs tools", param="tool_choice",
                       code="invalid_value")
    if named is not None and named not in names:
        raise APIError(400, f"tool_choice names {named!r}, which is not among the tools", param="tool_choice",
                       code="invalid_value")
    if not body.functions_offered:
        return None
    forced = choice == "required" or named is not None
    if not forced and any(t.function.strict for t in body.tools or ()):
        raise APIError(400, "not supported by this server yet: strict function calling with tool_choice auto (the "
                            "answer may be text or calls); use tool_choice required or a named function",
                       param="tools", code="unsupported_parameter")
    if not supports_tools(target):
        raise APIError(400, f"the chat template of {target.name} does not support tools", param="tools",
                       code="unsupported_value")
    grammar = None
    if forced:
        if body.engine_grammar is not None:
            raise APIError(400, "tool_choice required or a named function constrains the answer to calls: it cannot "
                                "be combined with response_format, regex or grammar", param="tool_choice",
                           code="invalid_value")
        try:
            grammar = forced_calls(body.template_tools(), [named] if named else body.functions_offered,
                                   body.parallel_tool_calls)
        except InvalidGrammarError as e:
            raise APIError(400, f"a tool's parameters cannot constrain its arguments: {e}", param="tools",
                           code="invalid_grammar") from None
    return ToolUse(body.functions_offered, body.parallel_tool_calls, grammar)


def _check_model(requested: str, served: list[str]) -> None:
    if requested not in served:
        raise APIError(404, f"the model `{requested}` does not exist: this server serves "
                            f"{', '.join(f'`{name}`' for name in served)}",
                       param="model", code="model_not_found")


def _seq_request(body: s.CompletionRequest | s.ChatCompletionRequest, tokens: list[int], max_tokens: int,
                 speculation: Speculation | None, memory: MemoryScope, cache_partition: str,
                 logprobs: int | None, grammar: Grammar | None) -> SeqRequest:
    # Below 1e-5 the warped distribution is the argmax up to exact ties: such temperatures
    # are greedy (as in vLLM).
    temperature = body.temperature if body.temperature >= _MIN_TEMPERATURE else 0.0
    params = SamplingParams(temperature=temperature, top_k=body.engine_top_k, top_p=body.top_p, seed=body.seed,
                            min_p=body.min_p, frequency_penalty=body.frequency_penalty,
                            presence_penalty=body.presence_penalty, repetition_penalty=body.repetition_penalty,
                            logit_bias=body.engine_logit_bias, grammar=grammar)
    return SeqRequest(tokens, params, max_tokens=max_tokens, stop=body.stop_list, speculation=speculation,
                      memory=memory, cache_partition=cache_partition, logprobs=logprobs)


async def _results_unless_disconnected(handles: list[ChoiceHandle], request: Request) -> list[GenerationResult] | None:
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


async def _merged(streams: list[AsyncIterator], usage=None) -> AsyncIterator[BaseModel]:
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


def _sse(handles: list[ChoiceHandle], chunks: AsyncIterator[BaseModel]) -> StreamingResponse:
    async def body() -> AsyncIterator[str]:
        try:
            async for chunk in chunks:
                yield f"data: {chunk.model_dump_json()}\n\n"
        except Exception as exc:  # noqa: BLE001 - after the headers, an error can only travel in the stream
            yield f"data: {_from_exception(exc).body.model_dump_json()}\n\n"
        yield "data: [DONE]\n\n"

    async def cancel() -> None:  # async: it runs on the event loop, as everything else touching the handles
        for handle in handles:
            handle.cancel()

    # The background task runs after the stream ends, also when the client disconnected.
    return StreamingResponse(body(), media_type="text/event-stream", background=BackgroundTask(cancel))


async def _completion_chunks(handle: ChoiceHandle, ident: str, created: int, model: str, index: int,
                             texts: s.TokenText | None) -> AsyncIterator[s.Completion | GenerationResult]:
    """Choice `index`'s chunks, then its result (for the usage chunk). texts: None when the
    request asked for no logprobs."""
    def chunk(choices):
        return s.Completion(id=ident, created=created, model=model, choices=choices)

    offset = 0  # the text offset of the next token (text_offset counts from the completion's start)
    async for item in handle.events():
        if isinstance(item, Delta):
            logprobs = None
            if texts is not None:
                logprobs = s.CompletionLogprobs.of(item.logprobs, texts, offset)
                offset += sum(len(t) for t in logprobs.tokens)
            yield chunk([s.CompletionChoice(index=index, text=item.text, finish_reason=None, logprobs=logprobs)])
        else:
            yield chunk([s.CompletionChoice(index=index, text="", finish_reason=item.finish_reason)])
            yield item


async def _chat_chunks(handle: ChoiceHandle, ident: str, created: int, model: str, index: int,
                       texts: s.TokenText | None, tool_use: ToolUse | None = None) -> AsyncIterator[s.ChatCompletionChunk | GenerationResult]:
    """Choice `index`'s chunks, then its result (for the usage chunk). texts: None when the
    request asked for no logprobs. With tools, text is passed on until a tool call may start
    (ToolCallStream); the calls come in one chunk at the end."""
    def chunk(choices):
        return s.ChatCompletionChunk(id=ident, created=created, model=model, choices=choices)

    calls = ToolCallStream(tool_use.functions) if tool_use is not None else None
    yield chunk([s.ChatChunkChoice(index=index, delta=s.ChatDelta(role="assistant", content=""))])
    async for item in handle.events():
        if isinstance(item, Delta):
            logprobs = s.ChatLogprobs.of(item.logprobs, texts) if texts is not None else None
            text = calls.feed(item.text) if calls is not None else item.text
            if text or logprobs is not None:
                yield chunk([s.ChatChunkChoice(index=index, delta=s.ChatDelta(content=text), logprobs=logprobs)])
        else:
            finish = item.finish_reason
            if calls is not None:
                answer = calls.finish()
                tool_calls = [s.ToolCallDelta(index=i, **c.model_dump()) for i, c in
                              enumerate(tool_use.calls(answer.calls))] or None
                if answer.content or tool_calls:
                    yield chunk([s.ChatChunkChoice(index=index, delta=s.ChatDelta(content=answer.content,
                                                                                 tool_calls=tool_calls))])
                finish = "tool_calls" if tool_calls else finish
            yield chunk([s.ChatChunkChoice(index=index, delta=s.ChatDelta(), finish_reason=finish)])
            yield item

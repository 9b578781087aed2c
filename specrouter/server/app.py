"""The HTTP API (FastAPI): OpenAI's completions and chat completions, models, health, metrics.

Errors are OpenAI's body (api_errors.py); streams and disconnects: streams.py. Work that
can take more than a moment (tokenizing, rendering a chat template, compiling a grammar)
runs in a thread, never on the event loop that serves every other client.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import time
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST

from specrouter.cascade.grammar import Grammar
from specrouter.cascade.grammar import prepare as grammar_vocabulary
from specrouter.cascade.sampling import SamplingParams
from specrouter.chat import chat_prompt_tokens
from specrouter.drafters.memory import OPTED_OUT, MemoryScope
from specrouter.engine.batch import SeqRequest
from specrouter.engine.request import GenerationResult
from specrouter.errors import InvalidGrammarError, clip
from specrouter.server import api_requests as q
from specrouter.server import api_responses as r
from specrouter.server.api_errors import APIError, ErrorResponse, install_error_handlers
from specrouter.server.config import ServeConfig
from specrouter.server.guard import RequestGuard, default_allowed_hosts
from specrouter.server.limits import PromptLimit
from specrouter.server.service import Serving
from specrouter.server.streams import chat_chunks, completion_chunks, merged, results_unless_disconnected, sse
from specrouter.server.tool_use import ToolUse, tool_use
from specrouter.server.tools import parse_tool_calls

#: The header that names a client's session (a conversation): with a fleet, the session's
#: requests prefer one replica (specrouter/fleet/affinity.py). Without it the body's
#: `prompt_cache_key` (OpenAI's routing hint for prompts that share a prefix), else `user`.
SESSION_HEADER = "X-Session-ID"
#: Below this temperature the warped distribution is the argmax up to exact ties: such
#: temperatures are greedy (as in vLLM).
_MIN_TEMPERATURE = 1e-5
_ERRORS = {code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 429, 503, 504)}
_STREAMED = {200: {"content": {"text/event-stream": {}}, "description": "with stream: server-sent events"}}


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
    install_error_handlers(app)
    app.add_middleware(RequestGuard, max_body_bytes=config.max_body_bytes, api_key=config.api_key,
                       allowed_hosts=config.allowed_hosts or default_allowed_hosts(config.host))
    if config.cors_origins:  # outermost: a browser's preflight is answered before the key is asked for
        app.add_middleware(CORSMiddleware, allow_origins=config.cors_origins, allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])
    app.include_router(_Endpoints(service, config).router())

    @app.get("/health", responses={503: {"model": ErrorResponse}})
    async def health() -> dict[str, str]:
        if not service.alive:
            raise APIError(503, "the scheduler is not running", "service_unavailable")
        return {"status": "ok"}

    @app.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
    async def metrics() -> Response:
        return Response(await service.exposition(), media_type=CONTENT_TYPE_LATEST)

    app.openapi = functools.partial(_document, app)
    return app


def _document(app: FastAPI) -> dict:
    """The OpenAPI document, without FastAPI's 422 responses: an invalid body is a 400 here
    (OpenAI's error body, api_errors.py)."""
    if app.openapi_schema is None:
        app.openapi_schema = FastAPI.openapi(app)
        for operations in app.openapi_schema["paths"].values():
            for operation in operations.values():
                operation["responses"].pop("422", None)
        for name in ("HTTPValidationError", "ValidationError"):
            app.openapi_schema.get("components", {}).get("schemas", {}).pop(name, None)
    return app.openapi_schema


class _Endpoints:
    """The /v1 routes of one server: its service, configuration and limits."""

    def __init__(self, service: Serving, config: ServeConfig) -> None:
        self.service, self.config = service, config
        self.limit = PromptLimit.of(service.target, config.max_prompt_tokens)
        self.names = config.served_model_name or [service.model_name]
        self.model = self.names[0]  # what responses report
        self.texts = r.TokenText(service.target.token_bytes)
        # The API key is checked by RequestGuard, before the body is read; this only reads it.
        self.bearer = HTTPBearer(auto_error=False)

    def router(self) -> APIRouter:
        v1 = APIRouter(prefix="/v1", responses=_ERRORS)
        v1.add_api_route("/models", self.models, methods=["GET"])
        v1.add_api_route("/completions", self.completions, methods=["POST"], response_model=r.Completion,
                         responses=_STREAMED)
        v1.add_api_route("/chat/completions", self.chat_completions, methods=["POST"],
                         response_model=r.ChatCompletion, responses=_STREAMED)
        return v1

    async def models(self) -> r.ModelList:
        return r.ModelList(data=[r.ModelCard(id=name, created=self.service.created) for name in self.names])

    async def completions(self, body: q.CompletionRequest, request: Request):
        self.check_request(body)
        if isinstance(body.prompt, str):
            self.limit.check_text([body.prompt])
            tokens = await asyncio.to_thread(self.service.target.tokenize, body.prompt)
        else:
            tokens = body.prompt  # ids are checked with the rest of the prompt (engine.request.check_prompt)
        self.limit.check_tokens(tokens)
        grammar = await asyncio.to_thread(_grammar, body)
        model = self.model

        def whole(ident: str, created: int, results: list[GenerationResult]) -> r.Completion:
            choices = [r.CompletionChoice(index=i, text=x.text, finish_reason=x.finish_reason,
                                          logprobs=r.CompletionLogprobs.of(x.logprobs, self.texts)
                                          if x.logprobs is not None else None) for i, x in enumerate(results)]
            return r.Completion(id=ident, created=created, model=model, usage=r.Usage.of(results), choices=choices)

        def usage_chunk(ident: str, created: int, results: list[GenerationResult]) -> r.Completion:
            return r.Completion(id=ident, created=created, model=model, choices=[], usage=r.Usage.of(results))

        max_tokens = self.limit.answer_tokens(len(tokens), body.max_tokens, self.config.max_tokens)
        return await self.generate(body, request, tokens, max_tokens, body.logprobs, "cmpl", completion_chunks,
                                   whole, usage_chunk, grammar)

    async def chat_completions(self, body: q.ChatCompletionRequest, request: Request):
        self.check_request(body)
        if body.top_logprobs and not body.logprobs:  # 0 asks for nothing
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs", code="invalid_value")
        tools = await asyncio.to_thread(tool_use, body, self.service.target)
        grammar = tools.grammar if tools is not None and tools.grammar is not None else \
            await asyncio.to_thread(_grammar, body)
        template_tools = body.template_tools()
        tools_text = [json.dumps(template_tools, ensure_ascii=False)] if template_tools else []
        self.limit.check_text([m.text or "" for m in body.messages] + tools_text)
        tokens = await asyncio.to_thread(chat_prompt_tokens, self.service.target,
                                         [m.for_template() for m in body.messages], template_tools,
                                         body.chat_template_kwargs)
        self.limit.check_tokens(tokens)
        model = self.model

        def whole(ident: str, created: int, results: list[GenerationResult]) -> r.ChatCompletion:
            return r.ChatCompletion(id=ident, created=created, model=model, usage=r.Usage.of(results),
                                    choices=[self.chat_choice(i, x, tools) for i, x in enumerate(results)])

        def usage_chunk(ident: str, created: int, results: list[GenerationResult]) -> r.ChatCompletionChunk:
            return r.ChatCompletionChunk(id=ident, created=created, model=model, choices=[], usage=r.Usage.of(results))

        asked = body.max_completion_tokens or body.max_tokens
        max_tokens = self.limit.answer_tokens(len(tokens), asked, self.config.max_tokens)
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        return await self.generate(body, request, tokens, max_tokens, logprobs, "chatcmpl",
                                   functools.partial(chat_chunks, tool_use=tools), whole, usage_chunk, grammar)

    def chat_choice(self, i: int, result: GenerationResult, tools: ToolUse | None) -> r.ChatChoice:
        """Choice i of a chat answer: its text, or the tool calls parsed from it."""
        logprobs = r.ChatLogprobs.of(result.logprobs, self.texts) if result.logprobs is not None else None
        message, finish = r.AssistantMessage(content=result.text), result.finish_reason
        if tools is not None:
            answer = parse_tool_calls(result.text, tools.functions)
            if answer.calls:
                message = r.AssistantMessage(content=answer.content, tool_calls=tools.calls(answer.calls))
                finish = "tool_calls"
        return r.ChatChoice(index=i, message=message, finish_reason=finish, logprobs=logprobs)

    def check_request(self, body: q.CompletionRequest | q.ChatCompletionRequest) -> None:
        """What a request must pass before its prompt is tokenized: the served model, and
        the kernels the server runs (one kind for every request)."""
        if body.model not in self.names:
            raise APIError(404, f"the model `{clip(body.model, 100)}` does not exist: this server serves "
                                f"{', '.join(f'`{name}`' for name in self.names)}",
                           param="model", code="model_not_found")
        exact = self.config.exact
        if body.exact is not None and body.exact != exact:
            raise APIError(400, f"this server runs {'exact' if exact else 'default'} kernels for every request: "
                                f"exact={str(body.exact).lower()} cannot be honoured "
                                f"({'restart it without' if exact else 'start it with'} --exact)",
                           param="exact", code="unsupported_value")

    async def generate(self, body: q.CompletionRequest | q.ChatCompletionRequest, request: Request,
                       tokens: list[int], max_tokens: int, logprobs: int | None, prefix: str, chunks, whole,
                       usage_chunk, grammar: Grammar | None):
        """Submit the request's n choices (their output held to grammar, None: free), then
        stream chunks(handle, ident, created, model, index, texts) of every choice (and
        usage_chunk(ident, created, results) when asked), or answer whole(ident, created, results)."""
        speculation = body.engine_speculation(self.service.levels, self.config.served)
        if grammar is not None:  # the grammar's vocabulary is built once, here rather than in the scheduler's step
            await asyncio.to_thread(grammar_vocabulary, self.service.target)
        creds = await self.bearer(request)
        session = request.headers.get(SESSION_HEADER) or body.prompt_cache_key or body.user
        seq = _seq_request(body, tokens, max_tokens, logprobs, grammar)
        seq.speculation, seq.memory = speculation, self.memory_scope(body, creds)
        seq.cache_partition = self.cache_partition(body, creds)
        seq.reproducible = body.seed is not None  # the seed contract (docs/serving.md, "Seeds")
        handles = await self.service.submit(seq, body.n, affinity=session)
        ident, created = f"{prefix}-{handles[0].id}", int(time.time())
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            texts = self.texts if logprobs is not None else None
            streams = [chunks(h, ident, created, self.model, i, texts) for i, h in enumerate(handles)]
            usage = functools.partial(usage_chunk, ident, created) if include_usage else None
            return sse(handles, merged(streams, usage))
        results = await results_unless_disconnected(handles, request)
        if results is None:
            return Response(status_code=499)  # nobody is listening; the sequences are cancelled
        return whole(ident, created, results)

    def memory_scope(self, body, creds: HTTPAuthorizationCredentials | None) -> MemoryScope:
        """The request's part of the cross-request memory: none when it or the server opts out;
        with `per-key`, the texts of requests that presented the same key (a digest of it)."""
        if not body.suffix_memory or self.config.memory == "off":
            return OPTED_OUT
        if self.config.memory == "shared" or creds is None:
            return MemoryScope()
        return MemoryScope(hashlib.sha256(creds.credentials.encode()).hexdigest())

    @staticmethod
    def cache_partition(body, creds: HTTPAuthorizationCredentials | None) -> str:
        """The request's partition of the prefix cache (engine/prefix_cache.py): requests
        resume only from caches that requests with the same key and the same `cache_salt`
        left; "" for those with neither."""
        if creds is None and body.cache_salt is None:
            return ""
        return hashlib.sha256(json.dumps([creds.credentials if creds else None, body.cache_salt]).encode()).hexdigest()


def _grammar(body: q.CompletionRequest | q.ChatCompletionRequest) -> Grammar | None:
    """The request's output constraint, compiled (a 400 naming its field if it does not compile)."""
    try:
        return body.engine_grammar
    except InvalidGrammarError as e:
        raise APIError(400, str(e), param=body.constraint_field, code="invalid_grammar") from None


def _seq_request(body: q.CompletionRequest | q.ChatCompletionRequest, tokens: list[int], max_tokens: int,
                 logprobs: int | None, grammar: Grammar | None) -> SeqRequest:
    temperature = body.temperature if body.temperature >= _MIN_TEMPERATURE else 0.0
    params = SamplingParams(temperature=temperature, top_k=body.engine_top_k, top_p=body.top_p, seed=body.seed,
                            min_p=body.min_p, frequency_penalty=body.frequency_penalty,
                            presence_penalty=body.presence_penalty, repetition_penalty=body.repetition_penalty,
                            logit_bias=body.engine_logit_bias, grammar=grammar)
    return SeqRequest(tokens, params, max_tokens=max_tokens, stop=body.stop_list, logprobs=logprobs)

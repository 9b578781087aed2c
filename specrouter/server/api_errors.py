"""Errors of the HTTP API: OpenAI's body {"error": {message, type, param, code}} for every one.

Bad input is a 400 (401 a missing or wrong API key, 404 another model, 413 a body over the
limit, 429 a full queue, 503 shutting down, 504 a timeout); anything unexpected is a 500
whose body says nothing of the exception. Three properties hold for any input:
- building an error body cannot fail: it is written as ASCII JSON (a lone surrogate a
  client sent comes back escaped), and client text quoted in a message is clipped;
- an unexpected exception is answered (a 500, or an error event once a stream started)
  and never re-raised to the server, so the kept-alive connection serves the next request;
- each failure is logged once, as one bounded record: the exception's type, its message
  clipped and its traceback's frames, never a client's whole grammar or prompt.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from specrouter.errors import (BackendError, ChatTemplateError, InvalidChainError, InvalidLogitBiasError,
                               InvalidTokenIdError, SpecRouterError, clip, log_failure)
from specrouter.server.service import QueueFullError, ReplicaLostError, RequestTimeoutError, ServiceStoppedError

log = logging.getLogger("specrouter.server")

#: Seconds a client is told to wait before retrying a 429 (queue full) or a 503 (shutting down).
RETRY_AFTER = 1
#: What an unknown field is told (nothing a request sends is silently ignored).
UNKNOWN_FIELD = "not a parameter this server supports (nothing is silently ignored)"
#: The request field (OpenAI's `param`) that an engine error points to.
_PARAMS: dict[type[Exception], str] = {InvalidChainError: "speculation.chain", InvalidTokenIdError: "prompt",
                                        InvalidLogitBiasError: "logit_bias", ChatTemplateError: "messages"}


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class APIError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.body = status, ErrorResponse(error=ErrorDetail(message=message, type=type, param=param,
                                                                         code=code))


class AsciiJSONResponse(JSONResponse):
    """JSON with every non-ASCII character escaped: any Python string can be written."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def from_exception(exc: Exception) -> APIError:
    """The API's error for an exception (an unexpected one is logged here, once)."""
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
        return APIError(400, clip(str(exc), 1000), param=_PARAMS.get(type(exc)), code=code)
    log_failure(log, "request failed", exc)  # the details go to the log, never to the client
    return APIError(500, "internal error (the server's log has the details)", "server_error")


def error_response(err: APIError, headers: dict | None = None) -> JSONResponse:
    if err.status in (429, 503):
        headers = {**(headers or {}), "Retry-After": str(RETRY_AFTER)}
    if err.status == 401:
        headers = {**(headers or {}), "WWW-Authenticate": "Bearer"}
    return AsciiJSONResponse(err.body.model_dump(), status_code=err.status, headers=headers)


def validation_error(exc: RequestValidationError) -> APIError:
    """A body that is not valid JSON or does not fit the request's type: a 400 naming the
    first field at fault (OpenAI's `param`: the top-level field) and every problem found."""
    errors = exc.errors()
    first = errors[0]
    if first.get("type") == "json_invalid":
        detail = clip(str(first.get("ctx", {}).get("error", "")))
        return APIError(400, f"the body is not valid JSON: {detail}", code="json_invalid")
    locs = [[clip(str(p), 40) for p in e.get("loc", ()) if p != "body"] for e in errors]
    parts = []
    for loc, e in zip(locs, errors):
        msg = UNKNOWN_FIELD if e.get("type") == "extra_forbidden" else clip(str(e.get("msg", "invalid")), 300)
        parts.append(f"{'.'.join(loc)}: {msg}" if loc else msg)
    code = first.get("type")
    # param: the top-level field (deeper parts of a loc include pydantic's union member tags);
    # a whole-body check names its field in its context.
    param = locs[0][0] if locs[0] else first.get("ctx", {}).get("field")
    return APIError(400, clip("; ".join(parts), 2000), param=param,
                    code="unsupported_parameter" if code == "extra_forbidden" else code)


def install_error_handlers(app: FastAPI) -> None:
    """Every error as OpenAI's body; the catch-all (CatchAll) is a middleware of its own."""

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(exc))

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return error_response(APIError(exc.status_code, clip(str(exc.detail)), kind), getattr(exc, "headers", None))

    # Starlette's handler of a bare Exception answers and then re-raises it (the server closes
    # the connection): only subclasses get handlers here; CatchAll answers the rest.
    @app.exception_handler(APIError)
    @app.exception_handler(SpecRouterError)
    async def known_error(_: Request, exc: Exception) -> JSONResponse:
        return error_response(from_exception(exc))

    app.add_middleware(CatchAll)


class CatchAll:
    """The innermost middleware: an exception nothing else handled becomes a 500 (when no
    response has started) and is not re-raised, so the connection lives on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception as exc:  # noqa: BLE001 - the last line of defence, logged once
            err = from_exception(exc)
            if not started:
                await error_response(err)(scope, receive, send)

"""Fuzz every route of the served OpenAPI document (schemathesis): requests that fit the
document and requests that break it (wrong types, missing fields, values out of range, bodies
that are not JSON, unexpected methods), from schemathesis' examples, coverage and fuzzing
phases. No request may get a 5xx; every 4xx is OpenAI's error body (error_shape.py); a
request that breaks the document is refused (negative_data_rejection); every answer has the
status, content type and schema the document declares; every sequence is released after each
request (no live sequence, no KV cell held).

The document comes from an app built at import (schemathesis' fixture-based lazy loading does
not work with pytest 9); the generated requests go to a live loopback server. Generation is
deterministic (derandomized, no example database), and bounded: at most MAX_EXAMPLES fuzzed
requests per route, plus the coverage phase's fixed set of boundary and type cases.
"""

from __future__ import annotations

import json

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import (content_type_conformance, negative_data_rejection,
                                               response_schema_conformance, status_code_conformance)

from specrouter.server.app import create_app
from specrouter.server.config import ServeConfig

from ..server_synth import MODEL, MODELS, build_service, leaked_kv, running_server, wait_until
from .error_shape import assert_openai_error

#: Fuzzed requests per route (the fuzzing phase; the coverage phase adds its own fixed set).
MAX_EXAMPLES = 200
ROUTES = {"GET /v1/models", "POST /v1/completions", "POST /v1/chat/completions", "GET /health", "GET /metrics"}
#: Explicit, so that no configuration file found on disk changes what is generated.
CONFIG = SchemathesisConfig.from_dict({"generation": {"mode": "all", "deterministic": True, "database": "none"}})

DOCUMENT = create_app(build_service(routed=False)[0], ServeConfig(models=MODELS)).openapi()
schema = schemathesis.openapi.from_dict(DOCUMENT, config=CONFIG)


def openai_error_body(ctx, response, case) -> None:
    """A schemathesis check: every 4xx answer is OpenAI's error body."""
    if 400 <= response.status_code < 500:
        content_type = (response.headers.get("content-type") or [None])[0]
        assert_openai_error(response.status_code, content_type, response.content)


CHECKS = [not_a_server_error, openai_error_body, negative_data_rejection, status_code_conformance,
          content_type_conformance, response_schema_conformance]


def _toward_the_engine(case) -> None:
    """Let a body reach the engine where the document cannot tell what the validator refuses:
    the served model's name (a random one only meets the 404), and in a body that fits the
    document, the rules a chat message's fields follow together (content unless an assistant's
    calls, tool_call_id on a tool's; calls are left out). A body that breaks the document is
    sent as generated."""
    body = case.body
    if not isinstance(body, dict):
        return
    if isinstance(body.get("model"), str):
        body["model"] = MODEL
    if case.meta.generation.mode.is_positive and isinstance(body.get("messages"), list):
        for message in body["messages"]:
            message.pop("tool_calls", None)
            if message.get("content") is None:
                message["content"] = "hi"
            if message["role"] == "tool" and not message.get("tool_call_id"):
                message["tool_call_id"] = "call"


@pytest.fixture(scope="module")
def served():
    service, models = build_service()
    with running_server(service, max_tokens=16) as (url, _):  # short default generations keep the pass quick
        yield url, service, models


def test_every_route_of_the_document_is_fuzzed():
    assert {result.ok().label for result in schema.get_all_operations()} == ROUTES


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
          database=None)
def test_no_request_gets_a_server_error_every_refusal_is_openai_shaped_and_none_leaves_a_sequence(case, served):
    url, service, models = served
    _toward_the_engine(case)
    case.call_and_validate(base_url=url, checks=CHECKS, timeout=30)
    assert wait_until(lambda: service.live_sequences == 0 and leaked_kv(models) == 0)


VALID = {"error": {"message": "m", "type": "invalid_request_error", "param": None, "code": None}}


@pytest.mark.parametrize(("status", "content_type", "body"), [
    (422, "application/json", {"detail": [{"loc": ["body"], "msg": "x", "type": "missing"}]}),  # FastAPI's own
    (400, "application/json", {"error": {"message": "m", "type": "t", "param": None}}),
    (400, "application/json", {"error": {"message": "m", "type": "t", "param": None, "code": 400}}),
    (400, "application/json", {"error": {"message": "", "type": "t", "param": None, "code": None}}),
    (400, "application/json", {"error": {**VALID["error"], "detail": "x"}}),
    (400, "application/json", {**VALID, "detail": "x"}),
    (400, "application/json", "not an object"),
    (400, "text/plain", VALID),
    (500, "application/json", VALID),
])
def test_the_error_check_refuses_what_is_not_openais_error_body(status, content_type, body):
    with pytest.raises(AssertionError):
        assert_openai_error(status, content_type, json.dumps(body).encode())


def test_the_error_check_takes_openais_error_body_and_no_other_text():
    assert assert_openai_error(404, "application/json; charset=utf-8", json.dumps(VALID).encode()) == VALID["error"]
    with pytest.raises(AssertionError, match="not JSON"):
        assert_openai_error(400, "application/json", b"{")

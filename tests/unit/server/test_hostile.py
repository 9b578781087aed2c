"""A hostile client, second round (issue server-hardening-2), on real loopback servers with
synthetic models: no input reaches a 500 (Unicode at any depth, nesting, grammars past the
grammar engine's limits), an unexpected error keeps the connection and is logged once,
briefly; types are strict as OpenAI's; max_tokens is bounded by the context; tool schemas
are checked whatever tool_choice says; slow clients are closed after their read timeouts
and connections are bounded, while a normal request is served."""

import json
import logging
import socket

import httpx
import pytest

from specrouter.server.api_requests import MAX_DEPTH

from ..server_synth import MODEL, N_CTX, build_service, running_server, wait_until

JSON = {"content-type": "application/json"}
CHAT = "/v1/chat/completions"
SURROGATE = "\ud800"  # placed by json.dumps as the escape \\ud800, as a client sends it


def _raw(body: dict) -> str:
    """The body as JSON text: Python strings with lone surrogates become \\udXXX escapes."""
    return json.dumps(body)


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


def _served_next(http: httpx.Client) -> None:
    """The same kept-alive connection serves a normal request."""
    ok = http.post("/v1/completions", json={"model": MODEL, "prompt": "abc", "max_tokens": 3})
    assert ok.status_code == 200 and len(ok.json()["choices"][0]["text"]) == 3


TOOL = {"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"a": {"type": "string", "description": "the a"}}}}}
CALL = {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                             "function": {"name": "f", "arguments": "{\"a\": \"x\"}"}}]}


@pytest.mark.parametrize(("body", "param", "path"), [
    ({"model": SURROGATE}, "model", "model"),
    ({"tools": [{**TOOL, "function": {**TOOL["function"], "parameters": {"type": "object", "properties": {
        "a": {"type": "string", "description": "x" + SURROGATE}}}}}]}, "tools",
     "tools.0.function.parameters.properties.a.description"),
    ({"messages": [{"role": "user", "content": "hi"}, {**CALL, "tool_calls": [
        {**CALL["tool_calls"][0], "function": {"name": "f", "arguments": "{\"a\": \"" + SURROGATE + "\"}"}}]}]},
     "messages", "messages.1.tool_calls.0.function.arguments"),
    ({"metadata": {"k": "v" + SURROGATE}}, "metadata", "metadata.k"),
    ({"chat_template_kwargs": {SURROGATE: 1}}, "chat_template_kwargs", "chat_template_kwargs.\\ud800"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {SURROGATE: {"type": "string"}}}}}}, "response_format",
     "response_format.json_schema.schema.properties.\\ud800"),
])
def test_a_lone_surrogate_at_any_depth_is_a_400_naming_its_path_and_the_connection_lives_on(body, param, path):
    service, _ = build_service()
    request = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, **body}
    with running_server(service) as (url, _), httpx.Client(base_url=url, timeout=30) as http:
        error = _error(http.post(CHAT, content=_raw(request), headers=JSON), 400)
        assert (error["param"], error["code"]) == (param, "invalid_unicode")
        assert error["message"].startswith(f"{path}: invalid Unicode: a lone surrogate at character")
        _served_next(http)


def test_a_body_nested_deeper_than_the_bound_is_a_400_naming_the_field():
    service, _ = build_service()
    deep: object = "x"
    for _ in range(MAX_DEPTH + 1):
        deep = {"k": deep}
    request = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "metadata": None,
               "chat_template_kwargs": deep}
    with running_server(service) as (url, _), httpx.Client(base_url=url, timeout=30) as http:
        error = _error(http.post(CHAT, json=request), 400)
        assert (error["param"], error["code"]) == ("chat_template_kwargs", "too_deep")
        assert f"nested deeper than {MAX_DEPTH} levels" in error["message"]
        _served_next(http)


def _nested(levels: int) -> dict:
    deep: object = "x"
    for _ in range(levels):
        deep = {"k": deep}
    return deep


@pytest.mark.parametrize(("arguments", "code", "detail"), [
    ({"a": "x" + SURROGATE}, "invalid_unicode", "arguments.a: invalid Unicode: a lone surrogate at character 1"),
    ({"a": [{SURROGATE: 1}]}, "invalid_unicode", "arguments.a.0.\\ud800: invalid Unicode: a lone surrogate"),
    (_nested(MAX_DEPTH + 1), "too_deep", "arguments.k.k.k"),
    (_nested(900), "too_deep", "arguments.k.k.k"),
])
def test_a_calls_arguments_are_checked_as_the_body_is_once_parsed(arguments, code, detail):
    """The arguments are JSON text: ASCII escapes of lone surrogates, or nesting, show only
    once it is parsed."""
    service, _ = build_service()
    call = {**CALL["tool_calls"][0], "function": {"name": "f", "arguments": json.dumps(arguments)}}
    request = {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"},
                                                             {**CALL, "tool_calls": [call]}]}
    with running_server(service) as (url, _), httpx.Client(base_url=url, timeout=30) as http:
        error = _error(http.post(CHAT, json=request), 400)
        assert (error["param"], error["code"]) == ("messages", code)
        assert error["message"].startswith(f"messages.1: tool_calls.0.function.{detail}")
        if code == "too_deep":
            assert error["message"].endswith(f"nested deeper than {MAX_DEPTH} levels")
        _served_next(http)


def test_an_unexpected_error_keeps_the_connection_and_is_logged_once_briefly(monkeypatch, caplog):
    service, _ = build_service()
    huge = "grammar " * 100_000  # an exception whose text quotes a client's whole input

    def broken(*_a, **_k):
        raise RuntimeError(huge)

    with running_server(service) as (url, _), httpx.Client(base_url=url, timeout=30) as http:
        monkeypatch.setattr(service.target, "tokenize", broken)
        with caplog.at_level(logging.ERROR):
            error = _error(http.post("/v1/completions", json={"model": MODEL, "prompt": "abc", "max_tokens": 3}), 500)
        monkeypatch.undo()
        assert error["type"] == "server_error" and "grammar" not in error["message"]
        _served_next(http)  # the connection was not dropped
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].name == "specrouter.server"
    message = errors[0].getMessage()
    # The exception's text is quoted up to 500 characters, the rest counted; the traceback's
    # frames follow (their length depends on where the package is installed).
    assert message.startswith("request failed: RuntimeError: " + huge[:500] + "... (")
    assert message.split("\n")[0].endswith(f"... ({len(huge) - 500:,} more characters)")


def _exploding_grammar(alternatives: int) -> str:
    """A GBNF grammar whose parser row after its first character holds one item per
    alternative: past the grammar engine's bound once generation starts (letters a..p
    are the synthetic vocabulary's)."""
    letters = "bcdefghijklmnop"
    words = [letters[i % 15] + letters[i // 15 % 15] + letters[i // 225 % 15] for i in range(alternatives)]
    return "root ::= " + " | ".join(f'"a" "{w}"' for w in words)


def test_a_grammar_past_the_engines_limits_is_a_400_naming_the_limit_and_logs_nothing(caplog):
    service, _ = build_service()
    body = {"model": MODEL, "prompt": "abc", "max_tokens": 5, "grammar": _exploding_grammar(3000),
            "speculation": "off"}
    with running_server(service) as (url, _), httpx.Client(base_url=url, timeout=60) as http:
        with caplog.at_level(logging.WARNING):
            error = _error(http.post("/v1/completions", json=body), 400)
        assert (error["code"], error["param"]) == ("invalid_grammar", None)
        assert "beyond the grammar engine's limits" in error["message"] and len(error["message"]) < 600
        _served_next(http)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("constraint", [{"regex": ""}, {"grammar": 'root ::= ""'}])
@pytest.mark.parametrize("stream", [False, True])
def test_a_grammar_whose_one_sentence_is_empty_gets_an_empty_answer_from_models_without_an_end_token(
        constraint, stream):
    """The synthetic models have no end-of-generation token: the grammar allows only its end."""
    service, _ = build_service()
    body = {"model": MODEL, "prompt": "abc", "max_tokens": 5, "stream": stream, **constraint}
    with running_server(service) as (url, _), httpx.Client(base_url=url, timeout=30) as http:
        response = http.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        if stream:
            events = [json.loads(line[6:]) for line in response.text.splitlines()
                      if line.startswith("data: {")]
            assert ["".join(c["text"] for c in e["choices"]) for e in events] == [""]
            assert events[-1]["choices"][0]["finish_reason"] == "stop"
        else:
            choice = response.json()["choices"][0]
            assert (choice["text"], choice["finish_reason"]) == ("", "stop")
            assert response.json()["usage"]["completion_tokens"] == 0
        _served_next(http)
    assert wait_until(lambda: service.live_sequences == 0)


@pytest.mark.parametrize(("path", "field", "value"), [
    ("/v1/completions", "stream", "yes"),
    ("/v1/completions", "max_tokens", "4"),
    ("/v1/completions", "n", "2"),
    ("/v1/completions", "temperature", "0.5"),
    ("/v1/completions", "seed", "1"),
    ("/v1/completions", "logprobs", "1"),
    ("/v1/completions", "suffix_memory", "false"),
    ("/v1/completions", "speculation", {"chain": ["ngram", MODEL], "draft_lengths": ["3"]}),
    (CHAT, "logprobs", 1),
    (CHAT, "max_completion_tokens", 4.0),
    (CHAT, "parallel_tool_calls", "false"),
])
def test_types_are_strict_as_openais(path, field, value):
    service, _ = build_service()
    body = {"model": MODEL, "max_tokens": 3, field: value}
    body.update({"prompt": "abc"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "x"}]})
    with running_server(service) as (url, _), httpx.Client(base_url=url, timeout=30) as http:
        error = _error(http.post(path, json=body), 400)
        assert error["param"] == field, error


def test_max_tokens_beyond_the_context_is_a_400_and_the_default_is_clamped_to_the_room():
    service, _ = build_service()
    prompt = "ab" * 250  # 500 tokens (one per character): 12 left of the 512
    with running_server(service, max_tokens=256) as (url, _), httpx.Client(base_url=url, timeout=30) as http:
        for asked in (10**12, 2**64, N_CTX - 500 + 1):
            error = _error(http.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": asked}),
                           400)
            assert (error["param"], error["code"]) == ("max_tokens", "context_length_exceeded")
            assert f"max_tokens asks for {asked:,}" in error["message"]
        exact = http.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": N_CTX - 500,
                                                   "speculation": "off"})
        default = http.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "speculation": "off"})
    for r in (exact, default):
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] <= N_CTX - 500


@pytest.mark.parametrize("choice", [None, "none", "auto", "required", {"type": "function", "function": {"name": "f"}}])
def test_a_tool_schema_that_cannot_constrain_arguments_is_a_400_whatever_tool_choice_says(choice):
    service, _ = build_service()
    bad = {**TOOL, "function": {**TOOL["function"], "parameters": {"type": "object", "properties": {
        "a": {"type": "nonsense"}}}}}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": [bad], "max_tokens": 3}
    if choice is not None:
        body["tool_choice"] = choice
    with running_server(service) as (url, _), httpx.Client(base_url=url, timeout=30) as http:
        error = _error(http.post(CHAT, json=body), 400)
    assert (error["param"], error["code"]) == ("tools", "invalid_grammar")
    assert error["message"].startswith("a tool's parameters cannot constrain its arguments")


def _closed_by_server(sock: socket.socket, timeout: float = 10.0) -> bytes | None:
    """What the server sent before closing the socket, or None if it is still open after `timeout`."""
    sock.settimeout(timeout)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return received


def test_slow_clients_are_closed_after_their_read_timeouts_while_a_normal_request_is_served():
    service, _ = build_service()
    with running_server(service, header_timeout=0.5, body_timeout=0.5) as (url, _):
        host, port = url.removeprefix("http://").split(":")
        sockets = []
        for i in range(30):
            s = socket.create_connection((host, int(port)))
            if i % 3 == 0:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n")  # headers never finish
            elif i % 3 == 1:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                          b"content-length: 100\r\n\r\n{\"model\": ")  # the body never finishes
            sockets.append(s)  # i % 3 == 2: connected, nothing sent
        ok = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "abc", "max_tokens": 3}, timeout=30)
        assert ok.status_code == 200
        answers = [_closed_by_server(s) for s in sockets]
        for s in sockets:
            s.close()
    assert all(a is not None for a in answers), "a slow client was still connected"
    assert all(a.startswith(b"HTTP/1.1 408 ") for a in answers)


def test_a_connection_beyond_the_bound_gets_a_503_and_is_closed():
    service, _ = build_service()
    with running_server(service, max_connections=3) as (url, server):
        host, port = url.removeprefix("http://").split(":")
        held = [socket.create_connection((host, int(port))) for _ in range(3)]
        assert wait_until(lambda: len(server.server_state.connections) == 3)
        extra = socket.create_connection((host, int(port)))
        answer = _closed_by_server(extra)
        assert answer is not None and answer.startswith(b"HTTP/1.1 503 ")
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "too_many_connections"
        for s in [*held, extra]:
            s.close()
        assert wait_until(lambda: not server.server_state.connections)
        ok = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "abc", "max_tokens": 3}, timeout=30)
        assert ok.status_code == 200

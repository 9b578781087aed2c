"""Nothing a request sends is silently ignored (openai-complete, item 1): a field of OpenAI's
API that the server does not implement yet is accepted at its neutral value only, any other
value is a 400 naming it (unsupported_parameter), and so is a field nobody defines; the
official client's usual calls still work, and top_k -1 means off."""

import httpx
import openai
import pytest

from ..server_synth import MODEL, build_service, reference_text, running_server

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "abc"}], "max_tokens": 4, "temperature": 0}
COMPLETION = {"model": MODEL, "prompt": "abc", "max_tokens": 4, "temperature": 0}


@pytest.fixture(scope="module")
def url():
    with running_server(build_service()[0]) as (base, _):
        yield base


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {"name": "f", "strict": True}}]},
     "tools"),  # strict under tool_choice auto (required and named hold it: test_structured_api.py)
    ("/v1/chat/completions", {**CHAT, "store": True}, "store"),
    ("/v1/chat/completions", {**CHAT, "audio": {"voice": "alloy"}}, "audio"),
    ("/v1/chat/completions", {**CHAT, "reasoning_effort": "low"}, "reasoning_effort"),
    ("/v1/chat/completions", {**CHAT, "typical_p": 0.9}, "typical_p"),  # nobody's field here
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "abc", "weight": 2}]}, "messages"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "assistant", "content": "a", "refusal": "no"}]},
     "messages"),
    ("/v1/completions", {**COMPLETION, "echo": True}, "echo"),
    ("/v1/completions", {**COMPLETION, "best_of": 2}, "best_of"),
    ("/v1/completions", {**COMPLETION, "suffix": "xyz"}, "suffix"),
    ("/v1/completions", {**COMPLETION, "mirostat": 2}, "mirostat"),
])
def test_a_field_the_server_does_not_implement_is_a_400_naming_it(url, path, body, field):
    r = httpx.post(url + path, json=body)
    error = r.json()["error"]
    assert r.status_code == 400 and (error["param"], error["code"]) == (field, "unsupported_parameter"), r.text
    assert error["type"] == "invalid_request_error"


def test_neutral_values_and_fields_that_change_no_output_are_accepted(url):
    neutral = {"n": 1, "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}, "user": "u1",
               "metadata": {"k": "v"}, "prompt_cache_key": "p", "safety_identifier": "s"}
    expected = reference_text(messages=CHAT["messages"], max_tokens=4)
    chat = {**CHAT, **neutral, "logprobs": False, "top_logprobs": 0, "response_format": {"type": "text"},
            "tools": [], "tool_choice": "none", "parallel_tool_calls": True, "store": False, "service_tier": "auto",
            "modalities": ["text"], "audio": None}
    r = httpx.post(url + "/v1/chat/completions", json=chat)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == expected
    # What clients echo back: a participant's name (ChatML ignores it), an assistant's refusal: null.
    echoed = [{"role": "user", "content": "abc", "name": "bob"}, {"role": "assistant", "content": "d", "refusal": None},
              {"role": "user", "content": "abc"}]
    assert httpx.post(url + "/v1/chat/completions", json={**CHAT, "messages": echoed}).status_code == 200
    r = httpx.post(url + "/v1/completions", json={**COMPLETION, **neutral, "echo": False, "best_of": 1,
                                                  "logprobs": None, "suffix": ""})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == reference_text("abc", 4)


def test_the_official_client_gets_a_bad_request_error_for_an_unsupported_field(url):
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="unsupported_parameter|not supported"):
        client.chat.completions.create(**CHAT, reasoning_effort="low")
    answer = client.chat.completions.create(**CHAT, n=1, presence_penalty=0)  # what many clients send
    assert answer.choices[0].message.content == reference_text(messages=CHAT["messages"], max_tokens=4)


def test_top_k_minus_one_is_off(url):
    # One chain for both (a seed fixes the draws of one chain; auto's choice depends on what
    # the router learnt from the requests before).
    body = {**COMPLETION, "temperature": 0.9, "seed": 7, "max_tokens": 12, "speculation": "off"}
    off = httpx.post(url + "/v1/completions", json={**body, "top_k": 0}).json()["choices"][0]["text"]
    minus_one = httpx.post(url + "/v1/completions", json={**body, "top_k": -1})
    assert minus_one.status_code == 200 and minus_one.json()["choices"][0]["text"] == off
    assert httpx.post(url + "/v1/completions", json={**body, "top_k": -2}).status_code == 400


def test_the_served_document_lists_the_values_an_unimplemented_field_accepts(url):
    schemas = httpx.get(url + "/openapi.json").json()["components"]["schemas"]
    completion, chat = schemas["CompletionRequest"]["properties"], schemas["ChatCompletionRequest"]["properties"]
    assert [completion[f]["enum"] for f in ("echo", "best_of", "suffix")] == [[False, None], [1, None], ["", None]]
    assert chat["function_call"]["enum"] == ["none", "auto", None] and chat["modalities"]["enum"] == [["text"], None]
    assert chat["audio"]["enum"] == [None] and schemas["ChatMessage"]["properties"]["refusal"]["enum"] == [None]


def test_the_served_document_lists_the_400_an_invalid_body_gets_and_no_422():
    from specrouter.server.app import create_app
    from specrouter.server.config import ServeConfig

    from ..server_synth import MODELS, build_service

    doc = create_app(build_service(routed=False)[0], ServeConfig(models=MODELS)).openapi()
    for path in ("/v1/completions", "/v1/chat/completions"):
        responses = doc["paths"][path]["post"]["responses"]
        assert "400" in responses and "422" not in responses
    assert "HTTPValidationError" not in doc["components"]["schemas"]

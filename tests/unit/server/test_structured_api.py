"""Structured output over HTTP (openai-complete, item 4), through the official client: a
response_format json_schema answer parses, validates against its schema (jsonschema) and, greedy,
equals the constrained target alone's under every speculation setting, whole and streamed;
json_object, the regex and grammar extensions; sampled choices valid; tool_choice required and
a named function answered with calls whose arguments validate against their tool's parameters
(strict); what cannot be compiled, or two constraints at once, a 400 naming the field.

The models are byte-level synthetic ones (a token per byte, 0 the end), so JSON can be written;
a logit_bias of -100 on whitespace keeps their random rows from wandering in the blanks JSON
allows between tokens (the bias is applied before the grammar's mask, at every level)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

import httpx
import jsonschema
import openai
import pytest

from specrouter.backends.synthetic import SyntheticBackend
from specrouter.cascade.chain import Chain
from specrouter.cascade.grammar import Grammar
from specrouter.cascade.sampling import SamplingParams
from specrouter.chat import chat_prompt_tokens
from specrouter.engine import generate
from specrouter.engine.batch import BatchScheduler, Speculation
from specrouter.engine.planning import pool_planner
from specrouter.server.service import Service

from ..router_synth import linear, make_router
from ..server_synth import SynthPool, running_server
from .test_tools import QWEN_TOOLS_TEMPLATE

MODEL = "target"
SCHEMA = {"type": "object",
          "properties": {"color": {"enum": ["red", "green", "blue"]},
                         "n": {"type": "integer", "minimum": 0, "maximum": 99},
                         "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3}},
          "required": ["color", "n", "tags"], "additionalProperties": False}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "item", "schema": SCHEMA, "strict": True}}
#: No whitespace: -100 on space, tab, newline and carriage return (token = byte).
NO_BLANKS = {str(b): -100 for b in b" \t\n\r"}
MESSAGES = [{"role": "user", "content": "An item as JSON, please."}]


class Bytes(SyntheticBackend):
    """A token per byte; token 0 is the end of generation."""

    def __init__(self, name: str, **kw) -> None:
        super().__init__(name, vocab=256, eos_id=0, n_ctx=1024, **kw)

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return list(text.encode())

    def _piece(self, token: int) -> bytes:
        return bytes([token]) if token else b""


def models() -> list[Bytes]:
    return [Bytes("small", model_seed=3, noise=1.0, params_b=0.1, latency=linear(0.0003, 0.00005)),
            Bytes("mid", model_seed=2, noise=0.5, params_b=1.0, latency=linear(0.0012, 0.0002)),
            Bytes(MODEL, params_b=7.0, latency=linear(0.005, 0.0004), chat_template=QWEN_TOOLS_TEMPLATE)]


@pytest.fixture(scope="module")
def url():
    small, mid, target = ms = models()
    plan = pool_planner(SynthPool(ms), MODEL, make_router(target, [small, mid]), Speculation())
    service = Service(BatchScheduler(plan, 4), target, ["ngram", "small", "mid", MODEL], 16, None)
    with running_server(service, models=["small", "mid", MODEL]) as (base, _):
        yield base


@pytest.fixture
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)


def constrained_alone(grammar: Grammar, prompt: Sequence[int], max_tokens: int = 120, **kw) -> str:
    """The constrained target alone, greedy, on fresh models."""
    target = models()[2]
    bias = tuple(sorted((int(k), float(v)) for k, v in NO_BLANKS.items()))
    r = generate(Chain([target], []), prompt, SamplingParams(grammar=grammar, logit_bias=bias, **kw), max_tokens)
    return r.text


def chat_prompt() -> list[int]:
    return chat_prompt_tokens(models()[2], MESSAGES)


SPECULATIONS = ["off", "auto", {"chain": ["ngram", MODEL], "draft_lengths": [6]},
                {"chain": ["small", "mid", MODEL], "draft_lengths": [2, 3]}]


@pytest.mark.parametrize("speculation", SPECULATIONS, ids=["off", "auto", "ngram", "3-level"])
def test_a_json_schema_answer_validates_and_equals_the_constrained_target_alone(client, speculation):
    expected = constrained_alone(Grammar.json_schema(SCHEMA), chat_prompt())
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, response_format=JSON_SCHEMA, temperature=0,
                                       max_tokens=120, logit_bias=NO_BLANKS, extra_body={"speculation": speculation})
    text = r.choices[0].message.content
    jsonschema.validate(json.loads(text), SCHEMA)
    assert text == expected and r.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(model=MODEL, messages=MESSAGES, response_format=JSON_SCHEMA,
                                              temperature=0, max_tokens=120, logit_bias=NO_BLANKS, stream=True,
                                              extra_body={"speculation": speculation})
    chunks = list(streamed)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


def test_without_the_schema_the_same_request_writes_no_json(client):
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=40,
                                       logit_bias=NO_BLANKS)
    with pytest.raises(json.JSONDecodeError):
        json.loads(r.choices[0].message.content)


def test_sampled_choices_all_validate(client):
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, response_format=JSON_SCHEMA, temperature=1.0,
                                       seed=11, n=4, max_tokens=200, logit_bias=NO_BLANKS)
    texts = [c.message.content for c in r.choices]
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMA)
    assert len(set(texts)) > 1  # they are samples, not one answer four times


def test_json_object_gives_an_object(client):
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, response_format={"type": "json_object"},
                                       temperature=0, max_tokens=200, logit_bias={**NO_BLANKS, "34": -5})
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_a_regex_and_a_gbnf_grammar_on_completions(client):
    pattern = r"[a-z]{3,8}@[a-z]{2,5}\.(com|org)"
    r = client.completions.create(model=MODEL, prompt="mail: ", temperature=0, max_tokens=40,
                                  extra_body={"regex": pattern, "speculation": {"chain": ["ngram", "mid", MODEL]}})
    assert re.fullmatch(pattern, r.choices[0].text) and r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == constrained_alone(Grammar("regex", pattern), list(b"mail: "), 40)
    gbnf = 'root ::= answer "." \nanswer ::= "yes" | "no" | "maybe"'
    r = client.completions.create(model=MODEL, prompt="well? ", temperature=0, max_tokens=40,
                                  extra_body={"grammar": gbnf})
    assert r.choices[0].text in ("yes.", "no.", "maybe.")


def test_text_response_format_is_free_text(client):
    free = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=20)
    text = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=20,
                                          response_format={"type": "text"})
    assert text.choices[0].message.content == free.choices[0].message.content


WEATHER = {"type": "object", "properties": {"city": {"enum": ["Oslo", "Paris", "Lima"]},
                                           "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER, "strict": True}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
             "additionalProperties": False}}}]
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.mark.parametrize("speculation", ["off", "auto", {"chain": ["ngram", "small", MODEL]}], ids=str)
@pytest.mark.parametrize("stream", [False, True])
def test_tool_choice_required_answers_with_calls_whose_arguments_follow_their_schemas(client, speculation, stream):
    kw = dict(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=300,
              logit_bias=NO_BLANKS, parallel_tool_calls=False, extra_body={"speculation": speculation})
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **kw))
        calls = [c for chunk in chunks if chunk.choices for c in chunk.choices[0].delta.tool_calls or ()]
        finish = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1]
    else:
        r = client.chat.completions.create(**kw)
        calls, finish = r.choices[0].message.tool_calls, r.choices[0].finish_reason
        assert not r.choices[0].message.content
    assert finish == "tool_calls" and len(calls) == 1
    jsonschema.validate(json.loads(calls[0].function.arguments), PARAMETERS[calls[0].function.name])


def test_a_named_tool_choice_calls_that_function_and_sampled_calls_validate(client):
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, temperature=1.0, seed=5, n=3,
                                       tool_choice={"type": "function", "function": {"name": "get_time"}},
                                       max_tokens=300, logit_bias=NO_BLANKS)
    for choice in r.choices:
        assert choice.finish_reason == "tool_calls"
        for call in choice.message.tool_calls:
            assert call.function.name == "get_time"
            jsonschema.validate(json.loads(call.function.arguments), PARAMETERS["get_time"])


@pytest.mark.parametrize(("path", "extra", "param", "code", "message"), [
    ("/v1/chat/completions",
     {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format", "invalid_grammar", "Invalid type: nonsense"),
    ("/v1/chat/completions", {"response_format": {"type": "xml"}}, "response_format", None, "xml"),
    ("/v1/completions", {"regex": "(ab"}, "regex", "invalid_grammar", "regex grammar"),
    ("/v1/completions", {"grammar": "root ::= missing"}, "grammar", "invalid_grammar", "gbnf grammar"),
    ("/v1/chat/completions", {"response_format": {"type": "json_object"}, "regex": "a+"}, None, "invalid_value",
     "at most one of response_format (json), regex and grammar"),
])
def test_what_cannot_constrain_the_output_is_a_400_naming_the_field(url, path, extra, param, code, message):
    body = {"model": MODEL, "max_tokens": 4, **extra}
    body.update({"messages": MESSAGES} if path.endswith("chat/completions") else {"prompt": "x"})
    r = httpx.post(url + path, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and message in error["message"]
    assert error["param"] == param
    if code is not None:
        assert error["code"] == code

"""Tools over HTTP (openai-complete, item 6): the tools rendered through the model's chat
template, the answer's calls returned as tool_calls (whole and streamed, through the official
client), a tool round trip accepted, and what cannot be honoured a 400 naming the field.

The target is scripted: a byte-level synthetic model whose greedy answer to any chat prompt
is SCRIPT (its logits put all mass on the script's next byte), so the parsing path runs on a
known text under speculation (the n-gram level drafts for it)."""

from __future__ import annotations

import json
from collections.abc import Sequence

import httpx
import numpy as np
import openai
import pytest

from specrouter.backends.synthetic import SyntheticBackend
from specrouter.engine.batch import BatchScheduler, Speculation
from specrouter.engine.planning import pool_planner
from specrouter.server.service import Service

from ..server_synth import SynthPool, running_server
from .test_tools import QWEN_TOOLS_TEMPLATE

MODEL = "scripted"
EOS = 0
SCRIPT = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
ANSWER_START = b"<|im_start|>assistant\n"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
MESSAGES = [{"role": "user", "content": "Weather in Oslo?"}]


class Scripted(SyntheticBackend):
    """Bytes as tokens (id 0: EOS); after the last ANSWER_START in its context, writes SCRIPT."""

    def __init__(self, template: str | None) -> None:
        super().__init__(MODEL, vocab=256, eos_id=EOS, params_b=1.0, chat_template=template)

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return list(text.encode())

    def _piece(self, token: int) -> bytes:
        return bytes([token]) if token else b""

    def logits_for(self, context: Sequence[int]) -> np.ndarray:
        written = bytes(context)
        start = written.rfind(ANSWER_START)
        k = len(written) - start - len(ANSWER_START) if start >= 0 else 0
        script = SCRIPT.encode()
        row = np.zeros(self.n_vocab)
        row[script[k] if k < len(script) else EOS] = 20.0
        return row


def service_of(template: str | None) -> Service:
    target = Scripted(template)
    plan = pool_planner(SynthPool([target]), MODEL, None, Speculation.fixed(["ngram", MODEL], [4]))
    return Service(BatchScheduler(plan, 2), target, ["ngram", MODEL], 8, None)


@pytest.fixture(scope="module")
def url():
    with running_server(service_of(QWEN_TOOLS_TEMPLATE), models=[MODEL]) as (base, _):
        yield base


def test_a_call_comes_back_as_tool_calls(url):
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, temperature=0, max_tokens=200)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me check."
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo"} and call.id.startswith("call_")


def test_a_streamed_call_comes_in_one_delta_after_the_text(url):
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, temperature=0,
                                                 max_tokens=200, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    calls = [tc for c in chunks for tc in c.choices[0].delta.tool_calls or ()]
    assert text.strip() == "Let me check." and "<tool_call>" not in text
    assert [(tc.index, tc.function.name, json.loads(tc.function.arguments)) for tc in calls] == \
        [(0, "get_weather", {"city": "Oslo"})]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_the_tools_are_in_the_prompt_and_tool_choice_none_leaves_them_out(url):
    body = {"model": MODEL, "messages": MESSAGES, "temperature": 0, "max_tokens": 200}
    with_tools = httpx.post(url + "/v1/chat/completions", json={**body, "tools": TOOLS}).json()
    without = httpx.post(url + "/v1/chat/completions", json={**body, "tools": TOOLS, "tool_choice": "none"}).json()
    tools_text = json.dumps(TOOLS[0], ensure_ascii=False)
    assert with_tools["usage"]["prompt_tokens"] - without["usage"]["prompt_tokens"] > len(tools_text.encode())
    assert without["choices"][0]["message"] == {"role": "assistant", "content": SCRIPT, "tool_calls": None}
    assert without["choices"][0]["finish_reason"] == "stop"


def test_a_round_trip_with_the_tools_answer_is_accepted(url):
    messages = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"celsius": 4}'}]
    r = httpx.post(url + "/v1/chat/completions", json={"model": MODEL, "messages": messages, "tools": TOOLS,
                                                       "temperature": 0, "max_tokens": 200})
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize(("extra", "param"), [
    ({"tool_choice": "required"}, "tool_choice"),  # without tools
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}],
      "tool_choice": "required"}, "tools"),
    ({"tools": TOOLS * 2}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "get_weather", "strict": True}}]}, "tools"),  # under auto
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages"),  # no tool_call_id
    ({"messages": [{"role": "assistant", "content": None}]}, "messages"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]}, "messages"),
])
def test_what_cannot_be_honoured_is_a_400_naming_the_field(url, extra, param):
    r = httpx.post(url + "/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, "max_tokens": 4, **extra})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_a_template_without_tools_is_a_400():
    with running_server(service_of(None), models=[MODEL]) as (base, _):
        r = httpx.post(base + "/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, "tools": TOOLS})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tools"
        assert "does not support tools" in r.json()["error"]["message"]

"""Tool calls parsed out of a model's text (server/tools.py), whole and streamed in every
split, and rendered into the prompt through a Qwen template (HF's Jinja settings)."""

from __future__ import annotations

import json

import pytest

from specrouter.backends.synthetic import SyntheticBackend
from specrouter.chat import render_chat, supports_tools
from specrouter.errors import ChatTemplateError
from specrouter.server.tools import ToolCallStream, parse_tool_calls

FUNCTIONS = ["get_weather", "add"]
TAGGED = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>'
TWO = ('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
       '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}\n</tool_call>')
FENCED = '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}\n```'
CASES = {
    "tagged, after text": (TAGGED, "Let me check.", [("get_weather", {"city": "Zürich"})]),
    "two calls, arguments as a string": (TWO, None, [("add", {"a": 1, "b": 2}), ("get_weather", {"city": "Oslo"})]),
    "fenced json (the 1.5B's habit)": (FENCED, None, [("get_weather", {"city": "Paris"})]),
    "a bare object as the whole answer": ('{"name": "add", "arguments": {"a": 3, "b": 4}}', None,
                                          [("add", {"a": 3, "b": 4})]),
    "unclosed at the end": ('<tool_call>\n{"name": "add", "arguments": {"a": 0, "b": 0}}', None,
                            [("add", {"a": 0, "b": 0})]),
    "an undeclared function stays text": ('<tool_call>{"name": "rm", "arguments": {}}</tool_call>',
                                          '<tool_call>{"name": "rm", "arguments": {}}</tool_call>', []),
    "code in a fence stays text": ("Use:\n```python\nprint({'name': 1})\n```\nDone.",
                                   "Use:\n```python\nprint({'name': 1})\n```\nDone.", []),
    "json without arguments stays text": ('```json\n{"name": "add"}\n```', '```json\n{"name": "add"}\n```', []),
    "broken json stays text": ('<tool_call>{"name": "add", "arguments": {</tool_call> ok',
                               '<tool_call>{"name": "add", "arguments": {</tool_call> ok', []),
    "plain text": ("a < b and c > d", "a < b and c > d", []),
}


def calls_of(answer):
    return [(c.name, json.loads(c.arguments)) for c in answer.calls]


@pytest.mark.parametrize(("text", "content", "calls"), CASES.values(), ids=CASES.keys())
def test_whole_answers(text, content, calls):
    answer = parse_tool_calls(text, FUNCTIONS)
    assert (answer.content, calls_of(answer)) == (content, calls)
    assert all(c.id.startswith("call_") for c in answer.calls) and len({c.id for c in answer.calls}) == len(calls)


@pytest.mark.parametrize(("text", "content", "calls"), CASES.values(), ids=CASES.keys())
def test_a_stream_in_any_split_gives_the_same_text_and_calls(text, content, calls):
    for size in (1, 2, 3, 7, len(text)):
        stream = ToolCallStream(FUNCTIONS)
        shown = "".join(stream.feed(text[i:i + size]) for i in range(0, len(text), size))
        answer = stream.finish()
        assert calls_of(answer) == calls
        full = shown + (answer.content or "")
        assert (full.strip() or None) == (content.strip() if content else None)
        if not calls:
            assert full == text  # nothing lost or reordered


def test_text_before_a_call_streams_before_the_call_is_complete():
    stream = ToolCallStream(FUNCTIONS)
    assert stream.feed("Let me check.\n<tool") == "Let me check.\n"
    assert stream.feed('_call>\n{"name": "add", "argu') == ""
    assert stream.feed('ments": {"a": 1, "b": 1}}\n</tool_call>') == "" and len(stream.calls) == 1


QWEN_TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>{%- for tool in tools %}\n{{- tool | tojson }}{%- endfor %}"
    "\n</tools><|im_end|>\n{%- endif %}"
    "{%- for message in messages %}{%- if message.role == 'assistant' and message.tool_calls %}"
    "<|im_start|>assistant{%- for tool_call in message.tool_calls %}{%- set tool_call = tool_call.function %}"
    "\n<tool_call>\n{\"name\": \"{{ tool_call.name }}\", \"arguments\": {{ tool_call.arguments | tojson }}}"
    "\n</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response>"
    "<|im_end|>\n{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endif %}"
    "{%- if loop.index0 > 50 %}{% break %}{% endif %}{%- endfor %}{{- '<|im_start|>assistant\\n' }}")


def test_tools_render_with_hf_json_and_loop_controls():
    model = SyntheticBackend("t", chat_template=QWEN_TOOLS_TEMPLATE)
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Wetter in <Stadt> & Land",
                                               "parameters": {"type": "object", "properties": {"city": {}}}}}]
    messages = [{"role": "user", "content": "Wie ist das Wetter?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather",
                                                                   "arguments": {"city": "Zürich"}}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "18 °C"}]
    text = render_chat(model, messages, tools)
    # Key order kept, no ASCII or HTML escaping (jinja's own tojson sorts keys and writes \\u00fc, \\u003c).
    assert json.dumps(tools[0], ensure_ascii=False) in text
    assert '{"name": "get_weather", "arguments": {"city": "Zürich"}}' in text
    assert "<tool_response>\n18 °C\n</tool_response>" in text
    assert supports_tools(model) and not supports_tools(SyntheticBackend("plain"))
    with pytest.raises(ChatTemplateError, match="does not support tools"):
        render_chat(SyntheticBackend("plain"), messages[:1], tools)

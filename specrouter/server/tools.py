"""Tool calls in the model's text, parsed back into OpenAI's tool_calls (the Qwen/Hermes format).

A Qwen chat template given `tools` asks the model to answer a call as
`<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call>`,
one block per call. Small models often write the same object in a fenced code block
(```json ... ```) or as the whole answer instead; llama.cpp's Hermes parser accepts those
openings too, and so does this one.

`parse_tool_calls` takes a whole answer apart: a block (tagged or fenced) whose JSON is an
object naming a declared function, with an object of arguments, is a call; everything else
is the message's content. A block that is not such a call stays in the content: the client
sees what the model wrote, never a call the model did not make.

`ToolCallStream` does the same for a stream: text is passed on as it comes, except a block
(from its opening, or a tail that may become one, to its close), which is held until it
closes and then passed on or taken as a call; an answer that opens with `{` is held whole.

`forced_calls` is the grammar for tool_choice `required` or a named function: the answer is
one tagged block (several with parallel calls) whose object names an offered function and
whose arguments follow that function's parameters schema (so `strict` holds). The object is
written as the template shows it, `{"name": ..., "arguments": {...}}` (", " and ": ", no
other whitespace): then everything up to the arguments' first value is forced, and a
model-free drafter proposes it in one block (drafters/lookup.py).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from specrouter.cascade.grammar import Grammar

#: How a forced call's JSON is written (llguidance's JSON options): the template's separators.
CALL_JSON = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}
#: Block openings and their closes: Hermes tags, then a fenced block (```json or ```).
_CLOSES = {"<tool_call>": "</tool_call>", "```": "```"}
_FENCE_LANGUAGE = re.compile(r"(?:json)?[ \t]*\n")


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, as OpenAI sends it


@dataclass
class ParsedAnswer:
    content: str | None  # None: nothing but calls
    calls: list[ToolCall] = field(default_factory=list)


def parse_tool_calls(text: str, functions: Collection[str]) -> ParsedAnswer:
    """The answer's content and calls (see the module docstring)."""
    stream = ToolCallStream(functions)
    shown = stream.feed(text)
    answer = stream.finish()
    content = (shown + (answer.content or "")).strip() if answer.calls else text
    return ParsedAnswer(content or None, answer.calls)


def _call(body: str, functions: Collection[str]) -> ToolCall | None:
    """A call from a block's body: a JSON object naming a declared function, with arguments
    as an object (or a string holding one, as some models write them)."""
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or data.get("name") not in functions or "arguments" not in data:
        return None
    arguments = data["arguments"]
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(f"call_{uuid.uuid4().hex[:24]}", data["name"], json.dumps(arguments, ensure_ascii=False))


class ToolCallStream:
    """A stream's text with tool calls taken out: `feed` returns the text that may be shown
    now, `finish` (at the end) the text held back that is content, and the calls."""

    def __init__(self, functions: Collection[str]) -> None:
        self.functions = functions
        self.calls: list[ToolCall] = []
        self._held = ""  # text not shown yet: a block in progress, or a tail that may open one
        self._started = False  # some text other than whitespace was seen
        self._whole = False  # the answer opened with "{": held whole

    def feed(self, text: str) -> str:
        self._held += text
        if not self._started and self._held.strip():
            self._started = True
            self._whole = self._held.lstrip().startswith("{")
        if self._whole:
            return ""
        shown = []
        while True:
            opening, at = _first_opening(self._held)
            if opening is None:
                hold = _partial_opening(self._held)
                shown.append(self._held[: len(self._held) - hold])
                self._held = self._held[len(self._held) - hold:]
                return "".join(shown)
            shown.append(self._held[:at])
            self._held = self._held[at:]
            end = _block_end(self._held, opening)
            if end is None:
                return "".join(shown)  # the block is still open: hold it
            block, self._held = self._held[:end], self._held[end:]
            call = _call(_block_body(block, opening), self.functions)
            if call is None:
                shown.append(block)
            else:
                self.calls.append(call)

    def finish(self) -> ParsedAnswer:
        held, self._held = self._held, ""
        if self._whole:
            call = _call(held, self.functions)
            return ParsedAnswer(None, [call]) if call is not None else ParsedAnswer(held or None)
        opening, at = _first_opening(held)
        if opening is not None and at == 0:  # a block left open (the answer ended inside it)
            call = _call(_block_body(held, opening), self.functions)
            if call is not None:
                self.calls.append(call)
                held = ""
        return ParsedAnswer(held or None, list(self.calls))


def _first_opening(text: str) -> tuple[str | None, int]:
    found = [(text.find(o), o) for o in _CLOSES if o in text]
    if not found:
        return None, -1
    at, opening = min(found)
    return opening, at


def _partial_opening(text: str) -> int:
    """The length of the longest tail of text that some opening starts with."""
    return max((n for o in _CLOSES for n in range(min(len(o) - 1, len(text)), 0, -1) if text.endswith(o[:n])),
               default=0)


def _block_end(text: str, opening: str) -> int | None:
    """Where a block that starts text ends (after its close), or None while it is open."""
    close = text.find(_CLOSES[opening], len(opening))
    return None if close < 0 else close + len(_CLOSES[opening])


def _block_body(block: str, opening: str) -> str:
    """A block's JSON text: between the opening (and a fence's language line) and the close."""
    body = block[len(opening):]
    if body.endswith(_CLOSES[opening]):
        body = body[: -len(_CLOSES[opening])]
    if opening == "```":
        language = _FENCE_LANGUAGE.match(body)
        if language is None:
            return ""  # a fence of another language (```python): no call
        body = body[language.end():]
    return body


def forced_calls(tools: Sequence[dict], names: Collection[str], parallel: bool) -> Grammar:
    """The answer as calls only (see the module docstring): tools as the request gave them
    (OpenAI's shape), names the functions allowed; parallel: one or more blocks, else one."""
    objects = [{"type": "object",
                "properties": {"name": {"const": f["name"]}, "arguments": f.get("parameters") or {"type": "object"}},
                "required": ["name", "arguments"], "additionalProperties": False}
               for f in (t["function"] for t in tools) if f["name"] in names]
    calls = 'start: call ("\\n" call)*' if parallel else "start: call"
    return Grammar("lark", f'{calls}\ncall: "<tool_call>\\n" body "\\n</tool_call>"\n'
                           f"body: %json {json.dumps({'x-guidance': CALL_JSON, 'anyOf': objects})}")

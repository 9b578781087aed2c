"""The client's text in a chat template's inputs, masked by sentinels, and found again in the
rendered prompt.

`mask` walks the inputs of a chat template (messages, tools, variables) and replaces every
string a client supplies by a sentinel: contents, names, ids, a tool's name, description and
parameter schema, a call's name and arguments (dict keys and string values, at any depth),
the string values of variables. Kept as they are: the keys of the records the template
reads (a message, a tool, a call, a function), the names of variables, and the values that
select template logic and are fixed by validation (a record's `role` and `type`). An empty
string stays empty, so a template's truthiness tests see what they would see.

A sentinel is `M`, the string's index, `\\x01`, more `\\x01` up to the string's length where
the string is long enough (a template that checks a length sees the same), and `M`; `M` is a
private-use character that neither the template nor any input string contains. `tojson`
writes `\\x01` as `\\u0001`, so a rendering tells how each occurrence was written: raw
(`{{ x }}`) or inside a JSON string (`{{ x | tojson }}`). A rendering of the masked inputs
holds no client text at all: what lies outside its sentinels is the template's own text,
whatever the template does with the strings it was given.

`Masked.align` lines the masked rendering up with the rendering of the real inputs: each
sentinel stands for its string raw, stripped (Jinja's `trim`) or JSON-escaped as `tojson`
writes it. Where that reproduces the real rendering exactly, it is cut into the template's
text and the client's spans; where it does not (a template that rewrites, slices or
branches on a client string), there is no alignment and the caller must not guess.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from specrouter.errors import ChatTemplateError

#: Values of a template record that select template logic and are fixed by validation.
_FIXED = frozenset({"role", "type"})
#: Private-use code points (U+E000..U+F8FF): the sentinels' delimiter is one of them.
_PRIVATE = re.compile("[\ue000-\uf8ff]")
_PAD = "\x01"


@dataclass(frozen=True)
class Span:
    """A run of the rendered prompt: the template's own text, or a client's string."""

    text: str
    client: bool


@dataclass(frozen=True)
class Masked:
    """Template inputs with every client string replaced by its sentinel (see the module)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    variables: dict[str, Any] | None
    #: The client strings; a sentinel's index points here.
    texts: tuple[str, ...]
    #: Finds a sentinel: group 1 its index, group 2 its padding (raw `\x01`s or `\u0001`s).
    sentinel: re.Pattern[str]

    def template_text(self, rendering: str) -> list[str]:
        """The text of a masked rendering between its sentinels: the template's own text."""
        return self.sentinel.split(rendering)[::3]

    def align(self, rendering: str, real: str) -> list[Span] | None:
        """`real` (the rendering of the real inputs) cut into the template's text and the
        client's spans, as the masked `rendering` places them; None where no choice of each
        sentinel's forms (see the module) reproduces `real`. Each sentinel takes the first
        form after which `real` goes on with the template's next text: linear, no search."""
        parts = self.sentinel.split(rendering)
        spans: list[Span] = []
        pos = 0
        for k in range(0, len(parts), 3):
            piece = parts[k]
            if not real.startswith(piece, pos):
                return None
            spans.append(Span(piece, client=False))
            pos += len(piece)
            if k + 1 == len(parts):
                break
            after = parts[k + 3]
            form = next((f for f in self._forms(int(parts[k + 1]), parts[k + 2].startswith(_PAD))
                         if real.startswith(f, pos) and real.startswith(after, pos + len(f))), None)
            if form is None:
                return None
            spans.append(Span(form, client=True))
            pos += len(form)
        return spans if pos == len(real) else None

    def _forms(self, index: int, raw: bool) -> list[str]:
        """How the template may have written string `index`: raw or stripped (`trim`), or
        JSON-escaped without its quotes (`tojson`)."""
        if index >= len(self.texts):
            return []
        text = self.texts[index]
        if not raw:
            return [json.dumps(text, ensure_ascii=False)[1:-1]]
        return [text] if text.strip() == text else [text, text.strip()]


def mask(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, variables: dict[str, Any] | None,
         reserved: tuple[str, ...]) -> Masked:
    """The inputs masked (see the module); `reserved`: the template and the other texts it
    may write (BOS, EOS), which the delimiter must not occur in either. ChatTemplateError
    where every private-use character occurs in them (nothing can delimit a sentinel)."""
    used = set()
    for text in (*reserved, *_strings([messages, tools, variables])):
        used.update(_PRIVATE.findall(text))
    mark = next((chr(c) for c in range(0xE000, 0xF900) if chr(c) not in used), None)
    if mark is None:
        raise ChatTemplateError("the request uses every private-use character (U+E000..U+F8FF): none is left "
                                "to mark its text apart from the chat template's")
    walk = _Walk(mark)
    return Masked(
        messages=[walk.record(m) for m in messages],
        tools=[walk.record(t) for t in tools] if tools else tools,
        variables={k: walk.free(v) for k, v in variables.items()} if variables else variables,
        texts=tuple(walk.texts),
        sentinel=re.compile(f"{mark}(\\d+)({_PAD}+|(?:\\\\u0001)+){mark}"),
    )


def _strings(value: Any) -> Iterator[str]:
    """Every string in value, dict keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


class _Walk:
    """Replaces client strings by sentinels, numbering them in the order met."""

    def __init__(self, mark: str) -> None:
        self.mark = mark
        self.texts: list[str] = []

    def text(self, text: str) -> str:
        if not text:
            return text
        head = f"{self.mark}{len(self.texts)}{_PAD}"
        self.texts.append(text)
        return head + _PAD * max(0, len(text) - len(head) - 1) + self.mark

    def free(self, value: Any) -> Any:
        """Client data: every string masked, dict keys too."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.free(k): self.free(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.free(v) for v in value]
        return value

    def record(self, record: dict[str, Any]) -> dict[str, Any]:
        """A record the template reads by key (a message, a tool, a call, a function): keys
        and fixed values kept, the rest masked."""
        out: dict[str, Any] = {}
        for key, value in record.items():
            if key in _FIXED and isinstance(value, str):
                out[key] = value
            elif key == "function" and isinstance(value, dict):
                out[key] = self.record(value)
            elif key == "tool_calls" and isinstance(value, list):
                out[key] = [self.record(c) if isinstance(c, dict) else self.free(c) for c in value]
            else:
                out[key] = self.free(value)
        return out

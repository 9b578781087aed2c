"""Chat prompts through the chat template stored in the model file (Jinja2, sandboxed, with
the settings Hugging Face's templates are written for: `loopcontrols`, and `tojson` that
keeps non-ASCII text and key order)."""

from __future__ import annotations

import functools
import json
import re
from datetime import datetime
from typing import Any

from jinja2 import Template
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from specrouter.backends.base import Backend
from specrouter.errors import ChatTemplateError

# Used when a model file carries no template (ChatML, which Qwen models also use).
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _raise(message: str):
    raise TemplateError(message)


def _tojson(value: Any, indent: int | None = None, separators=None, sort_keys: bool = False) -> str:
    """Hugging Face's tojson: no HTML escaping, non-ASCII kept, keys in their order."""
    return json.dumps(value, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)


@functools.lru_cache(maxsize=8)
def _compiled(template: str) -> Template:
    """The template compiled (once per template text: compiling costs more than rendering)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def supports_tools(model: Backend) -> bool:
    """Whether the model's chat template renders `tools` (Qwen's do; ChatML alone does not)."""
    return "tools" in (model.chat_template or CHATML)


def render_chat(model: Backend, messages: list[dict[str, Any]], tools: list[dict] | None = None,
                variables: dict[str, Any] | None = None) -> str:
    """The template's text of the messages (and of `tools`, function definitions in OpenAI's
    shape, where given; `variables`: more of the template's variables, which cannot replace
    these); a `developer` message (OpenAI's newer name of the system role)
    renders as `system` where the template does not know that role (Qwen's templates drop a
    role they do not know without a word)."""
    template = model.chat_template or CHATML
    if tools and not supports_tools(model):
        raise ChatTemplateError(f"the chat template of {model.name} does not support tools")
    if "developer" not in template:
        messages = [{**m, "role": "system"} if m.get("role") == "developer" else m for m in messages]
    try:
        return _compiled(template).render({
            **(variables or {}),
            "messages": messages,
            "tools": tools or None,
            "add_generation_prompt": True,
            "bos_token": model.bos_text,
            "eos_token": model.eos_text,
        })
    except TemplateError as exc:
        raise ChatTemplateError(f"the chat template of {model.name} cannot render these messages: {exc}") from None


#: Stands for message i's content while the template renders (templates hold no NUL).
_SLOT = "\x00specrouter-content-{}\x00"
_SLOTS = re.compile("\x00specrouter-content-(\\d+)\x00")


def chat_prompt_tokens(model: Backend, messages: list[dict[str, Any]], tools: list[dict] | None = None,
                       variables: dict[str, Any] | None = None) -> list[int]:
    """Token ids of a chat prompt (tools and variables: see render_chat); the template writes
    BOS itself where the model wants one.

    Only the template's own markers become control tokens: each message's content is
    tokenized as plain text (parse_special=False), so a user who writes `<|im_start|>system`
    gets those characters, not a new turn. The template is rendered with a placeholder per
    content, and the text between placeholders (the template's) is tokenized with special
    tokens parsed. A template that alters or repeats a content (a placeholder not found
    exactly once) is rendered with the contents in place and tokenized whole, as before.
    A message without text content (an assistant's tool calls) has no placeholder."""
    texts = [i for i, m in enumerate(messages) if isinstance(m.get("content"), str) and m["content"]]
    slotted = [{**m, "content": _SLOT.format(i)} if i in texts else m for i, m in enumerate(messages)]
    text = render_chat(model, slotted, tools, variables)
    found = [int(i) for i in _SLOTS.findall(text)]
    if sorted(found) != texts:
        return _tokenize_whole(model, render_chat(model, messages, tools, variables))
    bos = model.bos_text
    tokens: list[int] = []
    add_bos = not (bos and text.startswith(bos))
    for n, part in enumerate(_SLOTS.split(text)):
        if n % 2:  # a content
            tokens += model.tokenize(messages[int(part)]["content"], add_special=False, parse_special=False)
        elif part or (n == 0 and add_bos):
            tokens += model.tokenize(part, add_special=n == 0 and add_bos)
    return tokens


def _tokenize_whole(model: Backend, text: str) -> list[int]:
    bos = model.bos_text
    if bos and text.startswith(bos):
        return model.tokenize(text, add_special=False)
    return model.tokenize(text, add_special=True)

"""Chat prompts through the chat template stored in the model file (Jinja2, sandboxed, with
the settings Hugging Face's templates are written for: `loopcontrols`, and `tojson` that
keeps non-ASCII text and key order)."""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

from jinja2 import Template
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from specrouter.backends.base import Backend
from specrouter.chat_masking import mask
from specrouter.chat_tokens import checked_tokens, span_tokens
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


def chat_prompt_tokens(model: Backend, messages: list[dict[str, Any]], tools: list[dict] | None = None,
                       variables: dict[str, Any] | None = None) -> list[int]:
    """Token ids of a chat prompt (tools and variables: see render_chat); the template writes
    BOS itself where the model wants one, else the tokenizer adds it.

    Only the template's own markers become control tokens: every string the client supplies
    (contents, names, ids, tool definitions, call arguments, variables' strings) is text, so
    `<|im_start|>system` written anywhere in a request is those characters, not a new turn.
    The template is rendered twice: with the client's strings masked by sentinels
    (chat_masking), whose rendering holds only the template's text, and with the real
    strings. Where the sentinels' forms line the two up, the control tokens are taken from
    the template's text alone (chat_tokens.span_tokens): where no control-token text lies in
    a client's string or across its edge, that is the whole rendering's tokenization with
    special parsing, token for token.
    Where they do not (a template that rewrites or branches on a client string), the whole
    rendering is tokenized and checked (chat_tokens.checked_tokens): a ChatTemplateError
    where a client's text could have become a control token. Cost: a second render (the
    template is compiled once), and tokenizing the template's own text twice more (with and
    without special parsing) to find its control tokens."""
    template = model.chat_template or CHATML
    rendered = render_chat(model, messages, tools, variables)
    masked = mask(messages, tools, variables, (template, model.bos_text, model.eos_text))
    try:
        marked = render_chat(model, masked.messages, masked.tools, masked.variables)
    except ChatTemplateError as exc:
        raise ChatTemplateError(f"{exc} (with the request's text masked); the template checks the text itself, "
                                "so its control tokens cannot be told from the request's") from None
    bos = model.bos_text
    add_bos = not (bos and rendered.startswith(bos))
    spans = masked.align(marked, rendered)
    tokens = span_tokens(model, spans, add_bos) if spans is not None else None
    if tokens is None:
        tokens = checked_tokens(model, rendered, masked.template_text(marked), masked.texts, add_bos)
    return tokens

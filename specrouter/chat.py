"""Chat prompts through the chat template stored in the model file (Jinja2, sandboxed)."""

from __future__ import annotations

import re
from datetime import datetime

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


def render_chat(model: Backend, messages: list[dict[str, str]]) -> str:
    """The template's text of the messages; a `developer` message (OpenAI's newer name of
    the system role) renders as `system` where the template does not know that role (Qwen's
    templates drop a role they do not know without a word)."""
    template = model.chat_template or CHATML
    if "developer" not in template:
        messages = [{**m, "role": "system"} if m.get("role") == "developer" else m for m in messages]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template).render(
            messages=messages,
            add_generation_prompt=True,
            bos_token=model.bos_text,
            eos_token=model.eos_text,
        )
    except TemplateError as exc:
        raise ChatTemplateError(f"the chat template of {model.name} cannot render these messages: {exc}") from None


#: Stands for message i's content while the template renders (templates hold no NUL).
_SLOT = "\x00specrouter-content-{}\x00"
_SLOTS = re.compile("\x00specrouter-content-(\\d+)\x00")


def chat_prompt_tokens(model: Backend, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of a chat prompt; the template writes BOS itself where the model wants one.

    Only the template's own markers become control tokens: each message's content is
    tokenized as plain text (parse_special=False), so a user who writes `<|im_start|>system`
    gets those characters, not a new turn. The template is rendered with a placeholder per
    content, and the text between placeholders (the template's) is tokenized with special
    tokens parsed. A template that alters or repeats a content (a placeholder not found
    exactly once) is rendered with the contents in place and tokenized whole, as before."""
    slotted = [{**m, "content": _SLOT.format(i)} for i, m in enumerate(messages)]
    text = render_chat(model, slotted)
    found = [int(i) for i in _SLOTS.findall(text)]
    if sorted(found) != list(range(len(messages))):
        return _tokenize_whole(model, render_chat(model, messages))
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

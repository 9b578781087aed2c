"""Chat prompts through the chat template stored in the model file (Jinja2, sandboxed)."""

from __future__ import annotations

from datetime import datetime

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from specrouter.backends.base import Backend
from specrouter.errors import SpecRouterError

# Used when a model file carries no template (ChatML, which Qwen models also use).
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _raise(message: str):
    raise TemplateError(message)


def render_chat(model: Backend, messages: list[dict[str, str]]) -> str:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        template = env.from_string(model.chat_template or CHATML)
        return template.render(
            messages=messages,
            add_generation_prompt=True,
            bos_token=model.bos_text,
            eos_token=model.eos_text,
        )
    except TemplateError as exc:
        raise SpecRouterError(f"the chat template of {model.name} failed: {exc}") from None


def chat_prompt_tokens(model: Backend, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of a chat prompt; the template writes BOS itself where the model wants one."""
    text = render_chat(model, messages)
    bos = model.bos_text
    if bos and text.startswith(bos):
        return model.tokenize(text, add_special=False)
    return model.tokenize(text, add_special=True)

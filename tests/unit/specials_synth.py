"""A synthetic tokenizer with a control token, for the chat-prompt tests: `<|x|>` is token
255, which only special parsing yields (as a real control token: plain text never becomes
it, and its stored text is `<|x|>`); every other character is one synthetic token."""

from __future__ import annotations

from specrouter.backends.synthetic import SyntheticBackend

CONTROL, CONTROL_ID = "<|x|>", 255
#: A template with one control token before each turn and before the answer.
TURNS = "{% for m in messages %}<|x|>{{ m['role'] }}:{{ m['content'] }}{% endfor %}<|x|>assistant:"


class Specials(SyntheticBackend):
    """SyntheticBackend (vocab 256) with the control token above and a chat template (TURNS
    unless given)."""

    def __init__(self, name: str = "m", vocab: int = 256, chat_template: str = TURNS, **kwargs) -> None:
        super().__init__(name, vocab=vocab, chat_template=chat_template, **kwargs)

    def tokenize(self, text, add_special=True, parse_special=True):
        if not parse_special:  # the one character that lands on 255 lands next to it
            return [t if t != CONTROL_ID else CONTROL_ID - 1 for t in super().tokenize(text, add_special)]
        out = []
        for i, part in enumerate(text.split(CONTROL)):
            out += ([CONTROL_ID] if i else []) + self.tokenize(part, add_special, parse_special=False)
        return out

    def token_text(self, token: int) -> bytes:
        return CONTROL.encode() if token == CONTROL_ID else super().token_text(token)

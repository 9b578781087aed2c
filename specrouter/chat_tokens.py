"""Token ids of a rendered chat prompt whose control tokens come only from the template.

A control token is one that text never becomes unless special tokens are parsed (ChatML's
`<|im_start|>`): its stored text tokenizes to itself with special parsing and to something
else without. A token that plain text also becomes (Qwen's `<tool_call>`, which llama.cpp
and Hugging Face match in any text) is not one.

`span_tokens` tokenizes a prompt cut into the template's text and the client's spans
(chat_masking): the control tokens are found in the template's text alone; the text between
them, template and client text together, is tokenized with special parsing off; each
control token is emitted as its id. That is how llama.cpp and Hugging Face tokenize with
special parsing (split at the special tokens, then tokenize the fragments as text), so the
ids are the whole rendering's wherever no control-token text lies in a client's span or
across its edge; where one does, it stays text.

`checked_tokens` is for a rendering that could not be cut (a template that rewrites or
branches on a client string): the whole rendering tokenized with special parsing, accepted
only if no client string holds control-token text (raw or JSON-escaped) and the control
tokens are, as a multiset, the ones in the template's own text of the masked rendering.
The first check refuses what the template could have passed on; the second what it could
have built from harmless pieces (`replace`, a join). Either failure is a ChatTemplateError
(a 400): the prompt cannot be told apart from an injected one.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence

from specrouter.backends.base import Backend
from specrouter.chat_masking import Span
from specrouter.errors import ChatTemplateError


class _Controls:
    """Control tokens of one backend, found in texts; memoised for one prompt."""

    def __init__(self, model: Backend) -> None:
        self.model = model
        self._known: dict[int, str | None] = {}
        self._ids: dict[str, list[int]] = {}

    def text(self, token: int) -> str | None:
        """The token's text if it is a control token (see the module), else None."""
        if token not in self._known:
            text = self.model.token_text(token).decode("utf-8", errors="replace")
            tokenize = self.model.tokenize
            control = (tokenize(text, add_special=False, parse_special=True) == [token]
                       and tokenize(text, add_special=False, parse_special=False) != [token])
            self._known[token] = text if control else None
        return self._known[token]

    def ids(self, text: str) -> list[int]:
        """The control tokens that tokenizing text with special parsing yields, in order.
        A control token is never the plain tokenization's (that is what parse_special=False
        means), so only the ids missing from it are examined."""
        if text not in self._ids:
            if not text:
                self._ids[text] = []
            else:
                parsed = self.model.tokenize(text, add_special=False, parse_special=True)
                plain = set(self.model.tokenize(text, add_special=False, parse_special=False))
                self._ids[text] = [t for t in parsed if t not in plain and self.text(t) is not None]
        return self._ids[text]

    def split(self, text: str) -> list[str | int] | None:
        """text as fragments and control ids, cut where its control tokens' texts occur (the
        leftmost, longest first, as the tokenizers partition); None where that does not give
        the ids tokenizing finds."""
        ids = self.ids(text)
        if not ids:
            return [text]
        by_text = {self.text(t): t for t in ids}
        pattern = "|".join(re.escape(t) for t in sorted(by_text, key=len, reverse=True))
        out: list[str | int] = []
        pos = 0
        for match in re.finditer(pattern, text):
            out += [text[pos:match.start()], by_text[match.group()]]
            pos = match.end()
        out.append(text[pos:])
        return out if [p for p in out if isinstance(p, int)] == ids else None


def span_tokens(model: Backend, spans: Sequence[Span], add_bos: bool) -> list[int] | None:
    """Token ids of the spans (see the module); add_bos: the first fragment is tokenized
    with add_special (BOS where the model wants one). None where a control token's text
    cannot be located in the template's text (the caller falls back)."""
    controls = _Controls(model)
    fragments: list[list[str]] = [[]]  # fragment n comes before markers[n]
    markers: list[int] = []
    for span in spans:
        cut = [span.text] if span.client else controls.split(span.text)
        if cut is None:
            return None
        for part in cut:
            if isinstance(part, int):
                markers.append(part)
                fragments.append([])
            else:
                fragments[-1].append(part)
    tokens: list[int] = []
    for n, fragment in enumerate(fragments):
        text, first = "".join(fragment), n == 0 and add_bos
        if text or first:
            tokens += model.tokenize(text, add_special=first, parse_special=False)
        tokens += markers[n:n + 1]
    return tokens


def checked_tokens(model: Backend, rendering: str, template_text: Iterable[str], client: Sequence[str],
                   add_bos: bool) -> list[int]:
    """The whole rendering tokenized with special parsing, if the checks of the module hold;
    template_text: the masked rendering's text outside its sentinels; client: the client's
    strings. ChatTemplateError otherwise."""
    controls = _Controls(model)
    for text in client:
        for form in dict.fromkeys((text, json.dumps(text, ensure_ascii=False)[1:-1])):
            if controls.ids(form):
                raise ChatTemplateError(
                    f"the chat template of {model.name} rewrites the request's text, so the control-token text in "
                    f"{text[:80]!r} could not be kept as text; remove it")
    expected = Counter(t for text in template_text for t in controls.ids(text))
    found = Counter(controls.ids(rendering))
    if found != expected:
        raise ChatTemplateError(
            f"the chat template of {model.name} rewrites the request's text into control tokens: the prompt "
            f"holds {_listed(found)} where the template's own text holds {_listed(expected)}; the prompt is refused")
    return model.tokenize(rendering, add_special=add_bos)


def _listed(ids: Counter[int]) -> str:
    return ", ".join(f"{n} x {t}" for t, n in sorted(ids.items())) or "none"

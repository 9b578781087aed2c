"""The prompts of a comparison: from flags or a JSON Lines file, checked before any model
loads (PromptSpec), then tokenized by the target (Prompt).

A file holds one JSON object per line (blank lines skipped) with exactly one of "prompt"
(raw text to continue), "chat" (one user message) or "messages" (a chat in OpenAI's format:
objects with a string "role" and a string "content"), and optionally "id" (a string or an
integer; default: the line number), "max_tokens" (default: the command's) and "group"
(read and ignored: `specrouter simulate --record` files carry it). Any other key, or a line
that breaks these rules, is an InvalidParameterError naming the file and the line.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specrouter.backends.base import Backend
from specrouter.chat import chat_prompt_tokens
from specrouter.engine.checks import check_max_tokens, check_prompt_nonempty
from specrouter.errors import InvalidParameterError, SpecRouterError

#: The keys a line may hold; the first three name the prompt's kind (exactly one per line).
KINDS = ("prompt", "chat", "messages")
KEYS = (*KINDS, "id", "max_tokens", "group")


@dataclass(frozen=True)
class PromptSpec:
    """One prompt as given: raw text (`text`) or a chat (`messages`, OpenAI format), exactly
    one of them; `where` names it in error lines ("--prompt 1", "p.jsonl, line 3");
    max_tokens None: the command's."""

    id: str
    where: str
    text: str | None = None
    messages: tuple[dict[str, Any], ...] | None = None
    max_tokens: int | None = None

    def tokens(self, target: Backend) -> list[int]:
        """Token ids by the target's tokenizer (a chat through its chat template); an error
        of the template, or no tokens at all, is an InvalidParameterError naming `where`."""
        try:
            tokens = (target.tokenize(self.text) if self.text is not None
                      else chat_prompt_tokens(target, [dict(m) for m in self.messages or ()]))
            check_prompt_nonempty(tokens)
        except SpecRouterError as exc:
            raise InvalidParameterError(f"{self.where}: {exc}") from None
        return tokens


@dataclass(frozen=True)
class Prompt:
    """A prompt ready to run: its token ids and how many tokens each method may write."""

    id: str
    tokens: tuple[int, ...]
    max_tokens: int


def user_message(text: str) -> tuple[dict[str, Any], ...]:
    return ({"role": "user", "content": text},)


def from_flags(texts: Sequence[str], chats: Sequence[str]) -> list[PromptSpec]:
    """--prompt's values, then --chat's, each checked non-empty; ids "1", "2", ... in that order."""
    for value in (*texts, *chats):
        check_prompt_nonempty(value)
    specs = [PromptSpec(str(i), f"--prompt {i}", text=t) for i, t in enumerate(texts, 1)]
    return specs + [PromptSpec(str(len(specs) + i), f"--chat {i}", messages=user_message(c))
                    for i, c in enumerate(chats, 1)]


def read_file(file: Path) -> list[PromptSpec]:
    """Every prompt of a JSON Lines file (module docstring), each line checked; ids distinct."""
    try:
        lines = Path(file).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise InvalidParameterError(f"cannot read the prompts {file}: {reason}") from None
    specs: list[PromptSpec] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{file}, line {number}"
        spec = _spec(_object(line, where), number, where)
        if spec.id in seen:
            raise InvalidParameterError(f"{where}: id {spec.id!r} is also line {seen[spec.id]}'s")
        seen[spec.id] = number
        specs.append(spec)
    if not specs:
        raise InvalidParameterError(f"{file} holds no prompt")
    return specs


def _object(line: str, where: str) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except ValueError as exc:
        reason = f"{exc.msg} at column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise InvalidParameterError(f"{where}: not JSON ({reason})") from None
    if not isinstance(row, dict):
        raise InvalidParameterError(f"{where}: a line must be a JSON object, got {_kind(row)}")
    unknown = [k for k in row if k not in KEYS]
    if unknown:
        raise InvalidParameterError(f"{where}: unknown key {unknown[0]!r} (a line may hold {', '.join(KEYS)})")
    return row


def _spec(row: dict[str, Any], number: int, where: str) -> PromptSpec:
    kinds = [k for k in KINDS if k in row]
    if len(kinds) != 1:
        raise InvalidParameterError(f'{where}: give exactly one of "prompt", "chat" or "messages"')
    kind, value = kinds[0], row[kinds[0]]
    if kind == "messages":
        if not (isinstance(value, list) and value and all(_is_message(m) for m in value)):
            raise InvalidParameterError(f'{where}: "messages" must be a non-empty list of objects with a string '
                                        f'"role" and a string "content" (OpenAI format)')
        text, messages = None, tuple(value)
    elif not isinstance(value, str):
        raise InvalidParameterError(f'{where}: "{kind}" must be a string, got {_kind(value)}')
    else:
        _check(check_prompt_nonempty, value, where)
        text, messages = (value, None) if kind == "prompt" else (None, user_message(value))
    prompt_id = row.get("id", number)
    if isinstance(prompt_id, bool) or not isinstance(prompt_id, (str, int)):
        raise InvalidParameterError(f'{where}: "id" must be a string or an integer, got {_kind(prompt_id)}')
    max_tokens = row.get("max_tokens")
    if max_tokens is not None:
        _check(check_max_tokens, max_tokens, where)
    return PromptSpec(str(prompt_id), where, text=text, messages=messages, max_tokens=max_tokens)


def _check(check: Callable[[Any], None], value: Any, where: str) -> None:
    """check(value), its error an InvalidParameterError naming `where`."""
    try:
        check(value)
    except SpecRouterError as exc:
        raise InvalidParameterError(f"{where}: {exc}") from None


def _is_message(m: Any) -> bool:
    return isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)


def _kind(value: Any) -> str:
    """A JSON value's kind as JSON names it."""
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
             float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)

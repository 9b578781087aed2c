"""A chat request's tools, checked: which functions the model is told about, whether it may
call several, and the answer's grammar when calls are forced (tool_choice required or a
named function). Every tool's parameters schema is compiled the way a forced call would
compile it, whatever tool_choice says: a schema that cannot constrain arguments is a 400
under `auto` as under `required`."""

from __future__ import annotations

from dataclasses import dataclass

from specrouter.backends.base import Backend
from specrouter.cascade.grammar import Grammar
from specrouter.chat import supports_tools
from specrouter.errors import InvalidGrammarError
from specrouter.server import api_requests as q
from specrouter.server.api_errors import APIError
from specrouter.server.tools import ToolCall, forced_calls


@dataclass(frozen=True)
class ToolUse:
    """A chat request's tools: the functions the model was told about, and whether it may
    return several calls (parallel_tool_calls false: the first only)."""

    functions: list[str]
    parallel: bool
    #: The answer's grammar when the calls are forced (tool_choice required or named), else None.
    grammar: Grammar | None = None

    def calls(self, found: list[ToolCall]) -> list[q.ToolCall]:
        kept = found if self.parallel else found[:1]
        return [q.ToolCall(id=c.id, function=q.FunctionCall(name=c.name, arguments=c.arguments)) for c in kept]


def tool_use(body: q.ChatCompletionRequest, target: Backend) -> ToolUse | None:
    """The request's tools, checked (a 400 naming the field), or None when it offers none.
    Compiles grammars (a thread's work, not the event loop's)."""
    choice = body.tool_choice
    names = [t.function.name for t in body.tools or ()]
    if len(set(names)) != len(names):
        raise APIError(400, "tools must have distinct function names", param="tools", code="invalid_value")
    named = choice.function.name if isinstance(choice, q.NamedToolChoice) else None
    if (choice == "required" or named is not None) and not names:
        raise APIError(400, "tool_choice required or a named function needs tools", param="tool_choice",
                       code="invalid_value")
    if named is not None and named not in names:
        raise APIError(400, f"tool_choice names {named!r}, which is not among the tools", param="tool_choice",
                       code="invalid_value")
    every = _calls_grammar(body, names) if names else None  # every schema checked, whatever tool_choice is
    if not body.functions_offered:
        return None
    forced = choice == "required" or named is not None
    if not forced and any(t.function.strict for t in body.tools or ()):
        raise APIError(400, "not supported by this server yet: strict function calling with tool_choice auto (the "
                            "answer may be text or calls); use tool_choice required or a named function",
                       param="tools", code="unsupported_parameter")
    if not supports_tools(target):
        raise APIError(400, f"the chat template of {target.name} does not support tools", param="tools",
                       code="unsupported_value")
    if forced and body.constraint_field is not None:
        raise APIError(400, "tool_choice required or a named function constrains the answer to calls: it cannot "
                            "be combined with response_format, regex or grammar", param="tool_choice",
                       code="invalid_value")
    grammar = (_calls_grammar(body, [named]) if named else every) if forced else None
    return ToolUse(body.functions_offered, body.parallel_tool_calls, grammar)


def _calls_grammar(body: q.ChatCompletionRequest, names: list[str]) -> Grammar:
    """The grammar of calls of `names` (tools.forced_calls), or a 400 naming `tools`."""
    tools = [t.model_dump(exclude_none=True) for t in body.tools or ()]
    try:
        return forced_calls(tools, names, body.parallel_tool_calls)
    except InvalidGrammarError as e:
        raise APIError(400, f"a tool's parameters cannot constrain its arguments: {e}", param="tools",
                       code="invalid_grammar") from None

"""Request bodies of the HTTP API: OpenAI's shapes plus a few extensions.

The extensions are `speculation` on a request ("auto", "off", or a fixed chain with draft
lengths), `suffix_memory` on a request (false: opt out of the cross-request memory),
`cache_salt` (vLLM's: the prefix cache shared only with requests of the same salt), `exact`
on a request (true: refused unless the server runs exact kernels, `serve --exact`), vLLM's
`top_k`, `min_p`, `repetition_penalty` and `chat_template_kwargs`, structured output beyond
response_format (`regex`; `grammar`, GBNF or Lark as llama-server takes it), and
`usage.speculation` on a response (api_responses.py).

Nothing is silently ignored: a field of OpenAI's API that the engine does not implement yet
(echo, best_of, suffix, ...) is accepted only at its neutral value, the one that asks for
nothing (`Unsupported`: echo false, ...), and any other value is a 400 naming the field
with code `unsupported_parameter` (so is a tool's strict true under tool_choice auto,
app.py); a field that is in neither OpenAI's API nor the extensions is the same 400
(extra="forbid"). Fields that change no output (`user`,
`metadata`, `prompt_cache_key`, `safety_identifier`) are accepted.

Types are strict, as OpenAI's API: a boolean is `true` or `false` (not "yes"), an integer is
a JSON integer (not "4"); a number field takes integers too. Every string of a request, at
any depth (keys and values of tool schemas, metadata, template variables included), must be
valid Unicode: JSON's `\\ud800` escapes decode to lone surrogates, which no tokenizer can
encode; the first one found is a 400 naming its path (code invalid_unicode). Grammars and
schemas are compiled by the endpoint, off the event loop (app.py), not here.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from specrouter.cascade.grammar import Grammar
from specrouter.cascade.logprobs import MAX_TOP_LOGPROBS
from specrouter.cascade.sampling import MAX_LOGIT_BIAS, MAX_PENALTY, MAX_REPETITION_PENALTY, MIN_REPETITION_PENALTY
from specrouter.engine.speculation import Speculation
from specrouter.errors import clip

Temperature = Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)]
TopP = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
#: The most choices (n) one request may ask for.
MAX_CHOICES = 16
Penalty = Annotated[float, Field(ge=-MAX_PENALTY, le=MAX_PENALTY, allow_inf_nan=False)]
#: logit_bias: token ids (as strings, OpenAI's keys) -> a bias in [-100, 100]; at most 1,024.
LogitBias = Annotated[dict[Annotated[str, Field(pattern=r"^[0-9]{1,9}$")],
                           Annotated[float, Field(ge=-MAX_LOGIT_BIAS, le=MAX_LOGIT_BIAS, allow_inf_nan=False)]],
                      Field(max_length=1024)]


#: How deeply a request's JSON may nest (a tool's schema, metadata, template variables):
#: deeper is a 400 before anything recurses into it (a JSON parser, a template's tojson).
MAX_DEPTH = 64


@dataclass(frozen=True)
class BodyProblem:
    """What makes a parsed JSON body unusable at any depth: its path (keys and indices),
    the error code, and what is wrong there."""

    path: tuple[str, ...]
    code: str
    what: str


def body_problem(body: Any) -> BodyProblem | None:
    """The first string (key or value, at any depth) that UTF-8 cannot carry (a lone
    surrogate), or the first value nested deeper than MAX_DEPTH; None when there is none.
    Iterative: a deeply nested body costs no stack."""
    stack: list[tuple[tuple[str, ...], Any]] = [((), body)]
    while stack:
        path, value = stack.pop()
        if len(path) > MAX_DEPTH:
            return BodyProblem(path[:MAX_DEPTH], "too_deep", f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                return BodyProblem(path, "invalid_unicode", f"invalid Unicode: a lone surrogate at character {exc.start}")
        elif isinstance(value, dict):
            for key, item in reversed(list(value.items())):
                stack += [(path + (clip(str(key), 40),), item), (path + (clip(str(key), 40),), key)]
        elif isinstance(value, list):
            stack += [(path + (str(i),), item) for i, item in reversed(list(enumerate(value)))]
    return None


class _Strict(BaseModel):
    """A request body (or a part of one): no unknown field, no coercion between types."""

    model_config = ConfigDict(extra="forbid", strict=True)


#: A stop string: any length, not empty.
StopString = Annotated[str, Field(min_length=1)]
#: At most 8 stop strings (the limit is on the list: a single string may be of any length).
StopList = Annotated[list[StopString], Field(max_length=8)]
DraftLength = Annotated[int, Field(ge=1, le=32)]


def Unsupported(*neutral: Any, what: str) -> Any:  # noqa: N802 - a type, as Annotated aliases are
    """A field of OpenAI's API that this server does not implement: None or one of its
    `neutral` values (what asks for nothing) is accepted, anything else is a 400 naming the
    field (code unsupported_parameter). The OpenAPI document lists the accepted values (enum)."""

    def check(value: Any) -> Any:
        if value is not None and not any(_same(value, n) for n in neutral):
            raise PydanticCustomError("unsupported_parameter", "not supported by this server yet: {what} "
                                      "(accepted only as {neutral})", {"what": what, "neutral": neutral_text})
        return value

    neutral_text = " or ".join(json.dumps(n) for n in neutral) or "null"
    return Annotated[Any, AfterValidator(check), Field(description=f"not supported yet: only {neutral_text}",
                                                       json_schema_extra={"enum": [*neutral, None]})]


def _same(value: Any, neutral: Any) -> bool:
    """JSON equality: 0 and 0.0 are one number, but true is not 1."""
    def kind(x):
        return "number" if isinstance(x, (int, float)) and not isinstance(x, bool) else type(x)
    return kind(value) == kind(neutral) and value == neutral


# OpenAI's fields that are not implemented yet (see the module docstring).
NoEcho = Unsupported(False, what="echo")
NoBestOf = Unsupported(1, what="best_of > 1")
NoSuffix = Unsupported("", what="suffix")
NoFunctions = Unsupported([], what="functions")
NoFunctionCall = Unsupported("none", "auto", what="function_call")
NoStore = Unsupported(False, what="store")
DefaultTier = Unsupported("auto", "default", what="service_tier")
TextModality = Unsupported(["text"], what="modalities other than text")
NoAudio = Unsupported(what="audio")
NoPrediction = Unsupported(what="prediction")
NoReasoningEffort = Unsupported(what="reasoning_effort")
NoVerbosity = Unsupported(what="verbosity")
NoWebSearch = Unsupported(what="web_search_options")
NoRefusal = Unsupported(what="a message's refusal")


class SpeculationChain(_Strict):
    """A fixed chain: served level names, cheapest first, ending at the served model."""

    chain: list[str] = Field(min_length=1, max_length=8)
    draft_lengths: list[DraftLength] | None = Field(None, max_length=7, description="default 4 per drafting level")


class JSONSchemaFormat(_Strict):
    """OpenAI's response_format.json_schema. strict true or false: the output is always held
    to the schema (the grammar is applied whatever strict says)."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: str | None = None
    json_schema: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class TextFormat(_Strict):
    type: Literal["text"]


class JSONObjectFormat(_Strict):
    type: Literal["json_object"]


class JSONSchemaResponseFormat(_Strict):
    type: Literal["json_schema"]
    json_schema: JSONSchemaFormat


ResponseFormat = Annotated[TextFormat | JSONObjectFormat | JSONSchemaResponseFormat, Field(discriminator="type")]
#: Extensions: a regular expression (Rust regex syntax) or a GBNF / Lark grammar the output must match.
RegexField = Annotated[str, Field(max_length=65536)]
GrammarField = Annotated[str, Field(max_length=262144)]


#: The wire form of a request's speculation; _Sampling.engine_speculation turns it into the engine's Speculation.
SpeculationField = Literal["auto", "off"] | SpeculationChain


class StreamOptions(_Strict):
    include_usage: bool = False


class _Sampling(_Strict):
    """Fields shared by both endpoints."""

    model: str
    max_tokens: int | None = Field(None, ge=1, description="default: the server's max_tokens")
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    top_k: int = Field(0, ge=-1, description="0 or -1 disables (extension, as in vLLM)")
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stop: StopString | StopList | None = None
    n: int = Field(1, ge=1, le=MAX_CHOICES, description="choices, each its own sequence (and random stream)")
    frequency_penalty: Penalty = 0.0
    presence_penalty: Penalty = 0.0
    repetition_penalty: float = Field(1.0, ge=MIN_REPETITION_PENALTY, le=MAX_REPETITION_PENALTY, allow_inf_nan=False,
                                      description="1 disables (extension, as in vLLM)")
    min_p: float = Field(0.0, ge=0, le=1, allow_inf_nan=False, description="0 disables (extension, as in vLLM)")
    logit_bias: LogitBias | None = None
    response_format: ResponseFormat | None = Field(None, description="text, json_object or json_schema (held to "
                                                                     "the schema whatever strict says)")
    regex: RegexField | None = Field(None, description="the output matches this regular expression (extension)")
    grammar: GrammarField | None = Field(None, description="the output is a sentence of this GBNF or Lark grammar "
                                                           "(extension, as in llama-server)")
    # Change no output: accepted as they are.
    user: str | None = None
    metadata: dict[str, str] | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    speculation: SpeculationField | None = Field(None, description="default: the server's chain setting")
    suffix_memory: bool = Field(True, description="false: this request is neither drafted from the server's "
                                                  "cross-request suffix memory nor added to it (extension)")
    cache_salt: str | None = Field(None, min_length=1, max_length=1024,
                                   description="the request resumes only from prefix caches that requests with "
                                               "the same salt (and API key) left (extension, as in vLLM)")
    exact: bool | None = Field(None, description="true: greedy output bit-identical to the target alone's, "
                                                 "which needs a server started with --exact; false: refused "
                                                 "by such a server (extension)")

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        problem = body_problem(data)
        if problem is not None:
            raise PydanticCustomError(problem.code, "{path}: {what}", {
                "path": clip(".".join(problem.path), 120) or "body", "what": problem.what,
                "field": problem.path[0] if problem.path else None})
        return data

    @model_validator(mode="after")
    def _one_constraint(self):
        fields = {"response_format": None if isinstance(self.response_format, TextFormat) else self.response_format,
                  "regex": self.regex, "grammar": self.grammar}
        given = [name for name, value in fields.items() if value is not None]
        if len(given) > 1:
            raise PydanticCustomError("invalid_value", "at most one of response_format (json), regex and grammar may "
                                      "constrain the output; got {given}", {"given": ", ".join(given)})
        return self

    @property
    def constraint_field(self) -> str | None:
        """The field that constrains the output (response_format, regex or grammar), if any."""
        if self.regex is not None or self.grammar is not None:
            return "regex" if self.regex is not None else "grammar"
        free = self.response_format is None or isinstance(self.response_format, TextFormat)
        return None if free else "response_format"

    @cached_property
    def engine_grammar(self) -> Grammar | None:
        """The output's constraint as the engine takes it (None: free text). Compiled once, on
        first use (seconds for a large grammar: not on the event loop); a source that does not
        compile raises InvalidGrammarError."""
        f = self.response_format
        if isinstance(f, JSONObjectFormat):
            return Grammar.json_object()
        if isinstance(f, JSONSchemaResponseFormat):
            return Grammar.json_schema(f.json_schema.json_schema)
        if self.regex is not None:
            return Grammar("regex", self.regex)
        if self.grammar is not None:
            return Grammar("gbnf", self.grammar)
        return None

    @property
    def engine_logit_bias(self) -> tuple[tuple[int, float], ...]:
        """logit_bias as the engine takes it: (token id, bias) pairs, by id."""
        return tuple(sorted((int(k), float(v)) for k, v in (self.logit_bias or {}).items()))

    @property
    def engine_top_k(self) -> int:
        """top_k as the engine takes it: -1 (vLLM's and SGLang's "off") is 0."""
        return max(self.top_k, 0)

    @property
    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def engine_speculation(self, levels: Sequence[str], target: str) -> Speculation | None:
        """The request's speculation as the engine's type (None: the server's default); a
        chain is checked against the served levels and target (check_chain), an empty
        draft_lengths meaning the default."""
        field = self.speculation
        if field is None:
            return None
        if isinstance(field, str):
            return Speculation(field)
        return Speculation.fixed(field.chain, field.draft_lengths, levels, target)


#: Alternatives per token a request may ask for (logprobs, top_logprobs).
TopLogprobs = Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)]


class CompletionRequest(_Sampling):
    prompt: str | list[Annotated[int, Field(ge=0)]] = Field(description="text, or token ids")
    logprobs: TopLogprobs | None = Field(None, description="each token's log-probability with this many "
                                                             "alternatives (null: none)")
    echo: NoEcho = None
    best_of: NoBestOf = None
    suffix: NoSuffix = None


class TextPart(_Strict):
    type: Literal["text"]
    text: str


FunctionName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]


class FunctionDefinition(_Strict):
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="a JSON schema of the arguments")
    strict: bool | None = Field(None, description="true: arguments held to the parameters schema (needs "
                                                   "tool_choice required or a named function)")


class ToolDefinition(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionCall(_Strict):
    name: FunctionName
    arguments: str = Field(description="a JSON object, as a string")

    @property
    def parsed_arguments(self) -> dict:
        """The arguments as the chat template takes them (an object); a 400 unless a JSON object."""
        try:
            value = json.loads(self.arguments)
        except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes
            value = None
        if not isinstance(value, dict):
            raise ValueError(f"the arguments of a call of {self.name} are not a JSON object")
        return value


class ToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCall] | None = Field(None, description="an assistant's calls")
    tool_call_id: str | None = Field(None, description="a tool message: the call it answers")
    name: str | None = Field(None, max_length=256, description="the participant's name (passed to the template)")
    refusal: NoRefusal = None  # an assistant message echoed back by a client carries refusal: null

    @model_validator(mode="after")
    def _check(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content is required (only an assistant message with tool_calls may omit it)")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only an assistant message has tool_calls")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        for i, call in enumerate(self.tool_calls or ()):
            # Checked now (a 400 naming messages), as the body is: the text's \ud800 escapes
            # decode to lone surrogates only once it is parsed.
            problem = body_problem(call.function.parsed_arguments)
            if problem is not None:
                path = ".".join(("tool_calls", str(i), "function", "arguments", *problem.path))
                raise PydanticCustomError(problem.code, "{path}: {what}", {"path": clip(path, 120),
                                                                           "what": problem.what})
        return self

    @property
    def text(self) -> str | None:
        if self.content is None or isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates take it (HF's shape: a call's arguments as an object)."""
        out: dict[str, Any] = {"role": self.role, "content": self.text}
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.function.name, "arguments": c.function.parsed_arguments}} for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


class NamedFunction(_Strict):
    name: FunctionName


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, description="newer name of max_tokens")
    logprobs: bool = Field(False, description="each token's log-probability")
    top_logprobs: TopLogprobs | None = Field(None, description="alternatives per token (needs logprobs)")
    tools: list[ToolDefinition] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        None, description="none, auto (the default with tools), required (the answer is calls only) or a named "
                          "function (one call of it); the last two hold arguments to their schemas")
    parallel_tool_calls: bool = Field(True, description="false: at most the first call is returned")
    chat_template_kwargs: dict[str, Any] | None = Field(None, description="extra variables for the chat template "
                                                                          "(extension, as in vLLM)")

    functions: NoFunctions = None
    function_call: NoFunctionCall = None
    store: NoStore = None
    service_tier: DefaultTier = None
    modalities: TextModality = None
    audio: NoAudio = None
    prediction: NoPrediction = None
    reasoning_effort: NoReasoningEffort = None
    verbosity: NoVerbosity = None
    web_search_options: NoWebSearch = None

    @property
    def functions_offered(self) -> list[str]:
        """The functions the model is told about (none with tool_choice none)."""
        if self.tool_choice == "none":
            return []
        return [t.function.name for t in self.tools or ()]

    def template_tools(self) -> list[dict] | None:
        """The tools as chat templates take them (None: no tools to render)."""
        if not self.functions_offered:
            return None
        return [t.model_dump(exclude_none=True) for t in self.tools or ()]



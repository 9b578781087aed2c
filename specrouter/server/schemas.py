"""Request and response bodies of the HTTP API: OpenAI's shapes plus one extension.

The extensions are `speculation` on a request ("auto", "off", or a fixed chain with draft
lengths), `suffix_memory` on a request (false: opt out of the cross-request memory), `exact`
on a request (true: refused unless the server runs exact kernels, `serve --exact`), and
`usage.speculation` on a response (what that request's chain did).

Nothing is silently ignored: a field of OpenAI's API that the engine does not implement yet
(logprobs, n > 1, penalties, tools, response_format...) is accepted only at its neutral
value, the one that asks for nothing (`Unsupported`: penalties 0, n 1, tools [], ...), and
any other value is a 400 naming the field with code `unsupported_parameter`; a field that is
in neither OpenAI's API nor the extensions is the same 400 (extra="forbid"). Fields that
change no output (`user`, `metadata`, `prompt_cache_key`, `safety_identifier`) are accepted.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StrictBool
from pydantic_core import PydanticCustomError

from specrouter.engine.request import GenerationResult
from specrouter.engine.speculation import Speculation

Temperature = Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)]
TopP = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]


def _encodable(text: object) -> object:
    """Text that UTF-8 can carry: JSON's \\ud800 escapes decode to lone surrogates, which no
    tokenizer can encode (a 400 naming the field, not a 500 from the backend). Checked
    before the type (which has its own error for what is not a string)."""
    if not isinstance(text, str):
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"invalid Unicode: a lone surrogate at character {exc.start}") from None
    return text


#: Every text field of a request.
Text = Annotated[str, BeforeValidator(_encodable)]
StopString = Annotated[str, Field(min_length=1), BeforeValidator(_encodable)]
#: At most 8 stop strings (the limit is on the list: a single string may be of any length).
StopList = Annotated[list[StopString], Field(max_length=8)]
DraftLength = Annotated[int, Field(ge=1, le=32)]


def Unsupported(*neutral: Any, what: str) -> Any:  # noqa: N802 - a type, as Annotated aliases are
    """A field of OpenAI's API that this server does not implement: None or one of its
    `neutral` values (what asks for nothing) is accepted, anything else is a 400 naming the
    field (code unsupported_parameter)."""

    def check(value: Any) -> Any:
        if value is not None and not any(_same(value, n) for n in neutral):
            raise PydanticCustomError("unsupported_parameter", "not supported by this server yet: {what} "
                                      "(accepted only as {neutral})", {"what": what, "neutral": neutral_text})
        return value

    neutral_text = " or ".join(json.dumps(n) for n in neutral) or "null"
    return Annotated[Any, AfterValidator(check), Field(description=f"not supported yet: only {neutral_text}")]


def _same(value: Any, neutral: Any) -> bool:
    """JSON equality: 0 and 0.0 are one number, but true is not 1."""
    def kind(x):
        return "number" if isinstance(x, (int, float)) and not isinstance(x, bool) else type(x)
    return kind(value) == kind(neutral) and value == neutral


# OpenAI's fields that are not implemented yet (see the module docstring).
NotN = Unsupported(1, what="n > 1 (several choices)")
NoPenalty = Unsupported(0, what="frequency_penalty and presence_penalty other than 0")
NoLogitBias = Unsupported({}, what="logit_bias")
NoCompletionLogprobs = Unsupported(what="logprobs")
NoEcho = Unsupported(False, what="echo")
NoBestOf = Unsupported(1, what="best_of > 1")
NoSuffix = Unsupported("", what="suffix")
NoChatLogprobs = Unsupported(False, what="logprobs")
NoTopLogprobs = Unsupported(0, what="top_logprobs")
TextFormat = Unsupported({"type": "text"}, what="response_format other than text")
NoTools = Unsupported([], what="tools")
NoToolChoice = Unsupported("none", "auto", what="tool_choice other than none or auto (without tools)")
ParallelToolCalls = Unsupported(True, False, what="parallel_tool_calls")
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


class SpeculationChain(BaseModel):
    """A fixed chain: served level names, cheapest first, ending at the served model."""

    model_config = ConfigDict(extra="forbid")
    chain: list[str] = Field(min_length=1, max_length=8)
    draft_lengths: list[DraftLength] | None = Field(None, max_length=7, description="default 4 per drafting level")


#: The wire form of a request's speculation; _Sampling.engine_speculation turns it into the engine's Speculation.
SpeculationField = Literal["auto", "off"] | SpeculationChain


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Sampling(BaseModel):
    """Fields shared by both endpoints."""

    model_config = ConfigDict(extra="forbid")
    model: str
    max_tokens: int | None = Field(None, ge=1, description="default: the server's max_tokens")
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    top_k: int = Field(0, ge=-1, description="0 or -1 disables (extension, as in vLLM)")
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stop: StopString | StopList | None = None
    n: NotN = None
    frequency_penalty: NoPenalty = None
    presence_penalty: NoPenalty = None
    logit_bias: NoLogitBias = None
    # Change no output: accepted as they are.
    user: str | None = None
    metadata: dict[str, str] | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    speculation: SpeculationField | None = Field(None, description="default: the server's chain setting")
    suffix_memory: StrictBool = Field(True, description="false: this request is neither drafted from the server's "
                                                        "cross-request suffix memory nor added to it (extension)")
    exact: StrictBool | None = Field(None, description="true: greedy output bit-identical to the target alone's, "
                                                       "which needs a server started with --exact; false: refused "
                                                       "by such a server (extension)")

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


class CompletionRequest(_Sampling):
    prompt: Text | list[Annotated[int, Field(ge=0)]] = Field(description="text, or token ids")
    logprobs: NoCompletionLogprobs = None
    echo: NoEcho = None
    best_of: NoBestOf = None
    suffix: NoSuffix = None


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: Text


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant"]
    content: Text | list[TextPart]

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, description="newer name of max_tokens")
    logprobs: NoChatLogprobs = None
    top_logprobs: NoTopLogprobs = None
    response_format: TextFormat = None
    tools: NoTools = None
    tool_choice: NoToolChoice = None
    parallel_tool_calls: ParallelToolCalls = None
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


# Responses ------------------------------------------------------------------------------


class LevelUsage(BaseModel):
    name: str
    proposed: int
    accepted: int
    acceptance: float | None
    forwards: int


class ChainUsage(BaseModel):
    chain: list[str]
    draft_lengths: list[int]
    cycles: int


class SpeculationUsage(BaseModel):
    chain: list[str] = Field(description="the chain that ran most cycles")
    draft_lengths: list[int]
    chains_used: list[ChainUsage]
    levels: list[LevelUsage] = Field(description="per model, summed over every chain it ran in; target last")
    cycles: int
    mean_tokens_per_cycle: float


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    speculation: SpeculationUsage

    @classmethod
    def of(cls, r: GenerationResult) -> Usage:
        cycles = [r.chains_per_cycle.count(i) for i in range(len(r.chains_used))]
        spec = SpeculationUsage(
            chain=r.chain,
            draft_lengths=r.draft_lengths,
            chains_used=[ChainUsage(chain=c, draft_lengths=k, cycles=n) for (c, k), n in zip(r.chains_used, cycles)],
            levels=[LevelUsage(name=s.name, proposed=s.proposed, accepted=s.accepted, acceptance=s.acceptance,
                               forwards=s.forwards) for s in r.levels],
            cycles=r.cycles,
            mean_tokens_per_cycle=len(r.token_ids) / r.cycles if r.cycles else 0.0,
        )
        n = len(r.token_ids)
        return cls(prompt_tokens=r.prompt_tokens, completion_tokens=n, total_tokens=r.prompt_tokens + n,
                   speculation=spec)


FinishReason = Literal["stop", "length"]


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: FinishReason | None
    logprobs: None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: FinishReason
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    finish_reason: FinishReason | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "specrouter"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail

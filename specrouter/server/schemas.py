"""Request and response bodies of the HTTP API: OpenAI's shapes plus one extension.

The extensions are `speculation` on a request ("auto", "off", or a fixed chain with draft
lengths), `suffix_memory` on a request (false: opt out of the cross-request memory), `exact`
on a request (true: refused unless the server runs exact kernels, `serve --exact`), and
`usage.speculation` on a response (what that request's chain did). Fields
of OpenAI's API that the engine cannot honour (logprobs, n > 1, penalties...) are not
declared: unknown fields are ignored, as OpenAI-compatible servers commonly do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool

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

    model: str
    max_tokens: int | None = Field(None, ge=1, description="default: the server's max_tokens")
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    top_k: int = Field(0, ge=0, description="0 disables (extension, as in vLLM)")
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stop: StopString | StopList | None = None
    n: int = Field(1, ge=1, le=1, description="only one choice per request")
    stream: bool = False
    stream_options: StreamOptions | None = None
    speculation: SpeculationField | None = Field(None, description="default: the server's chain setting")
    suffix_memory: StrictBool = Field(True, description="false: this request is neither drafted from the server's "
                                                        "cross-request suffix memory nor added to it (extension)")
    exact: StrictBool | None = Field(None, description="true: greedy output bit-identical to the target alone's, "
                                                       "which needs a server started with --exact; false: refused "
                                                       "by such a server (extension)")

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


class TextPart(BaseModel):
    type: Literal["text"]
    text: Text


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: Text | list[TextPart]

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, description="newer name of max_tokens")


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

"""Response bodies of the HTTP API: OpenAI's shapes, plus `usage.speculation` (what the
request's chains did)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, Field

from specrouter.cascade.logprobs import TokenLogprob, finite
from specrouter.drafters.lookup import SOURCES, match_source
from specrouter.engine.request import GenerationResult
from specrouter.metrics import SpecStats
from specrouter.server.api_requests import ToolCall


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


class LookupSourceUsage(BaseModel):
    source: Literal["request", "memory", "forced"] = Field(description="the request's own text, the cross-request "
                                                                       "memory, or a grammar's forced tokens")
    drafts: int = Field(description="blocks the routed lookup drafted from this source (one per cycle at most)")
    proposed: int
    accepted: int


class SpeculationUsage(BaseModel):
    chain: list[str] = Field(description="the chain that ran most cycles")
    draft_lengths: list[int]
    chains_used: list[ChainUsage]
    levels: list[LevelUsage] = Field(description="per model, summed over every chain it ran in; target last")
    cycles: int
    mean_tokens_per_cycle: float
    lookup_sources: list[LookupSourceUsage] = Field(
        default_factory=list, description="what auto's model-free lookup drafted, per source (extension; empty "
                                          "for a fixed chain or the target alone)")


class PromptTokensDetails(BaseModel):
    cached_tokens: int = Field(description="prompt tokens the target took from a finished request's cache")


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    speculation: SpeculationUsage

    @classmethod
    def of(cls, results: Sequence[GenerationResult]) -> Usage:
        """A request's usage over its choices (n): the prompt once, every choice's tokens, and
        the speculation of all of them together (chain: the one that ran the most cycles)."""
        chains: dict[tuple[tuple[str, ...], tuple[int, ...]], int] = {}
        for r in results:
            for i, (c, k) in enumerate(r.chains_used):
                key = (tuple(c), tuple(k))
                chains[key] = chains.get(key, 0) + r.chains_per_cycle.count(i)
        levels = SpecStats.of(s for r in results for s in r.levels)
        target = results[0].levels[-1].name if results[0].levels else None
        ordered = [s for s in levels.values() if s.name != target] + ([levels[target]] if target in levels else [])
        top = max(chains, key=chains.get) if chains else (tuple(results[0].chain), tuple(results[0].draft_lengths))
        tokens, cycles = sum(len(r.token_ids) for r in results), sum(r.cycles for r in results)
        spec = SpeculationUsage(
            chain=list(top[0]),
            draft_lengths=list(top[1]),
            chains_used=[ChainUsage(chain=list(c), draft_lengths=list(k), cycles=n) for (c, k), n in chains.items()],
            levels=[LevelUsage(name=s.name, proposed=s.proposed, accepted=s.accepted, acceptance=s.acceptance,
                               forwards=s.forwards) for s in ordered],
            cycles=cycles,
            mean_tokens_per_cycle=tokens / cycles if cycles else 0.0,
            lookup_sources=_lookup_sources(results),
        )
        prompt = results[0].prompt_tokens
        return cls(prompt_tokens=prompt, completion_tokens=tokens, total_tokens=prompt + tokens,
                   prompt_tokens_details=PromptTokensDetails(cached_tokens=results[0].cached_tokens), speculation=spec)


def _lookup_sources(results: Sequence[GenerationResult]) -> list[LookupSourceUsage]:
    """The routed lookup's blocks of every choice, summed per source (SOURCES' order; a
    source that drafted nothing is left out)."""
    sums = {source: [0, 0, 0] for source in SOURCES}
    for r in results:
        for label, s in r.lookup.items():
            counts = sums[match_source(label)]
            counts[0] += s.drafts
            counts[1] += s.proposed
            counts[2] += s.accepted
    return [LookupSourceUsage(source=source, drafts=d, proposed=p, accepted=a)
            for source, (d, p, a) in sums.items() if d]


FinishReason = Literal["stop", "length", "tool_calls"]

class TokenText:
    """A token's text for logprobs: its bytes decoded (a token that is part of a UTF-8
    character shows U+FFFD; `bytes` has the exact bytes), and a finite log-probability."""

    def __init__(self, token_bytes) -> None:
        self.token_bytes = token_bytes

    def text(self, token: int) -> str:
        return self.token_bytes(token).decode("utf-8", errors="replace")

    logprob = staticmethod(finite)


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    """A chat choice's (or chunk's) logprobs, OpenAI's shape."""

    content: list[ChatTokenLogprob] | None

    @classmethod
    def of(cls, entries: Sequence[TokenLogprob], texts: TokenText) -> ChatLogprobs:
        def top(token: int, logprob: float) -> TopLogprob:
            raw = texts.token_bytes(token)
            return TopLogprob(token=texts.text(token), logprob=texts.logprob(logprob), bytes=list(raw))

        return cls(content=[ChatTokenLogprob(**top(e.token, e.logprob).model_dump(),
                                             top_logprobs=[top(t, lp) for t, lp in e.top]) for e in entries])


class CompletionLogprobs(BaseModel):
    """A completion choice's (or chunk's) logprobs, the legacy shape: per token its text, its
    log-probability, its alternatives with the token itself (OpenAI: up to logprobs + 1), and
    the offset of its text in the completion's (by the lengths of the token texts before it)."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]

    @classmethod
    def of(cls, entries: Sequence[TokenLogprob], texts: TokenText, offset: int = 0) -> CompletionLogprobs:
        """`offset`: the text offset of the first entry (a stream's chunks go on from the last)."""
        tokens = [texts.text(e.token) for e in entries]
        offsets = []
        for token in tokens:
            offsets.append(offset)
            offset += len(token)
        tops = [{texts.text(t): texts.logprob(lp) for t, lp in (*e.top, (e.token, e.logprob))} for e in entries]
        return cls(tokens=tokens, token_logprobs=[texts.logprob(e.logprob) for e in entries], top_logprobs=tops,
                   text_offset=offsets)


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: FinishReason | None
    logprobs: CompletionLogprobs | None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: FinishReason
    logprobs: ChatLogprobs | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ToolCallDelta(ToolCall):
    """A streamed call: OpenAI's delta shape (an index; here the whole call in one chunk)."""

    index: int


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    finish_reason: FinishReason | None = None
    logprobs: ChatLogprobs | None = None


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

"""Generation of one request over a chain: cycles, stop conditions, streaming text.

Stop rules: EOS ends generation and is not emitted; a stop string cuts the text
before it and token_ids keep only the tokens that make up the kept text (a token that
straddles the cut stays); max_tokens caps the emitted tokens. Text is streamed with a hold-back: a tail that could still become a
stop string (or is an incomplete UTF-8 character) is not shown until it is resolved.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from specrouter.cascade.chain import Chain, CycleRunner, LevelStats
from specrouter.cascade.sampling import SamplingParams
from specrouter.cascade.verify import residual
from specrouter.errors import EmptyPromptError, InvalidParameterError, PromptTooLongError
from specrouter.state import SequenceState


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" (EOS or stop string) or "length" (max_tokens or context full)
    chain: list[str]
    draft_lengths: list[int]
    levels: list[LevelStats]
    cycles: int
    prompt_tokens: int
    wall_seconds: float
    evaluated_tokens: dict[str, int] = field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        return len(self.token_ids) / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def as_dict(self) -> dict:
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "chain": self.chain,
            "draft_lengths": self.draft_lengths,
            "levels": [s.as_dict() for s in self.levels],
            "cycles": self.cycles,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": len(self.token_ids),
            "mean_tokens_per_cycle": len(self.token_ids) / self.cycles if self.cycles else 0.0,
            "wall_seconds": round(self.wall_seconds, 4),
            "tokens_per_second": round(self.tokens_per_second, 3),
            "evaluated_tokens": self.evaluated_tokens,
        }


def check_prompt(chain: Chain, prompt_tokens: Sequence[int]) -> None:
    if not prompt_tokens:
        raise EmptyPromptError("the prompt is empty: give at least one token of text")
    n_ctx = min(m.n_ctx for m in chain.models)
    if len(prompt_tokens) >= n_ctx:
        raise PromptTooLongError(
            f"the prompt has {len(prompt_tokens)} tokens but the context holds {n_ctx} "
            f"(at least one position must stay free for generation); shorten the prompt or raise --n-ctx"
        )


def generate_stream(
    chain: Chain,
    prompt_tokens: Sequence[int],
    params: SamplingParams,
    max_tokens: int,
    stop: Sequence[str] = (),
    rng: np.random.Generator | None = None,
    detokenize: Callable[[int], bytes] | None = None,
    residual_fn=residual,
) -> Iterator[str | GenerationResult]:
    """Yield text deltas as tokens are committed, then the GenerationResult last."""
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise InvalidParameterError(f"max_tokens must be an integer >= 1, got {max_tokens}")
    if any(not s for s in stop):
        raise InvalidParameterError("stop strings must be non-empty")
    check_prompt(chain, prompt_tokens)
    rng = rng if rng is not None else np.random.default_rng(params.seed)
    token_bytes = detokenize or chain.target.token_bytes
    n_ctx = min(m.n_ctx for m in chain.models)

    state = SequenceState()
    runner = CycleRunner(chain, state, params, rng, residual_fn=residual_fn)
    context = list(prompt_tokens)
    generated: list[int] = []
    text = _TextTracker(token_bytes, stop)
    finish = "length"
    cycles = 0
    start = time.perf_counter()
    try:
        while True:
            room = min(max_tokens - len(generated), n_ctx - len(context))
            if room <= 0:
                break
            new = runner.cycle(context, room)
            cycles += 1
            for token in new:
                if token in chain.eos_ids:
                    finish = "stop"
                    break
                generated.append(token)
                if text.add(token):
                    finish = "stop"
                    break
            else:
                context += new
                state.rollback_to(context)
                delta = text.flush(final=False)
                if delta:
                    yield delta
                continue
            break
    finally:
        wall = time.perf_counter() - start
        evaluated = dict(state.evaluated)
        state.release()
    generated = generated[: text.n_tokens]
    delta = text.flush(final=True)
    if delta:
        yield delta
    yield GenerationResult(
        text=text.text,
        token_ids=generated,
        finish_reason=finish,
        chain=chain.names,
        draft_lengths=list(chain.draft_lengths),
        levels=runner.stats,
        cycles=cycles,
        prompt_tokens=len(prompt_tokens),
        wall_seconds=wall,
        evaluated_tokens=evaluated,
    )


def generate(chain: Chain, prompt_tokens: Sequence[int], params: SamplingParams, max_tokens: int, **kw) -> GenerationResult:
    """Run to completion and return only the result."""
    result = None
    for item in generate_stream(chain, prompt_tokens, params, max_tokens, **kw):
        result = item
    assert isinstance(result, GenerationResult)
    return result


class _TextTracker:
    """Decodes tokens to text incrementally and finds stop strings."""

    def __init__(self, token_bytes: Callable[[int], bytes], stop: Sequence[str]) -> None:
        self._bytes = token_bytes
        self._stop = list(stop)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""
        self.n_tokens = 0  # tokens that contribute to the emitted text
        self._ends: list[int] = []  # text length after each token
        self._shown = 0
        self._stopped = False

    def add(self, token: int) -> bool:
        """Append one token; True when a stop string completed (text is then cut before it)."""
        before = len(self.text)
        self.text += self._decoder.decode(self._bytes(token))
        self.n_tokens += 1
        self._ends.append(len(self.text))
        if not self._stop:
            return False
        # Only a stop string that ends in the new text can be new; search from just before it.
        window_start = max(0, before - max(len(s) for s in self._stop) + 1)
        hits = [i for i in (self.text.find(s, window_start) for s in self._stop) if i >= 0]
        if hits:
            cut = min(hits)
            self.text = self.text[:cut]
            # Keep the fewest tokens whose text covers the kept text (a straddling token stays).
            self.n_tokens = next((j + 1 for j, end in enumerate(self._ends) if end >= cut), 0) if cut else 0
            self._stopped = True
            return True
        return False

    def flush(self, final: bool) -> str:
        """The text not shown yet, minus a tail that may still turn into a stop string."""
        if final and not self._stopped:
            self.text += self._decoder.decode(b"", final=True)
        end = len(self.text) if final else len(self.text) - self._holdback()
        delta = self.text[self._shown : end]
        self._shown = max(self._shown, end)
        return delta

    def _holdback(self) -> int:
        longest = 0
        for s in self._stop:
            for n in range(min(len(s) - 1, len(self.text)), 0, -1):
                if self.text.endswith(s[:n]):
                    longest = max(longest, n)
                    break
        return longest

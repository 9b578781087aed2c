"""What goes into the batch scheduler and what comes out of it: a sequence's request, and the
events of a step (text deltas, finished results, failures)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from specrouter.cascade.chain import Chain
from specrouter.cascade.logprobs import TokenLogprob
from specrouter.cascade.sampling import SamplingParams
from specrouter.drafters.memory import MemoryScope
from specrouter.engine.chain_router import ChainRouter
from specrouter.engine.request import GenerationResult
from specrouter.engine.speculation import Speculation


@dataclass
class SeqRequest:
    prompt_tokens: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = 16
    stop: list[str] = field(default_factory=list)
    #: Alternatives reported per emitted token with its log-probability (None: no logprobs).
    logprobs: int | None = None
    speculation: Speculation | None = None  # None: the scheduler's default
    #: The request's part of the cross-request suffix memory (OPTED_OUT: none).
    memory: MemoryScope = field(default_factory=MemoryScope)
    #: The prefix cache's partition it resumes from and keeps its caches in (prefix_cache.py).
    cache_partition: str = ""
    #: Fed and routed the same way each time it is sent (a request with a seed): its prompt is
    #: prefilled afresh, never resumed from the prefix cache (whose reuse rounds differently),
    #: and `auto` routes it from state frozen when the planner was made (router/frozen.py).
    reproducible: bool = False
    #: Which of its request's choices this sequence is (n > 1): its own random stream.
    choice: int = 0
    #: The id of a sequence with the same prompt (its request's choice 0) whose KV this one
    #: takes instead of prefilling the prompt again: it starts once that one has run a cycle.
    shares_prompt_with: str | None = None

    def rng(self) -> np.random.Generator:
        """The sequence's random stream: the seed's own for choice 0 (what the request alone
        gets), a stream of (seed, choice) for the others; fresh entropy without a seed."""
        seed = self.params.seed
        if seed is None:
            return np.random.default_rng()
        return np.random.default_rng(seed if self.choice == 0 else [seed, self.choice])


@dataclass
class Delta:
    request_id: str
    text: str
    tokens: int = 0  # tokens committed since the request's previous Delta
    #: The log-probabilities of the tokens this text shows (when the request asked for them).
    logprobs: list[TokenLogprob] = field(default_factory=list)


@dataclass
class Finished:
    request_id: str
    result: GenerationResult


@dataclass
class Failed:
    request_id: str
    error: Exception


Event = Delta | Finished | Failed
#: Turns a request's speculation choice into what generates it (a fixed chain or a router session).
Planner = Callable[[SeqRequest], Chain | ChainRouter]

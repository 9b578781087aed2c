"""Where a request's chain comes from: a router asked before every cycle (ChainRouter), or a
fixed chain as the router that always returns it (FixedChain, the null object of routing), so
a request has one code path. Switching chains between cycles needs no bookkeeping, because the
state manager lets a model that sat out catch up lazily, and it keeps the output exact, because
every cycle emits tokens distributed as the target's whatever chain produced them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from specrouter.backends.base import Backend
from specrouter.cascade.chain import Chain, CycleObserver
from specrouter.cascade.sampling import SamplingParams
from specrouter.errors import InvalidParameterError
from specrouter.metrics import SpecStats


class ChainRouter(CycleObserver, Protocol):
    """Chooses the chain of every cycle and learns from the cycle's observations."""

    target: Backend
    models: Sequence[Backend]  # every model it may put in a chain

    def start(self, params: SamplingParams, prompt_tokens: int, max_tokens: int) -> None: ...

    def choose(self, position: int, room: int, cached: Mapping[str, int], context: Sequence[int],
               forced: Sequence[int] = ()) -> Chain:
        """position: committed tokens so far; room: most tokens this cycle may emit;
        cached: per model name, committed tokens its cache already holds; context: the
        committed tokens (read-only, for a drafter's shadow lookup); forced: the tokens the
        request's grammar forces next (what a model-free drafter would propose)."""

    def on_choice(self, seconds: float) -> None:
        """seconds: the time the last choose() took, on the request's clock."""

    def end_cycle(self, new_tokens: Sequence[int], seconds: float) -> None:
        """new_tokens: what the target emitted this cycle; seconds: the cycle's time."""

    def finish(self) -> None: ...

    def exclude(self, name: str) -> None:
        """Route without this (non-target) model from the next cycle on (it failed)."""

    #: Sequences that advance together with this one (set before choose by the batch driver).
    batch_size: int
    decisions: list
    #: Whether the last choose() deliberated (False: it reused a decision, or chooses nothing).
    deliberated: bool
    #: Whether the last choose() ran the target alone while it fed the prompt: no choice.
    prefill: bool
    #: The request's model-free lookup per match class (what it drafted, what was accepted;
    #: reset by start): empty where nothing is looked up apart from the chain's levels.
    lookup_stats: SpecStats


class FixedChain:
    """A fixed chain as a router: the same chain every cycle, nothing learnt. The null object
    of routing (a request with a fixed chain runs the same code as a routed one)."""

    decisions: list = []
    batch_size = 1
    deliberated = False
    prefill = False

    def __init__(self, chain: Chain) -> None:
        if chain.eos_ids != chain.target.eos_ids:
            raise InvalidParameterError("a request stops at its target's EOS tokens: the chain must use them")
        self.chain = chain

    @property
    def target(self) -> Backend:
        return self.chain.target

    @property
    def models(self) -> list[Backend]:
        return self.chain.models

    @property
    def lookup_stats(self) -> SpecStats:
        """None told apart: a fixed chain's lookup level counts as a level (GenerationResult.levels)."""
        return SpecStats()

    def start(self, params: SamplingParams, prompt_tokens: int, max_tokens: int) -> None:
        pass

    def choose(self, position: int, room: int, cached: Mapping[str, int], context: Sequence[int],
               forced: Sequence[int] = ()) -> Chain:
        return self.chain

    def on_forward(self, level: str, n_tokens: int, seconds: float, shared: bool = False, batch: int = 1) -> None:
        pass

    def on_rows(self, level: str, rows: int, seconds: float) -> None:
        pass

    def on_verify(self, proposer, verifier, proposals, q, p, n_accepted, requested, match_class=None) -> None:
        pass

    def on_choice(self, seconds: float) -> None:
        pass

    def end_cycle(self, new_tokens: Sequence[int], seconds: float) -> None:
        pass

    def finish(self) -> None:
        pass

    def exclude(self, name: str) -> None:
        """The chain without that level; the others keep their draft lengths (a level's draft
        length is what it proposes upward)."""
        chain = self.chain
        keep = [i for i, level in enumerate(chain.levels) if level.name != name]
        self.chain = Chain([chain.levels[i] for i in keep], [chain.draft_lengths[i] for i in keep[:-1]], chain.eos_ids)


def as_router(chain: Chain | ChainRouter) -> ChainRouter:
    """What generates a request: a router as it is, a fixed chain as FixedChain."""
    return FixedChain(chain) if isinstance(chain, Chain) else chain

"""Which models a batch step calls: every model some sequence waits on, or only the one most
sequences wait on, so that the sequences of a batch run their cycles in phase.

A step of the batch scheduler (batch.py) serves each model it calls in one call, over every
sequence whose cycle waits on that model. Sequences whose chains draft with a model fall out
of phase (a block takes one draft forward or several, a request joins mid-cycle): some wait
on the draft model while others wait on the target. Calling every such model at every step
(ServeAll) then runs both models at every step while each sequence advances one stage of
its cycle. Where a call costs about the same whatever it feeds (a GPU below its
bandwidth/compute crossover, roofline.py), a cycle of k draft forwards and one verification
costs (k + 1)(t_d + t_t) out of phase instead of k t_d + t_t in phase, which can halve a
chain's speed (docs/journal.md, "A batch kept in phase").
Where a call costs its tokens (llama.cpp on a CPU), the split only adds each call's fixed
cost.

InPhase calls, per step, the model the most sequences wait on (a tie: the one whose oldest
sequence has waited longest, then the first seen), and any model with a sequence that has
waited `max_wait` steps already. The others wait: a group that waits on the target while the
majority drafts joins it when the majority reaches its verification, and from then on they
step together. The bound: a sequence waits at most `max_wait` steps beyond its due one, so
a sequence of a chain that runs one model (the target alone, a model-free draft) in a batch
of drafting ones advances at least once every max_wait + 1 steps, each of them a cheaper
step than ServeAll's (one model called, not two).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Protocol

from specrouter.errors import InvalidParameterError


class StepModels(Protocol):
    def pick(self, waits: Mapping[Hashable, Sequence[int]]) -> set[Hashable]:
        """waits: per model with pending forwards (in the order first seen), how many steps
        each sequence pending on it has waited already (0: due this step). Returns the
        models to call this step: at least one, when any is given."""


class ServeAll:
    """Every model some sequence waits on, at every step."""

    def pick(self, waits: Mapping[Hashable, Sequence[int]]) -> set[Hashable]:
        return set(waits)


class InPhase:
    """The model most sequences wait on, and every model whose oldest sequence has waited
    `max_wait` steps (see the module docstring)."""

    def __init__(self, max_wait: int = 1) -> None:
        if isinstance(max_wait, bool) or not isinstance(max_wait, int) or max_wait < 0:
            raise InvalidParameterError(f"max_wait must be an integer >= 0 (steps), got {max_wait!r}")
        self.max_wait = max_wait

    def pick(self, waits: Mapping[Hashable, Sequence[int]]) -> set[Hashable]:
        if not waits:
            return set()
        order = list(waits)
        most = max(order, key=lambda m: (len(waits[m]), max(waits[m]), -order.index(m)))
        return {most} | {m for m in order if max(waits[m]) >= self.max_wait}

"""Finished requests' KV caches kept for the requests that begin the same way.

A chat's next turn sends the whole conversation again, and an agent's every call its
system prompt and tools: a new prompt often begins with tokens an earlier request's caches
still held when it finished. The batch scheduler hands a finished request's SequenceState
to `keep` instead of releasing it, and a request it admits takes (`resume`), from the kept
state whose caches share the longest prefix with its prompt, that prefix in every model
(SequenceState.resume), so it feeds only the rest: a chat's second turn pays for its new
message, not the conversation again (vLLM's automatic prefix caching and llama-server's
`cache_prompt` do the same).

How the prefix is taken, per model (Backend.share_prefix):
- shared: llama.cpp's unified cache tags the cells with the new sequence too, torch copies
  the tensors; the kept state stays, for later requests as well;
- restored from a saved copy (Backend.restore) where the kept state left the shared cache
  (below); the kept state keeps its copy;
- taken over where the backend cannot share (llama.cpp in exact mode: a KV stream per
  sequence): the new request gets the kept sequence's slot itself, cut back to the prefix,
  and the kept state leaves the cache. Its cells are where they were when computed, and
  exact mode computes every row bit for bit as one-token decoding does, so the output stays
  the target alone's bit for bit, as after any rollback.
In default mode the shared cells were computed by forwards of other sizes than a cold
prefill's, which moves logits by kernel rounding: greedy output equals the target alone's
up to near-ties, as batching already does (docs/cascade-and-exactness.md).

What is kept: at most `capacity` states, the least recently used leaving first; a finished
state replaces the kept one it resumed from (the conversation's earlier turn: the new one
holds what the next turn will ask for) and any kept one it covers (every cache of the kept
one a prefix of its own). Kept states hold a sequence slot in each of
their models, so the pool must have `capacity` slots per model beyond the batch's
(n_seq_max = max_batch + capacity); in a unified llama.cpp cache, cells shared with live
requests are counted once. `capacity` 0 keeps nothing: every state is released at once.

Where kept cells lie in a cache shared with running requests (Backend.shared_cache),
every running request pays for them: llama.cpp attends over every cell up to the last in
use, masking other sequences' (a few thousand kept cells cost more per token than the
request's own context). So when a request is admitted, every kept state it does not resume
from moves its cells there into a saved copy in host memory (Backend.save: for the q4 1.5B
target ~29 kB per token) and frees its slot; a later request of its partition restores the
prefix it needs. The state a request resumes from stays in place (a conversation's next
turn shares its cells at no cost); a saved copy restores the same K and V rows, so the
logits after it are those the cells gave.

Reproducible requests (SeqRequest.reproducible: a seeded one) never resume, their numbers
must not depend on what was served before; and where kept states share a cache with them
(Backend.shared_cache: llama.cpp's unified cache, whose attention rounds by where a
sequence's cells lie) one admitted while nothing else runs has them saved first
(save_shared): its cells then lie where they would on a fresh server.

Partitions: every kept state belongs to the partition of the request that wrote it, and a
request resumes only from states of its own partition ("" unless its caller says otherwise;
the server derives it from the API key presented and the request's `cache_salt`). A prefix
reused across requests is visible in timing (a shorter first token), so requests of
different partitions learn nothing of each other's prompts this way; they still share the
capacity (a partition's new states push out the least recently used of any). A state that
covers another replaces it only within one partition.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specrouter.errors import InvalidParameterError
from specrouter.state import SequenceState


@dataclass
class PrefixCacheStats:
    """Plain counters (read by the server's metrics)."""

    queries: int = 0  # prompt tokens looked up
    hits: int = 0  # of those, positions the target took from a kept state
    kept: int = 0  # states kept
    evicted: int = 0  # states released by the capacity, or taken over


@dataclass(eq=False)  # compared by identity: list.remove must find this entry, not an equal one
class _Kept:
    state: SequenceState
    partition: str


class PrefixCache:
    """The kept states (module docstring); `capacity`: how many, 0 for none. Used by one
    scheduler's thread."""

    def __init__(self, capacity: int) -> None:
        self.capacity = self.check_capacity(capacity)
        self._kept: list[_Kept] = []  # least recently used first
        self.stats = PrefixCacheStats()

    @staticmethod
    def check_capacity(capacity: object) -> int:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
            raise InvalidParameterError(f"the prefix cache's capacity must be an integer >= 0 (sequences kept), "
                                        f"got {capacity!r}")
        return capacity

    def __len__(self) -> int:
        return len(self._kept)

    def kept(self) -> tuple[SequenceState, ...]:
        """The states kept, least recently used first."""
        return tuple(k.state for k in self._kept)

    def keep(self, state: SequenceState, partition: str = "") -> None:
        """A finished sequence's state, written by a request of `partition`: kept (its slots
        with it), or released."""
        if self.capacity == 0 or not state.held_tokens():
            state.release()
            return
        for old in [k for k in self._kept if k.state is state.resumed_from
                    or (k.partition == partition and state.covers(k.state))]:
            self._drop(old)
        state.resumed_from = None  # a long conversation's turns do not hold each other
        self._kept.append(_Kept(state, partition))
        self.stats.kept += 1
        while len(self._kept) > self.capacity:
            self._drop(self._kept[0])

    def resume(self, state: SequenceState, prompt: Sequence[int], target: str, partition: str = "") -> int:
        """Before `state`'s first forward: the kept state of `partition` sharing the longest
        prefix with `prompt` gives it that prefix in every model (SequenceState.resume); the
        positions the `target` model took. Every other kept state leaves the shared caches
        for a saved copy (save_shared): this request's attention pays for no cells of theirs."""
        self.stats.queries += len(prompt)
        held = [(k.state.held_prefix(prompt), k) for k in reversed(self._kept)  # newest first: max keeps the first
                if k.partition == partition]  # of equals
        n, best = max(held, key=lambda h: h[0], default=(0, None))
        for kept in self._kept:
            if kept is not best or n == 0:
                kept.state.save_shared()
        if n == 0:
            return 0
        models = len(best.state.held_tokens())
        taken = state.resume(best.state, prompt).get(target, 0)
        self._kept.remove(best)
        if len(best.state.held_tokens()) < models:  # a model's slot was taken over: the rest is of no use alone
            self.stats.evicted += 1
            best.state.release()
        else:
            self._kept.append(best)  # most recently used
        self.stats.hits += taken
        return taken

    def save_shared(self) -> None:
        """Move every kept state's cells in shared caches into saved copies
        (SequenceState.save_shared): a request that must compute as on a fresh server (a
        reproducible one, admitted alone) then finds its cells where it would there."""
        for kept in self._kept:
            kept.state.save_shared()

    def _drop(self, kept: _Kept) -> None:
        self._kept.remove(kept)
        self.stats.evicted += 1
        kept.state.release()

    def clear(self) -> None:
        """Release every kept state (the scheduler closes)."""
        for kept in list(self._kept):
            self._drop(kept)

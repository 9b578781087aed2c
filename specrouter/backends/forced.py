"""Trace-forced mode: a real model's forwards, a recorded trace's rows.

`ForcedBackend(real, replay)` performs every call it gets (decode, decode_batch, remove,
new_sequence, free_sequence, share_prefix) on `real`, the same call with the same sequences,
positions, token counts and rows wanted, a batched call as one batched call; it then
discards the real rows and returns the replay's (backends/replay.py) for the same contexts.
The engine's decisions (what is drafted, accepted, committed, routed) then follow the trace
while every forward's real cost is paid: on a device whose models have random weights of the
real shapes, the control flow, host work, forwards and batching are real, and the
acceptance is that of the models the trace was recorded with. The engine times its calls
into this backend on its own clock: a router's costs come from the real wall time.

- **Ids**: the cascade sees the replay's compact ids (its Vocabulary: what the simulator's
  models use, so a model-free drafter's matches are the replay's). The real model is fed
  each token's original id modulo its vocabulary (a model of cut-down shapes has fewer
  tokens), OFF and an added EOS as FILLER: a random-weight model's cost does not depend on
  which ids it reads.
- **Rows**: as wide as the real model's (real.n_vocab, the width the cascade's row work
  pays for), of the kind and dtype it returns (host numpy, or tensors left on its device:
  the cascade's argmax and softmax run where they run for real), built with the rows' own
  `one_hot` (ops/contract.py). A row is 0 but at the replay's token, whose logit is the
  replay's shifted by log((W - 1) / (n - 1)) for width W against the replay's n, so its
  softmax gives that token the replay's probability (what a draft stop reads). Values agree
  with the replay's to the dtype's rounding: in float32, a recorded confidence within about
  1e-7 of a draft stop's bin edge (ConfidenceStop) may fall in the other bin.
- **State**: per sequence, a mirror of its tokens (compact), the script its context is in
  and how far it follows that script's path, kept up to date per call, so a row costs O(1)
  on the path (O(its branch) off it) whatever the context's length. The real call runs
  first: where it raises, the mirror is untouched.
- **Its own work** (in the time the engine measures, beside the real call's): the ids
  mapped, the mirror extended, the rows built (one allocation and one scatter; on a GPU one
  small host-to-device copy per call).
- **Text**: token pieces, tokenize and vocab_texts are the replay's (placeholders): the
  detokenizer's work is not the real model's.

Replays of one trace share one Vocabulary, so forced models of one chain share it too; the
real backends are their owner's to close.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from specrouter.backends.base import Backend, Item, TimingKey
from specrouter.backends.replay import PEAK, Played, ReplayBackend, common_prefix
from specrouter.errors import BackendError, InvalidParameterError
from specrouter.ops.rows import ops_of

#: The real id fed where the compact id stands for no original token (OFF, an added EOS).
FILLER = 0


@dataclass
class Mirror:
    """One sequence as the replay reads it: its compact tokens, the current script its
    context is in (None: none yet), and the length of its common prefix with that script's path."""

    tokens: list[int] = field(default_factory=list)
    played: Played | None = None
    common: int = 0

    def extend(self, tokens: Sequence[int], find: Callable[[Sequence[int]], Played | None]) -> None:
        before = len(self.tokens)
        self.tokens.extend(tokens)
        if self.played is None:
            self.played = find(self.tokens)
            if self.played is not None:
                self.common = common_prefix(self.tokens, self.played.path)
        elif self.common == before:
            path, end = self.played.path, min(len(self.tokens), len(self.played.path))
            while self.common < end and self.tokens[self.common] == path[self.common]:
                self.common += 1

    def truncate(self, start: int) -> None:
        del self.tokens[start:]
        self.common = min(self.common, start)
        if self.played is not None and start < self.played.prompt:
            self.played = None

    def copy(self, n: int) -> Mirror:
        """Its first n positions (share_prefix)."""
        out = Mirror(self.tokens[:n], self.played, min(self.common, n))
        if out.played is not None and n < out.played.prompt:
            out.played = None
        return out

    def row(self, n: int, off: int) -> tuple[int, float]:
        """The replay's (token, logit) after its first n tokens; (off, PEAK) off the record."""
        found = self.played.row_at(self.tokens, n, self.common) if self.played is not None else None
        return found if found is not None else (off, PEAK)


class ForcedBackend(Backend):
    """`real`'s forwards, `replay`'s rows (the module docstring); named, sized and ended as
    the replay (the trace's model), shaped as the real model (its width, context, batching)."""

    kind = "forced"

    def __init__(self, real: Backend, replay: ReplayBackend) -> None:
        super().__init__()
        if replay.n_vocab > real.n_vocab:
            raise InvalidParameterError(f"{replay.name}: the replay's {replay.n_vocab} ids do not fit the rows of "
                                        f"{real.name} ({real.n_vocab} wide)")
        self.real, self.replay = real, replay
        self.name, self.params_b, self.eos_ids = replay.name, replay.params_b, replay.eos_ids
        self.n_vocab, self.n_ctx = real.n_vocab, min(real.n_ctx, replay.n_ctx)
        self.batches_natively, self.shared_cache = real.batches_natively, real.shared_cache
        self.path, self.n_threads = real.path, real.n_threads
        limit = min(real.n_tokens, real.n_vocab)
        ids = replay.vocabulary.ids
        #: The real id fed for each compact id.
        self.real_ids = [t % limit for t in ids] + [FILLER] * (replay.n_vocab - len(ids))
        #: What a replay's logit gains in a row of this width (same softmax probability).
        self.shift = math.log((real.n_vocab - 1) / (replay.n_vocab - 1))
        self._mirrors: dict[int, Mirror] = {}

    # What the runner plays (sim/simulate.py's Replay) -----------------------------------
    def play(self, index: int | None) -> tuple[list[int], list[int]]:
        return self.replay.play(index)

    def play_many(self, indices: Sequence[int]) -> list[tuple[list[int], list[int]]]:
        return self.replay.play_many(indices)

    # KV and compute ----------------------------------------------------------------------
    def decode(self, seq: int, tokens: Sequence[int], pos: int, n_logits: int) -> np.ndarray:
        self._check(seq, pos)
        rows = self.real.decode(seq, self._real(tokens), pos, n_logits)
        return self._forced(seq, tokens, n_logits, rows)

    def decode_batch(self, items: Sequence[Item]) -> list[np.ndarray]:
        for seq, _, pos, _ in items:
            self._check(seq, pos)
        out = self.real.decode_batch([(seq, self._real(tokens), pos, n) for seq, tokens, pos, n in items])
        return [self._forced(seq, tokens, n, rows) for (seq, tokens, _, n), rows in zip(items, out, strict=True)]

    def _check(self, seq: int, pos: int) -> None:
        mirror = self._mirrors.get(seq)
        if mirror is None:
            raise BackendError(f"{self.name}: sequence {seq} does not exist")
        if pos != len(mirror.tokens):
            raise BackendError(f"{self.name}: decode at position {pos} but sequence {seq} holds {len(mirror.tokens)}")

    def _real(self, tokens: Sequence[int]) -> list[int]:
        try:
            return [self.real_ids[t] for t in tokens]
        except (IndexError, TypeError):
            raise BackendError(f"{self.name}: token ids outside the replay's 0..{len(self.real_ids) - 1}") from None

    def _forced(self, seq: int, tokens: Sequence[int], n_logits: int, rows):
        """The replay's rows for the last n_logits of `tokens`, of the real rows' kind and shape."""
        mirror = self._mirrors[seq]
        mirror.extend(tokens, self.replay.played_for)
        first = len(mirror.tokens) - n_logits + 1
        peaks = [mirror.row(first + i, self.replay.off) for i in range(n_logits)]
        return ops_of(rows).one_hot(rows, [t for t, _ in peaks], [v + self.shift for _, v in peaks])

    def remove(self, seq: int, start: int) -> None:
        self.real.remove(seq, start)
        self._mirrors[seq].truncate(max(int(start), 0))

    def new_sequence(self) -> int:
        seq = self.real.new_sequence()
        self._mirrors[seq] = Mirror()
        return seq

    def free_sequence(self, seq: int) -> None:
        self.real.free_sequence(seq)
        self._mirrors.pop(seq, None)

    def share_prefix(self, src: int, dst: int, n: int) -> bool:
        if not self.real.share_prefix(src, dst, n):
            return False
        self._mirrors[dst] = self._mirrors[src].copy(n)
        return True

    def timing_key(self) -> TimingKey:
        key = self.real.timing_key()
        return dataclasses.replace(key, backend=f"{self.kind} {key.backend}")

    @property
    def live_sequences(self) -> int:
        """Sequences in use (a leak check)."""
        return len(self._mirrors)

    def kv_tokens(self, seq: int) -> list[int]:
        """The compact tokens the sequence holds (tests compare it with the real cache)."""
        return list(self._mirrors[seq].tokens)

    # Tokenizer: the replay's -----------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return self.replay.tokenize(text, add_special, parse_special)

    def _piece(self, token: int) -> bytes:
        return self.replay.token_bytes(token)

    def token_text(self, token: int) -> bytes:
        return self.replay.token_text(token)

    @property
    def n_tokens(self) -> int:
        return self.replay.n_tokens

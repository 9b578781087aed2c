"""The one narrow interface every model backend implements.

A backend owns a model and a KV cache holding several sequences. It knows nothing
of chains, acceptance or committed tokens: the state manager (specrouter.state)
decides which tokens to feed and which positions to remove. Positions are absolute
(0 = first prompt token) and a sequence's KV always covers positions [0, length).

What every backend shares is written here once (`Backend`: the piece cache, the
vocabulary texts, the timing key; `ForwardBackend`, for backends over a real model:
decode and decode_batch):

- **Catch-up head, then logit tail.** A call feeds `tokens` of which only the last
  `n_logits` need logits (the state manager sends a drafter's missed tokens in front
  of its new ones, or a whole prompt with one row wanted). What does not fit one forward
  (all but the last `n_batch` tokens) is fed first in forwards of at most `n_batch`
  tokens without logits (`_feed`); the rest of every sequence of a call, head and tail
  together, then goes through `_forward`, grouped so a group never exceeds `n_batch`
  tokens: a prompt's chunk rides in the same forward as other sequences' decoding (a
  forward's fixed cost, most of a token's on a CPU, is paid once). A backend implements
  only those two primitives.
- **Failure leaves the KV as it was**: if any forward of a call raises, every
  sequence of the call is rolled back to its `pos` (`_rollback`) before the error
  propagates, so the state manager's books and the cache never disagree.
- **Token pieces** are cached per token (`token_bytes` -> `_piece`), and the whole
  vocabulary's stored texts (`vocab_texts`, what tokenizers are compared by) once.
- **What its timing depends on** is stated by `timing_key` (the profile cache key):
  no caller probes class names or optional attributes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from specrouter.errors import BackendError

#: One decode item: (sequence, tokens, first position, rows of logits wanted).
Item = tuple[int, Sequence[int], int, int]
#: One forward run: (sequence, tokens, first position, rows of logits wanted: its last ones).
Run = tuple[int, Sequence[int], int, int]


@dataclass(frozen=True)
class SavedKV:
    """A sequence's KV copied out of a shared cache into host memory (Backend.save): what
    restore() puts back, in the backend's own format."""

    data: bytearray
    n_tokens: int  # positions [0, n_tokens) of the sequence it was saved from


@dataclass(frozen=True)
class TimingKey:
    """What a forward's wall time depends on besides n and the machine's CPU: the profile
    cache is keyed by it (plus the CPU model), so a change re-measures."""

    backend: str
    file: Path | None = None
    dtype: str | None = None
    n_threads: int | None = None
    #: The GPU the model runs on (its name), None on a CPU.
    gpu: str | None = None
    #: Which kernels compute a forward: "default", "exact" (llamacpp.py: every forward
    #: padded to rows the batched kernels treat alike) or "static" (the torch backend's static
    #: runtime: bucketed forwards, CUDA graphs on a GPU), whose costs differ.
    kernels: str = "default"


class Backend(ABC):
    #: Short name used in statistics and errors (pool name or file stem).
    name: str
    #: Length of a logits row. May exceed the tokenizer's size (padded vocabularies).
    n_vocab: int
    #: Context window in tokens, per sequence.
    n_ctx: int
    #: Tokens that end generation (EOS, end-of-turn).
    eos_ids: frozenset[int]
    #: Rough size, used to order models from cheapest to most expensive.
    params_b: float = 0.0
    #: Whether decode_batch evaluates sequences together (else it costs the sum of its items).
    batches_natively: bool = False
    #: Whether the sequences share one KV cache, so that where a sequence's cells lie, and so
    #: how its attention rounds, depends on the cells other sequences hold (llama.cpp's
    #: unified cache); False where each sequence's cache is its own.
    shared_cache: bool = False
    #: The backend's family in timing keys and messages.
    kind: ClassVar[str] = "backend"
    #: The model file or folder, None for a model built in memory.
    path: Path | None = None
    #: CPU threads a forward computes with (None: not set by this backend, or a GPU).
    n_threads: int | None = None

    def __init__(self) -> None:
        self._pieces: dict[int, bytes] = {}
        self._vocab_texts: list[bytes] | None = None

    # KV and compute ----------------------------------------------------------------
    @abstractmethod
    def decode(self, seq: int, tokens: Sequence[int], pos: int, n_logits: int) -> np.ndarray:
        """Append tokens at positions pos.. of sequence seq; return logits (n_logits, n_vocab)
        for the last n_logits of them (row i predicts the token after tokens[-n_logits + i])."""

    def decode_batch(self, items: Sequence[Item]) -> list[np.ndarray]:
        """Several sequences in one call: items of (seq, tokens, pos, n_logits), one logits
        array per item. Backends that can evaluate sequences together override this."""
        return [self.decode(seq, tokens, pos, n) for seq, tokens, pos, n in items]

    @abstractmethod
    def remove(self, seq: int, start: int) -> None:
        """Drop positions [start, end) of sequence seq from the KV cache."""

    @abstractmethod
    def new_sequence(self) -> int:
        """Reserve a sequence slot with an empty KV cache and return its id."""

    @abstractmethod
    def free_sequence(self, seq: int) -> None:
        """Release the slot and its KV cells."""

    def share_prefix(self, src: int, dst: int, n: int) -> bool:
        """Make the empty sequence dst hold src's first n positions without computing them
        (cells shared where the cache allows, else copied); False: this backend cannot, and
        the caller computes them. A later remove() on either sequence leaves the other whole."""
        return False

    def save(self, seq: int) -> SavedKV | None:
        """A copy of sequence seq's KV in host memory, where the cache is shared: a sequence
        nothing computes with (a finished one kept for later prompts) then need not hold cells
        there, whose count every other sequence's attention pays for (llama.cpp attends over
        every cell up to the last one in use, masking those of other sequences). None: this
        backend's sequences have caches of their own (nothing to gain). seq is left as it is."""
        return None

    def restore(self, saved: SavedKV, dst: int, n: int) -> bool:
        """Make the empty sequence dst hold the first n positions of a saved sequence, as
        they were computed; False: no room for its cells (dst left empty), the caller computes
        them."""
        return False

    def timing_key(self) -> TimingKey:
        """What this backend's forward times depend on (see TimingKey)."""
        return TimingKey(self.kind, self.path, None, self.n_threads)

    # Tokenizer ---------------------------------------------------------------
    @abstractmethod
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of text; add_special: BOS where the model wants one; parse_special: text
        such as `<|im_start|>` becomes its control token (False: plain text, as a user's
        words must be)."""

    def token_bytes(self, token: int) -> bytes:
        """The raw bytes of one token (may be part of a UTF-8 character); cached."""
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._pieces[token] = self._piece(int(token))
        return piece

    @abstractmethod
    def _piece(self, token: int) -> bytes:
        """token_bytes, uncached."""

    def token_text(self, token: int) -> bytes:
        """The vocabulary's stored text of a token, what tokenizers are compared by (for a
        byte-level BPE, e.g. b'\\xc4\\xa0the' for ' the'); by default the token's bytes."""
        return self.token_bytes(token)

    def vocab_texts(self) -> list[bytes]:
        """token_text of every token the tokenizer defines, computed once per backend."""
        if self._vocab_texts is None:
            self._vocab_texts = [self.token_text(t) for t in range(self.n_tokens)]
        return self._vocab_texts

    @property
    @abstractmethod
    def n_tokens(self) -> int:
        """Number of tokens the tokenizer defines (<= n_vocab)."""

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")

    @property
    def chat_template(self) -> str | None:
        return None

    @property
    def bos_text(self) -> str:
        return ""

    @property
    def eos_text(self) -> str:
        return ""

    def close(self) -> None:
        """Free native resources (idempotent)."""


class ForwardBackend(Backend):
    """A backend over a real model: decode and decode_batch written once from two
    primitives, `_feed` (catch-up, no logits) and `_forward` (tails with logits); see
    the module docstring for the head/tail split and the rollback on failure."""

    batches_natively = True
    #: Most tokens one forward takes (catch-up heads are fed in pieces of this size;
    #: n_logits may not exceed it).
    n_batch: int = 512

    def decode(self, seq: int, tokens: Sequence[int], pos: int, n_logits: int) -> np.ndarray:
        return self.decode_batch([(seq, tokens, pos, n_logits)])[0]

    def decode_batch(self, items: Sequence[Item]) -> list[np.ndarray]:
        """Each sequence appears at most once. What does not fit one forward goes first, per
        sequence; the rest of every sequence shares forwards of at most n_batch tokens."""
        if len({seq for seq, *_ in items}) < len(items):
            raise ValueError("decode_batch: each sequence may appear once")
        for seq, tokens, pos, n_logits in items:
            self._check_item(seq, tokens, pos, n_logits)
        try:
            runs: list[Run] = []
            for seq, tokens, pos, n_logits in items:
                cut = max(0, len(tokens) - self.n_batch)
                for start in range(0, cut, self.n_batch):
                    self._feed(seq, tokens[start : min(start + self.n_batch, cut)], pos + start)
                runs.append((seq, tokens[cut:], pos + cut, n_logits))
            out: list[np.ndarray] = []
            for group in _groups(runs, self.n_batch):
                out.extend(self._forward(group))
            return out
        except BaseException:
            for seq, _, pos, _ in items:
                self._rollback(seq, pos)
            raise

    def _check_item(self, seq: int, tokens: Sequence[int], pos: int, n_logits: int) -> None:
        """BackendError / ValueError for a call that cannot be right, before anything runs."""
        if not 1 <= n_logits <= min(len(tokens), self.n_batch):
            raise ValueError(f"n_logits={n_logits} must be in 1..min(len(tokens)={len(tokens)}, "
                             f"n_batch={self.n_batch})")
        if pos + len(tokens) > self.n_ctx:
            raise BackendError(f"{self.name}: positions up to {pos + len(tokens)} exceed the context of {self.n_ctx}")
        bad = [int(t) for t in tokens if not 0 <= int(t) < self.n_vocab]
        if bad:
            raise BackendError(f"{self.name}: token ids {bad[:5]} are outside 0..{self.n_vocab - 1}")

    @abstractmethod
    def _feed(self, seq: int, tokens: Sequence[int], pos: int) -> None:
        """One forward of at most n_batch tokens, no logits (catch-up)."""

    @abstractmethod
    def _forward(self, runs: Sequence[Run]) -> list[np.ndarray]:
        """One forward over runs of distinct sequences (at most n_batch tokens in all); per
        run, the logits rows of its last n_logits tokens (n_logits >= 1), one array per run."""

    def _rollback(self, seq: int, pos: int) -> None:
        """Bring the sequence back to positions [0, pos) after a failed call."""
        self.remove(seq, pos)


def _groups(runs: Sequence[Run], limit: int) -> list[list[Run]]:
    """Consecutive runs packed into groups of at most `limit` tokens (a run longer than
    the limit cannot occur: decode_batch fed what does not fit first)."""
    groups: list[list[Run]] = []
    size = limit + 1
    for run in runs:
        if size + len(run[1]) > limit:
            groups.append([])
            size = 0
        groups[-1].append(run)
        size += len(run[1])
    return groups

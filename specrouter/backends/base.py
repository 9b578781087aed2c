"""The one narrow interface every model backend implements.

A backend owns a model and a KV cache holding several sequences. It knows nothing
of chains, acceptance or committed tokens: the state manager (specrouter.state)
decides which tokens to feed and which positions to remove. Positions are absolute
(0 = first prompt token) and a sequence's KV always covers positions [0, length).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np


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

    @abstractmethod
    def decode(self, seq: int, tokens: Sequence[int], pos: int, n_logits: int) -> np.ndarray:
        """Append tokens at positions pos.. of sequence seq; return logits (n_logits, n_vocab)
        for the last n_logits of them (row i predicts the token after tokens[-n_logits + i])."""

    #: Whether decode_batch evaluates sequences together (else it is this loop, costing the sum).
    batches_natively: bool = False

    def decode_batch(self, items: Sequence[tuple[int, Sequence[int], int, int]]) -> list[np.ndarray]:
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

    # Tokenizer ---------------------------------------------------------------
    @abstractmethod
    def tokenize(self, text: str, add_special: bool = True) -> list[int]: ...

    @abstractmethod
    def token_bytes(self, token: int) -> bytes:
        """The raw bytes of one token (may be part of a UTF-8 character)."""

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

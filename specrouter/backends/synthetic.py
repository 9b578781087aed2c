"""Synthetic models with known next-token distributions, for exact tests.

A family shares a base table of logits (a seeded function of the last `order`
tokens); each member adds its own seeded noise scaled by `noise`. Noise 0 is the
family's "truth"; larger noise means lower acceptance against it. Because the
logits are an explicit function of the context, the exact distribution of any
chain's output can be enumerated by a test.

Cost is simulated, not only slept: every decode adds `latency(n)` seconds to
`simulated_seconds`, so router tests can compute throughput without wall time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from specrouter.backends.base import Backend, SavedKV


class SyntheticBackend(Backend):
    kind = "synthetic"

    def __init__(
        self,
        name: str,
        vocab: int = 8,
        family_seed: int = 0,
        model_seed: int = 1,
        noise: float = 0.0,
        scale: float = 2.0,
        order: int = 2,
        eos_id: int | None = None,
        n_ctx: int = 4096,
        params_b: float = 1.0,
        latency: Callable[[int], float] | None = None,
        sleep: bool = False,
        chat_template: str | None = None,
    ) -> None:
        super().__init__()
        self.name = name
        self.n_vocab = vocab
        self.n_ctx = n_ctx
        self.eos_ids = frozenset() if eos_id is None else frozenset({eos_id})
        self.params_b = params_b
        self.family_seed, self.model_seed = family_seed, model_seed
        self.noise, self.scale, self.order = noise, scale, order
        self.latency = latency or (lambda n: 0.0)
        self.sleep = sleep
        self._chat_template = chat_template  # None: none (chat.py then uses ChatML)
        self.simulated_seconds = 0.0
        self.decode_calls = 0  # calls into the model (a batch counts once)
        self.batch_calls = 0
        self.decoded_tokens = 0
        self._kv: dict[int, list[int]] = {}
        self._next_seq = 0
        self._memo: dict[tuple[int, ...], np.ndarray] = {}

    # The model itself ------------------------------------------------------------
    def logits_for(self, context: Sequence[int]) -> np.ndarray:
        """Next-token logits after `context` (memoised: tests call this millions of times)."""
        key = tuple(context[-self.order :]) if self.order else ()
        row = self._memo.get(key)
        if row is None:
            base = np.random.default_rng([self.family_seed, 7919, *key]).normal(size=self.n_vocab)
            row = self.scale * base
            if self.noise:
                own = np.random.default_rng([self.family_seed, self.model_seed, *key]).normal(size=self.n_vocab)
                row = row + self.noise * own
            self._memo[key] = row
        return row

    # Backend interface -----------------------------------------------------------
    @property
    def chat_template(self) -> str | None:
        return self._chat_template

    def decode(self, seq: int, tokens: Sequence[int], pos: int, n_logits: int) -> np.ndarray:
        logits = self._extend(seq, tokens, pos, n_logits)
        self._charge(len(tokens))
        return logits

    #: A simulated model: one call costs latency(all its tokens), head and tail together.
    batches_natively = True

    def decode_batch(self, items: Sequence[tuple[int, Sequence[int], int, int]]) -> list[np.ndarray]:
        """One call for several sequences: it costs latency(all their tokens), as a real batch.
        A call of one sequence is a decode (tests replace decode to make a model fail)."""
        if len(items) == 1:
            return [self.decode(*items[0])]
        out = [self._extend(*item) for item in items]
        self.batch_calls += 1
        self._charge(sum(len(tokens) for _, tokens, _, _ in items))
        return out

    def _extend(self, seq: int, tokens: Sequence[int], pos: int, n_logits: int) -> np.ndarray:
        kv = self._kv[seq]
        if pos != len(kv):
            raise AssertionError(f"{self.name}: decode at {pos} but KV holds {len(kv)} positions")
        if len(kv) + len(tokens) > self.n_ctx:
            raise AssertionError(f"{self.name}: context overflow")
        kv.extend(tokens)
        self.decoded_tokens += len(tokens)
        first = len(kv) - n_logits + 1  # row i follows kv[:first + i]
        return np.array([self.logits_for(kv[:end]) for end in range(first, first + n_logits)])

    def _charge(self, n_tokens: int) -> None:
        """One call into the model over n_tokens: its simulated (and optionally slept) cost."""
        self.decode_calls += 1
        cost = self.latency(n_tokens)
        self.simulated_seconds += cost
        if self.sleep and cost > 0:
            time.sleep(cost)

    def remove(self, seq: int, start: int) -> None:
        del self._kv[seq][start:]

    def new_sequence(self) -> int:
        seq = self._next_seq
        self._next_seq += 1
        self._kv[seq] = []
        return seq

    def free_sequence(self, seq: int) -> None:
        self._kv.pop(seq, None)

    def share_prefix(self, src: int, dst: int, n: int) -> bool:
        self._kv[dst] = list(self._kv[src][:n])
        return True

    def save(self, seq: int) -> SavedKV | None:
        """A copy where the cache is shared (a subclass that says so), as llama.cpp's."""
        if not self.shared_cache:
            return None
        return SavedKV(bytearray(np.array(self._kv[seq], dtype=np.int64).tobytes()), len(self._kv[seq]))

    def restore(self, saved: SavedKV, dst: int, n: int) -> bool:
        self._kv[dst] = np.frombuffer(bytes(saved.data), dtype=np.int64)[:n].tolist()
        return True

    @property
    def live_sequences(self) -> int:
        """Slots in use (a leak check: 0 once every request has ended)."""
        return len(self._kv)

    def kv_tokens(self, seq: int) -> list[int]:
        """What the cache holds (tests compare it with the state manager's books)."""
        return list(self._kv[seq])

    # Tokenizer: one character per token; token t < 26 is the letter chr(97 + t) ------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """One id per character, no special tokens: a lowercase letter is its own token where
        the vocabulary has it (so tokenize inverts token_bytes there: a grammar engine reads
        both), any other character (ord(c) - 97) mod vocab."""
        return [(ord(c) - 97) % self.n_vocab for c in text]

    def _piece(self, token: int) -> bytes:
        return chr(ord("a") + token).encode() if token < 26 else f"<{token}>".encode()

    @property
    def n_tokens(self) -> int:
        return self.n_vocab

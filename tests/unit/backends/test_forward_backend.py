"""ForwardBackend: what does not fit one forward is fed first, the rest of every sequence
(head and tail) is grouped into forwards of at most n_batch tokens, the checks before
anything runs and the rollback after a failure, written once for every real backend
(llama.cpp, torch). A recording backend shows each forward it is asked for."""

from collections.abc import Sequence

import numpy as np
import pytest

from specrouter.backends.base import ForwardBackend, Run, TimingKey
from specrouter.errors import BackendError


class Recording(ForwardBackend):
    """A model whose logits row after a context is a one-hot of (sum of the context) mod vocab;
    every forward is recorded as ("feed" | "forward", [(seq, n tokens, pos, n_logits), ...])."""

    kind = "recording"

    def __init__(self, n_batch: int = 8, fail_on_forward: int | None = None) -> None:
        super().__init__()
        self.name, self.n_vocab, self.n_ctx, self.n_batch = "rec", 16, 64, n_batch
        self.eos_ids = frozenset()
        self.kv: dict[int, list[int]] = {}
        self.calls: list[tuple[str, list[tuple[int, int, int, int]]]] = []
        self.fail_on_forward = fail_on_forward

    def _append(self, seq: int, tokens: Sequence[int], pos: int) -> None:
        assert pos == len(self.kv[seq]), "fed at the wrong position"
        assert len(tokens) <= self.n_batch
        self.kv[seq].extend(tokens)

    def _feed(self, seq, tokens, pos):
        self.calls.append(("feed", [(seq, len(tokens), pos, 0)]))
        self._append(seq, tokens, pos)

    def _forward(self, runs: Sequence[Run]):
        self.calls.append(("forward", [(seq, len(t), pos, n) for seq, t, pos, n in runs]))
        assert sum(len(t) for _, t, _, _ in runs) <= self.n_batch
        out = []
        for seq, tokens, pos, n_logits in runs:
            self._append(seq, tokens, pos)
            if self.fail_on_forward is not None and len(self.calls) >= self.fail_on_forward:
                raise RuntimeError("the device failed")
            ctx = self.kv[seq]
            out.append(np.stack([np.eye(self.n_vocab)[sum(ctx[: pos + j + 1]) % self.n_vocab]
                                 for j in range(len(tokens) - n_logits, len(tokens))]))
        return out

    def remove(self, seq, start):
        del self.kv[seq][start:]

    def new_sequence(self):
        seq = len(self.kv)
        self.kv[seq] = []
        return seq

    def free_sequence(self, seq):
        self.kv.pop(seq)

    def tokenize(self, text, add_special=True):
        return [ord(c) % self.n_vocab for c in text]

    def _piece(self, token):
        return bytes([97 + token])

    @property
    def n_tokens(self):
        return self.n_vocab


def expected_rows(context: list[int], n_logits: int) -> list[int]:
    """The argmax of each of the last n_logits rows after context."""
    return [sum(context[: len(context) - n_logits + j + 1]) % 16 for j in range(n_logits)]


def test_a_long_call_feeds_what_does_not_fit_one_forward_first_then_the_rest_in_one():
    b = Recording(n_batch=8)
    seq = b.new_sequence()
    tokens = [t % 16 for t in range(1, 21)]  # 20 tokens, 3 rows wanted: 12 fed first (8 + 4), then the last 8
    logits = b.decode(seq, tokens, 0, 3)
    assert b.calls == [("feed", [(seq, 8, 0, 0)]), ("feed", [(seq, 4, 8, 0)]), ("forward", [(seq, 8, 12, 3)])]
    assert logits.argmax(axis=1).tolist() == expected_rows(tokens, 3)
    assert b.kv[seq] == tokens


def test_sequences_share_forwards_of_at_most_n_batch_tokens_heads_and_tails_together():
    b = Recording(n_batch=8)
    seqs = [b.new_sequence() for _ in range(5)]
    items = [(seqs[0], [1, 2, 3], 0, 3), (seqs[1], [4] * 10, 0, 2), (seqs[2], [5, 6, 7, 8], 0, 4), (seqs[3], [9], 0, 1),
             (seqs[4], [3] * 4, 0, 1)]
    out = b.decode_batch(items)
    # What does not fit one forward first (seqs[1]: 2 of its 10 tokens); then runs packed in order:
    # 3 + its last 8 would not fit; 8; 4 + 1 + a prompt chunk of 4 with one row wanted would not: 4 + 1; 4.
    assert b.calls == [("feed", [(seqs[1], 2, 0, 0)]),
                       ("forward", [(seqs[0], 3, 0, 3)]),
                       ("forward", [(seqs[1], 8, 2, 2)]),
                       ("forward", [(seqs[2], 4, 0, 4), (seqs[3], 1, 0, 1)]),
                       ("forward", [(seqs[4], 4, 0, 1)])]
    for (_, tokens, _, n), logits in zip(items, out):
        assert logits.shape == (n, 16) and logits.argmax(axis=1).tolist() == expected_rows(tokens, n)


def test_a_failed_forward_rolls_every_sequence_of_the_call_back():
    b = Recording(n_batch=8, fail_on_forward=3)  # the 3rd call: the batch below
    seqs = [b.new_sequence() for _ in range(2)]
    b.decode(seqs[0], [1, 2], 0, 1)
    b.decode(seqs[1], [3], 0, 1)
    with pytest.raises(RuntimeError, match="the device failed"):
        b.decode_batch([(seqs[0], [4, 5, 6], 2, 3), (seqs[1], [7], 1, 1)])
    assert b.kv == {seqs[0]: [1, 2], seqs[1]: [3]}  # as before the call


@pytest.mark.parametrize(("item", "error", "message"), [
    ((0, [1, 2], 0, 0), ValueError, r"n_logits=0 must be in 1..min\(len\(tokens\)=2, n_batch=8\)"),
    ((0, [1, 2], 0, 3), ValueError, r"n_logits=3 must be in 1..min\(len\(tokens\)=2, n_batch=8\)"),
    ((0, [1] * 12, 0, 9), ValueError, r"n_logits=9 must be in 1..min\(len\(tokens\)=12, n_batch=8\)"),
    ((0, [1, 2], 63, 1), BackendError, "rec: positions up to 65 exceed the context of 64"),
    ((0, [1, 16, -1], 0, 1), BackendError, r"rec: token ids \[16, -1\] are outside 0..15"),
])
def test_a_call_that_cannot_be_right_fails_before_anything_runs(item, error, message):
    b = Recording()
    b.new_sequence()
    with pytest.raises(error, match=message):
        b.decode_batch([item])
    assert b.calls == [] and b.kv == {0: []}


def test_a_sequence_appears_once_per_call():
    b = Recording()
    seq = b.new_sequence()
    with pytest.raises(ValueError, match="each sequence may appear once"):
        b.decode_batch([(seq, [1], 0, 1), (seq, [2], 1, 1)])


def test_pieces_and_vocabulary_texts_are_computed_once():
    b = Recording()
    calls = []
    piece = b._piece
    b._piece = lambda t: calls.append(t) or piece(t)
    assert b.detokenize([0, 1, 0]) == "aba" and calls == [0, 1]
    assert b.vocab_texts() is b.vocab_texts() and len(b.vocab_texts()) == 16
    assert b.timing_key() == TimingKey("recording", None, None, None, None)

"""Exact mode's padding of calls with a catch-up head, run in a process of its own
(test_exact_padding_real.py starts it: exact kernels must be chosen before any llama.cpp
forward runs in the process). No benchmark data: the prompts are cut from a fixed text.

A call feeds tokens of which only the last n_logits want logits (a prompt, a drafter's
catch-up): in exact mode it is padded to a multiple of EXACT_ROWS rows, so every row goes
through the same 4-row kernels as one-token decoding. For prompt lengths of every residue
mod 4, logits rows 1..3 wanted, from position 0 (a prompt) and after a cached prefix (a
catch-up), the call's rows must equal one-token decoding's bit for bit.

Prints one JSON object: "differ", the (model, first position, tokens fed, n_logits) whose
rows differ from one-token decoding in any bit (expected: none), with the largest absolute
difference; "calls", how many calls were compared.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from specrouter.backends.llamacpp import EXACT_ROWS
from specrouter.pool import Pool

#: The target: its quantisation mix shows both kinds of unpadded call (a call's rows, and
#: its rows with logits, whose last layer runs on them alone).
MODEL = "qwen2.5-coder-1.5b"
#: Any text will do; its tokens are the prompts.
TEXT = ("The committee met on a grey Tuesday to settle the budget for the new library wing. "
        "Three proposals were on the table: a reading room facing the river, a workshop for "
        "repairing old maps, and a quiet hall of carrels. After an hour of argument the chair "
        "asked each member to write one sentence in favour of the plan they liked least.")
#: Prompt lengths: one of every residue mod EXACT_ROWS.
LENGTHS = range(13, 13 + EXACT_ROWS)
#: A cached prefix before a catch-up call (its length is no multiple of EXACT_ROWS either).
PREFIX = 5


def main() -> None:
    pool = Pool(n_ctx=256, n_seq_max=2, exact=True)
    model = pool.model(MODEL)
    tokens = model.tokenize(TEXT)
    assert len(tokens) > max(LENGTHS), len(tokens)
    seq = model.new_sequence()
    # single[i]: the row after tokens[:i + 1], each token decoded alone.
    single = np.stack([model.decode(seq, [t], i, 1)[0] for i, t in enumerate(tokens[:max(LENGTHS)])])
    model.free_sequence(seq)
    differ, calls = [], 0
    for length in LENGTHS:
        for n_logits in range(1, EXACT_ROWS):
            for start in (0, PREFIX):
                seq = model.new_sequence()
                try:
                    if start:
                        model.decode(seq, tokens[:start], 0, 1)
                    rows = model.decode(seq, tokens[start:length], start, n_logits)
                finally:
                    model.free_sequence(seq)
                calls += 1
                want = single[length - n_logits : length]
                if not np.array_equal(rows, want):
                    differ.append({"model": MODEL, "start": start, "fed": length - start, "n_logits": n_logits,
                                   "max_abs": float(np.abs(rows - want).max())})
    pool.close()
    json.dump({"differ": differ, "calls": calls}, sys.stdout)


if __name__ == "__main__":
    main()

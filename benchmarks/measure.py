"""Running one method on one prompt and recording what the report needs."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

from specrouter.drafters.lookup import Found
from specrouter.drafters.ngram import NGRAM_NAME, NgramDrafter
from specrouter.cascade.chain import Chain
from specrouter.cascade.sampling import SamplingParams
from specrouter.engine import generate
from specrouter.pool import Pool


class CountingNgram(NgramDrafter):
    """The n-gram level, counting the tokens it was asked for: the run's statistics hold
    only what it proposed, and the predictor needs the fill (proposed / asked)."""

    def __init__(self) -> None:
        super().__init__()
        self.requested = 0

    def lookup(self, context: Sequence[int], n: int, committed: int | None = None) -> Found:
        self.requested += n
        return super().lookup(context, n, committed)


def fixed_chain(pool: Pool, names: Sequence[str], lengths: Sequence[int]) -> Chain:
    chain = pool.chain(list(names), list(lengths))
    if names[0] == NGRAM_NAME:
        chain.levels[0] = CountingNgram()
    return chain


def run_fixed(chain: Chain, tokens: list[int], params: SamplingParams, max_tokens: int) -> tuple[dict, list[int]]:
    """One generation over a fixed chain: the run's record (without dataset/prompt/method) and its tokens."""
    counter = chain.levels[0] if isinstance(chain.levels[0], CountingNgram) else None
    if counter is not None:
        counter.requested = 0
    r = generate(chain, tokens, params, max_tokens)
    levels = r.levels
    pairs = []
    for j in range(len(levels) - 1):
        # Every forward of a level above the bottom is one block verifying the level below.
        requested = counter.requested if j == 0 and counter is not None else levels[j].proposed
        pairs.append({"proposed": levels[j].proposed, "accepted": levels[j].accepted,
                      "requested": requested, "blocks": levels[j + 1].forwards})
    record = {
        **_common(r),
        "chain": chain.names,
        "draft_lengths": list(chain.draft_lengths),
        "accepted_per_block": [p["accepted"] / p["blocks"] if p["blocks"] else 0.0 for p in pairs],
        "pairs": pairs,
    }
    return record, r.token_ids


def run_routed(router, tokens: list[int], params: SamplingParams, max_tokens: int) -> tuple[dict, list[int]]:
    r = generate(router, tokens, params, max_tokens)
    # Per-level numbers of a routed run mix chains: its record keeps the choices instead.
    record = {**_common(r), "accepted_per_block": [], "chains_per_cycle": r.chains_per_cycle,
              "chain_labels": [_label(names, ks) for names, ks in r.chains_used],
              "lookup_blocks": {c: s.drafts for c, s in router.lookup_stats.items()},
              "lookup_accepted": {c: s.accepted for c, s in router.lookup_stats.items()}}
    return record, r.token_ids


def _common(r) -> dict:
    return {"tokens": len(r.token_ids), "seconds": r.wall_seconds, "tokens_per_second": r.tokens_per_second,
            "cycles": r.cycles, "chains_used": [" -> ".join(c) for c, _ in r.chains_used]}


def _label(names: Sequence[str], lengths: Sequence[int]) -> str:
    short = [n.removeprefix("qwen2.5-coder-") for n in names]
    return " -> ".join(short) + (f" [{','.join(map(str, lengths))}]" if lengths else "")


def prefill_seconds(model, tokens: list[int]) -> float:
    """Wall time of evaluating the prompt into an empty cache, as a generation starts."""
    seq = model.new_sequence()
    try:
        start = time.perf_counter()
        model.decode(seq, tokens, 0, 1)
        return time.perf_counter() - start
    finally:
        model.free_sequence(seq)


def forward_costs(pool: Pool, names: Sequence[str], ks=(1, 2, 3, 4, 6, 8, 12, 16), repeats: int = 5) -> dict[str, dict[int, float]]:
    """Median ms of one decode of k tokens after a cached 64-token prefix."""
    costs = {}
    for name in names:
        model = pool.level(name)
        seq = model.new_sequence()
        text = model.tokenize("def quicksort(items):\n    return sorted(items)\n" * (8 + max(ks) // 8))
        prefix, fed = text[:64], text[64:]
        model.decode(seq, prefix, 0, 1)
        row = {}
        for k in ks:
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                model.decode(seq, fed[:k], len(prefix), k)
                times.append(time.perf_counter() - start)
                model.remove(seq, len(prefix))
            row[k] = round(statistics.median(times) * 1000, 1)
        model.free_sequence(seq)
        costs[name] = row
    return costs
